// Sessions on a device with per-session done fences (what the CUDA device does with IPC
// events), without a GPU: a wrapper around the host device that says it has session fences and
// records what the session layer declares. Each declaration also stores done in the shared host
// table, so copies that wait for it can go on. Checks that every session gets its own fences,
// that Release declares instead of checking counters, and that an ended session's leases and
// records are given up only when its process exited or the lease TTL passed.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>

#include "device/host/host_device.h"
#include "sessions.h"
#include "support/test_support.h"
#include "synth/synth.h"

namespace expertd {
namespace {

struct Call {
  std::string what;  // "declare", "force", "gone"
  uint64_t source = 0;
  SlotId slot = 0;
  uint64_t generation = 0;
  bool operator==(const Call&) const = default;
};

struct CallLog {
  std::mutex mu;
  std::vector<Call> calls;
  void Add(Call c) {
    std::lock_guard lock(mu);
    calls.push_back(std::move(c));
  }
  std::vector<Call> Take() {
    std::lock_guard lock(mu);
    return std::exchange(calls, {});
  }
};

class RecordingSessionFences final : public SessionFences {
 public:
  RecordingSessionFences(uint64_t source, FenceExport shared, MappedFences fences, CallLog* log)
      : source_(source), shared_(std::move(shared)), fences_(std::move(fences)), log_(log) {}
  absl::StatusOr<FenceExport> Export() const override {
    FenceExport e = shared_;
    e.handle.shm_name = "/session-fences-" + std::to_string(source_);  // this session's own
    return e;
  }
  absl::Status DeclareDone(SlotId slot, uint64_t generation) override {
    log_->Add({"declare", source_, slot, generation});
    return Store(slot, generation);
  }
  absl::Status ForceDone(SlotId slot, uint64_t generation) override {
    log_->Add({"force", source_, slot, generation});
    return Store(slot, generation);
  }
  void ClientGone() override { log_->Add({"gone", source_, 0, 0}); }

 private:
  absl::Status Store(SlotId slot, uint64_t generation) {
    if (fences_.done(slot) >= generation) return absl::OkStatus();
    return fences_.SignalDone(slot, generation);
  }
  uint64_t source_;
  FenceExport shared_;
  MappedFences fences_;
  CallLog* log_;
};

// The host device, saying it has session fences.
class SessionFenceDevice final : public Device {
 public:
  SessionFenceDevice(std::unique_ptr<Device> inner, CallLog* log)
      : inner_(std::move(inner)), caps_(inner_->caps()), log_(log) {
    caps_.session_fences = true;
  }
  std::string_view name() const override { return "host"; }
  const Capabilities& caps() const override { return caps_; }
  absl::StatusOr<std::unique_ptr<Arena>> AllocateArena(uint64_t bytes,
                                                       std::string_view label) override {
    return inner_->AllocateArena(bytes, label);
  }
  absl::StatusOr<std::unique_ptr<StagingBuffer>> AllocateStaging(uint64_t bytes) override {
    return inner_->AllocateStaging(bytes);
  }
  absl::StatusOr<std::unique_ptr<FenceTable>> CreateFences(uint32_t n_slots) override {
    return inner_->CreateFences(n_slots);
  }
  absl::Status SubmitCopy(CopyRequest request, CopyCallback on_complete) override {
    return inner_->SubmitCopy(std::move(request), std::move(on_complete));
  }
  absl::Status Drain(absl::Duration timeout) override { return inner_->Drain(timeout); }
  void Shutdown() override { inner_->Shutdown(); }
  absl::StatusOr<std::unique_ptr<SessionFences>> CreateSessionFences(FenceTable& shared) override {
    absl::StatusOr<FenceExport> e = shared.Export();
    if (!e.ok()) return e.status();
    absl::StatusOr<MappedFences> mapped = MapFences(*e);
    if (!mapped.ok()) return mapped.status();
    return std::make_unique<RecordingSessionFences>(++sources_, *e, *std::move(mapped), log_);
  }
  uint64_t sources() const { return sources_; }

 private:
  std::unique_ptr<Device> inner_;
  Capabilities caps_;
  CallLog* log_;
  uint64_t sources_ = 0;
};

class QueueOutbox final : public Outbox {
 public:
  bool Push(v1::SessionResponse message) override {
    std::lock_guard lock(mu_);
    messages_.push_back(std::move(message));
    cv_.notify_all();
    return true;
  }
  std::optional<v1::SessionResponse> Next(absl::Duration timeout = absl::Seconds(5)) {
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout),
                      [this] { return !messages_.empty(); })) {
      return std::nullopt;
    }
    v1::SessionResponse r = std::move(messages_.front());
    messages_.erase(messages_.begin());
    return r;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<v1::SessionResponse> messages_;
};

class SessionFencesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SynthOptions so;
    so.preset = "mixtral-tiny";
    so.out_dir = dir_.path();
    auto written = SynthesizeModel(so);
    ASSERT_TRUE(written.ok()) << written.status();
    auto host = MakeHostDevice();
    ASSERT_TRUE(host.ok()) << host.status();
    device_ = std::make_unique<SessionFenceDevice>(*std::move(host), &log_);
    EngineOptions eo;
    eo.slots_per_class = 16;
    eo.predictor = "none";
    auto model = ServedModel::Load({"m", written->front(), "", "", {}}, *device_, {}, eo);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = *std::move(model);
    SessionLimits limits;
    limits.reap_interval = absl::Hours(1);  // ReapOnce is called by the tests
    limits.lease_ttl = absl::Seconds(30);
    registry_ = std::make_unique<SessionRegistry>(limits);
  }
  void TearDown() override {
    registry_.reset();
    model_.reset();
  }
  // Opens and attaches a session; acquires `experts` of layer 0 and returns the grant.
  std::shared_ptr<Session> OpenAttached(const Peer& peer, std::shared_ptr<QueueOutbox> outbox) {
    auto s = registry_->Open(model_.get(), peer, "t");
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) return nullptr;
    EXPECT_TRUE(registry_->Attach((*s)->id(), peer, outbox).ok());
    return *s;
  }
  v1::Grant AcquireOne(Session& s, QueueOutbox& outbox, uint64_t seq,
                       std::vector<uint32_t> experts) {
    v1::Acquire a;
    a.set_seq(seq);
    a.set_layer(model_->catalog().layers().front().block);
    for (uint32_t e : experts) a.add_experts(e);
    s.Acquire(a);
    auto r = outbox.Next();
    EXPECT_TRUE(r.has_value() && r->has_grant()) << (r ? r->DebugString() : "no answer");
    return r && r->has_grant() ? r->grant() : v1::Grant();
  }

  testing::TempDir dir_;
  CallLog log_;
  std::unique_ptr<SessionFenceDevice> device_;
  std::unique_ptr<ServedModel> model_;
  std::unique_ptr<SessionRegistry> registry_;
  Peer peer_{true, 1000, 1000, 0};
};

TEST_F(SessionFencesTest, EverySessionIsSentItsOwnDoneFences) {
  ASSERT_TRUE(model_->session_fences());
  auto a = OpenAttached(peer_, std::make_shared<QueueOutbox>());
  auto b = OpenAttached(peer_, std::make_shared<QueueOutbox>());
  ASSERT_TRUE(a && b);
  const auto ha = a->Handles();
  const auto hb = b->Handles();
  ASSERT_EQ(ha.size(), model_->handles().size());
  ASSERT_EQ(hb.size(), ha.size());
  for (size_t c = 0; c < ha.size(); ++c) {
    // Arenas are shared; fences are each session's own, and not the class table's.
    EXPECT_EQ(ha[c].arenas(0).memory().shm_name(), hb[c].arenas(0).memory().shm_name());
    EXPECT_NE(ha[c].fences().memory().shm_name(), hb[c].fences().memory().shm_name());
    EXPECT_NE(ha[c].fences().memory().shm_name(),
              model_->handles()[c].fences().memory().shm_name());
    EXPECT_EQ(ha[c].fences().n_slots(), model_->handles()[c].fences().n_slots());
  }
  EXPECT_EQ(device_->sources(), 2 * ha.size());
}

TEST_F(SessionFencesTest, ReleaseDeclaresEverySlotAndGivesTheLeaseBack) {
  auto outbox = std::make_shared<QueueOutbox>();
  auto s = OpenAttached(peer_, outbox);
  ASSERT_TRUE(s);
  const v1::Grant g = AcquireOne(*s, *outbox, 1, {1, 4, 6});
  ASSERT_EQ(g.slots_size(), 3);
  EXPECT_EQ(registry_->LeasesOutstanding(), 1u);
  log_.Take();
  // The client never stored done in any counter: with session fences the daemon cannot check,
  // it declares (the copy engine waits on the client's record) and releases.
  v1::Release rel;
  rel.set_seq(2);
  rel.set_lease(g.lease());
  s->Release(rel);
  EXPECT_EQ(registry_->LeasesOutstanding(), 0u);
  std::vector<Call> want;
  for (const v1::GrantedSlot& slot : g.slots()) {
    want.push_back({"declare", 0, slot.slot(), slot.generation()});
  }
  std::vector<Call> got = log_.Take();
  for (Call& c : got) c.source = 0;  // which source is the fake's numbering, not the point
  EXPECT_EQ(got, want);
  // A second release of the same lease is NotFound and declares nothing.
  s->Release(rel);
  auto err = outbox->Next();
  ASSERT_TRUE(err.has_value() && err->has_error());
  EXPECT_EQ(err->error().code(), static_cast<int>(absl::StatusCode::kNotFound));
  EXPECT_TRUE(log_.Take().empty());
}

TEST_F(SessionFencesTest, AnEndedSessionsLeasesWaitForItsProcessToExit) {
  // The client: a child process that waits to be killed.
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    pause();
    _exit(0);
  }
  Peer peer = peer_;
  peer.pid = child;
  auto outbox = std::make_shared<QueueOutbox>();
  auto s = OpenAttached(peer, outbox);
  ASSERT_TRUE(s);
  const v1::Grant kept = AcquireOne(*s, *outbox, 1, {2});
  const v1::Grant released = AcquireOne(*s, *outbox, 2, {3});
  v1::Release rel;
  rel.set_seq(3);
  rel.set_lease(released.lease());
  s->Release(rel);
  log_.Take();

  // The stream ends with one lease held: it is not given back (its kernels may still read).
  registry_->End(s);
  registry_->ReapOnce(absl::Now());
  EXPECT_EQ(registry_->LeasesOutstanding(), 1u);
  EXPECT_TRUE(log_.Take().empty());

  // The process exits: the held lease is forced done and released, and nothing the process
  // recorded is waited for any more.
  kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  registry_->ReapOnce(absl::Now());
  EXPECT_EQ(registry_->LeasesOutstanding(), 0u);
  std::vector<Call> got = log_.Take();
  std::vector<std::string> what;
  for (const Call& c : got) what.push_back(c.what);
  const size_t classes = model_->handles().size();
  std::vector<std::string> want = {"force"};
  for (size_t i = 0; i < classes; ++i) want.push_back("gone");
  EXPECT_EQ(what, want);
  ASSERT_FALSE(got.empty());
  EXPECT_EQ(got[0].slot, kept.slots(0).slot());
  EXPECT_EQ(got[0].generation, kept.slots(0).generation());
  registry_->ReapOnce(absl::Now());
  EXPECT_TRUE(log_.Take().empty());  // said once
}

// An open refused at max_sessions makes nothing first: no done fences (on CUDA one IPC event per
// slot), no lane.
TEST_F(SessionFencesTest, ARefusedOpenCreatesNoFences) {
  SessionLimits limits;
  limits.max_sessions = 1;
  limits.reap_interval = absl::Hours(1);
  registry_ = std::make_unique<SessionRegistry>(limits);
  auto first = registry_->Open(model_.get(), peer_, "first");
  ASSERT_TRUE(first.ok()) << first.status();
  const uint64_t made = device_->sources();
  EXPECT_EQ(made, model_->handles().size());
  for (int i = 0; i < 10; ++i) {
    auto refused = registry_->Open(model_.get(), peer_, "more");
    ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  }
  EXPECT_EQ(device_->sources(), made);
}

TEST_F(SessionFencesTest, AClientThatDiesWithItsStreamStillOpenIsGoneOnce) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    pause();
    _exit(0);
  }
  Peer peer = peer_;
  peer.pid = child;
  auto outbox = std::make_shared<QueueOutbox>();
  auto s = OpenAttached(peer, outbox);
  ASSERT_TRUE(s);
  const v1::Grant g = AcquireOne(*s, *outbox, 1, {1});
  v1::Release rel;
  rel.set_seq(2);
  rel.set_lease(g.lease());
  s->Release(rel);
  log_.Take();
  registry_->ReapOnce(absl::Now());
  EXPECT_TRUE(log_.Take().empty());  // alive: its records are waited for
  kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  // The stream is still open (another process could hold the socket); the registry ends it
  // through the end_stream callback, which this test does not pass: the session lives on.
  registry_->ReapOnce(absl::Now());
  std::vector<Call> got = log_.Take();
  ASSERT_EQ(got.size(), model_->handles().size());
  for (const Call& c : got) EXPECT_EQ(c.what, "gone");
  registry_->ReapOnce(absl::Now());
  registry_->End(s);
  registry_->ReapOnce(absl::Now() + absl::Seconds(31));
  EXPECT_TRUE(log_.Take().empty());  // said once, also after the stream ended
}

TEST_F(SessionFencesTest, AnEndedSessionWithNothingHeldIsWatchedUntilTheTtl) {
  auto outbox = std::make_shared<QueueOutbox>();
  auto s = OpenAttached(peer_, outbox);  // pid 0: its exit cannot be seen
  ASSERT_TRUE(s);
  const v1::Grant g = AcquireOne(*s, *outbox, 1, {5});
  v1::Release rel;
  rel.set_seq(2);
  rel.set_lease(g.lease());
  s->Release(rel);
  registry_->End(s);
  log_.Take();
  registry_->ReapOnce(absl::Now() + absl::Seconds(31));
  // Nothing to force; without a visible exit the records stay trusted (never "gone").
  EXPECT_TRUE(log_.Take().empty());
  EXPECT_EQ(registry_->LeasesOutstanding(), 0u);
}

TEST_F(SessionFencesTest, ALeaseKeptPastTheTtlIsForcedForThatSessionOnly) {
  auto oa = std::make_shared<QueueOutbox>();
  auto ob = std::make_shared<QueueOutbox>();
  auto a = OpenAttached(peer_, oa);
  auto b = OpenAttached(peer_, ob);
  ASSERT_TRUE(a && b);
  const v1::Grant ga = AcquireOne(*a, *oa, 1, {7});
  const v1::Grant gb = AcquireOne(*b, *ob, 1, {7});  // the same bundle: the same slot
  ASSERT_EQ(ga.slots(0).slot(), gb.slots(0).slot());
  log_.Take();
  v1::Release rel;
  rel.set_seq(2);
  rel.set_lease(gb.lease());
  b->Release(rel);
  registry_->ReapOnce(absl::Now() + absl::Seconds(31));
  auto expired = oa->Next();
  ASSERT_TRUE(expired.has_value() && expired->has_lease_expired());
  EXPECT_EQ(expired->lease_expired().lease(), ga.lease());
  std::vector<Call> got = log_.Take();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].what, "declare");
  EXPECT_EQ(got[1].what, "force");
  EXPECT_NE(got[0].source, got[1].source);  // b declared; a was forced
  EXPECT_EQ(registry_->LeasesOutstanding(), 0u);
}

}  // namespace
}  // namespace expertd
