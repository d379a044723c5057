// A client process for daemon_lane.sh: the session request lane through real processes. Modes:
//   grants ADDR GGUF lane|stream N SEED   N acquires of a seeded sequence on one session of that
//                                         transport, every slot checked against the GGUF (plain
//                                         pread); prints one line per grant: layer, then
//                                         expert/class/slot/generation/hit per slot
//   garbage ADDR                          opens a lane session by hand (raw gRPC), writes garbage
//                                         into its lane; exit 0 when the daemon ends the stream
//                                         with INVALID_ARGUMENT naming the lane within 5 s
//   stuff ADDR N                          a raw lane session with N acquires written and never
//                                         read; prints "stuffed N", then sleeps (kill -9 me)
//   idle ADDR N SECONDS                   N lane sessions, one acquire and release each, then
//                                         idle; prints "idle N"
//   rate ADDR SECONDS [THREADS]           acquire/release cycles on one session from THREADS
//                                         threads (default 1) for SECONDS; prints "cycles C"
//   deaf ADDR N                           a raw stream session (TRANSPORT_STREAM) that sends N
//                                         acquires of a layer that does not exist without
//                                         reading an answer; then reads: exit 0 when the daemon
//                                         cancelled the stream with fewer than N answers sent
//   survive ADDR GGUF                     holds one verified lease, prints "holding", then
//                                         acquires and releases until a call fails (the daemon
//                                         was killed): prints "failed AT CODE" (AT: realtime
//                                         seconds); checks the held lease's bytes are still
//                                         readable and right; then waits up to 60 s for a
//                                         daemon at ADDR again and verifies a lease of a new
//                                         session in this same process; prints "recovered".
//                                         Once each client is closed, none of its shared-memory
//                                         mappings and no descriptor of it is left
//   survive-c ADDR                        the same through the C API (expertd_client.h)
//   isolate ADDR DAEMON_PID               as a user other than the daemon's: arenas and fence
//                                         tables map read-only, never read-write (by name, by
//                                         the passed descriptor, or reopened through /proc);
//                                         its done words and lane come only as passed
//                                         descriptors; nothing opens through /proc/DAEMON_PID;
//                                         another process is refused its descriptors;
//                                         prints "isolated: ..."
// Every check prints what failed and exits 1.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "catalog/catalog.h"
#include "client.h"
#include "expertd_client.h"
#include "device/host/handle_passing.h"
#include "device/host/host_device.h"
#include "expertd/v1/service.grpc.pb.h"
#include "format/gguf_model.h"
#include "lane/lane.h"
#include "util/file.h"
#include "util/hash.h"

namespace {

using expertd::client::Client;
using expertd::client::Session;
using expertd::client::SessionOptions;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "lane_client: FAIL: %s\n", what.c_str());
  std::exit(1);
}

std::unique_ptr<Client> Connect(const std::string& addr) {
  expertd::client::ConnectOptions o;
  o.address = addr;
  auto c = Client::Connect(o);
  if (!c.ok()) Die(std::string(c.status().message()));
  return *std::move(c);
}

std::unique_ptr<Session> Open(Client& c, SessionOptions::Transport transport,
                              const std::string& name) {
  SessionOptions o;
  o.model = "demo";
  o.client_name = name;
  o.transport = transport;
  auto s = c.OpenSession(o);
  if (!s.ok()) Die(absl::StrCat("OpenSession: ", s.status().ToString()));
  return *std::move(s);
}

// The served model's file, read with plain pread: the oracle every granted slot is checked with.
class ModelFile {
 public:
  explicit ModelFile(const std::string& gguf) {
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
  // Every projection of every slot of `lease` against the file; dies on a difference.
  void Verify(const expertd::client::Lease& lease) {
    for (const auto& s : lease.slots) {
      for (size_t p = 0; p < s.projections.size(); ++p) {
        auto loc = catalog_->Locate(lease.layer, s.expert, p);
        if (!loc.ok()) Die(loc.status().ToString());
        want_.resize(loc->bytes);
        if (auto st = files_[loc->pack]->ReadAt(loc->offset, want_); !st.ok()) Die(st.ToString());
        if (expertd::Xxh3(s.projections[p].first(loc->bytes)) != expertd::Xxh3(want_)) {
          Die(absl::StrCat("layer ", lease.layer, " expert ", s.expert, " projection ", p,
                           ": bytes differ from the model file"));
        }
      }
    }
  }

 private:
  std::unique_ptr<expertd::ModelCatalog> catalog_;
  std::vector<std::unique_ptr<expertd::ReadFile>> files_;
  std::vector<uint8_t> want_;
};

int Grants(const std::string& addr, const std::string& gguf, const std::string& transport,
           int n, uint32_t seed) {
  ModelFile file(gguf);
  auto client = Connect(addr);
  auto session = Open(*client,
                      transport == "lane" ? SessionOptions::Transport::kLane
                                          : SessionOptions::Transport::kStream,
                      "grants");
  if (session->transport() != transport) Die("transport " + std::string(session->transport()));
  std::mt19937 rng(seed);
  const auto& info = session->model();
  for (int i = 0; i < n; ++i) {
    const uint32_t layer = info.moe_layers(static_cast<int>(rng() % info.moe_layers_size()));
    std::vector<uint32_t> experts = {static_cast<uint32_t>(rng() % info.n_expert())};
    do {
      experts.resize(1);
      experts.push_back(static_cast<uint32_t>(rng() % info.n_expert()));
    } while (experts[1] == experts[0]);
    auto lease = session->Acquire(layer, experts);
    if (!lease.ok()) Die(absl::StrCat("acquire: ", lease.status().ToString()));
    file.Verify(*lease);
    std::string line = absl::StrCat(layer);
    for (const auto& s : lease->slots) {
      absl::StrAppend(&line, " ", s.expert, "/", s.slot_class, "/", s.slot, "/", s.generation, "/",
                      s.hit ? 1 : 0);
    }
    std::printf("%s\n", line.c_str());
    if (auto st = session->Release(*lease); !st.ok()) Die(st.ToString());
  }
  session->Close();
  if (!session->TakeAsyncErrors().empty()) Die("a release was refused");
  return 0;
}

// A lane session opened by hand: the raw stream and this process's mapping of the lane.
struct RawLane {
  std::unique_ptr<expertd::v1::Expertd::Stub> stub;
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReaderWriter<expertd::v1::SessionRequest,
                                           expertd::v1::SessionResponse>> stream;
  expertd::ShmMapping map;
  std::unique_ptr<expertd::lane::LaneClientEnd> end;
  uint8_t* base = nullptr;
  expertd::lane::LaneGeometry geometry;
};

std::unique_ptr<RawLane> OpenRaw(const std::string& addr) {
  auto r = std::make_unique<RawLane>();
  r->stub = expertd::v1::Expertd::NewStub(grpc::CreateChannel(
      expertd::client::ChannelTarget(addr), grpc::InsecureChannelCredentials()));
  grpc::ClientContext open_ctx;
  expertd::v1::OpenSessionRequest req;
  req.set_model("demo");
  req.set_client_name("raw-lane");
  req.set_transport(expertd::v1::TRANSPORT_LANE);
  expertd::v1::OpenSessionResponse resp;
  grpc::Status st = r->stub->OpenSession(&open_ctx, req, &resp);
  if (!st.ok()) Die(absl::StrCat("OpenSession: ", st.error_message()));
  if (!resp.has_lane()) Die("no lane offered");
  const auto& m = resp.lane().memory();
  // The lane is a memfd: its descriptor comes over the handle socket, to this process only.
  auto passed = expertd::FetchDescriptors(resp.handle_socket(), resp.session_id(),
                                          absl::Seconds(5));
  if (!passed.ok()) Die(absl::StrCat("handle socket: ", passed.status().ToString()));
  expertd::SharedHandle h;
  h.passed_fd = passed->ForPassed(m.passed());
  if (h.passed_fd < 0) Die("the lane was not passed as a descriptor");
  h.kind = expertd::SharedHandle::Kind::kHostShm;
  h.shm_name = m.shm_name();
  h.fd = m.fd();
  h.owner_pid = m.owner_pid();
  h.dev = m.dev();
  h.inode = m.inode();
  auto map = expertd::MapSharedSegment(h, resp.lane().segment_bytes());
  if (!map.ok()) Die(map.status().ToString());
  r->map = *std::move(map);
  r->base = r->map.data();
  r->geometry.request_bytes = resp.lane().request_bytes();
  r->geometry.response_bytes = resp.lane().response_bytes();
  r->geometry.pin_words = resp.lane().pin_words();
  auto end = expertd::lane::LaneClientEnd::Attach(r->base, r->map.bytes(), r->geometry);
  if (!end.ok()) Die(end.status().ToString());
  r->end = std::make_unique<expertd::lane::LaneClientEnd>(*std::move(end));
  r->stream = r->stub->Session(&r->ctx);
  expertd::v1::SessionRequest attach;
  attach.mutable_attach()->set_session_id(resp.session_id());
  expertd::v1::SessionResponse reply;
  if (!r->stream->Write(attach) || !r->stream->Read(&reply) || !reply.has_attached()) {
    Die("attach");
  }
  return r;
}

int Garbage(const std::string& addr) {
  auto r = OpenRaw(addr);
  // A record claiming 2 GiB, published by moving the head.
  std::vector<uint8_t> junk(64, 0x7f);
  if (!r->end->Write(junk)) Die("the lane was full");
  std::thread watchdog([] {
    std::this_thread::sleep_for(std::chrono::seconds(5));
    Die("the daemon did not end the stream within 5 s");
  });
  watchdog.detach();
  expertd::v1::SessionResponse reply;
  while (r->stream->Read(&reply)) {
  }
  const grpc::Status st = r->stream->Finish();
  if (st.error_code() != grpc::StatusCode::INVALID_ARGUMENT ||
      st.error_message().find("lane") == std::string::npos) {
    Die(absl::StrCat("stream ended with ", st.error_code(), ": ", st.error_message()));
  }
  if (r->end->state() != expertd::lane::kStateFailed) Die("the lane is not marked failed");
  std::printf("failed: %s\n", st.error_message().c_str());
  return 0;
}

int Stuff(const std::string& addr, int n) {
  auto r = OpenRaw(addr);
  for (int i = 1; i <= n; ++i) {
    std::vector<uint8_t> rec;
    const uint32_t experts[] = {static_cast<uint32_t>(i % 8), static_cast<uint32_t>((i + 1) % 8)};
    if (!expertd::lane::EncodeAcquire(i, static_cast<uint32_t>(i % 4), experts, &rec).ok() ||
        !r->end->Write(rec)) {
      Die("writing acquires");
    }
  }
  std::printf("stuffed %d\n", n);
  std::fflush(stdout);
  for (;;) pause();
}

int Idle(const std::string& addr, int n, double seconds) {
  auto client = Connect(addr);
  std::vector<std::unique_ptr<Session>> sessions;
  for (int i = 0; i < n; ++i) {
    sessions.push_back(Open(*client, SessionOptions::Transport::kLane, absl::StrCat("idle-", i)));
    const uint32_t experts[] = {static_cast<uint32_t>(i % 8)};
    auto lease = sessions.back()->Acquire(0, experts);
    if (!lease.ok()) Die(lease.status().ToString());
    if (auto st = sessions.back()->Release(*lease); !st.ok()) Die(st.ToString());
  }
  std::printf("idle %d\n", n);
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)));
  return 0;
}

int Rate(const std::string& addr, double seconds, int threads) {
  auto client = Connect(addr);
  auto session = Open(*client, SessionOptions::Transport::kAuto, "rate");
  std::atomic<uint64_t> cycles{0};
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::mt19937 rng(t + 1);
      const auto& info = session->model();
      while (std::chrono::steady_clock::now() < deadline) {
        const uint32_t layer = info.moe_layers(static_cast<int>(rng() % info.moe_layers_size()));
        const uint32_t experts[] = {static_cast<uint32_t>(rng() % info.n_expert())};
        auto lease = session->Acquire(layer, experts);
        if (!lease.ok()) Die(lease.status().ToString());
        if (auto st = session->Release(*lease); !st.ok()) Die(st.ToString());
        cycles.fetch_add(1);
      }
    });
  }
  for (std::thread& t : pool) t.join();
  std::printf("cycles %llu\n", static_cast<unsigned long long>(cycles.load()));
  return 0;
}

int Deaf(const std::string& addr, int n) {
  auto stub = expertd::v1::Expertd::NewStub(grpc::CreateChannel(
      expertd::client::ChannelTarget(addr), grpc::InsecureChannelCredentials()));
  grpc::ClientContext open_ctx;
  expertd::v1::OpenSessionRequest req;
  req.set_model("demo");
  req.set_client_name("deaf");
  req.set_transport(expertd::v1::TRANSPORT_STREAM);
  expertd::v1::OpenSessionResponse resp;
  if (grpc::Status st = stub->OpenSession(&open_ctx, req, &resp); !st.ok()) {
    Die(absl::StrCat("OpenSession: ", st.error_message()));
  }
  if (resp.has_lane()) Die("a lane although the stream was asked for");
  grpc::ClientContext ctx;
  auto stream = stub->Session(&ctx);
  expertd::v1::SessionRequest r;
  r.mutable_attach()->set_session_id(resp.session_id());
  if (!stream->Write(r)) Die("attach");
  int sent = 0;
  for (; sent < n; ++sent) {
    expertd::v1::SessionRequest a;
    a.mutable_acquire()->set_seq(sent + 1);
    a.mutable_acquire()->set_layer(100000);
    a.mutable_acquire()->add_experts(0);
    if (!stream->Write(a)) break;  // the daemon gave up on us
  }
  stream->WritesDone();
  expertd::v1::SessionResponse reply;
  int answers = 0;
  while (stream->Read(&reply)) answers += reply.has_error() ? 1 : 0;
  const grpc::Status st = stream->Finish();
  std::printf("sent %d, answers %d, stream ended with %d: %s\n", sent, answers,
              static_cast<int>(st.error_code()), st.error_message().c_str());
  if (st.ok() || answers >= n) Die("the daemon answered everything: nothing was bounded");
  return 0;
}

// Mappings of the daemon's shared-memory objects in this process, and open descriptors.
int ShmMappings() {
  std::ifstream maps("/proc/self/maps");
  int n = 0;
  for (std::string line; std::getline(maps, line);) {
    n += line.find("/dev/shm/expertd-") != std::string::npos ||
         line.find("/memfd:expertd") != std::string::npos;
  }
  return n;
}
// Descriptors a session could leave: sockets, shared-memory objects, memfds, pidfds. (gRPC's
// pollers, epoll and eventfd, are its own and grow with its channel history.)
int OpenFds(std::string* list = nullptr) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const std::string target = std::filesystem::read_symlink(e.path(), ec).string();
    if (target.rfind("socket:", 0) == 0 || target.find("/dev/shm/") != std::string::npos ||
        target.find("memfd:") != std::string::npos || target.find("pidfd") != std::string::npos) {
      ++n;
      if (list != nullptr) absl::StrAppend(list, " ", e.path().filename().string(), "->", target);
    }
  }
  return n;
}
// Once a client and its sessions are closed: nothing of them is left (`fds` open before).
void ExpectNothingLeft(int fds, const char* when) {
  if (const int m = ShmMappings(); m != 0) {
    Die(absl::StrCat(when, ": ", m, " mappings of the daemon's shared memory are left"));
  }
  std::string open;
  if (const int now = OpenFds(&open); now > fds) {
    Die(absl::StrCat(when, ": ", now, " socket, shared-memory or pidfd descriptors open, ", fds,
                     " before the client:", open));
  }
}

int Survive(const std::string& addr, const std::string& gguf) {
  ModelFile file(gguf);
  Connect(addr).reset();  // gRPC's own process-wide descriptors exist from the first channel on
  const int fds = OpenFds();
  auto client = Connect(addr);
  auto session = Open(*client, SessionOptions::Transport::kAuto, "survive");
  const uint32_t held_experts[] = {0, 1};
  auto held = session->Acquire(0, held_experts);
  if (!held.ok()) Die(held.status().ToString());
  file.Verify(*held);
  std::printf("holding\n");
  std::fflush(stdout);
  absl::Status failure;
  for (uint32_t i = 0; failure.ok(); ++i) {
    const uint32_t experts[] = {2 + i % 6};
    auto lease = session->Acquire(1 + i % 4, experts, absl::Seconds(5));
    if (!lease.ok()) {
      failure = lease.status();
      break;
    }
    failure = session->Release(*lease);
    absl::SleepFor(absl::Milliseconds(2));
  }
  std::printf("failed %.3f %d %s\n", absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()),
              static_cast<int>(failure.code()), std::string(failure.message()).c_str());
  std::fflush(stdout);
  if (failure.code() != absl::StatusCode::kUnavailable) Die("the failure is not UNAVAILABLE");
  file.Verify(*held);  // the mapping outlives the daemon: no SIGBUS
  if (ShmMappings() == 0) Die("no mapping of the daemon's shared memory seen: the check is blind");
  held = absl::CancelledError("dropped");
  session.reset();
  client.reset();
  ExpectNothingLeft(fds, "the dead daemon's session closed");
  // A new daemon at the same address; a new session in this process.
  std::unique_ptr<Client> again;
  for (int tries = 0; tries < 600 && !again; ++tries) {
    expertd::client::ConnectOptions o;
    o.address = addr;
    o.connect_timeout = absl::Milliseconds(100);
    auto c = Client::Connect(o);
    if (c.ok() && (*c)->Health("demo").value_or(false)) again = *std::move(c);
  }
  if (!again) Die("no daemon came back within 60 s");
  auto fresh = Open(*again, SessionOptions::Transport::kAuto, "survive-again");
  auto lease = fresh->Acquire(0, held_experts);
  if (!lease.ok()) Die(lease.status().ToString());
  file.Verify(*lease);
  if (auto st = fresh->Release(*lease); !st.ok()) Die(st.ToString());
  lease = absl::CancelledError("dropped");
  fresh.reset();
  again.reset();
  ExpectNothingLeft(fds, "the new daemon's session closed");
  std::printf("recovered\n");
  return 0;
}

// The C API's part: the same steps as Survive (bytes checked by a checksum of the held lease
// taken before and after the daemon died).
int SurviveC(const std::string& addr) {
  const auto check = [](EXPERTD_Error* e, const char* what) {
    if (e == nullptr) return;
    const std::string m = absl::StrCat(what, ": ", EXPERTD_ErrorMessage(e));
    EXPERTD_ErrorDelete(e);
    Die(m);
  };
  EXPERTD_Client* client = nullptr;
  check(EXPERTD_ClientNew(&client, addr.c_str(), nullptr), "connect");
  check(EXPERTD_ClientDelete(client), "close");  // gRPC's process-wide descriptors, as above
  const int fds = OpenFds();
  check(EXPERTD_ClientNew(&client, addr.c_str(), nullptr), "connect");
  EXPERTD_Session* session = nullptr;
  check(EXPERTD_SessionNew(&session, client, "demo", "survive-c"), "open");
  const uint32_t held_experts[] = {0, 1};
  EXPERTD_Lease* held = nullptr;
  check(EXPERTD_SessionAcquire(session, 0, held_experts, 2, 30000, &held), "acquire");
  const auto sum = [&] {
    uint64_t h = 0;
    const void* data = nullptr;
    uint64_t bytes = 0;
    check(EXPERTD_LeaseProjection(held, 1, 0, &data, &bytes), "projection");
    h = expertd::Xxh3(std::span<const uint8_t>(static_cast<const uint8_t*>(data), bytes));
    return h;
  };
  const uint64_t before = sum();
  std::printf("holding\n");
  std::fflush(stdout);
  EXPERTD_Error* failure = nullptr;
  for (uint32_t i = 0; failure == nullptr; ++i) {
    const uint32_t experts[] = {2 + i % 6};
    EXPERTD_Lease* lease = nullptr;
    failure = EXPERTD_SessionAcquire(session, 1 + i % 4, experts, 1, 5000, &lease);
    if (failure == nullptr) failure = EXPERTD_SessionRelease(session, lease);
    absl::SleepFor(absl::Milliseconds(2));
  }
  const int code = EXPERTD_ErrorCode(failure);
  std::printf("failed %.3f %d %s\n", absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()),
              code, EXPERTD_ErrorMessage(failure));
  std::fflush(stdout);
  EXPERTD_ErrorDelete(failure);
  if (code != EXPERTD_ERROR_UNAVAILABLE) Die("the failure is not UNAVAILABLE");
  if (sum() != before) Die("the held lease's bytes changed after the daemon died");
  if (ShmMappings() == 0) Die("no mapping of the daemon's shared memory seen: the check is blind");
  EXPERTD_ErrorDelete(EXPERTD_LeaseDelete(held));
  check(EXPERTD_SessionDelete(session), "close the session");
  check(EXPERTD_ClientDelete(client), "close the client");
  ExpectNothingLeft(fds, "the dead daemon's session closed (C)");
  session = nullptr;
  for (int tries = 0; tries < 600 && session == nullptr; ++tries) {
    EXPERTD_Client* c = nullptr;
    if (EXPERTD_Error* e = EXPERTD_ClientNewWithTimeout(&c, addr.c_str(), nullptr, 100)) {
      EXPERTD_ErrorDelete(e);
      continue;
    }
    if (EXPERTD_Error* e = EXPERTD_SessionNew(&session, c, "demo", "survive-c-again")) {
      EXPERTD_ErrorDelete(e);
      session = nullptr;
      check(EXPERTD_ClientDelete(c), "close a client");
      absl::SleepFor(absl::Milliseconds(100));
      continue;
    }
    client = c;
  }
  if (session == nullptr) Die("no daemon came back within 60 s");
  EXPERTD_Lease* lease = nullptr;
  check(EXPERTD_SessionAcquire(session, 0, held_experts, 2, 30000, &lease), "acquire again");
  check(EXPERTD_SessionRelease(session, lease), "release again");
  check(EXPERTD_SessionDelete(session), "close again");
  check(EXPERTD_ClientDelete(client), "close the client again");
  ExpectNothingLeft(fds, "the new daemon's session closed (C)");
  std::printf("recovered\n");
  return 0;
}

}  // namespace

// Run as another user than the daemon's, in its allowed group: what one client can reach of
// the shared objects. The arenas and fence tables by name read-only, never read-write; its own
// done words and lane only as the descriptors passed to it; no descriptor of the daemon
// through /proc; and no other process may fetch its descriptors.
int Isolate(const std::string& addr, int daemon_pid) {
  if (getuid() == 0) Die("isolate must run as a user other than root");
  auto stub = expertd::v1::Expertd::NewStub(grpc::CreateChannel(
      expertd::client::ChannelTarget(addr), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  expertd::v1::OpenSessionRequest req;
  req.set_model("demo");
  req.set_client_name("isolate");
  req.set_transport(expertd::v1::TRANSPORT_LANE);
  expertd::v1::OpenSessionResponse resp;
  if (grpc::Status st = stub->OpenSession(&ctx, req, &resp); !st.ok()) {
    Die(absl::StrCat("OpenSession: ", st.error_message()));
  }
  // Another process (a child: another pid, the same user) is refused the descriptors.
  const pid_t child = fork();
  if (child == 0) {
    auto other = expertd::FetchDescriptors(resp.handle_socket(), resp.session_id(),
                                           absl::Seconds(5));
    _exit(!other.ok() && other.status().code() == absl::StatusCode::kPermissionDenied ? 0 : 1);
  }
  int status = 0;
  if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    Die("another process fetched this session's descriptors");
  }
  auto passed = expertd::FetchDescriptors(resp.handle_socket(), resp.session_id(),
                                          absl::Seconds(5));
  if (!passed.ok()) Die(absl::StrCat("own descriptors: ", passed.status().ToString()));
  const auto handle = [&](const expertd::v1::SharedMemory& m) {
    expertd::SharedHandle h;
    h.shm_name = m.shm_name();
    h.passed_fd = passed->ForPassed(m.passed());
    h.dev = m.dev();
    h.inode = m.inode();
    return h;
  };
  // Nothing reaches the daemon's own descriptors.
  const auto not_through_proc = [&](const expertd::v1::SharedMemory& m, const char* what) {
    const std::string proc = absl::StrCat("/proc/", daemon_pid, "/fd/", m.fd());
    const int fd = open(proc.c_str(), O_RDONLY);
    if (fd >= 0 || errno != EACCES) Die(absl::StrCat(what, " is reachable as ", proc));
  };
  int shared = 0;
  // Arenas and fence tables: readable, never writable, whichever way they come.
  const auto shared_read_only = [&](const expertd::v1::SharedMemory& m, uint64_t bytes,
                                    const char* what) {
    ++shared;
    if (!m.shm_name().empty()) {
      const int rw = shm_open(m.shm_name().c_str(), O_RDWR, 0);
      if (rw >= 0 || errno != EACCES) Die(absl::StrCat(what, " ", m.shm_name(), " opens read-write"));
      const int ro = shm_open(m.shm_name().c_str(), O_RDONLY, 0);
      if (ro < 0) Die(absl::StrCat(what, " ", m.shm_name(), " does not open read-only"));
      close(ro);
      return;
    }
    not_through_proc(m, what);
    const int fd = passed->ForPassed(m.passed());
    if (fd < 0) Die(absl::StrCat(what, " has neither a name nor a passed descriptor"));
    void* w = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (w != MAP_FAILED) Die(absl::StrCat(what, ": its passed descriptor maps writable"));
    void* r = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
    if (r == MAP_FAILED) Die(absl::StrCat(what, ": its passed descriptor does not map read-only"));
    munmap(r, bytes);
    const std::string self = absl::StrCat("/proc/self/fd/", fd);  // reopened for writing
    const int again = open(self.c_str(), O_RDWR);
    if (again >= 0) {
      void* w2 = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, again, 0);
      close(again);
      if (w2 != MAP_FAILED) Die(absl::StrCat(what, ": reopened through /proc, it maps writable"));
    }
  };
  // The session's own objects: only as passed descriptors, and writable through them.
  const auto own_object = [&](const expertd::v1::SharedMemory& m, uint64_t bytes,
                              const char* what) {
    if (!m.shm_name().empty() || m.passed() == 0) {
      Die(absl::StrCat(what, " is not passed as a descriptor (name '", m.shm_name(), "')"));
    }
    not_through_proc(m, what);
    auto mapped = expertd::MapSharedSegment(handle(m), bytes);
    if (!mapped.ok()) Die(absl::StrCat(what, ": ", mapped.status().ToString()));
  };
  for (const auto& c : resp.slot_classes()) {
    for (const auto& a : c.arenas()) shared_read_only(a.memory(), a.reserved_bytes(), "arena");
    shared_read_only(c.fences().memory(), c.fences().segment_bytes(), "fence table");
    if (!c.fences().has_session_done()) Die("no session done words");
    own_object(c.fences().session_done(), c.fences().segment_bytes() - c.fences().done_offset(),
               "the session's done words");
  }
  if (!resp.has_lane()) Die("no lane");
  own_object(resp.lane().memory(), resp.lane().segment_bytes(), "the lane");
  std::printf("isolated: %d shared objects read-only, %zu descriptors passed\n", shared,
              passed->size());
  return 0;
}

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "grants" && argc == 7) {
    return Grants(argv[2], argv[3], argv[4], std::atoi(argv[5]), std::atoi(argv[6]));
  }
  if (mode == "garbage" && argc == 3) return Garbage(argv[2]);
  if (mode == "isolate" && argc == 4) return Isolate(argv[2], std::atoi(argv[3]));
  if (mode == "survive" && argc == 4) return Survive(argv[2], argv[3]);
  if (mode == "survive-c" && argc == 3) return SurviveC(argv[2]);
  if (mode == "deaf" && argc == 4) return Deaf(argv[2], std::atoi(argv[3]));
  if (mode == "stuff" && argc == 4) return Stuff(argv[2], std::atoi(argv[3]));
  if (mode == "idle" && argc == 5) return Idle(argv[2], std::atoi(argv[3]), std::atof(argv[4]));
  if (mode == "rate" && (argc == 4 || argc == 5)) {
    return Rate(argv[2], std::atof(argv[3]), argc == 5 ? std::atoi(argv[4]) : 1);
  }
  std::fprintf(stderr, "usage: see the comment at the top of lane_client.cpp\n");
  return 2;
}
