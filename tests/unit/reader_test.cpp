// Packs and reader pools (docs/readers.md). The conformance suite runs the same cases on every
// read method against a plain pread + memcpy oracle; the other suites use the test hook of
// PackSpec to block, slow down or fail reads.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

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
#include "pack/reader_pool.h"
#include "support/test_support.h"

namespace expertd {
namespace {

using ::expertd::testing::IsError;
using ::expertd::testing::TempDir;

// Deterministic bytes that differ at every offset (so misplaced bytes are caught).
std::string Content(size_t n, uint64_t seed) {
  std::string s(n, '\0');
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    s[i] = static_cast<char>(x >> 24);
  }
  return s;
}

std::string MakePack(const TempDir& dir, const std::string& name, size_t size, uint64_t seed) {
  std::string path = dir.File(name);
  testing::WriteFile(path, Content(size, seed));
  return path;
}

// The reference: the whole file read with plain pread, ranges copied out with memcpy.
class Oracle {
 public:
  explicit Oracle(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    EXPECT_GE(fd, 0) << path;
    struct stat st {};
    ::fstat(fd, &st);
    bytes_.resize(static_cast<size_t>(st.st_size));
    size_t done = 0;
    while (done < bytes_.size()) {
      const ssize_t n =
          ::pread(fd, bytes_.data() + done, bytes_.size() - done, static_cast<off_t>(done));
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    EXPECT_EQ(done, bytes_.size());
    ::close(fd);
  }
  std::string Range(uint64_t offset, uint64_t bytes) const {
    std::string out(bytes, '\0');
    std::memcpy(out.data(), bytes_.data() + offset, bytes);
    return out;
  }
  uint64_t size() const { return bytes_.size(); }

 private:
  std::vector<char> bytes_;
};

std::string AsString(const uint8_t* p, size_t n) {
  return std::string(reinterpret_cast<const char*>(p), n);
}

// A one-shot event on std primitives (ThreadSanitizer cannot see Debian's absl::Mutex).
class Notification {
 public:
  void Notify() {
    std::lock_guard lock(mu_);
    notified_ = true;
    cv_.notify_all();
  }
  void Wait() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [this] { return notified_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool notified_ = false;
};

// Collects the outcome of one job.
struct Done {
  std::mutex mu;
  Notification finished;
  absl::Status status;  // guarded by mu
  int calls = 0;        // guarded by mu

  ReadDone Callback() {
    return [this](absl::Status s) {
      {
        std::lock_guard lock(mu);
        status = std::move(s);
        ++calls;
      }
      finished.Notify();
    };
  }
  absl::Status Wait() {
    finished.Wait();
    std::lock_guard lock(mu);
    return status;
  }
  int Calls() {
    std::lock_guard lock(mu);
    return calls;
  }
};

PackSpec Spec(std::string path, std::string label, std::string group = "", PackReadHook hook = {}) {
  PackSpec spec;
  spec.path = std::move(path);
  spec.label = std::move(label);
  spec.group = std::move(group);
  spec.test_hook = std::move(hook);
  return spec;
}

PackSetOptions WithMethod(ReadMethod method) {
  PackSetOptions o;
  o.method = method;
  return o;
}

// ---------------------------------------------------------------------------------------------
// Conformance: every method against the oracle.

class ReaderConformance : public ::testing::TestWithParam<ReadMethod> {
 protected:
  absl::StatusOr<std::unique_ptr<PackSet>> OpenOne(const std::string& path) {
    return PackSet::Open({Spec(path, "Q")}, WithMethod(GetParam()));
  }
  // direct may fall back (a filesystem without O_DIRECT), but then it must say why.
  void ExpectMethod(const PackEntry& e) {
    EXPECT_EQ(e.requested, GetParam());
    if (e.method != GetParam()) {
      EXPECT_FALSE(e.method_note.empty());
      std::printf("note: %s fell back to %s: %s\n", std::string(ReadMethodName(GetParam())).c_str(),
                  std::string(ReadMethodName(e.method)).c_str(), e.method_note.c_str());
    }
    if (e.method == ReadMethod::kDirect) {
      EXPECT_TRUE(IsPowerOfTwoAlign(e.dio_mem_align));
      EXPECT_TRUE(IsPowerOfTwoAlign(e.dio_offset_align));
    }
  }
  static bool IsPowerOfTwoAlign(uint32_t v) { return v != 0 && (v & (v - 1)) == 0; }
  TempDir dir_;
};

TEST_P(ReaderConformance, RandomRangesMatchOracle) {
  const uint64_t size = (12u << 20) + 12345;  // not a multiple of any block size
  const std::string path = MakePack(dir_, "q.pack", size, 1);
  absl::StatusOr<std::unique_ptr<PackSet>> set = OpenOne(path);
  ASSERT_TRUE(set.ok()) << set.status();
  const PackSet& packs = **set;
  ExpectMethod(packs.pack(0));
  EXPECT_EQ(packs.pack(0).size, size);
  const Oracle oracle(path);

  std::mt19937_64 rng(42);
  auto uniform = [&](uint64_t lo, uint64_t hi) {
    return std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
  };
  struct R {
    uint64_t offset, bytes;
  };
  std::vector<R> ranges = {{0, 1},       {size - 1, 1},       {0, size},           {0, 4096},
                           {4096, 4096}, {size - 4096, 4096}, {size - 5000, 5000}, {4095, 2},
                           {0, 0}};
  for (int i = 0; i < 180; ++i) {
    // Length classes: 1 byte, small, tens of KiB, multi-MiB, up to 1 MiB, a few KiB.
    static constexpr std::pair<uint64_t, uint64_t> kLengths[] = {
        {1, 1}, {2, 600}, {600, 70000}, {1u << 20, 4u << 20}, {1, 1u << 20}, {1, 9000}};
    const auto [lo, hi] = kLengths[i % 6];
    const uint64_t bytes = uniform(lo, hi);
    const bool at_end = i % 7 == 0;  // touching the end of the file
    const uint64_t offset = at_end ? size - bytes : uniform(0, size - bytes);
    ranges.push_back({offset, bytes});
  }
  ReadScratch scratch;
  uint64_t expected_bytes = 0;
  std::vector<uint8_t> buf;
  for (const R& r : ranges) {
    const size_t shift = static_cast<size_t>(uniform(0, 63));  // unaligned destinations too
    buf.assign(r.bytes + shift, 0);
    ASSERT_TRUE(packs.Read(0, r.offset, std::span(buf.data() + shift, r.bytes), scratch).ok())
        << r.offset << "+" << r.bytes;
    ASSERT_EQ(AsString(buf.data() + shift, r.bytes), oracle.Range(r.offset, r.bytes))
        << "range " << r.offset << "+" << r.bytes << " shift " << shift;
    expected_bytes += r.bytes;
  }
  const PackStats stats = packs.stats(0);
  EXPECT_EQ(stats.bytes_read, expected_bytes);
  EXPECT_EQ(stats.errors, 0u);
  EXPECT_FALSE(stats.failed);
}

TEST_P(ReaderConformance, ConcurrentJobsMatchOracle) {
  const uint64_t size_a = (6u << 20) + 77;
  const uint64_t size_b = (3u << 20) + 5;
  const std::string a = MakePack(dir_, "a.pack", size_a, 2);
  const std::string b = MakePack(dir_, "b.pack", size_b, 3);
  // Two named groups on one drive, so the job is split across two pools.
  absl::StatusOr<std::unique_ptr<PackSet>> set =
      PackSet::Open({Spec(a, "A", "ga"), Spec(b, "B", "gb")}, WithMethod(GetParam()));
  ASSERT_TRUE(set.ok()) << set.status();
  const Oracle oa(a), ob(b);
  ReaderPools pools(**set, ReaderPoolOptions{});
  std::mt19937_64 rng(7);
  struct Expect {
    std::vector<uint8_t> buf;
    std::vector<std::pair<size_t, std::string>> parts;  // position in buf, expected bytes
    Done done;
  };
  std::vector<std::unique_ptr<Expect>> jobs;
  for (int j = 0; j < 40; ++j) {
    auto e = std::make_unique<Expect>();
    ReadJob job;
    job.priority = j % 3 == 0 ? ReadPriority::kPrefetch : ReadPriority::kDemand;
    size_t total = 0;
    const int n = 1 + static_cast<int>(rng() % 5);
    std::vector<std::tuple<PackId, uint64_t, uint64_t, size_t>> spec;
    for (int k = 0; k < n; ++k) {
      const PackId pack = rng() % 2;
      const uint64_t psize = pack == 0 ? size_a : size_b;
      const uint64_t bytes = 1 + rng() % (k == 0 ? (1u << 20) : 40000);
      const uint64_t offset = rng() % (psize - bytes + 1);
      spec.emplace_back(pack, offset, bytes, total);
      total += bytes + rng() % 100;
    }
    e->buf.assign(total, 0);
    for (const auto& [pack, offset, bytes, at] : spec) {
      job.ranges.push_back(ReadRange{pack, offset, bytes, e->buf.data() + at});
      e->parts.emplace_back(at, (pack == 0 ? oa : ob).Range(offset, bytes));
    }
    job.done = e->done.Callback();
    ASSERT_TRUE(pools.Submit(std::move(job)).ok());
    jobs.push_back(std::move(e));
  }
  for (auto& e : jobs) {
    ASSERT_TRUE(e->done.Wait().ok());
    EXPECT_EQ(e->done.Calls(), 1);
    for (const auto& [at, want] : e->parts) {
      ASSERT_EQ(AsString(e->buf.data() + at, want.size()), want);
    }
  }
  const ReaderStats stats = pools.Stats();
  EXPECT_EQ(stats.jobs_submitted, 40u);
  EXPECT_EQ(stats.jobs_ok, 40u);
  ASSERT_EQ(stats.groups.size(), 2u);
  EXPECT_EQ(stats.groups[0].bytes_read, stats.packs[0].bytes_read);
  EXPECT_GT(stats.groups[1].bytes_read, 0u);
}

// The projections of one bundle: near ranges laid out alike in file and destination are one
// read, and the gap bytes land in the destination gap.
TEST_P(ReaderConformance, NearRangesMerge) {
  const uint64_t size = 2u << 20;
  const std::string path = MakePack(dir_, "q.pack", size, 4);
  absl::StatusOr<std::unique_ptr<PackSet>> set = OpenOne(path);
  ASSERT_TRUE(set.ok()) << set.status();
  const Oracle oracle(path);
  ReaderPools pools(**set, ReaderPoolOptions{});
  std::vector<uint8_t> dst(1u << 20, 0xEE);
  uint8_t* d = dst.data();
  ReadJob job;
  // One bundle: three projections with 256 bytes of padding in the file and in the destination
  // (given out of order); then a range 100 KiB further (too far) and one whose destination gap
  // differs from its file gap.
  job.ranges = {
      {0, 101256, 2000, d + 1256},   {0, 100000, 1000, d},          {0, 103512, 3000, d + 3512},
      {0, 500000, 4000, d + 400000}, {0, 504016, 4000, d + 404032},
  };
  Done done;
  job.done = done.Callback();
  ASSERT_TRUE(pools.Submit(std::move(job)).ok());
  ASSERT_TRUE(done.Wait().ok());
  const uint64_t span = 3512 + 3000;
  EXPECT_EQ(AsString(d, span), oracle.Range(100000, span));  // padding included
  EXPECT_EQ(AsString(d + 400000, 4000), oracle.Range(500000, 4000));
  EXPECT_EQ(AsString(d + 404032, 4000), oracle.Range(504016, 4000));
  EXPECT_EQ(dst[404000], 0xEE);  // unmerged: the gap is not written
  const ReaderStats stats = pools.Stats();
  EXPECT_EQ(stats.merges, 2u);
  EXPECT_EQ(stats.packs[0].reads, 3u);
  EXPECT_EQ(stats.packs[0].bytes_read, span + 4000 + 4000);
}

// Short transfers continue where they stopped; for direct also with small bounce chunks.
TEST_P(ReaderConformance, PartialReadsStillDeliverAllBytes) {
  const uint64_t size = (1u << 20) + 333;
  const std::string path = MakePack(dir_, "q.pack", size, 5);
  std::atomic<int> calls{0};
  PackSpec spec = Spec(path, "Q");
  // Every other attempt reports only a third of what it was asked for (an interrupted transfer).
  // Armed after open, so the O_DIRECT probe read is left alone.
  std::atomic<bool> armed{false};
  spec.test_hook = [&](uint64_t, uint64_t bytes) -> int64_t {
    if (!armed.load() || calls++ % 2 == 1) return std::numeric_limits<int64_t>::max();
    return static_cast<int64_t>(std::max<uint64_t>(bytes / 3, 1));
  };
  PackSetOptions options = WithMethod(GetParam());
  options.direct_chunk_bytes = 16384;  // many bounce-buffer rounds per read
  absl::StatusOr<std::unique_ptr<PackSet>> set = PackSet::Open({std::move(spec)}, options);
  ASSERT_TRUE(set.ok()) << set.status();
  armed = true;
  const Oracle oracle(path);
  std::vector<uint8_t> buf(600000);
  const absl::Status read = (*set)->Read(0, 12345, std::span(buf.data(), buf.size()));
  ASSERT_TRUE(read.ok()) << read;
  EXPECT_EQ(AsString(buf.data(), buf.size()), oracle.Range(12345, buf.size()));
  EXPECT_GE((*set)->stats(0).syscalls, 2u);
  EXPECT_GE(calls.load(), 2);
}

// A pack that shrinks under us: an error naming the pack and offset, never a crash (for mmap the
// size check before the copy catches it; see docs/readers.md for the remaining race).
TEST_P(ReaderConformance, TruncatedAfterOpen) {
  const uint64_t size = (1u << 20) + 100;
  const std::string path = MakePack(dir_, "q.pack", size, 6);
  const Oracle oracle(path);
  absl::StatusOr<std::unique_ptr<PackSet>> set = OpenOne(path);
  ASSERT_TRUE(set.ok()) << set.status();
  ASSERT_EQ(::truncate(path.c_str(), 300007), 0);
  std::vector<uint8_t> buf(8192);
  EXPECT_TRUE(IsError((*set)->Read(0, 524288, std::span(buf.data(), 4096)),
                      absl::StatusCode::kDataLoss, ErrorKind::kTruncated,
                      {path, "524288", "truncated"}));
  EXPECT_TRUE(IsError((*set)->Read(0, 300000, std::span(buf.data(), 1000)),
                      absl::StatusCode::kDataLoss, ErrorKind::kTruncated, {path, "300007"}));
  ASSERT_TRUE((*set)->Read(0, 290000, std::span(buf.data(), 8192)).ok());
  EXPECT_EQ(AsString(buf.data(), 8192), oracle.Range(290000, 8192));

  // Through the pools: the job fails, the pack stays usable (truncation is not a drive fault).
  ReaderPools pools(**set, ReaderPoolOptions{});
  Done done;
  ASSERT_TRUE(
      pools.Submit(ReadJob{{{0, 600000, 100, buf.data()}}, ReadPriority::kDemand, done.Callback()})
          .ok());
  EXPECT_TRUE(IsError(done.Wait(), absl::StatusCode::kDataLoss, ErrorKind::kTruncated, {path}));
  EXPECT_FALSE((*set)->failed(0));
}

TEST_P(ReaderConformance, EmptyPack) {
  const std::string path = MakePack(dir_, "empty.pack", 0, 0);
  absl::StatusOr<std::unique_ptr<PackSet>> set = OpenOne(path);
  ASSERT_TRUE(set.ok()) << set.status();
  uint8_t byte = 0;
  EXPECT_TRUE((*set)->Read(0, 0, std::span(&byte, 0)).ok());
  EXPECT_TRUE(IsError((*set)->Read(0, 0, std::span(&byte, 1)), absl::StatusCode::kOutOfRange,
                      ErrorKind::kOutOfBounds, {path}));
}

INSTANTIATE_TEST_SUITE_P(Methods, ReaderConformance,
                         ::testing::Values(ReadMethod::kPread, ReadMethod::kDirect,
                                           ReadMethod::kMmap),
                         [](const auto& param_info) {
                           return std::string(ReadMethodName(param_info.param));
                         });

// ---------------------------------------------------------------------------------------------
// Opening: files, groups, methods.

TEST(PackSetTest, MissingFileIsNotFound) {
  TempDir dir;
  const std::string path = dir.File("nope.pack");
  absl::StatusOr<std::unique_ptr<PackSet>> set =
      PackSet::Open({Spec(path, "Q7")}, PackSetOptions{});
  EXPECT_TRUE(
      IsError(set.status(), absl::StatusCode::kNotFound, ErrorKind::kMissingFile, {path, "Q7"}));
  EXPECT_TRUE(IsError(PackSet::Open({Spec(dir.path(), "D")}, {}).status(),
                      absl::StatusCode::kInvalidArgument, ErrorKind::kMissingFile,
                      {"not a regular file"}));
}

TEST(PackSetTest, ParseReadMethod) {
  EXPECT_EQ(ParseReadMethod("direct").value(), ReadMethod::kDirect);
  EXPECT_EQ(ParseReadMethod("mmap").value(), ReadMethod::kMmap);
  EXPECT_TRUE(IsError(ParseReadMethod("uring").status(), absl::StatusCode::kInvalidArgument,
                      ErrorKind::kBadValue, {"uring", "pread"}));
}

TEST(PackSetTest, GroupsByDeviceUnlessNamed) {
  TempDir dir;
  const std::string a = MakePack(dir, "a", 10, 1);
  const std::string b = MakePack(dir, "b", 10, 2);
  const std::string c = MakePack(dir, "c", 10, 3);
  absl::StatusOr<std::unique_ptr<PackSet>> set =
      PackSet::Open({Spec(a, "A"), Spec(b, "B"), Spec(c, "C", "optane")}, {});
  ASSERT_TRUE(set.ok()) << set.status();
  const PackSet& packs = **set;
  ASSERT_EQ(packs.groups().size(), 2u);
  EXPECT_EQ(packs.pack(0).group, packs.pack(1).group);  // one filesystem, one device
  EXPECT_EQ(packs.groups()[0].name.rfind("dev:", 0), 0u) << packs.groups()[0].name;
  EXPECT_EQ(packs.groups()[1].name, "optane");
  EXPECT_EQ(packs.groups()[0].packs, (std::vector<PackId>{0, 1}));

  // A file on another filesystem (tmpfs) has another st_dev, hence its own group.
  struct stat shm {
  }, tmp{};
  if (::stat("/dev/shm", &shm) == 0 && ::stat(dir.path().c_str(), &tmp) == 0 &&
      shm.st_dev != tmp.st_dev) {
    const std::string on_shm = "/dev/shm/expertd-reader-test-" + std::to_string(::getpid());
    testing::WriteFile(on_shm, "xyz");
    absl::StatusOr<std::unique_ptr<PackSet>> two =
        PackSet::Open({Spec(a, "A"), Spec(on_shm, "S")}, {});
    std::filesystem::remove(on_shm);
    ASSERT_TRUE(two.ok()) << two.status();
    EXPECT_EQ((*two)->groups().size(), 2u);
  }
}

TEST(PackSetTest, DirectFallsBackToPreadWhenReadsAreRefused) {
  TempDir dir;
  const std::string path = MakePack(dir, "q", 100000, 9);
  std::atomic<int> calls{0};
  PackSpec spec = Spec(path, "Q");
  spec.method = ReadMethod::kDirect;
  // The filesystem accepts O_DIRECT at open but refuses the reads, as some FUSE mounts do.
  spec.test_hook = [&](uint64_t, uint64_t) -> int64_t {
    return calls++ == 0 ? -EINVAL : std::numeric_limits<int64_t>::max();
  };
  absl::StatusOr<std::unique_ptr<PackSet>> set = PackSet::Open({std::move(spec)}, {});
  ASSERT_TRUE(set.ok()) << set.status();
  const PackEntry& e = (*set)->pack(0);
  EXPECT_EQ(e.requested, ReadMethod::kDirect);
  if (calls.load() == 0) GTEST_SKIP() << "no O_DIRECT here, so no probe: " << e.method_note;
  EXPECT_EQ(e.method, ReadMethod::kPread);
  EXPECT_NE(e.method_note.find("O_DIRECT"), std::string::npos) << e.method_note;
  std::vector<uint8_t> buf(5000);
  ASSERT_TRUE((*set)->Read(0, 3, std::span(buf.data(), buf.size())).ok());
  EXPECT_EQ(AsString(buf.data(), buf.size()), Oracle(path).Range(3, buf.size()));
}

TEST(PackSetTest, DirectOnTmpfsWorksOrFallsBack) {
  const std::string path = "/dev/shm/expertd-direct-test-" + std::to_string(::getpid());
  if (!std::filesystem::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm";
  testing::WriteFile(path, Content(70000, 11));
  absl::StatusOr<std::unique_ptr<PackSet>> set =
      PackSet::Open({Spec(path, "S")}, WithMethod(ReadMethod::kDirect));
  ASSERT_TRUE(set.ok()) << set.status();
  const PackEntry& e = (*set)->pack(0);
  std::printf("tmpfs O_DIRECT: method %s %s\n", std::string(ReadMethodName(e.method)).c_str(),
              e.method_note.c_str());
  EXPECT_TRUE(e.method == ReadMethod::kDirect || !e.method_note.empty());
  std::vector<uint8_t> buf(9999);
  EXPECT_TRUE((*set)->Read(0, 60001, std::span(buf.data(), buf.size())).ok());
  EXPECT_EQ(AsString(buf.data(), buf.size()), Oracle(path).Range(60001, buf.size()));
  set->reset();
  std::filesystem::remove(path);
}

TEST(PackSetTest, OutOfBoundsRejectedUpFront) {
  TempDir dir;
  const std::string path = MakePack(dir, "q", 4096, 1);
  std::atomic<int> calls{0};
  PackSpec spec = Spec(path, "Q");
  spec.test_hook = [&](uint64_t, uint64_t) -> int64_t {
    ++calls;
    return std::numeric_limits<int64_t>::max();
  };
  absl::StatusOr<std::unique_ptr<PackSet>> set = PackSet::Open({std::move(spec)}, {});
  ASSERT_TRUE(set.ok());
  std::vector<uint8_t> buf(8192);
  EXPECT_TRUE(IsError((*set)->Read(0, 4000, std::span(buf.data(), 97)),
                      absl::StatusCode::kOutOfRange, ErrorKind::kOutOfBounds,
                      {path, "4000", "4096"}));
  EXPECT_TRUE(IsError((*set)->CheckRange(0, std::numeric_limits<uint64_t>::max(), 2),
                      absl::StatusCode::kOutOfRange, ErrorKind::kOutOfBounds, {path}));
  EXPECT_TRUE(IsError((*set)->CheckRange(1, 0, 1), absl::StatusCode::kInvalidArgument,
                      ErrorKind::kBadValue, {"pack id 1"}));

  ReaderPools pools(**set, ReaderPoolOptions{});
  Done done;
  const absl::StatusOr<ReadJobHandle> handle =
      pools.Submit(ReadJob{{{0, 0, 100, buf.data()}, {0, 4095, 2, buf.data() + 200}},
                           ReadPriority::kDemand,
                           done.Callback()});
  EXPECT_TRUE(IsError(handle.status(), absl::StatusCode::kOutOfRange, ErrorKind::kOutOfBounds,
                      {path, "4095"}));
  EXPECT_TRUE(
      IsError(pools.Submit(ReadJob{{{0, 0, 100, nullptr}}, ReadPriority::kDemand, done.Callback()})
                  .status(),
              absl::StatusCode::kInvalidArgument, ErrorKind::kBadValue, {"null"}));
  EXPECT_EQ(calls.load(), 0);
  EXPECT_EQ(done.Calls(), 0);  // a rejected job never calls back
  EXPECT_EQ(pools.Stats().jobs_submitted, 0u);
}

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
      std::this_thread::sleep_for(std::chrono::milliseconds(60));
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
  auto pools = std::make_unique<ReaderPools>(**set, OneThread());
  JobRecorder jobs(*pools);
  jobs.Submit("running", ReadPriority::kDemand);
  gate.entered.Wait();
  for (int i = 0; i < 8; ++i) {
    jobs.Submit("queued", i % 2 ? ReadPriority::kDemand : ReadPriority::kPrefetch);
  }
  std::thread destroyer([&] { pools.reset(); });  // blocks joining the gated thread
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  gate.released.Notify();
  destroyer.join();
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
