// Reader pools: one pool of threads per source group (drive) of a PackSet, fed with read jobs.
//
// A read job is a list of ranges {pack, offset, bytes, destination} with a priority and a
// completion callback. ReaderPools::Submit splits a job by source group, so each drive reads its
// part in parallel, and merges ranges of one pack that are laid out the same way in the file and
// in the destination (the padding between the projections of one bundle) into one read.
//
// Within a pool, demand parts are always taken before prefetch parts; each class is FIFO.
// See docs/readers.md.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pack/pack_set.h"

namespace expertd {

enum class ReadPriority {
  kDemand,    // an acquire waits for it: goes ahead of every queued prefetch
  kPrefetch,  // a prediction: may be cancelled while queued
};

// `bytes` bytes of pack `pack` at byte `offset` go to dst[0, bytes). The destination must stay
// valid and untouched by others until the job's callback has run.
struct ReadRange {
  PackId pack = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;
  uint8_t* dst = nullptr;
};

// Called exactly once per accepted job, on a reader thread, with OK or the first error of any of
// its parts. CancelledError when the job was cancelled or the pools shut down before it ran; then
// (as after any error) the destinations hold unspecified bytes. The callback must not block for
// long (it holds a reader thread) and must not destroy the ReaderPools.
using ReadDone = absl::AnyInvocable<void(absl::Status)>;

struct ReadJob {
  std::vector<ReadRange> ranges;
  ReadPriority priority = ReadPriority::kDemand;
  ReadDone done;
};

// Ranges of one pack whose file gap equals their destination gap and is at most this many bytes
// are read as one; the gap's file bytes are written into the destination gap.
inline constexpr uint64_t kMaxMergeGapBytes = 64ull << 10;

struct ReaderPoolOptions {
  uint32_t threads_per_group = 2;
  // Per source group name (SourceGroup::name): thread count overriding threads_per_group.
  absl::flat_hash_map<std::string, uint32_t> group_threads;
  uint64_t max_merge_gap_bytes = kMaxMergeGapBytes;
  // Tests: called by the destructor once every pool was told to stop (queued jobs will be
  // cancelled, no new one starts), before it waits for the reads in progress.
  std::function<void()> stopping_hook;
};

// Counters of one source group (a snapshot). Byte, read, retry and error counts are the sums of
// the group's packs' PackStats; the rest are the pool's.
struct GroupStats {
  std::string name;
  uint32_t threads = 0;
  uint64_t bytes_read = 0;
  uint64_t reads = 0;
  uint64_t retries = 0;
  uint64_t errors = 0;
  uint64_t demand_parts = 0;    // job parts run at demand priority
  uint64_t prefetch_parts = 0;  // job parts run at prefetch priority
  uint64_t cancelled_parts = 0;
  uint64_t merges = 0;  // ranges folded into the read of a preceding range
};

struct ReaderStats {
  std::vector<PackStats> packs;    // by PackId
  std::vector<GroupStats> groups;  // by GroupId
  uint64_t jobs_submitted = 0;
  uint64_t jobs_ok = 0;
  uint64_t jobs_failed = 0;
  uint64_t jobs_cancelled = 0;
  uint64_t merges = 0;
};

namespace reader_detail {
struct JobState;
class ReaderPool;
struct JobCounters {
  std::atomic<uint64_t> submitted{0};
  std::atomic<uint64_t> ok{0};
  std::atomic<uint64_t> failed{0};
  std::atomic<uint64_t> cancelled{0};
};
}  // namespace reader_detail

// The caller's hold on a submitted job: lets it cancel the job. Copyable; a default-constructed
// handle refers to no job. Thread-safe.
class ReadJobHandle {
 public:
  ReadJobHandle() = default;
  // Requests cancellation. Parts not yet started complete without I/O; a part already reading
  // stops before its next merged read. The callback then receives CancelledError. No effect
  // after the job finished. Returns immediately; the callback still runs on a reader thread.
  void Cancel() const;
  // Cancels the job only if none of its parts has started reading: returns true when it did
  // (the callback then receives CancelledError and no byte of any destination was written),
  // false when a part already started (the job runs to completion as if never asked) or for a
  // default-constructed handle. Exactly one of the two outcomes, even racing a reader thread.
  bool TryCancel() const;

 private:
  friend class ReaderPools;
  explicit ReadJobHandle(std::shared_ptr<reader_detail::JobState> job) : job_(std::move(job)) {}
  std::shared_ptr<reader_detail::JobState> job_;
};

// One reader pool per source group of `packs`, started by the constructor. Thread-safe. The
// PackSet must outlive it. Destruction cancels queued jobs (their callbacks run with
// CancelledError on reader threads), lets reads in progress finish, and joins every thread: no
// accepted job is lost or completed twice. Submit must not race with destruction.
class ReaderPools {
 public:
  ReaderPools(const PackSet& packs, const ReaderPoolOptions& options);
  ~ReaderPools();
  ReaderPools(const ReaderPools&) = delete;
  ReaderPools& operator=(const ReaderPools&) = delete;

  // Validates, merges, splits by source group and queues `job`. Fails up front, without calling
  // `job.done` and without I/O, when a range lies outside its pack (OutOfRange, kOutOfBounds),
  // names an unknown pack or has a null destination (InvalidArgument), or touches a pack marked
  // failed (that failure, kIo). Zero-byte ranges are dropped; a job without bytes to read
  // completes OK on a reader thread.
  absl::StatusOr<ReadJobHandle> Submit(ReadJob job);

  ReaderStats Stats() const;
  const PackSet& packs() const { return packs_; }

 private:
  const PackSet& packs_;
  const uint64_t max_merge_gap_;
  reader_detail::JobCounters counters_;  // jobs count their outcome here when they complete
  std::vector<std::unique_ptr<reader_detail::ReaderPool>> pools_;  // by GroupId
  std::function<void()> stopping_hook_;
};

}  // namespace expertd
