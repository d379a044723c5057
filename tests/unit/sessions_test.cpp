// Sessions and leases without gRPC: a real engine on a synthesized model with the host device,
// and a recording outbox in place of the stream.
#include "sessions.h"

#include <gtest/gtest.h>

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>

#include <condition_variable>
#include <filesystem>
#include <mutex>

#include "device/host/host_device.h"
#include "support/session_done.h"
#include "support/test_support.h"
#include "synth/synth.h"
#include "unix_listener.h"
#include "util/latency_histogram.h"

namespace expertd {
namespace {

class RecordingOutbox final : public Outbox {
 public:
  bool Push(v1::SessionResponse message) override {
    std::lock_guard<std::mutex> lock(mu_);
    messages_.push_back(std::move(message));
    cv_.notify_all();
    return true;
  }
  // Waits for the first message matching `pred` and removes it.
  template <typename Pred>
  std::optional<v1::SessionResponse> Take(Pred pred, absl::Duration timeout = absl::Seconds(5)) {
    std::unique_lock<std::mutex> lock(mu_);
    const auto deadline = absl::ToChronoTime(absl::Now() + timeout);
    for (;;) {
      for (auto it = messages_.begin(); it != messages_.end(); ++it) {
        if (pred(*it)) {
          v1::SessionResponse r = std::move(*it);
          messages_.erase(it);
          return r;
        }
      }
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout) return std::nullopt;
    }
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<v1::SessionResponse> messages_;
};

auto GrantFor(uint64_t seq) {
  return [seq](const v1::SessionResponse& r) { return r.has_grant() && r.grant().seq() == seq; };
}
auto ErrorFor(uint64_t seq) {
  return [seq](const v1::SessionResponse& r) { return r.has_error() && r.error().seq() == seq; };
}

class SessionsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SynthOptions so;
    so.preset = "mixtral-tiny";
    so.out_dir = dir_.path();
    auto written = SynthesizeModel(so);
    ASSERT_TRUE(written.ok()) << written.status();
    auto device = MakeHostDevice();
    ASSERT_TRUE(device.ok()) << device.status();
    device_ = *std::move(device);
    EngineOptions eo;
    eo.slots_per_class = 16;
    eo.predictor = "none";
    auto model = ServedModel::Load({"m", written->front(), "", "", {}}, *device_, {}, eo);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = *std::move(model);
  }
  void TearDown() override {
    registry_.reset();
    model_.reset();
  }
  SessionRegistry& Registry(SessionLimits limits = {}) {
    limits.reap_interval = absl::Hours(1);  // the tests call ReapOnce themselves
    registry_ = std::make_unique<SessionRegistry>(limits);
    return *registry_;
  }
  v1::Acquire AcquireMsg(uint64_t seq, uint32_t layer, std::vector<uint32_t> experts) {
    v1::Acquire a;
    a.set_seq(seq);
    a.set_layer(layer);
    for (uint32_t e : experts) a.add_experts(e);
    return a;
  }

  testing::TempDir dir_;
  std::unique_ptr<Device> device_;
  std::unique_ptr<ServedModel> model_;
  std::unique_ptr<SessionRegistry> registry_;
  Peer peer_{true, 1000, 1000, 0};
};

TEST_F(SessionsTest, AcquireGrantsAndReleaseNeedsDone) {
  SessionRegistry& reg = Registry();
  auto s = reg.Open(model_.get(), peer_, "t");
  ASSERT_TRUE(s.ok());
  auto outbox = std::make_shared<RecordingOutbox>();
  ASSERT_TRUE(reg.Attach((*s)->id(), peer_, outbox).ok());
  (*s)->Acquire(AcquireMsg(1, 0, {3, 5}));
  auto g = outbox->Take(GrantFor(1));
  ASSERT_TRUE(g.has_value());
  ASSERT_EQ(g->grant().slots_size(), 2);
  EXPECT_EQ(g->grant().slots(0).expert(), 3u);
  EXPECT_EQ(reg.LeasesOutstanding(), 1u);

  v1::Release rel;
  rel.set_seq(2);
  rel.set_lease(g->grant().lease());
  (*s)->Release(rel);  // done not signalled: refused, the lease stays
  auto err = outbox->Take(ErrorFor(2));
  ASSERT_TRUE(err.has_value());
  EXPECT_EQ(err->error().code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(reg.LeasesOutstanding(), 1u);

  ASSERT_TRUE(testing::SignalDoneAsClient(**s, g->grant()).ok());
  rel.set_seq(3);
  (*s)->Release(rel);
  EXPECT_EQ(reg.LeasesOutstanding(), 0u);
  rel.set_seq(4);
  (*s)->Release(rel);  // twice: not held any more
  err = outbox->Take(ErrorFor(4));
  ASSERT_TRUE(err.has_value());
  EXPECT_EQ(err->error().code(), static_cast<int>(absl::StatusCode::kNotFound));
}

// One session cannot lease the whole pool: by default it may hold half of the model's slots
// (16 here), so another session still gets slots while the first holds all it may.
TEST_F(SessionsTest, OneSessionCannotLeaseThePool) {
  SessionLimits limits;
  limits.max_experts_per_acquire = 4;
  SessionRegistry& reg = Registry(limits);
  EXPECT_EQ(SlotsPerSession(limits, *model_), 8u);
  auto greedy = reg.Open(model_.get(), peer_, "greedy");
  auto other = reg.Open(model_.get(), peer_, "other");
  ASSERT_TRUE(greedy.ok() && other.ok());
  auto gbox = std::make_shared<RecordingOutbox>();
  auto obox = std::make_shared<RecordingOutbox>();
  ASSERT_TRUE(reg.Attach((*greedy)->id(), peer_, gbox).ok());
  ASSERT_TRUE(reg.Attach((*other)->id(), peer_, obox).ok());
  std::vector<v1::Grant> held;
  int refused = 0;
  for (uint32_t layer = 0; layer < 8; ++layer) {
    (*greedy)->Acquire(AcquireMsg(layer + 1, layer, {0, 1, 2, 3}));
    auto r = gbox->Take([&](const v1::SessionResponse& m) {
      return (m.has_grant() && m.grant().seq() == layer + 1) ||
             (m.has_error() && m.error().seq() == layer + 1);
    });
    ASSERT_TRUE(r.has_value());
    if (r->has_grant()) {
      held.push_back(r->grant());
      continue;
    }
    ++refused;
    EXPECT_EQ(r->error().code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
    EXPECT_NE(r->error().message().find("limits.max_slots_per_session"), std::string::npos)
        << r->error().message();
  }
  EXPECT_EQ(held.size(), 2u);  // 8 slots
  EXPECT_EQ(refused, 6);
  // The other session gets its share while the greedy one holds all it may.
  (*other)->Acquire(AcquireMsg(1, 9, {4, 5, 6, 7}));
  auto g = obox->Take(GrantFor(1));
  ASSERT_TRUE(g.has_value());
  // A release makes room again for the greedy session.
  ASSERT_TRUE(testing::SignalDoneAsClient(**greedy, held[0]).ok());
  v1::Release rel;
  rel.set_seq(100);
  rel.set_lease(held[0].lease());
  (*greedy)->Release(rel);
  (*greedy)->Acquire(AcquireMsg(101, 10, {0, 1, 2, 3}));
  EXPECT_TRUE(gbox->Take(GrantFor(101)).has_value());
  // An explicit bound, below one acquire: every acquire of more is refused.
  limits.max_slots_per_session = 3;
  EXPECT_EQ(SlotsPerSession(limits, *model_), 3u);
  limits.max_slots_per_session = 1000;  // never more than the model has
  EXPECT_EQ(SlotsPerSession(limits, *model_), 16u);
}

// A client that opens, acquires and closes in a loop without giving leases back: the ended
// sessions waiting for their leases stay bounded (max_sessions), and so do their pidfds and
// slots.
// An attached session does not outlive the process that opened it, even while its stream stays
// open (here: nothing ends it; in the daemon a child that inherited the connection).
TEST_F(SessionsTest, AttachedSessionEndsWhenItsProcessExits) {
  SessionRegistry& reg = Registry();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    pause();
    _exit(0);
  }
  Peer opener = peer_;
  opener.pid = child;
  auto s = reg.Open(model_.get(), opener, "orphan");
  ASSERT_TRUE(s.ok()) << s.status();
  absl::Status ended;
  int calls = 0;
  ASSERT_TRUE(reg.Attach((*s)->id(), opener, std::make_shared<RecordingOutbox>(),
                         [&](const absl::Status& why) {
                           ended = why;
                           ++calls;
                         })
                  .ok());
  reg.ReapOnce(absl::Now());
  EXPECT_EQ(calls, 0);  // alive: nothing happens
  ASSERT_EQ(kill(child, SIGKILL), 0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);
  reg.ReapOnce(absl::Now());
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(ended.code(), absl::StatusCode::kUnavailable) << ended;
  EXPECT_NE(ended.message().find(absl::StrCat("pid ", child)), std::string::npos) << ended;
  reg.ReapOnce(absl::Now());
  EXPECT_EQ(calls, 1);  // once
}

TEST_F(SessionsTest, EndedSessionsAreBounded) {
  SessionLimits limits;
  limits.max_sessions = 4;
  SessionRegistry& reg = Registry(limits);
  Peer me = peer_;
  me.pid = getpid();  // a live process: its sessions get a pidfd each
  const auto fds = [] {
    return std::distance(std::filesystem::directory_iterator("/proc/self/fd"),
                         std::filesystem::directory_iterator());
  };
  const auto before = fds();
  for (uint64_t turn = 1; turn <= 100; ++turn) {
    auto s = reg.Open(model_.get(), me, "loop");
    ASSERT_TRUE(s.ok()) << s.status();
    auto box = std::make_shared<RecordingOutbox>();
    ASSERT_TRUE(reg.Attach((*s)->id(), me, box).ok());
    (*s)->Acquire(AcquireMsg(turn, static_cast<uint32_t>(turn % 32), {0}));
    ASSERT_TRUE(box->Take(GrantFor(turn)).has_value()) << "turn " << turn;
    reg.End(*s);  // done never signalled, lease never released
    reg.ReapOnce(absl::Now());
    ASSERT_LE(reg.ended_sessions(), 4u) << "turn " << turn;
    ASSERT_LE(reg.LeasesOutstanding(), 4u) << "turn " << turn;
  }
  // Each of the 4 draining sessions holds its pidfd and one done-word object per slot class.
  const auto per_session = static_cast<long>(1 + model_->catalog().slot_classes().size());
  EXPECT_LE(fds(), before + 4 * per_session);
}

// The handle socket's gate: only the process that opened a session gets its descriptors, and
// only before it attaches. A host session passes its own done words (memfds, no name).
TEST_F(SessionsTest, PassedDescriptorsGoOnlyToTheOpenerBeforeAttach) {
  SessionRegistry& reg = Registry();
  auto s = reg.Open(model_.get(), peer_, "t");
  ASSERT_TRUE(s.ok()) << s.status();
  std::vector<int> fds;
  for (const v1::SlotClassHandles& h : (*s)->Handles()) {
    ASSERT_TRUE(h.fences().has_session_done());
    EXPECT_TRUE(h.fences().session_done().shm_name().empty());
    fds.push_back(h.fences().session_done().fd());
  }
  (*s)->SetPassed(fds);
  EXPECT_EQ(reg.Passed("00", peer_).status().code(), absl::StatusCode::kNotFound);
  Peer other_pid = peer_;
  other_pid.pid += 1;
  EXPECT_EQ(reg.Passed((*s)->id(), other_pid).status().code(),
            absl::StatusCode::kPermissionDenied);
  Peer other_uid = peer_;
  other_uid.uid += 1;
  EXPECT_EQ(reg.Passed((*s)->id(), other_uid).status().code(),
            absl::StatusCode::kPermissionDenied);
  auto passed = reg.Passed((*s)->id(), peer_);
  ASSERT_TRUE(passed.ok()) << passed.status();
  EXPECT_EQ(passed->second, fds);
  ASSERT_TRUE(reg.Attach((*s)->id(), peer_, std::make_shared<RecordingOutbox>()).ok());
  EXPECT_EQ(reg.Passed((*s)->id(), peer_).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(SessionsTest, LimitsAndAttachRules) {
  SessionLimits limits;
  limits.max_sessions = 1;
  limits.max_leases_per_session = 2;
  SessionRegistry& reg = Registry(limits);
  auto s = reg.Open(model_.get(), peer_, "t");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(reg.Open(model_.get(), peer_, "u").status().code(),
            absl::StatusCode::kResourceExhausted);
  Peer other = peer_;
  other.uid = 1001;
  auto outbox = std::make_shared<RecordingOutbox>();
  EXPECT_EQ(reg.Attach((*s)->id(), other, outbox).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(reg.Attach("nope", peer_, outbox).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(reg.Attach((*s)->id(), peer_, outbox).ok());
  EXPECT_EQ(reg.Attach((*s)->id(), peer_, outbox).status().code(),
            absl::StatusCode::kFailedPrecondition);

  (*s)->Acquire(AcquireMsg(1, 0, {0}));
  (*s)->Acquire(AcquireMsg(2, 1, {0}));
  ASSERT_TRUE(outbox->Take(GrantFor(1)).has_value());
  ASSERT_TRUE(outbox->Take(GrantFor(2)).has_value());
  (*s)->Acquire(AcquireMsg(3, 2, {0}));
  auto err = outbox->Take(ErrorFor(3));
  ASSERT_TRUE(err.has_value());
  EXPECT_EQ(err->error().code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ((*s)->counters().leases_held, 2u);
}

TEST_F(SessionsTest, UnattachedSessionIsDroppedAfterTimeout) {
  SessionLimits limits;
  limits.attach_timeout = absl::Seconds(1);
  SessionRegistry& reg = Registry(limits);
  auto s = reg.Open(model_.get(), peer_, "t");
  ASSERT_TRUE(s.ok());
  reg.ReapOnce(absl::Now());
  EXPECT_EQ(reg.size(), 1u);
  reg.ReapOnce(absl::Now() + absl::Seconds(2));
  EXPECT_EQ(reg.size(), 0u);
  EXPECT_EQ(reg.Attach((*s)->id(), peer_, std::make_shared<RecordingOutbox>()).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(SessionsTest, LeaseTtlReclaimsAndTellsTheClient) {
  SessionLimits limits;
  limits.lease_ttl = absl::Seconds(10);
  SessionRegistry& reg = Registry(limits);
  auto s = reg.Open(model_.get(), peer_, "t");
  auto outbox = std::make_shared<RecordingOutbox>();
  ASSERT_TRUE(reg.Attach((*s)->id(), peer_, outbox).ok());
  (*s)->Acquire(AcquireMsg(1, 0, {1, 2}));
  auto g = outbox->Take(GrantFor(1));
  ASSERT_TRUE(g.has_value());
  reg.ReapOnce(absl::Now() + absl::Seconds(5));
  EXPECT_EQ(reg.LeasesOutstanding(), 1u);
  // A session that keeps sending requests keeps its old leases.
  absl::SleepFor(absl::Milliseconds(20));
  (*s)->Prefetch(v1::Prefetch());
  reg.ReapOnce(absl::Now() + absl::Seconds(10) - absl::Milliseconds(10));
  EXPECT_EQ(reg.LeasesOutstanding(), 1u);
  reg.ReapOnce(absl::Now() + absl::Seconds(11));
  EXPECT_EQ(reg.LeasesOutstanding(), 0u);
  auto expired = outbox->Take([](const v1::SessionResponse& r) { return r.has_lease_expired(); });
  ASSERT_TRUE(expired.has_value());
  EXPECT_EQ(expired->lease_expired().lease(), g->grant().lease());
  // The daemon signalled done for the client, so the slots can be refilled.
  for (const auto& slot : g->grant().slots()) {
    EXPECT_GE(model_->engine().fences(slot.slot_class()).done(slot.slot()), slot.generation());
  }
}

TEST_F(SessionsTest, EndedSessionDrainsOnDoneOrDeadline) {
  SessionLimits limits;
  limits.lease_ttl = absl::Seconds(30);
  SessionRegistry& reg = Registry(limits);
  auto s = reg.Open(model_.get(), peer_, "t");
  auto outbox = std::make_shared<RecordingOutbox>();
  ASSERT_TRUE(reg.Attach((*s)->id(), peer_, outbox).ok());
  (*s)->Acquire(AcquireMsg(1, 0, {1}));
  (*s)->Acquire(AcquireMsg(2, 1, {1}));
  auto g1 = outbox->Take(GrantFor(1));
  auto g2 = outbox->Take(GrantFor(2));
  // The client finished reading the first before its stream ended.
  ASSERT_TRUE(testing::SignalDoneAsClient(**s, g1->grant()).ok());
  reg.End(*s);
  EXPECT_EQ(reg.size(), 0u);
  EXPECT_EQ(reg.LeasesOutstanding(), 1u);  // the second waits for its done fence
  reg.ReapOnce(absl::Now());
  EXPECT_EQ(reg.LeasesOutstanding(), 1u);
  reg.ReapOnce(absl::Now() + absl::Seconds(31));  // the budget ran out: reclaimed
  EXPECT_EQ(reg.LeasesOutstanding(), 0u);
  EXPECT_TRUE(reg.WaitDrained(absl::ZeroDuration()));
}

TEST_F(SessionsTest, DrainRefusesNewWork) {
  SessionRegistry& reg = Registry();
  auto s = reg.Open(model_.get(), peer_, "t");
  auto outbox = std::make_shared<RecordingOutbox>();
  ASSERT_TRUE(reg.Attach((*s)->id(), peer_, outbox).ok());
  reg.BeginDrain();
  (*s)->Acquire(AcquireMsg(1, 0, {1}));
  auto err = outbox->Take(ErrorFor(1));
  ASSERT_TRUE(err.has_value());
  EXPECT_EQ(err->error().code(), static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_EQ(reg.Open(model_.get(), peer_, "u").status().code(), absl::StatusCode::kUnavailable);
}

// SIGHUP's engine side: the policy and predictor change while bundles stay resident.
TEST_F(SessionsTest, ReconfigureKeepsResidentBundles) {
  SessionRegistry& reg = Registry();
  auto s = reg.Open(model_.get(), peer_, "t");
  auto outbox = std::make_shared<RecordingOutbox>();
  ASSERT_TRUE(reg.Attach((*s)->id(), peer_, outbox).ok());
  (*s)->Acquire(AcquireMsg(1, 0, {1, 2}));
  auto g = outbox->Take(GrantFor(1));
  ASSERT_TRUE(g.has_value());
  EXPECT_FALSE(g->grant().slots(0).hit());
  ASSERT_TRUE(testing::SignalDoneAsClient(**s, g->grant()).ok());
  v1::Release rel;
  rel.set_seq(2);
  rel.set_lease(g->grant().lease());
  (*s)->Release(rel);

  PredictorOptions po;
  EXPECT_EQ(model_->engine().Reconfigure("no-such-policy", "none", po).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model_->engine().Reconfigure("lru", "no-such-predictor", po).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(model_->engine().Reconfigure("lru", "history", po).ok());
  (*s)->Acquire(AcquireMsg(3, 0, {1, 2}));
  g = outbox->Take(GrantFor(3));
  ASSERT_TRUE(g.has_value());
  EXPECT_TRUE(g->grant().slots(0).hit());  // still resident under the new policy
  EXPECT_TRUE(g->grant().slots(1).hit());
  // The new policy evicts: fill more bundles than the pool holds without an error.
  ASSERT_TRUE(testing::SignalDoneAsClient(**s, g->grant()).ok());
  rel.set_seq(4);
  rel.set_lease(g->grant().lease());
  (*s)->Release(rel);
  for (uint32_t layer = 1; layer < 20; ++layer) {
    (*s)->Acquire(AcquireMsg(10 + layer, layer, {0, 1}));
    auto gl = outbox->Take(GrantFor(10 + layer));
    ASSERT_TRUE(gl.has_value()) << "layer " << layer;
    ASSERT_TRUE(testing::SignalDoneAsClient(**s, gl->grant()).ok());
    rel.set_seq(100 + layer);
    rel.set_lease(gl->grant().lease());
    (*s)->Release(rel);
  }
  EXPECT_EQ(reg.LeasesOutstanding(), 0u);
}

TEST(PeerAllowedTest, UidsAndGroups) {
  UnixListenerOptions o;
  EXPECT_TRUE(PeerAllowed(1000, {1000}, 1000, 997, o));
  EXPECT_FALSE(PeerAllowed(1001, {1001}, 1000, 997, o));
  o.allowed_uids = {1001};
  EXPECT_TRUE(PeerAllowed(1001, {1001}, 1000, 997, o));
  EXPECT_FALSE(PeerAllowed(1002, {1002, 44}, 1000, 997, o));
  o.allowed_gids = {44};
  EXPECT_TRUE(PeerAllowed(1002, {1002, 44}, 1000, 997, o));  // a supplementary group counts
  EXPECT_FALSE(PeerAllowed(0, {0}, 1000, 997, o));            // root is not special
  // The daemon's own group (a member of group expertd), primary or supplementary.
  EXPECT_TRUE(PeerAllowed(1003, {1003, 997}, 1000, 997, UnixListenerOptions{}));
  EXPECT_TRUE(PeerAllowed(1003, {997}, 1000, 997, UnixListenerOptions{}));
  EXPECT_FALSE(PeerAllowed(1003, {1003, 998}, 1000, 997, UnixListenerOptions{}));
}

TEST(UnixListenerTest, PeerGroupsComeFromTheConnection) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  std::vector<gid_t> mine(getgroups(0, nullptr));
  ASSERT_EQ(getgroups(static_cast<int>(mine.size()), mine.data()),
            static_cast<int>(mine.size()));
  const std::vector<uint32_t> got = PeerGroups(sv[0], 4242);
  ASSERT_FALSE(got.empty());
  EXPECT_EQ(got[0], 4242u);  // the primary, as given
  EXPECT_EQ(std::vector<uint32_t>(got.begin() + 1, got.end()),
            std::vector<uint32_t>(mine.begin(), mine.end()));
  close(sv[0]);
  close(sv[1]);
  // Not a socket: only the primary.
  EXPECT_EQ(PeerGroups(-1, 7), std::vector<uint32_t>{7});
}

TEST(UnixListenerTest, AnExistingDirectoryOthersCanWriteIsRefused) {
  testing::TempDir dir;
  PeerTable peers;
  const std::string run = dir.path() + "/run";
  ASSERT_EQ(mkdir(run.c_str(), 0700), 0);
  UnixListenerOptions o;
  o.path = run + "/expertd.sock";
  o.socket_mode = 0640;
  {
    auto ok = UnixListener::Bind(o, &peers);
    ASSERT_TRUE(ok.ok()) << ok.status();
    struct stat st{};
    ASSERT_EQ(stat(o.path.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0640u);
  }
  ASSERT_EQ(chmod(run.c_str(), 0777), 0);  // anyone may replace the socket
  auto refused = UnixListener::Bind(o, &peers);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("can be written by other users"), std::string::npos)
      << refused.status();
  EXPECT_NE(refused.status().message().find(run), std::string::npos);
  ASSERT_EQ(chmod(run.c_str(), 01777), 0);  // sticky, as /tmp: names cannot be replaced
  EXPECT_TRUE(UnixListener::Bind(o, &peers).ok());
  // A symlink in the directory's place is refused too.
  const std::string link = dir.path() + "/link";
  ASSERT_EQ(symlink(run.c_str(), link.c_str()), 0);
  EXPECT_FALSE(CheckSocketDirectory(link, geteuid()).ok());
  if (geteuid() == 0) {  // another owner (only root can make one)
    ASSERT_EQ(chmod(run.c_str(), 0700), 0);
    ASSERT_EQ(chown(run.c_str(), 65534, 65534), 0);
    auto other = CheckSocketDirectory(run, 0);
    ASSERT_FALSE(other.ok());
    EXPECT_NE(other.message().find("belongs to another user"), std::string::npos) << other;
  }
}

TEST(LatencyHistogramTest, QuantilesWithinBucketError) {
  LatencyHistogram h;
  EXPECT_EQ(h.Quantile(0.5), 0);
  for (uint64_t v = 1; v <= 10000; ++v) h.Add(v * 1000);  // 1 µs .. 10 ms uniformly
  EXPECT_EQ(h.count(), 10000u);
  const double p50 = h.Quantile(0.5), p99 = h.Quantile(0.99);
  EXPECT_NEAR(p50, 5e6, 5e6 * 0.13);
  EXPECT_NEAR(p99, 9.9e6, 9.9e6 * 0.13);
  EXPECT_LE(h.Quantile(1.0), 10e6);
  for (uint64_t v : {0ull, 7ull, 8ull, 1000ull, 123456789ull}) {
    const int b = LatencyHistogram::BucketOf(v);
    EXPECT_GE(LatencyHistogram::UpperEdge(b), v);
    if (b > 0) {
      EXPECT_LT(LatencyHistogram::UpperEdge(b - 1), v);
    }
  }
  const std::vector<uint64_t> cum = h.CumulativeAt({500, 2'000'000, 100'000'000});
  EXPECT_EQ(cum[0], 0u);
  EXPECT_NEAR(static_cast<double>(cum[1]), 2000, 2000 * 0.13);
  EXPECT_EQ(cum[2], 10000u);
}

TEST(ClientNames, StayValidUtf8AndAreCutAtACharacterBoundary) {
  // 63 ASCII bytes then a 2-byte character: cutting at byte 64 would split it.
  EXPECT_EQ(ClientNameForStats(std::string(63, 'a') + "\xc3\xa9"), std::string(63, 'a'));
  std::string umlauts;
  for (int i = 0; i < 40; ++i) umlauts += "\xc3\xbc";  // 80 bytes of "ü"
  EXPECT_EQ(ClientNameForStats(umlauts), umlauts.substr(0, 64));
  // Bytes that are not UTF-8: a lone continuation byte, a truncated sequence, 0xff.
  EXPECT_EQ(ClientNameForStats("x\x80y\xe6\x97z\xff"), "x?y??z?");
  EXPECT_EQ(ClientNameForStats("engine \xe6\x97\xa5"), "engine \xe6\x97\xa5");
}

TEST_F(SessionsTest, ATcpPeerCannotAttachEvenToARootSession) {
  SessionRegistry& reg = Registry();
  const Peer root{true, 0, 0, 0};
  auto s = reg.Open(model_.get(), root, "t");
  ASSERT_TRUE(s.ok());
  const Peer tcp{false, 0, 0, 0};  // what a TCP connection looks like: no credentials
  auto a = reg.Attach((*s)->id(), tcp, std::make_shared<RecordingOutbox>());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kFailedPrecondition) << a.status();
  EXPECT_TRUE(reg.Attach((*s)->id(), root, std::make_shared<RecordingOutbox>()).ok());
}

}  // namespace
}  // namespace expertd
