#include "pack/reader_pool.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "util/os_file.h"
#include "util/status.h"

namespace expertd {
namespace reader_detail {

// Shared by the parts of one job and the caller's handle. The last part to finish runs the
// callback; the acq_rel countdown makes every part's destination writes visible to it.
struct JobState {
  JobState(ReadDone cb, JobCounters* job_counters, int parts)
      : done(std::move(cb)), counters(job_counters), remaining(parts) {}

  // Statuses are moved, never copied, between threads: Debian's Abseil is not built for
  // ThreadSanitizer, so a status representation shared by two threads shows as a false race.
  void Finish(absl::Status status) {
    if (!status.ok()) {
      std::lock_guard lock(mu);
      if (first_error.ok()) first_error = std::move(status);
      failed.store(true, std::memory_order_release);
    }
    if (remaining.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    absl::Status result;
    {
      std::lock_guard lock(mu);
      result = std::move(first_error);
    }
    if (result.ok()) {
      counters->ok.fetch_add(1, std::memory_order_relaxed);
    } else if (absl::IsCancelled(result)) {
      counters->cancelled.fetch_add(1, std::memory_order_relaxed);
    } else {
      counters->failed.fetch_add(1, std::memory_order_relaxed);
    }
    // Moved out so captures are released now, not when the last handle goes.
    ReadDone cb = std::move(done);
    cb(std::move(result));
  }

  ReadDone done;
  JobCounters* counters;
  std::atomic<int> remaining;
  std::atomic<bool> cancelled{false};
  // kStarted: some part began reading; kRefused: TryCancel won the race, no part may start.
  static constexpr uint32_t kStarted = 1, kRefused = 2;
  std::atomic<uint32_t> phase{0};
  std::atomic<bool> failed{false};  // some part failed: the others stop early
  std::mutex mu;
  absl::Status first_error;  // guarded by mu
};

// The ranges of one job that belong to one source group, already merged.
struct JobPart {
  std::shared_ptr<JobState> job;
  std::vector<ReadRange> reads;
  ReadPriority priority = ReadPriority::kDemand;
};

class ReaderPool {
 public:
  ReaderPool(const PackSet& packs, std::string name, uint32_t threads)
      : packs_(packs), name_(std::move(name)) {
    threads_.reserve(threads);
    for (uint32_t i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
  }
  ~ReaderPool() {
    Stop();
    for (std::thread& t : threads_) t.join();
  }
  ReaderPool(const ReaderPool&) = delete;
  ReaderPool& operator=(const ReaderPool&) = delete;

  void Push(JobPart part) {
    {
      std::lock_guard lock(mu_);
      if (!stopping_) {
        (part.priority == ReadPriority::kDemand ? demand_ : prefetch_).push_back(std::move(part));
        work_.notify_one();
        return;
      }
    }
    part.job->Finish(absl::CancelledError("reader pools are shutting down"));
  }

  void Stop() {
    std::lock_guard lock(mu_);
    stopping_ = true;
    work_.notify_all();
  }

  const std::string& name() const { return name_; }
  uint32_t threads() const { return static_cast<uint32_t>(threads_.size()); }

  std::atomic<uint64_t> demand_parts{0};
  std::atomic<uint64_t> prefetch_parts{0};
  std::atomic<uint64_t> cancelled_parts{0};
  std::atomic<uint64_t> merges{0};

 private:
  void Loop() {
    // Thread names show the group in top/perf; Linux limits them to 15 characters.
    SetCurrentThreadName(absl::StrCat("rd ", name_));
    ReadScratch scratch;
    for (;;) {
      JobPart part;
      bool stopping = false;
      {
        std::unique_lock lock(mu_);
        work_.wait(lock, [this] { return stopping_ || !demand_.empty() || !prefetch_.empty(); });
        std::deque<JobPart>& queue = !demand_.empty() ? demand_ : prefetch_;
        if (queue.empty()) return;  // stopping and drained
        part = std::move(queue.front());
        queue.pop_front();
        stopping = stopping_;
      }
      if (stopping) {
        cancelled_parts.fetch_add(1, std::memory_order_relaxed);
        part.job->Finish(absl::CancelledError("reader pools shut down before the read job ran"));
        continue;
      }
      Run(part, scratch);
    }
  }

  void Run(JobPart& part, ReadScratch& scratch) {
    JobState& job = *part.job;
    // Claim the start (or see that TryCancel refused it): both are RMWs of `phase`, so exactly
    // one of them wins.
    const uint32_t phase = job.phase.fetch_or(JobState::kStarted, std::memory_order_acq_rel);
    if ((phase & JobState::kRefused) != 0 || job.cancelled.load(std::memory_order_acquire)) {
      cancelled_parts.fetch_add(1, std::memory_order_relaxed);
      job.Finish(absl::CancelledError("read job cancelled before it started"));
      return;
    }
    (part.priority == ReadPriority::kDemand ? demand_parts : prefetch_parts)
        .fetch_add(1, std::memory_order_relaxed);
    absl::Status status;
    for (const ReadRange& r : part.reads) {
      // Another part already failed the job; its error is recorded and wins.
      if (job.failed.load(std::memory_order_acquire)) break;
      if (job.cancelled.load(std::memory_order_acquire)) {
        status = absl::CancelledError("read job cancelled while reading");
        break;
      }
      status = packs_.Read(r.pack, r.offset, std::span<uint8_t>(r.dst, r.bytes), scratch);
      if (!status.ok()) break;
    }
    job.Finish(std::move(status));
  }

  const PackSet& packs_;
  const std::string name_;
  // std primitives rather than absl::Mutex: Debian's Abseil is not built for ThreadSanitizer.
  std::mutex mu_;
  std::condition_variable work_;
  std::deque<JobPart> demand_;    // guarded by mu_
  std::deque<JobPart> prefetch_;  // guarded by mu_
  bool stopping_ = false;         // guarded by mu_
  std::vector<std::thread> threads_;
};

}  // namespace reader_detail

using reader_detail::JobPart;
using reader_detail::JobState;
using reader_detail::ReaderPool;

void ReadJobHandle::Cancel() const {
  if (job_) job_->cancelled.store(true, std::memory_order_release);
}

bool ReadJobHandle::TryCancel() const {
  if (!job_) return false;
  uint32_t phase = job_->phase.load(std::memory_order_acquire);
  do {
    if ((phase & JobState::kStarted) != 0) return false;
  } while (!job_->phase.compare_exchange_weak(
      phase, phase | JobState::kRefused, std::memory_order_acq_rel, std::memory_order_acquire));
  job_->cancelled.store(true, std::memory_order_release);
  return true;
}

ReaderPools::ReaderPools(const PackSet& packs, const ReaderPoolOptions& options)
    : packs_(packs),
      max_merge_gap_(options.max_merge_gap_bytes),
      stopping_hook_(options.stopping_hook) {
  for (const SourceGroup& group : packs.groups()) {
    const auto it = options.group_threads.find(group.name);
    const uint32_t n = it != options.group_threads.end() ? it->second : options.threads_per_group;
    pools_.push_back(std::make_unique<ReaderPool>(packs, group.name, std::max<uint32_t>(n, 1)));
  }
}

ReaderPools::~ReaderPools() {
  // Stop every pool first so all groups cancel their queues at once, then join them.
  for (auto& pool : pools_) pool->Stop();
  if (stopping_hook_) stopping_hook_();
  pools_.clear();
}

absl::StatusOr<ReadJobHandle> ReaderPools::Submit(ReadJob job) {
  std::vector<ReadRange> ranges;
  ranges.reserve(job.ranges.size());
  for (const ReadRange& r : job.ranges) {
    RETURN_IF_ERROR(packs_.CheckRange(r.pack, r.offset, r.bytes));
    if (r.bytes == 0) continue;
    if (r.dst == nullptr) {
      return InvalidError(
          ErrorKind::kBadValue,
          absl::StrCat("read job: null destination for ", r.bytes, " bytes of pack ",
                       packs_.pack(r.pack).label, " at byte ", r.offset));
    }
    ranges.push_back(r);
  }
  if (pools_.empty()) {
    return InvalidError(ErrorKind::kBadValue, "read job submitted to reader pools without packs");
  }

  // Merge: sort by file position within each pack, then fold a range into its predecessor when
  // the file gap equals the destination gap and is small.
  std::sort(ranges.begin(), ranges.end(), [](const ReadRange& a, const ReadRange& b) {
    return a.pack != b.pack ? a.pack < b.pack : a.offset < b.offset;
  });
  std::vector<std::vector<ReadRange>> by_group(pools_.size());
  std::vector<uint64_t> merges(pools_.size(), 0);
  ReadRange* last = nullptr;
  for (const ReadRange& r : ranges) {
    const GroupId g = packs_.pack(r.pack).group;
    if (last != nullptr && last->pack == r.pack && r.offset >= last->offset + last->bytes) {
      const uint64_t file_gap = r.offset - (last->offset + last->bytes);
      const auto last_end = reinterpret_cast<uintptr_t>(last->dst) + last->bytes;
      const auto dst = reinterpret_cast<uintptr_t>(r.dst);
      if (dst >= last_end && dst - last_end == file_gap && file_gap <= max_merge_gap_) {
        last->bytes = r.offset + r.bytes - last->offset;
        ++merges[g];
        continue;
      }
    }
    by_group[g].push_back(r);
    last = &by_group[g].back();
  }

  int parts = 0;
  for (const auto& reads : by_group) parts += reads.empty() ? 0 : 1;
  auto state = std::make_shared<JobState>(std::move(job.done), &counters_, std::max(parts, 1));
  counters_.submitted.fetch_add(1, std::memory_order_relaxed);
  if (parts == 0) {
    pools_[0]->Push(JobPart{state, {}, job.priority});
    return ReadJobHandle(state);
  }
  for (size_t g = 0; g < by_group.size(); ++g) {
    if (by_group[g].empty()) continue;
    pools_[g]->merges.fetch_add(merges[g], std::memory_order_relaxed);
    pools_[g]->Push(JobPart{state, std::move(by_group[g]), job.priority});
  }
  return ReadJobHandle(state);
}

ReaderStats ReaderPools::Stats() const {
  ReaderStats s;
  s.groups.resize(pools_.size());
  for (size_t g = 0; g < pools_.size(); ++g) {
    const ReaderPool& pool = *pools_[g];
    GroupStats& gs = s.groups[g];
    gs.name = pool.name();
    gs.threads = pool.threads();
    gs.demand_parts = pool.demand_parts.load(std::memory_order_relaxed);
    gs.prefetch_parts = pool.prefetch_parts.load(std::memory_order_relaxed);
    gs.cancelled_parts = pool.cancelled_parts.load(std::memory_order_relaxed);
    gs.merges = pool.merges.load(std::memory_order_relaxed);
    s.merges += gs.merges;
  }
  for (PackId id = 0; id < packs_.size(); ++id) {
    const PackStats ps = packs_.stats(id);
    GroupStats& gs = s.groups[packs_.pack(id).group];
    gs.bytes_read += ps.bytes_read;
    gs.reads += ps.reads;
    gs.retries += ps.retries;
    gs.errors += ps.errors;
    s.packs.push_back(ps);
  }
  s.jobs_submitted = counters_.submitted.load(std::memory_order_relaxed);
  s.jobs_ok = counters_.ok.load(std::memory_order_relaxed);
  s.jobs_failed = counters_.failed.load(std::memory_order_relaxed);
  s.jobs_cancelled = counters_.cancelled.load(std::memory_order_relaxed);
  return s;
}

}  // namespace expertd
