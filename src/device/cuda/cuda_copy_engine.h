// Internal to the CUDA backend: the copy engine behind CudaDevice::SubmitCopy.
//
// Streams: lane 0 is the demand stream, created with the device's greatest priority; lanes
// 1..n-1 are prefetch streams with the least priority (one lane: everything shares it). All are
// cudaStreamNonBlocking, so nothing else in the process serializes them.
//
// A copy first waits on the CPU in one of two FIFO queues (demand, prefetch) until every
// FenceWait is declared (event_generations.h: a done event is trusted only for generations the
// client declared it recorded) and every declared done record has completed (cudaEventQuery).
// It never queues a GPU-side wait on another process's record: such a wait cannot be withdrawn,
// and the record of a process that dies first may never complete — the copy stream, and every
// copy of every client behind it, would stop for good. While copies are held, the completion
// thread re-checks them every `poll_interval` (a record completing wakes nobody). Then a copy is
// put on the GPU at once — demand copies all, prefetch copies only while their stream has fewer
// than `prefetch_in_flight` on the GPU, so a demand copy never queues behind a deep prefetch
// backlog. On its stream: one cudaMemcpyAsync per segment; for each signal a record of the
// slot's ready IPC event; then a private completion event.
//
// Completion: one thread polls the oldest completion event of each stream (cudaEventQuery;
// events on one stream complete in order) and runs the callbacks. Not cudaLaunchHostFunc: host
// functions run on a driver thread that must not call CUDA, yet our callbacks submit copies;
// a host function also holds up its stream while it runs, and one stuck behind a client's done
// event could not be abandoned at shutdown. Polling costs a cudaEventQuery per stream every
// `poll_interval` while copies are in flight or held, and nothing when idle.
//
// Thread-safety: every public member is thread-safe. Lock order: engine mutex, then a fence
// table's mutex; a table calls Kick() after releasing its own.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "device/cuda/cuda_objects.h"
#include "device/device.h"

namespace expertd::cuda {

class CudaCopyEngine {
 public:
  struct Options {
    uint32_t streams = 2;
    uint32_t prefetch_in_flight = 4;
    absl::Duration poll_interval = absl::Microseconds(50);
    absl::Duration shutdown_timeout = absl::Seconds(30);
    // A reader's done record still pending this long after its declaration is given up on
    // (CudaFenceTable::AbandonSource): a live client whose context hit a sticky error would
    // otherwise pin the slot, and stall Drain, for good.
    absl::Duration done_record_timeout = absl::Seconds(30);
  };

  // Creates the streams and starts the completion thread.
  static absl::StatusOr<std::unique_ptr<CudaCopyEngine>> Create(DeviceContext* ctx,
                                                                Options options);
  ~CudaCopyEngine();  // Shutdown()
  CudaCopyEngine(const CudaCopyEngine&) = delete;
  CudaCopyEngine& operator=(const CudaCopyEngine&) = delete;

  // `request` passed ValidateCopyRequest and names only this device's arenas and CUDA fence
  // tables. FailedPrecondition after Shutdown(); the sticky error once the device has one.
  absl::Status Submit(CopyRequest request, CopyCallback on_complete);
  absl::Status Drain(absl::Duration timeout);
  void Shutdown();
  // A done declaration arrived: queued copies may have become eligible.
  void Kick();

  uint32_t streams() const { return static_cast<uint32_t>(lanes_.size()); }
  bool priorities_distinct() const { return priorities_distinct_; }

 private:
  struct Job {
    CopyRequest request;
    CopyCallback on_complete;
  };
  struct InFlight {
    Job job;
    EventOwner event;  // recorded after the copy's last operation; empty when recording failed
    absl::Status status;
    bool prefetch = false;
  };
  struct Lane {
    StreamOwner stream;
    std::deque<InFlight> in_flight;
    uint32_t prefetches = 0;
  };

  CudaCopyEngine(DeviceContext* ctx, Options options) : ctx_(ctx), options_(options) {}

  // Whether every wait of `request` passed (declared, and each declared record completed or
  // given up on). May give up on sources (below).
  bool EligibleLocked(const CopyRequest& request);
  // A reader's done event answered `error`: the client's context failed (AbandonSource) unless
  // this device's own stream fails too (then the latch takes it).
  void GiveUpOnRecordLocked(CudaFenceTable& table, const CudaFenceTable::DoneWait& done,
                            cudaError_t error);
  bool WaitingLocked() const;  // copies wait on the CPU (for declarations or pending records)
  Lane* PrefetchLaneLocked();
  void DispatchLocked();
  void EnqueueLocked(Job job, Lane& lane, bool prefetch);
  absl::Status EnqueueOperations(const CopyRequest& request, cudaStream_t stream,
                                 absl::Status* signal_status);
  bool IdleLocked() const;
  void CompletionLoop();

  DeviceContext* const ctx_;
  const Options options_;
  std::vector<Lane> lanes_;  // fixed after Create
  bool priorities_distinct_ = false;

  std::mutex mu_;
  std::condition_variable work_cv_;  // something was put on the GPU, or stopping
  std::condition_variable idle_cv_;  // nothing queued, in flight or calling back
  std::deque<Job> queues_[2];        // [0] demand, [1] prefetch: waiting on the CPU
  std::vector<EventOwner> event_pool_;
  uint32_t callbacks_running_ = 0;
  bool stopping_ = false;
  std::chrono::steady_clock::time_point shutdown_deadline_{};

  std::mutex shutdown_mu_;
  std::thread completion_thread_;
};

}  // namespace expertd::cuda
