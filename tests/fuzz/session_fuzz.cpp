// Fuzz target: the daemon's session handling (daemon/sessions.h) against a real engine on the
// host device, serving a synthesized mixtral-tiny model (32 layers x 8 experts, 16 slots). The
// input is a program over up to four sessions of one registry (limits: 3 sessions, 6 leases and
// 8 experts per acquire):
//   0 k t        open session k (t picks the transport asked for)
//   1 k m        attach session k: m picks its own id, another session's, a made-up one, a
//                peer of another uid, a peer not on the Unix socket
//   2 k ...      acquire on k: seq (u64), layer (a small number or any u32), 0..15 experts (each
//                a small number or any u32)
//   3 k ...      prefetch on k: layer and experts as for acquire
//   4 k m ...    release on k: a lease this session was granted (after signalling done for
//                its slots, or without), one of another session's, or any u64
//   5 k          end session k (its stream closed)
//   6 d          one reaper pass at now + d seconds, once every acquire sent was answered
//   7            wait until every attached session got an answer to each acquire
// Checks, beyond "no crash, no sanitizer report": every acquire of an attached, live session is
// answered exactly once (a grant or an error with a known code and a message), within 10 s; a
// grant names the acquired layer and one slot per requested expert, in order, each slot within
// its class; no lease number is granted twice in a session; a release of a lease the session
// does not hold fails with NOT_FOUND and changes nothing; the session limit holds. After the
// program every session is ended and reaped: 0 sessions and 0 leases remain, and a new session
// can still lease 8 experts (no slot was lost).
#include <unistd.h>

#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "spdlog/spdlog.h"
#include "../support/session_done.h"
#include "device/host/host_device.h"
#include "sessions.h"
#include "synth/synth.h"

namespace {

using namespace expertd;

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "session_fuzz: check failed: %s\n", what);
    std::abort();
  }
}

class Input {
 public:
  Input(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}
  bool empty() const { return p_ == end_; }
  uint8_t Byte() { return p_ == end_ ? 0 : *p_++; }
  uint32_t U32() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t{Byte()} << (8 * i);
    return v;
  }
  uint64_t U64() { return uint64_t{U32()} | uint64_t{U32()} << 32; }
  // A small number most of the time, any value (the type's limits included) otherwise.
  uint32_t Small(uint32_t below) {
    const uint8_t b = Byte();
    if (b < 0xF0) return b % below;
    if (b == 0xF0) return UINT32_MAX;
    if (b == 0xF1) return below;
    return U32();
  }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

constexpr uint32_t kSlots = 16;
// Releases carry seqs with the top bit set, acquires without: their errors cannot be confused.
constexpr uint64_t kReleaseSeq = uint64_t{1} << 63;

// What one session's outbox received, and what the fuzzer expects of it.
class Recorder final : public Outbox {
 public:
  bool Push(v1::SessionResponse m) override {
    std::lock_guard<std::mutex> lock(mu);
    if (m.has_grant()) {
      const v1::Grant& g = m.grant();
      auto it = asked.find(g.seq());
      Check(it != asked.end(), "a grant for a seq never acquired");
      const Asked& a = it->second;
      Check(a.answers == 0, "an acquire answered twice");
      Check(g.layer() == a.layer, "a grant of another layer");
      Check(g.slots_size() == static_cast<int>(a.experts.size()), "a grant's slot count");
      for (int i = 0; i < g.slots_size(); ++i) {
        Check(g.slots(i).expert() == a.experts[i], "a grant's experts out of order");
        Check(g.slots(i).slot() < kSlots, "a slot beyond its class");
      }
      Check(leases_seen.insert(g.lease()).second, "a lease number granted twice");
      granted.emplace(g.lease(), g);
      ++it->second.answers;
      ++answers;
    } else if (m.has_error()) {
      const v1::RequestError& e = m.error();
      Check(e.code() > 0 && e.code() <= 16 && !e.message().empty(), "an error without a cause");
      if (e.seq() & kReleaseSeq) {
        if (e.code() == 5 /* NOT_FOUND */) ++not_found;
      } else {
        auto it = asked.find(e.seq());
        Check(it != asked.end(), "an error for a seq never acquired");
        Check(it->second.answers == 0, "an acquire answered twice");
        ++it->second.answers;
        ++answers;
      }
    } else if (m.has_lease_expired()) {
      Check(granted.erase(m.lease_expired().lease()) == 1, "an unknown lease expired");
    }
    cv.notify_all();
    return true;
  }
  struct Asked {
    uint32_t layer = 0;
    std::vector<uint32_t> experts;
    int answers = 0;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::map<uint64_t, Asked> asked;  // acquires sent while attached, by seq (unique seqs only)
  uint64_t expected = 0;            // acquires sent while attached and live
  uint64_t answers = 0;
  uint64_t not_found = 0;
  std::set<uint64_t> leases_seen;
  std::map<uint64_t, v1::Grant> granted;
};

struct Slot {
  std::shared_ptr<Session> session;
  std::shared_ptr<Recorder> recorder;
  bool attached = false;
  bool ended = false;
  bool maybe_reaped = false;  // a reaper pass past attach_timeout ran while it was unattached
};

struct World {
  std::string dir;
  std::unique_ptr<Device> device;
  std::unique_ptr<ServedModel> model;
  std::unique_ptr<SessionRegistry> registry;
  Peer peer;
};

World& TheWorld() {
  static World* const world = [] {
    spdlog::set_level(spdlog::level::off);  // reclaimed leases and refusals are expected here
    auto* w = new World;
    char tmpl[] = "/tmp/expertd-session-fuzz.XXXXXX";
    Check(mkdtemp(tmpl) != nullptr, "mkdtemp");
    w->dir = tmpl;
    SynthOptions so;
    so.preset = "mixtral-tiny";
    so.out_dir = w->dir;
    auto written = SynthesizeModel(so);
    Check(written.ok(), "synthesize the model");
    auto device = MakeHostDevice();
    Check(device.ok(), "host device");
    w->device = *std::move(device);
    EngineOptions eo;
    eo.slots_per_class = kSlots;
    eo.predictor = "none";
    auto model = ServedModel::Load({"m", written->front(), "", "", {}}, *w->device, {}, eo);
    Check(model.ok(), "load the model");
    w->model = *std::move(model);
    SessionLimits limits;
    limits.max_sessions = 3;
    limits.max_leases_per_session = 6;
    limits.max_experts_per_acquire = 8;
    limits.lease_ttl = absl::Seconds(60);
    limits.reap_interval = absl::Hours(1);  // reaper passes are the program's (op 6)
    w->registry = std::make_unique<SessionRegistry>(limits);
    w->peer.unix_socket = true;
    w->peer.uid = getuid();
    w->peer.gid = getgid();
    w->peer.pid = getpid();
    return w;
  }();
  return *world;
}

void WaitAnswers(Slot& s) {
  if (!s.recorder) return;
  std::unique_lock<std::mutex> lock(s.recorder->mu);
  const bool all = s.recorder->cv.wait_for(lock, std::chrono::seconds(10), [&] {
    return s.recorder->answers >= s.recorder->expected;
  });
  Check(all, "an acquire was never answered (10 s)");
}

// The client's part of a release: signal done for every slot of the grant.
void SignalDone(const Session& session, const v1::Grant& g) {
  const absl::Status st = testing::SignalDoneAsClient(session, g);
  Check(st.ok(), "signalling done for a held lease failed");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  World& w = TheWorld();
  Input in(data, size);
  Slot slots[4];
  int steps = 0;
  while (!in.empty() && steps++ < 64) {
    const uint8_t op = in.Byte() % 8;
    Slot& s = slots[in.Byte() % 4];
    switch (op) {
      case 0: {
        const uint8_t t = in.Byte() % 3;
        if (s.session) break;
        const v1::Transport transport =
            t == 0 ? v1::TRANSPORT_AUTO : t == 1 ? v1::TRANSPORT_STREAM : v1::TRANSPORT_LANE;
        auto opened = w.registry->Open(w.model.get(), w.peer, "fuzz", transport);
        if (!opened.ok()) {
          // No lanes in this registry: LANE is refused; and the session limit.
          Check(opened.status().code() == absl::StatusCode::kFailedPrecondition ||
                    opened.status().code() == absl::StatusCode::kResourceExhausted,
                "open refused for another reason");
          break;
        }
        Check(w.registry->size() <= 3, "more sessions than the limit");
        s = Slot{*opened, std::make_shared<Recorder>(), false, false, false};
        break;
      }
      case 1: {
        const uint8_t m = in.Byte() % 5;
        Slot& other = slots[in.Byte() % 4];
        if (!s.session) break;
        std::string id = s.session->id();
        Peer peer = w.peer;
        bool valid = !s.attached && !s.ended;
        if (m == 1) {  // another session's id, once that one has a stream or ended
          if (&other == &s || !other.session || !(other.attached || other.ended)) break;
          id = other.session->id();
          valid = false;
        }
        if (m == 2) id = "no-such-session", valid = false;
        if (m == 3) peer.uid = w.peer.uid + 1, valid = false;
        if (m == 4) peer.unix_socket = false, valid = false;
        auto a = w.registry->Attach(id, peer, s.recorder);
        Check(a.ok() ? valid : !valid || s.maybe_reaped, a.ok() ? "an attach that should fail"
                                                                : "a valid attach refused");
        if (a.ok()) s.attached = true;
        break;
      }
      case 2: {
        v1::Acquire r;
        r.set_seq(in.U64() & ~kReleaseSeq);
        r.set_layer(in.Small(32));
        const uint32_t n = in.Byte() % 16;
        for (uint32_t i = 0; i < n; ++i) r.add_experts(in.Small(8));
        // Requests come only after Attach (the service reads nothing before it); an ended
        // session may still get some (its lane thread was at it): they are dropped.
        if (!s.attached) break;
        if (!s.ended) {
          std::lock_guard<std::mutex> lock(s.recorder->mu);
          if (s.recorder->asked.count(r.seq()) > 0) break;  // a repeated seq: ambiguous answers
          Recorder::Asked a;
          a.layer = r.layer();
          a.experts.assign(r.experts().begin(), r.experts().end());
          s.recorder->asked.emplace(r.seq(), std::move(a));
          ++s.recorder->expected;
        }
        s.session->Acquire(r);
        break;
      }
      case 3: {
        v1::Prefetch r;
        r.set_layer(in.Small(32));
        const uint32_t n = in.Byte() % 16;
        for (uint32_t i = 0; i < n; ++i) r.add_experts(in.Small(8));
        if (s.attached) s.session->Prefetch(r);
        break;
      }
      case 4: {
        const uint8_t m = in.Byte() % 4;
        Slot& other = slots[in.Byte() % 4];
        const uint64_t any = in.U64();
        v1::Release r;
        r.set_seq(in.U64() | kReleaseSeq);
        if (!s.attached) break;
        WaitAnswers(s);
        if (m <= 1) {  // one of its own leases, after signalling done (0) or without (1)
          std::lock_guard<std::mutex> lock(s.recorder->mu);
          if (s.recorder->granted.empty()) break;
          const v1::Grant& own = s.recorder->granted.begin()->second;
          if (m == 0) SignalDone(*s.session, own);
          r.set_lease(own.lease());
        } else if (m == 2) {  // another session's lease number
          if (!other.recorder) break;
          std::lock_guard<std::mutex> lock(other.recorder->mu);
          if (other.recorder->granted.empty()) break;
          r.set_lease(other.recorder->granted.begin()->first);
        } else {
          r.set_lease(any);
        }
        uint64_t not_found = 0;
        bool held = false;
        {
          std::lock_guard<std::mutex> lock(s.recorder->mu);
          not_found = s.recorder->not_found;
          held = s.recorder->granted.count(r.lease()) > 0;
        }
        const uint32_t before = s.session->counters().leases_held;
        s.session->Release(r);
        const uint32_t after = s.session->counters().leases_held;
        if (s.ended) break;
        std::lock_guard<std::mutex> lock(s.recorder->mu);
        if (!held) {
          Check(s.recorder->not_found == not_found + 1, "a release of a lease not held accepted");
          Check(after == before, "a refused release changed the leases held");
        } else if (after + 1 == before) {
          s.recorder->granted.erase(r.lease());
        } else {
          Check(m != 0, "a release after done was refused");
          Check(after == before, "a refused release changed the leases held");
        }
        break;
      }
      case 5:
        if (!s.session || s.ended) break;
        WaitAnswers(s);
        w.registry->End(s.session);
        s.ended = true;
        break;
      case 6: {
        const uint8_t d = in.Byte();
        if (d >= 10) {  // past attach_timeout: unattached sessions may go
          for (Slot& each : slots) each.maybe_reaped |= each.session && !each.attached;
        }
        // Time passes: the grants in flight arrive first. (A pass that ran between a grant's
        // lease entering the session and its message leaving would need lease_ttl, a minute,
        // to pass within those microseconds.)
        for (Slot& each : slots) WaitAnswers(each);
        w.registry->ReapOnce(absl::Now() + absl::Seconds(d));
        break;
      }
      case 7:
        for (Slot& each : slots) WaitAnswers(each);
        break;
    }
  }
  // Every session ends (its stream closes); the reaper forces what is left; nothing remains.
  for (Slot& each : slots) {
    if (!each.session) continue;
    WaitAnswers(each);
    if (!each.ended) w.registry->End(each.session);
  }
  for (int i = 0; i < 100 && (w.registry->LeasesOutstanding() > 0 || w.registry->size() > 0);
       ++i) {
    w.registry->ReapOnce(absl::Now() + absl::Hours(2));
    if (w.registry->LeasesOutstanding() > 0) usleep(1000);
  }
  Check(w.registry->LeasesOutstanding() == 0, "leases left after every session ended");
  Check(w.registry->size() == 0, "sessions left after every session ended");
  // No slot was lost: a fresh session leases all 8 experts of a layer.
  auto fresh = w.registry->Open(w.model.get(), w.peer, "check", v1::TRANSPORT_STREAM);
  Check(fresh.ok(), "a session after the program");
  auto rec = std::make_shared<Recorder>();
  Check(w.registry->Attach((*fresh)->id(), w.peer, rec).ok(), "attach after the program");
  v1::Acquire all;
  all.set_seq(1);
  all.set_layer(static_cast<uint32_t>(size % 32));
  for (uint32_t e = 0; e < 8; ++e) all.add_experts(e);
  {
    std::lock_guard<std::mutex> lock(rec->mu);
    rec->asked.emplace(1, Recorder::Asked{all.layer(), {0, 1, 2, 3, 4, 5, 6, 7}, 0});
    rec->expected = 1;
  }
  (*fresh)->Acquire(all);
  Slot check{*fresh, rec, true, false, false};
  WaitAnswers(check);
  {
    std::lock_guard<std::mutex> lock(rec->mu);
    Check(rec->granted.size() == 1, "8 experts could not be leased after the program");
    SignalDone(**fresh, rec->granted.begin()->second);
  }
  w.registry->End(*fresh);
  for (int i = 0; i < 100 && w.registry->size() > 0; ++i) {
    w.registry->ReapOnce(absl::Now() + absl::Hours(2));
  }
  Check(w.registry->size() == 0 && w.registry->LeasesOutstanding() == 0, "the check's session");
  return 0;
}
