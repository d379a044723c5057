// Reader pools (docs/readers.md): scheduling (priorities, cancellation, parallel source
// groups, shutdown) and faults injected through the packs' test hook (EIO, EINTR, short reads).
#include "pack/reader_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "pack/pack_set.h"
#include "support/test_support.h"
#include "unit/reader_test_util.h"

namespace expertd {
namespace {

using ::expertd::testing::IsError;
using ::expertd::testing::TempDir;
using namespace ::expertd::reader_test;  // NOLINT(google-build-using-namespace): shared helpers

// ---------------------------------------------------------------------------------------------
// Scheduling: priorities, cancellation, parallel groups, shutdown.

// Holds the first read attempt that passes through it until released.
struct Gate {
  Notification entered;
  Notification released;
  std::atomic<bool> first{true};
  int64_t Pass() {
    if (first.exchange(false)) {
      entered.Notify();
      released.Wait();
    }
    return std::numeric_limits<int64_t>::max();
  }
};

// Jobs of one 4 KiB range each, recording the order in which they complete.
class JobRecorder {
 public:
  explicit JobRecorder(ReaderPools& pools) : pools_(pools) {}
  ReadJobHandle Submit(const std::string& name, ReadPriority priority, PackId pack = 0) {
    auto& buf = bufs_.emplace_back(std::make_unique<std::vector<uint8_t>>(4096, 0xEE));
    auto& done = done_.emplace_back(std::make_unique<Done>());
    ReadDone inner = done->Callback();
    ReadJob job{{{pack, 4096 * bufs_.size(), 4096, buf->data()}},
                priority,
                [this, name, inner = std::move(inner)](absl::Status s) mutable {
                  {
                    std::lock_guard lock(mu_);
                    order_.push_back(name);
                  }
                  inner(std::move(s));
                }};
    absl::StatusOr<ReadJobHandle> handle = pools_.Submit(std::move(job));
    EXPECT_TRUE(handle.ok()) << handle.status();
    return handle.ok() ? *handle : ReadJobHandle();
  }
  Done& done(size_t i) { return *done_[i]; }
  const std::vector<uint8_t>& buf(size_t i) { return *bufs_[i]; }
  size_t size() const { return done_.size(); }
  std::vector<std::string> WaitAll() {
    for (auto& d : done_) d->finished.Wait();
    std::lock_guard lock(mu_);
    return order_;
  }

 private:
  ReaderPools& pools_;
  std::vector<std::unique_ptr<std::vector<uint8_t>>> bufs_;
  std::vector<std::unique_ptr<Done>> done_;
  std::mutex mu_;
  std::vector<std::string> order_;  // guarded by mu_
};

ReaderPoolOptions OneThread() {
  ReaderPoolOptions o;
  o.threads_per_group = 1;
  return o;
}

TEST(ReaderPoolTest, DemandBeforePrefetchAndCancelledPrefetchReadsNothing) {
  TempDir dir;
  PackSpec spec = Spec(MakePack(dir, "q", 1u << 20, 1), "Q");
  Gate gate;
  std::atomic<int> attempts{0};
  spec.test_hook = [&](uint64_t, uint64_t) {
    ++attempts;
    return gate.Pass();
  };
  absl::StatusOr<std::unique_ptr<PackSet>> set = PackSet::Open({std::move(spec)}, {});
  ASSERT_TRUE(set.ok());
  ReaderPools pools(**set, OneThread());
  JobRecorder jobs(pools);
  jobs.Submit("A", ReadPriority::kDemand);  // occupies the only reader thread
  gate.entered.Wait();
  jobs.Submit("P1", ReadPriority::kPrefetch);
  jobs.Submit("P2", ReadPriority::kPrefetch);
  jobs.Submit("D1", ReadPriority::kDemand);
  const ReadJobHandle p3 = jobs.Submit("P3", ReadPriority::kPrefetch);
  jobs.Submit("D2", ReadPriority::kDemand);
  p3.Cancel();
  gate.released.Notify();
  EXPECT_EQ(jobs.WaitAll(), (std::vector<std::string>{"A", "D1", "D2", "P1", "P2", "P3"}));
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (i == 4) continue;
    EXPECT_TRUE(jobs.done(i).Wait().ok()) << i;
  }
  EXPECT_TRUE(absl::IsCancelled(jobs.done(4).Wait()));
  EXPECT_EQ(jobs.done(4).Calls(), 1);
  EXPECT_TRUE(
      std::all_of(jobs.buf(4).begin(), jobs.buf(4).end(), [](uint8_t b) { return b == 0xEE; }));
  EXPECT_EQ(attempts.load(), 5);
  const ReaderStats stats = pools.Stats();
  EXPECT_EQ(stats.groups[0].demand_parts, 3u);
  EXPECT_EQ(stats.groups[0].prefetch_parts, 2u);
  EXPECT_EQ(stats.groups[0].cancelled_parts, 1u);
  EXPECT_EQ(stats.jobs_cancelled, 1u);
  EXPECT_EQ(stats.jobs_ok, 5u);
  EXPECT_EQ(stats.packs[0].bytes_read, 5u * 4096);
}

// TryCancel stops a job only before any part started: a queued job is cancelled without I/O, a
// job already reading is left to finish and delivers its bytes.
TEST(ReaderPoolTest, TryCancelOnlyBeforeTheReadStarts) {
  TempDir dir;
  const std::string path = MakePack(dir, "q", 1u << 20, 1);
  PackSpec spec = Spec(path, "Q");
  Gate gate;
  std::atomic<int> attempts{0};
  spec.test_hook = [&](uint64_t, uint64_t) {
    ++attempts;
    return gate.Pass();
  };
  absl::StatusOr<std::unique_ptr<PackSet>> set = PackSet::Open({std::move(spec)}, {});
  ASSERT_TRUE(set.ok());
  ReaderPools pools(**set, OneThread());
  JobRecorder jobs(pools);
  const ReadJobHandle running = jobs.Submit("running", ReadPriority::kPrefetch);
  gate.entered.Wait();
  const ReadJobHandle queued = jobs.Submit("queued", ReadPriority::kPrefetch);
  EXPECT_FALSE(running.TryCancel());  // held inside its read
  EXPECT_TRUE(queued.TryCancel());
  EXPECT_FALSE(ReadJobHandle().TryCancel());
  gate.released.Notify();
  jobs.WaitAll();
  EXPECT_TRUE(jobs.done(0).Wait().ok());
  EXPECT_EQ(AsString(jobs.buf(0).data(), 4096), Oracle(path).Range(4096, 4096));
  EXPECT_TRUE(absl::IsCancelled(jobs.done(1).Wait()));
  EXPECT_TRUE(
      std::all_of(jobs.buf(1).begin(), jobs.buf(1).end(), [](uint8_t b) { return b == 0xEE; }));
  EXPECT_EQ(attempts.load(), 1);
  EXPECT_FALSE(queued.TryCancel());  // finished: nothing to cancel
}

// Each group has one thread; a slow read in each. Groups overlap, one group serializes.
TEST(ReaderPoolTest, SourceGroupsReadInParallel) {
  TempDir dir;
  const std::string a = MakePack(dir, "a", 1u << 20, 1);
  const std::string b = MakePack(dir, "b", 1u << 20, 2);
  for (const bool separate : {true, false}) {
    std::atomic<int> in_flight{0}, max_in_flight{0};
    auto slow = [&](uint64_t, uint64_t) -> int64_t {
      const int now = ++in_flight;
      int seen = max_in_flight.load();
      while (now > seen && !max_in_flight.compare_exchange_weak(seen, now)) {
      }
      // With two groups, the first reads wait (up to 10 s, a bound on a hang) until two have
      // been in flight at once: they overlap however slowly the machine schedules the second
      // thread. With one group a second read cannot start while one waits, so each gives up
      // after 100 ms.
      const auto deadline = std::chrono::steady_clock::now() +
                            (separate ? std::chrono::seconds(10) : std::chrono::milliseconds(100));
      while (max_in_flight.load() < 2 && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      --in_flight;
      return std::numeric_limits<int64_t>::max();
    };
    absl::StatusOr<std::unique_ptr<PackSet>> set =
        PackSet::Open({Spec(a, "A", "a", slow), Spec(b, "B", separate ? "b" : "a", slow)}, {});
    ASSERT_TRUE(set.ok());
    ASSERT_EQ((*set)->groups().size(), separate ? 2u : 1u);
    ReaderPools pools(**set, OneThread());
    std::vector<uint8_t> buf(size_t{3} * 4096);
    Done done;
    // One job spanning both packs: split by group, one callback.
    ASSERT_TRUE(pools
                    .Submit(ReadJob{{{0, 0, 4096, buf.data()},
                                     {1, 0, 4096, buf.data() + 4096},
                                     {1, 8192, 4096, buf.data() + 8192}},
                                    ReadPriority::kDemand,
                                    done.Callback()})
                    .ok());
    ASSERT_TRUE(done.Wait().ok());
    EXPECT_EQ(done.Calls(), 1);
    if (separate) {
      EXPECT_GE(max_in_flight.load(), 2);
    } else {
      EXPECT_EQ(max_in_flight.load(), 1);
    }
  }
}

TEST(ReaderPoolTest, ShutdownCancelsQueuedJobs) {
  TempDir dir;
  PackSpec spec = Spec(MakePack(dir, "q", 1u << 20, 1), "Q");
  Gate gate;
  spec.test_hook = [&](uint64_t, uint64_t) { return gate.Pass(); };
  absl::StatusOr<std::unique_ptr<PackSet>> set = PackSet::Open({std::move(spec)}, {});
  ASSERT_TRUE(set.ok());
  // The gated read is let go only once the destructor has told the pool to stop: the queued
  // jobs must then be cancelled, never read.
  ReaderPoolOptions options = OneThread();
  options.stopping_hook = [&] { gate.released.Notify(); };
  auto pools = std::make_unique<ReaderPools>(**set, options);
  JobRecorder jobs(*pools);
  jobs.Submit("running", ReadPriority::kDemand);
  gate.entered.Wait();
  for (int i = 0; i < 8; ++i) {
    jobs.Submit("queued", i % 2 ? ReadPriority::kDemand : ReadPriority::kPrefetch);
  }
  pools.reset();  // stops, runs the hook (opening the gate), joins
  EXPECT_TRUE(jobs.done(0).Wait().ok());
  for (size_t i = 0; i < jobs.size(); ++i) {
    EXPECT_EQ(jobs.done(i).Calls(), 1) << i;
    if (i > 0) {
      EXPECT_TRUE(absl::IsCancelled(jobs.done(i).Wait())) << jobs.done(i).Wait();
    }
  }
}

TEST(ReaderPoolTest, EmptyJobCompletes) {
  TempDir dir;
  absl::StatusOr<std::unique_ptr<PackSet>> set =
      PackSet::Open({Spec(MakePack(dir, "q", 10, 1), "Q")}, {});
  ASSERT_TRUE(set.ok());
  ReaderPools pools(**set, ReaderPoolOptions{});
  Done done;
  ASSERT_TRUE(
      pools.Submit(ReadJob{{{0, 10, 0, nullptr}}, ReadPriority::kPrefetch, done.Callback()}).ok());
  EXPECT_TRUE(done.Wait().ok());
}

// ---------------------------------------------------------------------------------------------
// Faults injected through the hook.

TEST(ReaderFaultTest, EioIsRetriedThenThePackFails) {
  TempDir dir;
  const std::string q = MakePack(dir, "q", 1u << 20, 1);
  std::atomic<int> attempts{0};
  PackSpec bad = Spec(q, "Q");
  bad.test_hook = [&](uint64_t, uint64_t) -> int64_t {
    ++attempts;
    return -EIO;
  };
  PackSetOptions options;
  options.max_eio_retries = 2;
  absl::StatusOr<std::unique_ptr<PackSet>> set =
      PackSet::Open({std::move(bad), Spec(MakePack(dir, "r", 1u << 20, 2), "R")}, options);
  ASSERT_TRUE(set.ok());
  ReaderPools pools(**set, ReaderPoolOptions{});
  std::vector<uint8_t> buf(8192);
  Done done;
  ASSERT_TRUE(
      pools.Submit(ReadJob{{{0, 4096, 100, buf.data()}}, ReadPriority::kDemand, done.Callback()})
          .ok());
  EXPECT_TRUE(IsError(done.Wait(), absl::StatusCode::kUnavailable, ErrorKind::kIo,
                      {q, "4096", "3 times", "marked failed"}));
  EXPECT_EQ(attempts.load(), 3);
  EXPECT_TRUE((*set)->failed(0));
  const ReaderStats stats = pools.Stats();
  EXPECT_EQ(stats.packs[0].retries, 2u);
  EXPECT_EQ(stats.packs[0].errors, 1u);
  EXPECT_TRUE(stats.packs[0].failed);
  EXPECT_EQ(stats.jobs_failed, 1u);

  // Later jobs touching Q fail at once, without I/O; R is still served.
  EXPECT_TRUE(IsError(pools
                          .Submit(ReadJob{{{1, 0, 10, buf.data()}, {0, 0, 10, buf.data() + 10}},
                                          ReadPriority::kDemand,
                                          [](const absl::Status&) {}})
                          .status(),
                      absl::StatusCode::kUnavailable, ErrorKind::kIo, {q, "marked failed"}));
  EXPECT_TRUE(IsError((*set)->Read(0, 0, std::span(buf.data(), 10)), absl::StatusCode::kUnavailable,
                      ErrorKind::kIo, {q}));
  EXPECT_EQ(attempts.load(), 3);
  Done ok;
  ASSERT_TRUE(
      pools.Submit(ReadJob{{{1, 0, 10, buf.data()}}, ReadPriority::kDemand, ok.Callback()}).ok());
  EXPECT_TRUE(ok.Wait().ok());
}

TEST(ReaderFaultTest, TransientErrorsAreRetried) {
  TempDir dir;
  const std::string q = MakePack(dir, "q", 1u << 20, 1);
  std::atomic<int> attempts{0};
  PackSpec spec = Spec(q, "Q");
  spec.test_hook = [&](uint64_t, uint64_t) -> int64_t {
    switch (attempts++) {
      case 0:
        return -EINTR;
      case 1:
        return -EAGAIN;
      case 2:
        return -EIO;  // one EIO is within max_eio_retries
      default:
        return std::numeric_limits<int64_t>::max();
    }
  };
  absl::StatusOr<std::unique_ptr<PackSet>> set = PackSet::Open({std::move(spec)}, {});
  ASSERT_TRUE(set.ok());
  std::vector<uint8_t> buf(70000);
  ASSERT_TRUE((*set)->Read(0, 999, std::span(buf.data(), buf.size())).ok());
  EXPECT_EQ(AsString(buf.data(), buf.size()), Oracle(q).Range(999, buf.size()));
  EXPECT_EQ((*set)->stats(0).retries, 3u);
  EXPECT_FALSE((*set)->failed(0));
}

TEST(ReaderFaultTest, ShortReadFailsTheJob) {
  TempDir dir;
  const std::string q = MakePack(dir, "q", 1u << 20, 1);
  PackSpec spec = Spec(q, "Q");
  spec.test_hook = [](uint64_t, uint64_t) -> int64_t { return 0; };  // end of file
  absl::StatusOr<std::unique_ptr<PackSet>> set = PackSet::Open({std::move(spec)}, {});
  ASSERT_TRUE(set.ok());
  ReaderPools pools(**set, ReaderPoolOptions{});
  std::vector<uint8_t> buf(100);
  Done done;
  ASSERT_TRUE(
      pools.Submit(ReadJob{{{0, 8192, 100, buf.data()}}, ReadPriority::kDemand, done.Callback()})
          .ok());
  EXPECT_TRUE(
      IsError(done.Wait(), absl::StatusCode::kDataLoss, ErrorKind::kTruncated, {q, "8192"}));
  EXPECT_FALSE((*set)->failed(0));
}

TEST(ReaderFaultTest, FirstErrorWinsAcrossGroups) {
  TempDir dir;
  const std::string a = MakePack(dir, "a", 1u << 20, 1);
  const std::string b = MakePack(dir, "b", 1u << 20, 2);
  PackSetOptions options;
  options.max_eio_retries = 0;
  absl::StatusOr<std::unique_ptr<PackSet>> set =
      PackSet::Open({Spec(a, "A", "a",
                          [](uint64_t, uint64_t) -> int64_t {
                            std::this_thread::sleep_for(std::chrono::milliseconds(30));
                            return std::numeric_limits<int64_t>::max();
                          }),
                     Spec(b, "B", "b", [](uint64_t, uint64_t) -> int64_t { return -EIO; })},
                    options);
  ASSERT_TRUE(set.ok());
  ReaderPools pools(**set, ReaderPoolOptions{});
  std::vector<uint8_t> buf(200);
  Done done;
  ASSERT_TRUE(pools
                  .Submit(ReadJob{{{0, 0, 100, buf.data()}, {1, 0, 100, buf.data() + 100}},
                                  ReadPriority::kDemand,
                                  done.Callback()})
                  .ok());
  EXPECT_TRUE(IsError(done.Wait(), absl::StatusCode::kUnavailable, ErrorKind::kIo, {b}));
  EXPECT_EQ(done.Calls(), 1);
}

}  // namespace
}  // namespace expertd
