// A client process for the daemon's integration tests (daemon_*.sh). Modes:
//   verify ADDR GGUF SECONDS SEED   acquire random experts, check every slot's bytes against the
//                                   GGUF (plain pread), release; exit 0 when all matched
//   hold ADDR LEASES                acquire LEASES leases, print "holding N", sleep (kill -9 me)
//   load ADDR GGUF                  acquire/verify/release until the daemon ends the stream or
//                                   refuses acquires (drain); exit 0 when nothing mismatched
//   bad ADDR                        every bad-request class: codes and messages, state unchanged
//   leases ADDR                     prints "sessions S leases L outstanding O" from GetStats
//                                   (O: with ended sessions' leases still draining)
//   pin ADDR                        client-side hits on experts 0 and 1 of the two middle MoE
//                                   layers, held (no daemon lease), print "pinning 4", sleep
//                                   (kill -9 me)
//   sweep ADDR                      without client-side hits: acquire and release every bundle of
//                                   the model in layer order, twice, then print how many of pin's
//                                   4 bundles were still resident ("pinned bundles resident R of 4")
// Every check prints what failed and exits 1.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "catalog/catalog.h"
#include "client.h"
#include "expertd/v1/service.grpc.pb.h"
#include "format/gguf_model.h"
#include "util/file.h"
#include "util/hash.h"

namespace {

using expertd::client::Client;
using expertd::client::Lease;
using expertd::client::Session;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "session_client: FAIL: %s\n", what.c_str());
  std::exit(1);
}

void Check(bool ok, const std::string& what) {
  if (!ok) Die(what);
}

std::unique_ptr<Client> Connect(const std::string& addr) {
  expertd::client::ConnectOptions options;
  options.address = addr;
  auto c = Client::Connect(options);
  if (!c.ok()) Die(std::string(c.status().message()));
  return *std::move(c);
}

// `client_hits` false: every acquire is a lease the daemon holds (what "hold" needs to show).
std::unique_ptr<Session> Open(Client& c, const std::string& name, bool client_hits = true) {
  expertd::client::SessionOptions options;
  options.model = "demo";
  options.client_name = name;
  options.client_hits = client_hits;
  auto s = c.OpenSession(options);
  if (!s.ok()) Die(absl::StrCat("OpenSession: ", s.status().ToString()));
  return *std::move(s);
}

// Expected XXH3 of (layer, expert, projection), read from the model file with pread.
class Oracle {
 public:
  explicit Oracle(const std::string& gguf) {
    auto model = expertd::GgufModel::Open(gguf);
    if (!model.ok()) Die(model.status().ToString());
    auto catalog = expertd::ModelCatalog::Build(*model, nullptr);
    if (!catalog.ok()) Die(catalog.status().ToString());
    catalog_ = std::make_unique<expertd::ModelCatalog>(*std::move(catalog));
    for (const auto& p : catalog_->packs()) {
      auto f = expertd::ReadFile::Open(p.path);
      if (!f.ok()) Die(f.status().ToString());
      files_.push_back(std::make_unique<expertd::ReadFile>(*std::move(f)));
    }
  }
  uint64_t Expected(uint32_t layer, uint32_t expert, size_t projection) {
    const auto key = std::make_tuple(layer, expert, projection);
    if (auto it = cache_.find(key); it != cache_.end()) return it->second;
    auto loc = catalog_->Locate(layer, expert, projection);
    if (!loc.ok()) Die(loc.status().ToString());
    std::vector<uint8_t> buf(loc->bytes);
    if (auto st = files_[loc->pack]->ReadAt(loc->offset, buf); !st.ok()) Die(st.ToString());
    return cache_[key] = expertd::Xxh3(buf);
  }
  const expertd::ModelCatalog& catalog() const { return *catalog_; }

 private:
  std::unique_ptr<expertd::ModelCatalog> catalog_;
  std::vector<std::unique_ptr<expertd::ReadFile>> files_;
  std::map<std::tuple<uint32_t, uint32_t, size_t>, uint64_t> cache_;
};

// Checks every slot of `lease`; returns the number of projections verified.
uint64_t VerifyLease(Oracle& oracle, const Lease& lease) {
  uint64_t n = 0;
  const expertd::MoeLayer* layer = oracle.catalog().FindLayer(lease.layer);
  Check(layer != nullptr, "grant for an unknown layer");
  for (const auto& s : lease.slots) {
    for (size_t p = 0; p < s.projections.size(); ++p) {
      const uint64_t bytes = layer->projections[p].expert_bytes;
      const uint64_t got = expertd::Xxh3(s.projections[p].first(bytes));
      if (got != oracle.Expected(lease.layer, s.expert, p)) {
        Die(absl::StrCat("layer ", lease.layer, " expert ", s.expert, " projection ", p,
                         " slot ", s.slot, ": bytes differ from the model file"));
      }
      ++n;
    }
  }
  return n;
}

std::vector<uint32_t> RandomExperts(std::mt19937& rng, uint32_t n_expert, uint32_t k) {
  std::vector<uint32_t> all(n_expert);
  for (uint32_t i = 0; i < n_expert; ++i) all[i] = i;
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(k);
  return all;
}

int Verify(const std::string& addr, const std::string& gguf, double seconds, uint32_t seed) {
  Oracle oracle(gguf);
  auto client = Connect(addr);
  auto session = Open(*client, absl::StrCat("verify-", seed));
  std::mt19937 rng(seed);
  const auto& info = session->model();
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  uint64_t verified = 0, acquires = 0, local = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    const uint32_t layer = info.moe_layers(static_cast<int>(rng() % info.moe_layers_size()));
    auto experts = RandomExperts(rng, info.n_expert(), info.n_expert_used());
    auto lease = session->Acquire(layer, experts);
    if (!lease.ok()) Die(absl::StrCat("acquire: ", lease.status().ToString()));
    verified += VerifyLease(oracle, *lease);
    ++acquires;
    local += lease->id >> 63;  // served in this process (client-side hits)
    if (auto st = session->Release(*lease); !st.ok()) Die(st.ToString());
  }
  Check(session->TakeAsyncErrors().empty(), "the daemon reported errors for releases");
  std::printf("verify seed %u: %llu acquires, %llu slots, %llu projections verified, "
              "%llu acquires served in the client\n", seed,
              static_cast<unsigned long long>(acquires),
              static_cast<unsigned long long>(acquires * info.n_expert_used()),
              static_cast<unsigned long long>(verified), static_cast<unsigned long long>(local));
  return 0;
}

int Hold(const std::string& addr, int leases) {
  auto client = Connect(addr);
  auto session = Open(*client, "holder", /*client_hits=*/false);
  std::vector<Lease> held;
  for (int i = 0; i < leases; ++i) {
    const uint32_t layer = session->model().moe_layers(i % session->model().moe_layers_size());
    const uint32_t experts[] = {0, 1};
    auto lease = session->Acquire(layer, experts);
    if (!lease.ok()) Die(lease.status().ToString());
    held.push_back(*std::move(lease));
  }
  std::printf("holding %d\n", leases);
  std::fflush(stdout);
  for (;;) pause();
}

// The bundles "pin" holds: experts 0 and 1 of the two middle MoE layers. The demo's pool holds a
// quarter of the model, and a sweep in layer order evicts the middle layers under every policy
// (cycle keeps the layers it needs next, the first ones; lru and lfu the last ones).
std::vector<uint32_t> PinnedLayers(const expertd::v1::ModelInfo& info) {
  const int mid = info.moe_layers_size() / 2;
  return {info.moe_layers(mid - 1), info.moe_layers(mid)};
}
constexpr uint32_t kPinnedExperts[] = {0, 1};

int Pin(const std::string& addr) {
  auto client = Connect(addr);
  auto session = Open(*client, "pinner");
  if (!session->client_hits()) Die("the session serves no client-side hits");
  std::vector<Lease> held;
  for (uint32_t layer : PinnedLayers(session->model())) {
    // The first acquire loads the bundles (a daemon lease); the second finds them resident.
    auto first = session->Acquire(layer, kPinnedExperts);
    if (!first.ok()) Die(first.status().ToString());
    Check(session->Release(*first).ok(), "release");
    auto pinned = session->Acquire(layer, kPinnedExperts);
    if (!pinned.ok()) Die(pinned.status().ToString());
    held.push_back(*std::move(pinned));
  }
  // Served in this process: the daemon holds no lease of this session.
  for (int tries = 0;; ++tries) {
    auto stats = client->GetStats();
    if (!stats.ok()) Die(stats.status().ToString());
    int64_t leases = -1;
    for (const auto& m : stats->models()) {
      for (const auto& st : m.sessions()) {
        if (st.client_name() == "pinner") leases = st.leases_held();
      }
    }
    if (leases == 0) break;
    // The release of the first acquires may still be in the lane.
    if (tries == 50) Die(absl::StrCat("the daemon holds ", leases, " leases of the pinner"));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::printf("pinning %zu\n", held.size() * std::size(kPinnedExperts));
  std::fflush(stdout);
  for (;;) pause();
}

int Sweep(const std::string& addr) {
  auto client = Connect(addr);
  auto session = Open(*client, "sweep", /*client_hits=*/false);
  const auto& info = session->model();
  for (int round = 0; round < 2; ++round) {
    for (uint32_t layer : info.moe_layers()) {
      for (uint32_t e = 0; e < info.n_expert(); ++e) {
        const uint32_t one[] = {e};
        auto lease = session->Acquire(layer, one, absl::Seconds(30));
        if (!lease.ok()) Die(absl::StrCat("sweep layer ", layer, ": ", lease.status().ToString()));
        Check(session->Release(*lease).ok(), "release");
      }
    }
  }
  // The probe itself: a hit means the bundle stayed resident through both sweeps.
  int resident = 0, probed = 0;
  for (uint32_t layer : PinnedLayers(info)) {
    auto lease = session->Acquire(layer, kPinnedExperts);
    if (!lease.ok()) Die(lease.status().ToString());
    for (const auto& slot : lease->slots) resident += slot.hit ? 1 : 0;
    probed += static_cast<int>(lease->slots.size());
    Check(session->Release(*lease).ok(), "release");
  }
  std::printf("pinned bundles resident %d of %d\n", resident, probed);
  return 0;
}

int Load(const std::string& addr, const std::string& gguf) {
  Oracle oracle(gguf);
  auto client = Connect(addr);
  auto session = Open(*client, "load");
  std::mt19937 rng(getpid());
  const auto& info = session->model();
  uint64_t acquires = 0;
  std::printf("loading\n");
  std::fflush(stdout);
  for (;;) {
    const uint32_t layer = info.moe_layers(static_cast<int>(rng() % info.moe_layers_size()));
    auto lease = session->Acquire(layer, RandomExperts(rng, info.n_expert(), 2),
                                  absl::Seconds(30));
    if (!lease.ok()) {
      // Draining: the daemon refuses new acquires with UNAVAILABLE, or the stream ends (also
      // UNAVAILABLE). That is the only expected way for this loop to stop, and only after it
      // did real work; a deadline means the daemon stopped answering.
      if (lease.status().code() != absl::StatusCode::kUnavailable) {
        Die(absl::StrCat("load: acquire ", acquires + 1, ": ", lease.status().ToString()));
      }
      Check(acquires > 0, "load: stopped before a single acquire");
      std::printf("load: stopped after %llu acquires: %s\n",
                  static_cast<unsigned long long>(acquires),
                  std::string(lease.status().message()).c_str());
      return 0;
    }
    VerifyLease(oracle, *lease);
    ++acquires;
    if (acquires == 20) {
      std::printf("loaded 20\n");
      std::fflush(stdout);
    }
    (void)session->Release(*lease);
  }
}

// The next answer to a raw request: waits for an async error with `seq`, or returns nullopt
// after a short wait (no answer = success for Release).
std::optional<expertd::v1::RequestError> ErrorFor(Session& s, uint64_t seq) {
  for (int i = 0; i < 100; ++i) {
    for (auto& e : s.TakeAsyncErrors()) {
      if (e.seq() == seq) return e;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return std::nullopt;
}

void ExpectCode(const absl::Status& st, absl::StatusCode code, std::string_view needle,
                const std::string& what) {
  if (st.code() != code || !absl::StrContains(st.message(), absl::string_view(needle.data(), needle.size()))) {
    Die(absl::StrCat(what, ": expected ", absl::StatusCodeToString(code), " mentioning '",
                     absl::string_view(needle.data(), needle.size()), "', got ", st.ToString()));
  }
  std::printf("ok: %s -> %s\n", what.c_str(), st.ToString().c_str());
}

int Bad(const std::string& addr) {
  auto client = Connect(addr);
  auto before = client->GetStats("demo");
  Check(before.ok(), "GetStats");

  // Unknown model.
  expertd::client::SessionOptions unknown;
  unknown.model = "no-such-model";
  auto none = client->OpenSession(unknown);
  ExpectCode(none.status(), absl::StatusCode::kNotFound, "no-such-model", "open unknown model");

  auto session = Open(*client, "bad");
  const auto& info = session->model();
  const uint32_t layer0 = info.moe_layers(0);
  // Layer that is not an MoE layer, expert out of range, empty and oversized acquires.
  const uint32_t e01[] = {0, 1};
  ExpectCode(session->Acquire(100000, e01).status(), absl::StatusCode::kInvalidArgument,
             "not an MoE layer", "acquire unknown layer");
  const uint32_t far[] = {0, info.n_expert()};
  ExpectCode(session->Acquire(layer0, far).status(), absl::StatusCode::kInvalidArgument,
             "out of range", "acquire expert out of range");
  ExpectCode(session->Acquire(layer0, {}).status(), absl::StatusCode::kInvalidArgument,
             "no experts", "acquire no experts");
  std::vector<uint32_t> many(65, 0);
  ExpectCode(session->Acquire(layer0, many).status(), absl::StatusCode::kInvalidArgument,
             "at most", "acquire more experts than allowed per acquire");

  // Release of a lease that was never granted.
  expertd::v1::SessionRequest r;
  r.mutable_release()->set_seq(777);
  r.mutable_release()->set_lease(424242);
  Check(session->SendRaw(r).ok(), "send release");
  auto err = ErrorFor(*session, 777);
  Check(err.has_value(), "no answer to the release of an unknown lease");
  ExpectCode(absl::Status(static_cast<absl::StatusCode>(err->code()), err->message()),
             absl::StatusCode::kNotFound, "not held", "release unknown lease");

  // Release before signalling done: refused, the lease stays. Checked on a slot that this
  // acquire filled (a miss): a resident slot whose current generation another client already
  // signalled done for passes the check, rightly. The test's config keeps the pool smaller than
  // the model, so some expert is not resident.
  std::optional<Lease> fresh;
  for (int i = 0; i < info.moe_layers_size() && !fresh.has_value(); ++i) {
    for (uint32_t e = 0; e < info.n_expert() && !fresh.has_value(); ++e) {
      const uint32_t one[] = {e};
      auto l = session->Acquire(info.moe_layers(i), one);
      Check(l.ok(), "acquire while looking for a non-resident expert");
      if (!l->slots[0].hit) {
        fresh = *std::move(l);
      } else {
        Check(session->Release(*l).ok(), "release of a resident expert");
      }
    }
  }
  Check(fresh.has_value(),
        "every expert was resident: no slot to check release-before-done on (the pool must be "
        "smaller than the model)");
  r.mutable_release()->set_seq(778);
  r.mutable_release()->set_lease(fresh->id);
  Check(session->SendRaw(r).ok(), "send early release");
  err = ErrorFor(*session, 778);
  Check(err.has_value(), "release before done was accepted");
  ExpectCode(absl::Status(static_cast<absl::StatusCode>(err->code()), err->message()),
             absl::StatusCode::kFailedPrecondition, "signal done", "release before done");
  Check(session->Release(*fresh).ok(), "proper release after the refused one");

  // A second Session stream for the same session id is refused; the first keeps working.
  {
    auto stub = expertd::v1::Expertd::NewStub(
        grpc::CreateChannel(expertd::client::ChannelTarget(addr), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    auto stream = stub->Session(&ctx);
    expertd::v1::SessionRequest attach;
    attach.mutable_attach()->set_session_id(session->info().session_id());
    stream->Write(attach);
    expertd::v1::SessionResponse resp;
    Check(!stream->Read(&resp), "second stream got an answer");
    grpc::Status st = stream->Finish();
    ExpectCode(absl::Status(static_cast<absl::StatusCode>(st.error_code()), st.error_message()),
               absl::StatusCode::kFailedPrecondition, "already has a Session stream",
               "second stream for one session");
    // Unknown session id.
    grpc::ClientContext ctx2;
    auto stream2 = stub->Session(&ctx2);
    attach.mutable_attach()->set_session_id("00000000000000000000000000000000");
    stream2->Write(attach);
    Check(!stream2->Read(&resp), "unknown session got an answer");
    st = stream2->Finish();
    ExpectCode(absl::Status(static_cast<absl::StatusCode>(st.error_code()), st.error_message()),
               absl::StatusCode::kNotFound, "unknown session", "attach unknown session");
  }
  // Messages at the size limit (limits.max_message_bytes, 4 MiB): just under it, an acquire
  // is refused by the acquire rules and the stream goes on; just over it, gRPC refuses the
  // message and the stream ends with RESOURCE_EXHAUSTED.
  {
    auto stub = expertd::v1::Expertd::NewStub(
        grpc::CreateChannel(expertd::client::ChannelTarget(addr), grpc::InsecureChannelCredentials()));
    grpc::ClientContext octx;
    expertd::v1::OpenSessionRequest open;
    open.set_model("demo");
    open.set_client_name("size-limit");
    open.set_transport(expertd::v1::TRANSPORT_STREAM);
    expertd::v1::OpenSessionResponse opened;
    Check(stub->OpenSession(&octx, open, &opened).ok(), "open for the size-limit checks");
    grpc::ClientContext ctx;
    auto stream = stub->Session(&ctx);
    expertd::v1::SessionRequest attach;
    attach.mutable_attach()->set_session_id(opened.session_id());
    expertd::v1::SessionResponse resp;
    Check(stream->Write(attach) && stream->Read(&resp) && resp.has_attached(), "attach");
    const auto acquire_of = [&](uint64_t seq, size_t bytes) {  // `bytes` serialized, or just over
      expertd::v1::SessionRequest req;
      req.mutable_acquire()->set_seq(seq);
      req.mutable_acquire()->set_layer(layer0);
      auto* experts = req.mutable_acquire()->mutable_experts();
      experts->Resize(static_cast<int>(bytes - 64), 1);  // one byte each, packed
      while (req.ByteSizeLong() < bytes) experts->Add(1);
      return req;
    };
    const size_t limit = size_t{4} << 20;
    Check(stream->Write(acquire_of(1, limit - 1024)) && stream->Read(&resp) && resp.has_error(),
          "an answer to an acquire just under the size limit");
    ExpectCode(absl::Status(static_cast<absl::StatusCode>(resp.error().code()),
                            resp.error().message()),
               absl::StatusCode::kInvalidArgument, "per acquire", "acquire just under 4 MiB");
    stream->Write(acquire_of(2, limit + 1024));
    while (stream->Read(&resp)) {
    }
    grpc::Status st = stream->Finish();
    ExpectCode(absl::Status(static_cast<absl::StatusCode>(st.error_code()), st.error_message()),
               absl::StatusCode::kResourceExhausted, "", "a message over 4 MiB");
  }

  auto again = session->Acquire(layer0, e01);
  Check(again.ok(), "the session works after the refused second stream");
  Check(session->Release(*again).ok(), "release");

  // Per-session lease cap: acquire until RESOURCE_EXHAUSTED (limits.max_leases_per_session is
  // set small by the test's config).
  std::vector<Lease> held;
  absl::Status capped;
  for (int i = 0; i < 64; ++i) {
    const uint32_t one[] = {static_cast<uint32_t>(i % info.n_expert())};
    auto l = session->Acquire(info.moe_layers(i % info.moe_layers_size()), one);
    if (!l.ok()) {
      capped = l.status();
      break;
    }
    held.push_back(*std::move(l));
  }
  ExpectCode(capped, absl::StatusCode::kResourceExhausted, "per-session limit",
             "acquire beyond the per-session lease cap");
  for (const Lease& l : held) Check(session->Release(l).ok(), "release held");
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  Check(session->TakeAsyncErrors().empty(), "errors for valid releases");

  // State unchanged: nothing leased any more, counters only moved by the valid acquires.
  auto after = client->GetStats("demo");
  Check(after.ok(), "GetStats after");
  for (const auto& s : after->models(0).sessions()) {
    Check(s.leases_held() == 0, absl::StrCat("session ", s.session(), " still holds leases"));
  }
  Check(after->models(0).fills_failed() == before->models(0).fills_failed(), "fills failed");
  std::printf("bad requests: all refused as expected\n");
  return 0;
}

// Prints "sessions S leases L" from GetStats (all models).
int Leases(const std::string& addr) {
  auto client = Connect(addr);
  auto stats = client->GetStats();
  if (!stats.ok()) Die(stats.status().ToString());
  uint64_t leases = 0;
  for (const auto& m : stats->models()) {
    for (const auto& s : m.sessions()) leases += s.leases_held();
  }
  std::printf("sessions %u leases %llu outstanding %llu\n", stats->sessions(),
              static_cast<unsigned long long>(leases),
              static_cast<unsigned long long>(stats->leases_outstanding()));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "verify" && argc == 6) return Verify(argv[2], argv[3], std::atof(argv[4]), std::atoi(argv[5]));
  if (mode == "hold" && argc == 4) return Hold(argv[2], std::atoi(argv[3]));
  if (mode == "load" && argc == 4) return Load(argv[2], argv[3]);
  if (mode == "bad" && argc == 3) return Bad(argv[2]);
  if (mode == "leases" && argc == 3) return Leases(argv[2]);
  if (mode == "pin" && argc == 3) return Pin(argv[2]);
  if (mode == "sweep" && argc == 3) return Sweep(argv[2]);
  std::fprintf(stderr, "usage: session_client verify|hold|load|bad|leases|pin|sweep ADDR ...\n");
  return 2;
}
