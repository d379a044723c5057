// See session_impl.h.
#include "session_impl.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "expertd/v1/service.grpc.pb.h"
#include "lane/lane.h"
#include "local_hits.h"

namespace expertd::client::internal {
namespace {

// How long a caller watches the lane for its answer (yielding the core meanwhile) before it
// sleeps on the lane's doorbell: a hit is answered within microseconds, a miss takes a read.
constexpr absl::Duration kLaneSpin = absl::Microseconds(50);
// How long Close waits for the GPU work that reads client-side hits of released leases.
constexpr absl::Duration kDrainPins = absl::Seconds(30);

class SessionImpl final : public Session {
 public:
  SessionImpl(std::shared_ptr<grpc::Channel> channel, v1::OpenSessionResponse info,
              std::vector<SlotClassView> classes, std::unique_ptr<ClientLane> lane,
              int cuda_device, bool client_hits)
      : stub_(v1::Expertd::NewStub(channel)), info_(std::move(info)),
        classes_(std::move(classes)), cuda_(info_.device_kind() == "cuda"),
        cuda_device_(cuda_ ? cuda_device : -1), lane_(std::move(lane)) {
    if (client_hits && lane_ != nullptr) {
      hits_ = LocalHits::Make(info_, classes_, lane_->end.pins(), cuda_device_);
    }
  }

  ~SessionImpl() override { Close(); }

  absl::Status Start() {
    stream_ = stub_->Session(&context_);
    v1::SessionRequest attach;
    attach.mutable_attach()->set_session_id(info_.session_id());
    v1::SessionResponse reply;
    if (!stream_->Write(attach) || !stream_->Read(&reply) || !reply.has_attached()) {
      grpc::Status st = stream_->Finish();
      stream_.reset();
      return FromGrpc(st.ok() ? grpc::Status(grpc::StatusCode::UNKNOWN, "no Attached reply") : st,
                      "attach");
    }
    reader_ = std::thread([this] { ReadLoop(); });
    return absl::OkStatus();
  }

  const v1::ModelInfo& model() const override { return info_.model(); }
  const v1::OpenSessionResponse& info() const override { return info_; }
  int cuda_device() const override { return cuda_device_; }

  absl::StatusOr<ArenaRef> arena(uint32_t slot_class, uint32_t projection) const override {
    if (slot_class >= classes_.size() || projection >= classes_[slot_class].strides.size()) {
      return absl::InvalidArgumentError(absl::StrCat("no arena for slot class ", slot_class,
                                                     " projection ", projection));
    }
    const SlotClassView& c = classes_[slot_class];
    ArenaRef ref;
    if (cuda_) {
      ref.keep_alive = c.cuda_arenas[projection];
      ref.device_ptr = c.cuda_arenas[projection]->device_ptr();
      ref.device_bytes = c.cuda_arenas[projection]->bytes();
    } else {
      ref.keep_alive = c.arenas[projection];
      ref.bytes = c.arenas[projection]->data();
    }
    ref.stride = c.strides[projection];
    ref.slots = info_.slot_classes(static_cast<int>(slot_class)).slots();
    return ref;
  }

  absl::StatusOr<Lease> Acquire(uint32_t layer, std::span<const uint32_t> experts,
                                absl::Duration timeout) override {
    // A session whose stream or lane ended serves nothing from the table: the daemon answers.
    if (hits_ && lane_->end.state() == lane::kStateOpen && !closed()) {
      if (std::optional<Lease> local = hits_->TryLease(layer, experts)) {
        ReportHits(layer, experts);
        return *std::move(local);
      }
    }
    const absl::Time deadline = absl::Now() + timeout;
    absl::Duration backoff = absl::Microseconds(200);
    for (;;) {
      absl::StatusOr<v1::Grant> grant = AcquireOnce(layer, experts, deadline);
      if (grant.ok()) {
        absl::StatusOr<Lease> lease = ToLease(*grant, deadline);
        if (!lease.ok()) GiveBack(*grant);  // the daemon would hold it until its TTL otherwise
        return lease;
      }
      if (grant.status().code() != absl::StatusCode::kUnavailable || closed()) return grant.status();
      if (absl::Now() + backoff >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "acquire layer ", layer, ": no slots free before the timeout (", grant.status().message(), ")"));
      }
      absl::SleepFor(backoff);
      backoff = std::min(backoff * 2, absl::Milliseconds(20));
    }
  }

  absl::Status Prefetch(uint32_t layer, std::span<const uint32_t> experts) override {
    PrefetchHint hint{layer, {experts.begin(), experts.end()}};
    return Prefetch(std::span<const PrefetchHint>(&hint, 1));
  }

  absl::Status Prefetch(std::span<const PrefetchHint> hints) override {
    if (lane_) {
      std::vector<lane::PrefetchGroup> groups;
      for (const PrefetchHint& h : hints) groups.push_back({h.layer, h.experts});
      return WriteLane([&](std::vector<uint8_t>* out) { return lane::EncodePrefetch(groups, out); },
                       absl::Now() + absl::Seconds(5));
    }
    for (const PrefetchHint& h : hints) {
      v1::SessionRequest r;
      r.mutable_prefetch()->set_layer(h.layer);
      for (uint32_t e : h.experts) r.mutable_prefetch()->add_experts(e);
      if (absl::Status st = SendRaw(r); !st.ok()) return st;
    }
    return absl::OkStatus();
  }

  std::string_view transport() const override { return lane_ ? "lane" : "stream"; }
  bool client_hits() const override { return hits_ != nullptr; }

  absl::Status WaitReady(const Lease& lease, void* cuda_stream) override {
    if (!cuda_) return absl::OkStatus();
    // A client-side hit's bytes landed before its slot was published: nothing to wait for, but
    // the stream must be one of the session's GPU, as for any lease.
    if (LocalHits::IsLocal(lease.id)) {
      if (absl::Status st = CheckCudaStreamIfBuilt(cuda_stream, cuda_device_); !st.ok()) return st;
    } else {
      for (const SlotView& s : lease.slots) {
        absl::Status st =
            classes_.at(s.slot_class).events->WaitReady(s.slot, s.generation, cuda_stream);
        if (!st.ok()) return st;
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    waited_.insert(lease.id);
    return absl::OkStatus();
  }

  absl::Status WaitReadyOnHost(const Lease& lease) override {
    if (!cuda_) return absl::OkStatus();
    // A client-side hit's bytes landed before its slot was published: nothing to wait for.
    if (!LocalHits::IsLocal(lease.id)) {
      for (const SlotView& s : lease.slots) {
        absl::Status st = classes_.at(s.slot_class).events->WaitReadyOnHost(s.slot, s.generation);
        if (!st.ok()) return st;
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    waited_.insert(lease.id);
    return absl::OkStatus();
  }

  absl::Status CopySlot(const SlotView& slot, size_t projection, std::span<uint8_t> out,
                        void* cuda_stream) override {
    if (slot.slot_class >= classes_.size() ||
        projection >= classes_[slot.slot_class].strides.size()) {
      return absl::InvalidArgumentError(absl::StrCat("no projection ", projection, " in class ",
                                                     slot.slot_class));
    }
    const SlotClassView& c = classes_[slot.slot_class];
    const uint64_t stride = c.strides[projection];
    if (out.size() != stride) {
      return absl::InvalidArgumentError(
          absl::StrCat("CopySlot: ", out.size(), " bytes asked, a slot holds ", stride));
    }
    if (!cuda_) {
      if (projection >= slot.projections.size()) {
        return absl::InvalidArgumentError("CopySlot: the slot view has no such projection");
      }
      std::memcpy(out.data(), slot.projections[projection].data(), stride);
      return absl::OkStatus();
    }
    return c.cuda_arenas[projection]->CopyToHost(uint64_t{slot.slot} * stride, out, cuda_stream);
  }

  absl::Status RecordDone(const Lease& lease, void* cuda_stream) override {
    if (!cuda_) return SignalHostDone(lease);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!waited_.contains(lease.id)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "lease ", lease.id, ": RecordDone before WaitReady (the kernels cannot have read it)"));
      }
    }
    if (LocalHits::IsLocal(lease.id)) {
      // Its pins hold the slots until the kernels queued so far on the stream finished.
      if (hits_ == nullptr) return absl::InvalidArgumentError("no lease of this session");
      if (absl::Status st = hits_->RecordDone(lease, cuda_stream); !st.ok()) return st;
    } else {
      for (const SlotView& s : lease.slots) {
        absl::Status st =
            classes_.at(s.slot_class).events->RecordDone(s.slot, s.generation, cuda_stream);
        if (!st.ok()) return st;
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    recorded_.insert(lease.id);
    return absl::OkStatus();
  }

  absl::Status Release(const Lease& lease) override { return Give(lease, /*wake=*/true); }
  absl::Status ReleaseLater(const Lease& lease) override { return Give(lease, /*wake=*/false); }

  void Flush() override {
    if (lane_) lane_->end.Flush();
  }

  absl::Status Give(const Lease& lease, bool wake) {
    const bool local = LocalHits::IsLocal(lease.id);
    if (local && hits_ == nullptr) return absl::InvalidArgumentError("no lease of this session");
    if (cuda_) {
      // Recorded: the daemon's next copies wait for the record (a client-side hit: its pins
      // stay until the record's work finished). Never waited for: no stream of this library was
      // ordered after its copies, so nothing read it through us (a give-back, e.g. after a
      // failed acquire). Waited but not recorded: kernels may be reading it.
      std::lock_guard<std::mutex> lock(mu_);
      if (!recorded_.contains(lease.id) && waited_.contains(lease.id)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "lease ", lease.id, ": call RecordDone on the stream that read it before Release (",
            local ? "its slots stay pinned until that record's work finished"
                  : "the daemon's next copy into its slots waits on that record",
            ")"));
      }
      recorded_.erase(lease.id);
      waited_.erase(lease.id);
    }
    if (local) return hits_->Release(lease);
    if (!cuda_) {
      if (absl::Status st = SignalHostDone(lease); !st.ok()) return st;
    }
    return SendRelease(NextSeq(), lease.id, wake);
  }

  absl::Status SendRelease(uint64_t seq, uint64_t lease, bool wake = true) {
    if (lane_) {
      const uint64_t one[] = {lease};
      return WriteLane([&](std::vector<uint8_t>* out) { return lane::EncodeRelease(seq, one, out); },
                       absl::Now() + absl::Seconds(5), wake);
    }
    v1::SessionRequest r;
    r.mutable_release()->set_seq(seq);
    r.mutable_release()->set_lease(lease);
    return SendRaw(r);
  }

  absl::Status SignalHostDone(const Lease& lease) {
    if (LocalHits::IsLocal(lease.id)) return absl::OkStatus();  // pinned: nothing waits for done
    for (const SlotView& s : lease.slots) {
      MappedFences* f = classes_.at(s.slot_class).fences.get();
      if (f->done(s.slot) < s.generation) {
        absl::Status st = f->SignalDone(s.slot, s.generation);
        if (!st.ok() && f->done(s.slot) < s.generation) return st;
      }
    }
    return absl::OkStatus();
  }

  absl::Status SendRaw(const v1::SessionRequest& request) override {
    std::lock_guard<std::mutex> lock(write_mu_);
    if (!stream_ || closed()) return absl::UnavailableError("the session stream has ended");
    if (!stream_->Write(request)) return absl::UnavailableError("the session stream has ended");
    return absl::OkStatus();
  }

  std::vector<v1::RequestError> TakeAsyncErrors() override {
    if (lane_) PumpLane(nullptr);
    std::lock_guard<std::mutex> lock(mu_);
    return std::exchange(async_errors_, {});
  }
  std::vector<uint64_t> TakeExpiredLeases() override {
    if (lane_) PumpLane(nullptr);
    std::lock_guard<std::mutex> lock(mu_);
    return std::exchange(expired_, {});
  }

  void Close() override {
    // The daemon drops this session's pins when it ends: kernels still reading client-side
    // hits must finish first.
    if (hits_) hits_->Drain(kDrainPins);
    {
      std::lock_guard<std::mutex> lock(write_mu_);
      if (!stream_ || writes_done_) return;
      writes_done_ = true;
      stream_->WritesDone();
    }
    if (reader_.joinable()) reader_.join();
  }

 private:
  struct Waiter {
    bool answered = false;
    bool abandoned = false;
    v1::Grant grant;
    absl::Status status;
  };

  // The daemon learns of client-side hits from a record it reads with its next look at the
  // lane (no wake-up): eviction recency, statistics and the predictor see every access. A full
  // ring wakes it; a report that still finds no room is dropped (counted nowhere but harmless).
  void ReportHits(uint32_t layer, std::span<const uint32_t> experts) {
    std::lock_guard<std::mutex> lock(lane_->write_mu);
    lane_->record.clear();
    if (!lane::EncodeHits(layer, experts, &lane_->record).ok()) return;
    if (!lane_->end.Write(lane_->record, /*wake=*/false)) lane_->end.Write(lane_->record);
  }

  uint64_t NextSeq() {
    std::lock_guard<std::mutex> lock(mu_);
    return next_seq_++;
  }
  bool closed() {
    std::lock_guard<std::mutex> lock(mu_);
    return stream_ended_;
  }

  absl::StatusOr<v1::Grant> AcquireOnce(uint32_t layer, std::span<const uint32_t> experts,
                                        absl::Time deadline) {
    auto waiter = std::make_shared<Waiter>();
    v1::SessionRequest r;
    uint64_t seq;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stream_ended_) return absl::UnavailableError(absl::StrCat("the session stream has ended: ", end_reason_));
      seq = next_seq_++;
      waiters_[seq] = waiter;
    }
    absl::Status sent;
    if (lane_) {
      sent = WriteLane(
          [&](std::vector<uint8_t>* out) { return lane::EncodeAcquire(seq, layer, experts, out); },
          deadline);
    } else {
      r.mutable_acquire()->set_seq(seq);
      r.mutable_acquire()->set_layer(layer);
      for (uint32_t e : experts) r.mutable_acquire()->add_experts(e);
      sent = SendRaw(r);
    }
    if (!sent.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      waiters_.erase(seq);
      return sent;
    }
    if (lane_) WaitLane(*waiter, deadline);
    std::unique_lock<std::mutex> lock(mu_);
    while (!waiter->answered) {
      if (!lane_broken_.ok()) {
        waiter->abandoned = true;
        return lane_broken_;
      }
      if (cv_.wait_until(lock, absl::ToChronoTime(deadline)) == std::cv_status::timeout &&
          !waiter->answered) {
        // The grant may still come: the reader thread gives it back then.
        waiter->abandoned = true;
        return absl::DeadlineExceededError(absl::StrCat("acquire layer ", layer, ": no grant before the timeout"));
      }
    }
    if (!waiter->status.ok()) return waiter->status;
    return std::move(waiter->grant);
  }

  absl::StatusOr<Lease> ToLease(const v1::Grant& g, absl::Time deadline) {
    Lease lease;
    lease.id = g.lease();
    lease.layer = g.layer();
    lease.stall = absl::Microseconds(static_cast<int64_t>(g.stall_us()));
    for (const v1::GrantedSlot& s : g.slots()) {
      if (s.slot_class() >= classes_.size()) {
        return absl::InternalError(absl::StrCat("grant names slot class ", s.slot_class()));
      }
      const SlotClassView& c = classes_[s.slot_class()];
      if (!cuda_) {
        absl::Status ready = c.fences->WaitReady(s.slot(), s.generation(), deadline - absl::Now());
        if (!ready.ok()) return ready;
      }
      SlotView v;
      v.expert = s.expert();
      v.slot_class = s.slot_class();
      v.slot = s.slot();
      v.generation = s.generation();
      v.hit = s.hit();
      if (absl::Status mapped = AddSlotProjections(c, cuda_, s.slot(), &v); !mapped.ok()) {
        return mapped;
      }
      lease.slots.push_back(std::move(v));
    }
    return lease;
  }

  // Gives back a grant nobody will read (its acquire timed out). CUDA: no record is needed,
  // nothing of this session read the slots under this grant.
  void GiveBack(const v1::Grant& g) {
    for (const v1::GrantedSlot& s : g.slots()) {
      if (cuda_ || s.slot_class() >= classes_.size()) continue;
      MappedFences* f = classes_[s.slot_class()].fences.get();
      if (f->done(s.slot()) < s.generation()) (void)f->SignalDone(s.slot(), s.generation());
    }
    (void)SendRelease(0, g.lease());
  }

  // Writes one request record into the lane, waiting (reading answers meanwhile, so a full lane
  // drains) until there is room, the session ends or `deadline`.
  template <typename Encode>
  absl::Status WriteLane(Encode encode, absl::Time deadline, bool wake = true) {
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(lane_->write_mu);
        lane_->record.clear();
        if (absl::Status st = encode(&lane_->record); !st.ok()) return st;
        if (closed()) return absl::UnavailableError(absl::StrCat("the session stream has ended: ", EndReason()));
        if (lane_->end.state() != lane::kStateOpen) {
          return absl::UnavailableError("the session's request lane was closed by the daemon");
        }
        if (lane_->end.Write(lane_->record, wake)) return absl::OkStatus();
      }
      PumpLane(nullptr);
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError("the session's request lane stayed full");
      }
      absl::SleepFor(absl::Microseconds(20));
    }
  }

  // Reads every answer waiting in the lane and hands each to its waiter (as the stream's reader
  // thread does). Returns without reading when another thread is at it. Wakes the other sleeping
  // threads of this process when one of their answers was read here.
  void PumpLane(const Waiter* mine) {
    std::unique_lock<std::mutex> reading(lane_->read_mu, std::try_to_lock);
    if (!reading.owns_lock()) return;
    bool others = false;
    std::vector<v1::Grant> give_back;
    for (;;) {
      lane::Response r;
      bool got = false;
      if (absl::Status st = lane_->end.Next(&r, &got); !st.ok()) {
        std::lock_guard<std::mutex> lock(mu_);
        lane_broken_ = st;
        others = true;
        break;
      }
      if (!got) break;
      v1::SessionResponse resp;
      if (r.type == lane::RecordType::kGrant) {
        v1::Grant* g = resp.mutable_grant();
        g->set_seq(r.seq);
        g->set_lease(r.lease);
        g->set_layer(r.layer);
        g->set_stall_us(r.stall_ns / 1000);
        for (const lane::GrantSlot& s : r.slots) {
          v1::GrantedSlot* o = g->add_slots();
          o->set_expert(s.expert);
          o->set_slot_class(s.slot_class);
          o->set_slot(s.slot);
          o->set_generation(s.generation);
          o->set_hit(s.hit);
        }
      } else if (r.type == lane::RecordType::kError) {
        resp.mutable_error()->set_seq(r.seq);
        resp.mutable_error()->set_code(r.code);
        resp.mutable_error()->set_message(std::move(r.message));
      } else {
        resp.mutable_lease_expired()->set_lease(r.lease);
      }
      if (const Waiter* w = Dispatch(resp, &give_back); w != nullptr && w != mine) others = true;
    }
    reading.unlock();
    if (others) lane_->end.WakeAll();
    for (const v1::Grant& g : give_back) GiveBack(g);
  }

  // Until `waiter` is answered, the session ends or `deadline`: watches the lane for kLaneSpin,
  // then sleeps on its doorbell.
  void WaitLane(const Waiter& waiter, absl::Time deadline) {
    const absl::Time spin_until = absl::Now() + kLaneSpin;
    for (;;) {
      const uint32_t seen = lane_->end.doorbell();
      PumpLane(&waiter);
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (waiter.answered || stream_ended_) return;
        if (!lane_broken_.ok()) return;
        if (lane_->end.state() != lane::kStateOpen) {
          // The daemon failed or closed the lane: the stream's end follows and answers us.
          cv_.wait_until(lock, absl::ToChronoTime(deadline), [&] { return waiter.answered; });
          return;
        }
      }
      const absl::Time now = absl::Now();
      if (now >= deadline) return;
      if (now < spin_until) {
        // Yield, not pause: on a busy host the daemon's lane thread may need this very core.
        std::this_thread::yield();
        continue;
      }
      lane_->end.Sleep(seen, std::min(deadline - now, absl::Milliseconds(100)));
      // Sleep returns at once while answers wait that another thread is reading: let it.
      std::this_thread::yield();
    }
  }

  // Hands one answer to its waiter (or to the async lists). Returns the waiter it answered.
  // A grant for an abandoned waiter goes to `give_back` (the caller releases it once it holds no
  // lock of the lane).
  const Waiter* Dispatch(v1::SessionResponse& resp, std::vector<v1::Grant>* give_back) {
    std::unique_lock<std::mutex> lock(mu_);
    if (resp.has_grant() || resp.has_error()) {
      const uint64_t seq = resp.has_grant() ? resp.grant().seq() : resp.error().seq();
      auto it = waiters_.find(seq);
      if (it == waiters_.end()) {
        if (resp.has_error()) async_errors_.push_back(resp.error());
        return nullptr;
      }
      std::shared_ptr<Waiter> w = it->second;
      waiters_.erase(it);
      if (w->abandoned) {
        if (resp.has_grant()) give_back->push_back(std::move(*resp.mutable_grant()));
        return nullptr;
      }
      w->answered = true;
      if (resp.has_grant()) {
        w->grant = std::move(*resp.mutable_grant());
      } else {
        w->status = absl::Status(static_cast<absl::StatusCode>(resp.error().code()),
                                 resp.error().message());
      }
      cv_.notify_all();
      return w.get();
    }
    if (resp.has_lease_expired()) expired_.push_back(resp.lease_expired().lease());
    return nullptr;
  }

  void ReadLoop() {
    v1::SessionResponse resp;
    std::vector<v1::Grant> give_back;
    while (stream_->Read(&resp)) {
      Dispatch(resp, &give_back);
      for (const v1::Grant& g : give_back) GiveBack(g);
      give_back.clear();
    }
    const grpc::Status st = stream_->Finish();
    {
      std::lock_guard<std::mutex> lock(mu_);
      stream_ended_ = true;
      end_reason_ = st.ok() ? "closed" : st.error_message();
      for (auto& [seq, w] : waiters_) {
        w->answered = true;
        w->status = absl::UnavailableError(absl::StrCat("the session stream ended: ", end_reason_));
      }
      waiters_.clear();
      cv_.notify_all();
    }
    if (lane_) lane_->end.WakeAll();
  }

  std::string EndReason() {
    std::lock_guard<std::mutex> lock(mu_);
    return end_reason_;
  }

  std::unique_ptr<v1::Expertd::Stub> stub_;
  const v1::OpenSessionResponse info_;
  std::vector<SlotClassView> classes_;
  const bool cuda_;
  const int cuda_device_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::SessionRequest, v1::SessionResponse>> stream_;
  std::thread reader_;
  std::mutex write_mu_;
  bool writes_done_ = false;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t next_seq_ = 1;
  std::map<uint64_t, std::shared_ptr<Waiter>> waiters_;
  std::vector<v1::RequestError> async_errors_;
  std::vector<uint64_t> expired_;
  std::set<uint64_t> waited_;    // CUDA: leases whose ready events a stream waits on
  std::set<uint64_t> recorded_;  // CUDA: leases whose done events were recorded
  bool stream_ended_ = false;
  std::string end_reason_;
  std::unique_ptr<ClientLane> lane_;  // nullptr: requests go on the stream
  absl::Status lane_broken_;          // the daemon wrote a record this client cannot read
  std::unique_ptr<LocalHits> hits_;   // nullptr: every acquire asks the daemon
};

}  // namespace

absl::StatusOr<std::unique_ptr<Session>> StartSession(std::shared_ptr<grpc::Channel> channel,
                                                      v1::OpenSessionResponse info,
                                                      std::vector<SlotClassView> classes,
                                                      std::unique_ptr<ClientLane> lane,
                                                      int cuda_device, bool client_hits) {
  auto session = std::make_unique<SessionImpl>(std::move(channel), std::move(info),
                                               std::move(classes), std::move(lane), cuda_device,
                                               client_hits);
  if (absl::Status a = session->Start(); !a.ok()) return a;
  return std::unique_ptr<Session>(std::move(session));
}

}  // namespace expertd::client::internal
