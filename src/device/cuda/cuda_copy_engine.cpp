// The CUDA copy engine: CPU queues, copy streams, completion thread (see cuda_copy_engine.h).
#include "device/cuda/cuda_copy_engine.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "util/status.h"

namespace expertd::cuda {
namespace {

const CudaFenceTable& Table(const FenceTable* t) { return *static_cast<const CudaFenceTable*>(t); }
CudaFenceTable& Table(FenceTable* t) { return *static_cast<CudaFenceTable*>(t); }
// A wait's table, to give up on a source's records (AbandonSource): requests name tables const
// because copies only read them, but each is this device's own object.
CudaFenceTable& OwnTable(const FenceTable* t) {
  return *const_cast<CudaFenceTable*>(static_cast<const CudaFenceTable*>(t));
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaCopyEngine>> CudaCopyEngine::Create(DeviceContext* ctx,
                                                                       Options options) {
  RETURN_IF_ERROR(ctx->Use());
  int least = 0;
  int greatest = 0;
  EXPERTD_CUDA_RETURN_IF_ERROR(ctx->latch, cudaDeviceGetStreamPriorityRange(&least, &greatest));
  std::unique_ptr<CudaCopyEngine> engine(new CudaCopyEngine(ctx, options));
  engine->priorities_distinct_ = least != greatest;
  for (uint32_t i = 0; i < options.streams; ++i) {
    cudaStream_t s = nullptr;
    // Numerically lower is higher priority: `greatest` is the demand stream's.
    EXPERTD_CUDA_RETURN_IF_ERROR(
        ctx->latch,
        cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, i == 0 ? greatest : least));
    Lane lane;
    lane.stream = StreamOwner(s);
    engine->lanes_.push_back(std::move(lane));
  }
  engine->completion_thread_ = std::thread([e = engine.get()] { e->CompletionLoop(); });
  return engine;
}

CudaCopyEngine::~CudaCopyEngine() { Shutdown(); }

absl::Status CudaCopyEngine::Submit(CopyRequest request, CopyCallback on_complete) {
  std::lock_guard lock(mu_);
  if (stopping_) return absl::FailedPreconditionError("cuda device is shut down");
  RETURN_IF_ERROR(ctx_->latch.Get());
  const size_t q = request.priority == CopyPriority::kDemand ? 0 : 1;
  queues_[q].push_back(Job{std::move(request), std::move(on_complete)});
  DispatchLocked();
  return absl::OkStatus();
}

void CudaCopyEngine::Kick() {
  std::lock_guard lock(mu_);
  if (!stopping_) DispatchLocked();
}

bool CudaCopyEngine::EligibleLocked(const CopyRequest& request) {
  for (const FenceWait& w : request.waits) {
    CudaFenceTable& table = OwnTable(w.fences);
    const WaitAction action = table.ForWait(w.slot, w.generation);
    if (action == WaitAction::kNotDeclared) return false;
    if (action != WaitAction::kWaitDoneEvent) continue;
    // A reader's done record still pending: hold the copy here rather than queue a GPU-side
    // wait on it. A cudaStreamWaitEvent cannot be withdrawn, and a record of a process that
    // dies before reaching it may never complete: the copy stream (and every copy behind it,
    // of every client) would stop for good. Held here, DropSource (the process exited), the
    // record completing, or its deadline passing lets it go; the completion thread re-checks
    // every poll_interval.
    for (const CudaFenceTable::DoneWait& done : table.DoneWaits(w.slot)) {
      const cudaError_t q = cudaEventQuery(done.event);
      if (q == cudaSuccess) continue;
      if (q != cudaErrorNotReady) {
        GiveUpOnRecordLocked(table, done, q);
        continue;
      }
      const auto pending = std::chrono::steady_clock::now() - done.declared_at;
      if (pending < absl::ToChronoNanoseconds(options_.done_record_timeout)) return false;
      table.AbandonSource(
          done.source,
          absl::DeadlineExceededError(absl::StrCat(
              "a done record of this session (slot ", w.slot, ") was still pending ",
              absl::FormatDuration(options_.done_record_timeout),
              " after its release: the daemon took the session's slots back")));
    }
  }
  return true;
}

void CudaCopyEngine::GiveUpOnRecordLocked(CudaFenceTable& table,
                                          const CudaFenceTable::DoneWait& done,
                                          cudaError_t error) {
  // The record is the client's, made in its context, which may be gone or broken
  // (cudaErrorUnknown, cudaErrorContextIsDestroyed) while this device's context is fine: ask
  // this device's own demand stream which it is.
  const cudaError_t own = cudaStreamQuery(lanes_[0].stream.get());
  if (own != cudaSuccess && own != cudaErrorNotReady) {
    (void)ctx_->latch.Observe(EXPERTD_CUDA_ERROR(own, "cudaStreamQuery(demand stream)"));
    return;  // this device is broken: the copy fails when it is enqueued
  }
  table.AbandonSource(
      done.source,
      Annotate(EXPERTD_CUDA_ERROR(error, "cudaEventQuery(a done event of this session)"),
               "the client's context failed with its done record pending (this device's own "
               "stream is fine); the daemon took the session's slots back"));
}

bool CudaCopyEngine::WaitingLocked() const { return !queues_[0].empty() || !queues_[1].empty(); }

CudaCopyEngine::Lane* CudaCopyEngine::PrefetchLaneLocked() {
  Lane* best = nullptr;
  const size_t first = lanes_.size() > 1 ? 1 : 0;
  for (size_t i = first; i < lanes_.size(); ++i) {
    Lane& lane = lanes_[i];
    if (lane.prefetches >= options_.prefetch_in_flight) continue;
    if (best == nullptr || lane.in_flight.size() < best->in_flight.size()) best = &lane;
  }
  return best;
}

void CudaCopyEngine::DispatchLocked() {
  if (!WaitingLocked()) return;
  // Callers are engine, reader, gRPC and completion threads: the queries and copies below need
  // this device current on the calling thread. A failure shows in EnqueueOperations' statuses.
  (void)ctx_->Use();
  bool enqueued = false;
  for (auto it = queues_[0].begin(); it != queues_[0].end();) {
    if (!EligibleLocked(it->request)) {
      ++it;
      continue;
    }
    EnqueueLocked(std::move(*it), lanes_[0], /*prefetch=*/false);
    it = queues_[0].erase(it);
    enqueued = true;
  }
  for (auto it = queues_[1].begin(); it != queues_[1].end();) {
    Lane* lane = PrefetchLaneLocked();
    if (lane == nullptr) break;
    if (!EligibleLocked(it->request)) {
      ++it;
      continue;
    }
    EnqueueLocked(std::move(*it), *lane, /*prefetch=*/true);
    it = queues_[1].erase(it);
    enqueued = true;
  }
  // Copies still held need the completion thread polling (nothing signals a done record's
  // completion); it may be in its untimed wait, so wake it for them too.
  if (enqueued || WaitingLocked()) work_cv_.notify_one();
}

absl::Status CudaCopyEngine::EnqueueOperations(const CopyRequest& request, cudaStream_t stream,
                                               absl::Status* signal_status) {
  RETURN_IF_ERROR(ctx_->Use());
  for (const FenceWait& w : request.waits) {
    CudaFenceTable& table = OwnTable(w.fences);
    if (table.ForWait(w.slot, w.generation) != WaitAction::kWaitDoneEvent) continue;
    // One done event per session that declared a read of the slot's previous occupants.
    // EligibleLocked saw each complete; an event never goes back to pending, so this only
    // catches errors (and orders the copy after the record, which costs nothing once complete).
    for (const CudaFenceTable::DoneWait& done : table.DoneWaits(w.slot)) {
      const cudaError_t q = cudaEventQuery(done.event);
      if (q == cudaSuccess) continue;
      if (q != cudaErrorNotReady) {
        GiveUpOnRecordLocked(table, done, q);
        RETURN_IF_ERROR(ctx_->latch.Get());
        continue;
      }
      EXPERTD_CUDA_RETURN_IF_ERROR(ctx_->latch, cudaStreamWaitEvent(stream, done.event, 0));
    }
  }
  for (const CopySegment& s : request.segments) {
    uint8_t* dst = static_cast<const CudaArena*>(s.arena)->device_data() + s.arena_offset;
    EXPERTD_CUDA_RETURN_IF_ERROR(ctx_->latch, cudaMemcpyAsync(dst, s.source.data(), s.source.size(),
                                                              cudaMemcpyHostToDevice, stream));
  }
  for (const FenceSignal& s : request.signals) {
    absl::Status st = Table(s.fences).RecordReady(s.slot, s.generation, stream);
    if (st.ok()) continue;
    if (CudaErrorCodeOf(st).has_value()) return st;  // the stream is in trouble: stop here
    signal_status->Update(st);  // a stale generation: the bytes are copied, no record made
  }
  return absl::OkStatus();
}

void CudaCopyEngine::EnqueueLocked(Job job, Lane& lane, bool prefetch) {
  InFlight f;
  absl::Status signal_status;
  f.status = EnqueueOperations(job.request, lane.stream.get(), &signal_status);
  f.status.Update(signal_status);
  // Whatever was enqueued must finish before the callback lets the caller reuse the staging:
  // record the completion event even after an error (it fails only when the context is gone).
  if (event_pool_.empty()) {
    absl::StatusOr<EventOwner> e = CreateEvent(ctx_->latch, cudaEventDisableTiming);
    if (e.ok()) {
      event_pool_.push_back(*std::move(e));
    } else {
      f.status.Update(e.status());
    }
  }
  if (!event_pool_.empty()) {
    EventOwner event = std::move(event_pool_.back());
    event_pool_.pop_back();
    const cudaError_t r = cudaEventRecord(event.get(), lane.stream.get());
    if (r == cudaSuccess) {
      f.event = std::move(event);
    } else {
      f.status.Update(
          ctx_->latch.Observe(EXPERTD_CUDA_ERROR(r, "cudaEventRecord(completion event, stream)")));
      event_pool_.push_back(std::move(event));
    }
  }
  f.job = std::move(job);
  f.prefetch = prefetch;
  if (prefetch) ++lane.prefetches;
  lane.in_flight.push_back(std::move(f));
}

bool CudaCopyEngine::IdleLocked() const {
  if (!queues_[0].empty() || !queues_[1].empty() || callbacks_running_ != 0) return false;
  for (const Lane& lane : lanes_) {
    if (!lane.in_flight.empty()) return false;
  }
  return true;
}

void CudaCopyEngine::CompletionLoop() {
  // The thread's current device; a failure shows as errors of the queries below.
  (void)ctx_->Use();
  std::unique_lock lock(mu_);
  uint32_t quiet_polls = 0;
  while (true) {
    std::vector<InFlight> finished;
    bool in_flight = false;
    const bool give_up = stopping_ && std::chrono::steady_clock::now() >= shutdown_deadline_;
    for (Lane& lane : lanes_) {
      while (!lane.in_flight.empty()) {
        InFlight& f = lane.in_flight.front();
        if (f.event.get() != nullptr) {
          const cudaError_t q = cudaEventQuery(f.event.get());
          if (q == cudaErrorNotReady && !give_up) break;
          if (q == cudaErrorNotReady) {
            f.status.Update(absl::DeadlineExceededError(
                "cuda device shut down while the copy was still running on the GPU"));
            f.event = EventOwner();  // pending: destroyed asynchronously, never reused
          } else if (q != cudaSuccess) {
            f.status.Update(
                ctx_->latch.Observe(EXPERTD_CUDA_ERROR(q, "cudaEventQuery(completion event)")));
          }
        }
        if (f.prefetch) --lane.prefetches;
        finished.push_back(std::move(f));
        lane.in_flight.pop_front();
      }
      in_flight = in_flight || !lane.in_flight.empty();
    }
    if (!finished.empty()) {
      quiet_polls = 0;
      ++callbacks_running_;
      lock.unlock();
      std::vector<EventOwner> reusable;
      for (InFlight& f : finished) {
        std::move(f.job.on_complete)(std::move(f.status));
        f.job = Job{};  // drop the callback's captures outside the lock
        if (f.event.get() != nullptr) reusable.push_back(std::move(f.event));
      }
      lock.lock();
      --callbacks_running_;
      for (EventOwner& e : reusable) event_pool_.push_back(std::move(e));
      if (!stopping_) DispatchLocked();
      if (IdleLocked()) idle_cv_.notify_all();
      continue;
    }
    if (!in_flight) {
      if (stopping_) break;
      if (WaitingLocked()) {
        // Copies held for a reader's pending done record: nothing wakes us when it completes.
        work_cv_.wait_for(lock, absl::ToChronoNanoseconds(options_.poll_interval));
        DispatchLocked();
      } else {
        work_cv_.wait(lock);
      }
      continue;
    }
    // Copies on the GPU, none finished: re-check at once a few times (a copy about to finish is
    // cheaper to catch than to sleep through), then every poll_interval.
    lock.unlock();
    if (quiet_polls < 8) {
      ++quiet_polls;
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(absl::ToChronoNanoseconds(options_.poll_interval));
    }
    lock.lock();
    if (!stopping_ && WaitingLocked()) DispatchLocked();
  }
  idle_cv_.notify_all();
}

absl::Status CudaCopyEngine::Drain(absl::Duration timeout) {
  std::unique_lock lock(mu_);
  const auto idle = [this] { return IdleLocked(); };
  if (timeout == absl::InfiniteDuration()) {
    idle_cv_.wait(lock, idle);
  } else if (!idle_cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), idle)) {
    size_t waiting = queues_[0].size() + queues_[1].size();
    size_t running = 0;
    for (const Lane& lane : lanes_) running += lane.in_flight.size();
    return absl::DeadlineExceededError(
        absl::StrCat("cuda device: after ", absl::FormatDuration(timeout), ", ", waiting,
                     " copies still wait for done declarations and ", running, " are on the GPU"));
  }
  return absl::OkStatus();
}

void CudaCopyEngine::Shutdown() {
  std::lock_guard shutdown_lock(shutdown_mu_);  // two callers must not join the same thread
  std::vector<Job> cancelled;
  {
    std::lock_guard lock(mu_);
    if (!stopping_) {
      stopping_ = true;
      shutdown_deadline_ = options_.shutdown_timeout == absl::InfiniteDuration()
                               ? std::chrono::steady_clock::time_point::max()
                               : std::chrono::steady_clock::now() +
                                     absl::ToChronoNanoseconds(options_.shutdown_timeout);
    }
    for (auto& queue : queues_) {
      for (Job& job : queue) cancelled.push_back(std::move(job));
      queue.clear();
    }
  }
  work_cv_.notify_all();
  for (Job& job : cancelled) {
    std::move(job.on_complete)(absl::CancelledError("cuda device shut down before the copy"));
  }
  if (completion_thread_.joinable()) completion_thread_.join();
  idle_cv_.notify_all();
}

}  // namespace expertd::cuda
