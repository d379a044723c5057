// Packs (docs/readers.md): the conformance suite runs the same cases on every read method
// against a plain whole-file read + memcpy oracle; then opening packs: files, groups, methods, bounds.
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

#include "absl/strings/str_cat.h"
#include "pack/pack_set.h"
#include "pack/reader_pool.h"
#include "support/test_support.h"
#include "unit/reader_test_util.h"

namespace expertd {
namespace {

using ::expertd::testing::IsError;
using ::expertd::testing::TempDir;
using ::expertd::testing::WriteFile;
using namespace ::expertd::reader_test;  // NOLINT(google-build-using-namespace): shared helpers

// What the platform does differently, for the few tests that see it. Windows names a file
// system's group by its volume, refuses to shrink a file while a view of it is mapped
// (ERROR_USER_MAPPED_FILE), and to rename another file over one that is open.
#ifdef _WIN32
constexpr std::string_view kFileSystemGroupPrefix = "vol:";
constexpr bool MappedFilesCannotShrink() { return true; }
constexpr bool OpenFilesCanBeReplaced() { return false; }
// Windows 10 on NTFS removes the name at once (POSIX delete semantics); wine, like older
// Windows, keeps it, delete-pending, until the file's last handle closes.
constexpr bool RemovedNamesVanishAtOnce() { return false; }
#else
constexpr std::string_view kFileSystemGroupPrefix = "dev:";
constexpr bool MappedFilesCannotShrink() { return false; }
constexpr bool OpenFilesCanBeReplaced() { return true; }
constexpr bool RemovedNamesVanishAtOnce() { return true; }
#endif

// Truncates (or extends) in place; false with the reason printed when the OS refuses.
bool Shrink(const std::string& path, uint64_t size) {
  std::error_code error;
  std::filesystem::resize_file(path, size, error);
  if (error) std::printf("resize %s to %llu: %s\n", path.c_str(),
                         static_cast<unsigned long long>(size), error.message().c_str());
  return !error;
}

// Renames `from` over `to` (a new file under the old name).
bool Replace(const std::string& from, const std::string& to) {
  std::error_code error;
  std::filesystem::rename(from, to, error);
  if (error) std::printf("rename %s over %s: %s\n", from.c_str(), to.c_str(), error.message().c_str());
  return !error;
}

// ---------------------------------------------------------------------------------------------
// Conformance: every method against the oracle.

class ReaderConformance : public ::testing::TestWithParam<ReadMethod> {
 protected:
  absl::StatusOr<std::unique_ptr<PackSet>> OpenOne(const std::string& path) {
    return PackSet::Open({Spec(path, "Q")}, WithMethod(GetParam()));
  }
  // direct may fall back (a file system without O_DIRECT), but then it must say why.
  void ExpectMethod(const PackEntry& e) {
    EXPECT_EQ(e.requested, GetParam());
    if (e.method != GetParam()) {
      EXPECT_FALSE(e.method_note.empty());
    }
    if (e.method == ReadMethod::kDirect) {
      EXPECT_TRUE(IsPowerOfTwoAlign(e.dio_mem_align));
      EXPECT_TRUE(IsPowerOfTwoAlign(e.dio_offset_align));
    }
  }
  // True when a pack fell back to another method: the case then tested that method, not the
  // parameter's, and is skipped with the reason instead of counting as a pass.
  bool FellBack(const PackSet& set) {
    for (size_t i = 0; i < set.size(); ++i) {
      const PackEntry& e = set.pack(static_cast<PackId>(i));
      if (e.method != GetParam()) {
        EXPECT_FALSE(e.method_note.empty()) << "a fallback without a reason";
        reason_ = absl::StrCat(std::string(ReadMethodName(GetParam())), " fell back to ",
                               std::string(ReadMethodName(e.method)), " on this file system (",
                               e.path, "): ", e.method_note);
        return true;
      }
    }
    return false;
  }
  std::string reason_;
  static bool IsPowerOfTwoAlign(uint32_t v) { return v != 0 && (v & (v - 1)) == 0; }
  TempDir dir_;
};

TEST_P(ReaderConformance, RandomRangesMatchOracle) {
  const uint64_t size = (12u << 20) + 12345;  // not a multiple of any block size
  const std::string path = MakePack(dir_, "q.pack", size, 1);
  absl::StatusOr<std::unique_ptr<PackSet>> set = OpenOne(path);
  ASSERT_TRUE(set.ok()) << set.status();
  if (FellBack(**set)) GTEST_SKIP() << reason_;
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
  if (FellBack(**set)) GTEST_SKIP() << reason_;
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
  if (FellBack(**set)) GTEST_SKIP() << reason_;
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
  if (FellBack(**set)) GTEST_SKIP() << reason_;
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
  if (FellBack(**set)) GTEST_SKIP() << reason_;
  std::vector<uint8_t> buf(8192);
  if (MappedFilesCannotShrink() && GetParam() == ReadMethod::kMmap) {
    // The OS keeps the mapped bytes: the file cannot be cut from under the reader.
    EXPECT_FALSE(Shrink(path, 300007));
    ASSERT_TRUE((*set)->Read(0, 524288, std::span(buf.data(), 4096)).ok());
    EXPECT_EQ(AsString(buf.data(), 4096), oracle.Range(524288, 4096));
    return;
  }
  ASSERT_TRUE(Shrink(path, 300007));
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
  if (FellBack(**set)) GTEST_SKIP() << reason_;
  uint8_t byte = 0;
  EXPECT_TRUE((*set)->Read(0, 0, std::span(&byte, 0)).ok());
  EXPECT_TRUE(IsError((*set)->Read(0, 0, std::span(&byte, 1)), absl::StatusCode::kOutOfRange,
                      ErrorKind::kOutOfBounds, {path}));
}

// A pack file changed under the open set: truncated in place, replaced by a new file,
// removed. CheckFiles marks it failed with the reason, reads return it, and Reopen serves it
// again once the same file is back, never another one.
TEST_P(ReaderConformance, FilesChangedUnderTheSetAreNoticedAndReopened) {
  const size_t size = (3u << 20) + 4096;
  const std::string path = MakePack(dir_, "p.bin", size, 11);
  const std::string original = Content(size, 11);
  auto set = OpenOne(path);
  ASSERT_TRUE(set.ok()) << set.status();
  if (FellBack(**set)) GTEST_SKIP() << reason_;
  PackSet& packs = **set;
  std::vector<uint8_t> buf(8192);
  const auto read_ok = [&](uint64_t at) {
    absl::Status st = packs.Read(0, at, std::span<uint8_t>(buf));
    return st.ok() && AsString(buf.data(), buf.size()) == original.substr(at, buf.size());
  };
  EXPECT_TRUE(packs.CheckFiles().empty());
  EXPECT_TRUE(read_ok(size - 8192));

  // Truncated in place (refused on Windows while the pack is mapped: served intact instead).
  if (MappedFilesCannotShrink() && GetParam() == ReadMethod::kMmap) {
    EXPECT_FALSE(Shrink(path, size / 2));
    EXPECT_TRUE(packs.CheckFiles().empty());
    EXPECT_TRUE(read_ok(size - 8192));
  } else {
    ASSERT_TRUE(Shrink(path, size / 2));
    EXPECT_EQ(packs.CheckFiles(), std::vector<PackId>{0});
    EXPECT_TRUE(packs.failed(0));
    EXPECT_NE(packs.failure(0).message().find("truncated to"), std::string::npos)
        << packs.failure(0);
    EXPECT_NE(packs.failure(0).message().find(path), std::string::npos);
    // Never UNAVAILABLE: clients retry that code (no slot free) until their timeout.
    EXPECT_NE(packs.failure(0).code(), absl::StatusCode::kUnavailable) << packs.failure(0);
    absl::Status st = packs.Read(0, 0, std::span<uint8_t>(buf));  // even below the cut
    EXPECT_EQ(st, packs.failure(0));
    EXPECT_TRUE(packs.CheckFiles().empty());  // reported once
    EXPECT_FALSE(packs.Reopen(0).ok());        // not back yet: still short
    WriteFile(path, original);                 // back, in place
    ASSERT_TRUE(packs.Reopen(0).ok());
    EXPECT_FALSE(packs.failed(0));
    EXPECT_TRUE(read_ok(size - 8192));
    EXPECT_TRUE(packs.CheckFiles().empty());
  }

  // Replaced by a new file (a new inode) with the same bytes: noticed, and served again. Windows
  // refuses to rename over a file that is open: then the pack is served intact.
  const std::string copy = dir_.File("copy.bin");
  WriteFile(copy, original);
  if (!OpenFilesCanBeReplaced()) {
    EXPECT_FALSE(Replace(copy, path));
    EXPECT_TRUE(packs.CheckFiles().empty());
    EXPECT_TRUE(read_ok(4096));
  } else {
    ASSERT_TRUE(Replace(copy, path));
    EXPECT_EQ(packs.CheckFiles(), std::vector<PackId>{0});
    EXPECT_NE(packs.failure(0).message().find("replaced"), std::string::npos)
        << packs.failure(0);
    ASSERT_TRUE(packs.Reopen(0).ok());
    EXPECT_TRUE(read_ok(4096));
    EXPECT_TRUE(packs.CheckFiles().empty());  // the new inode is the one served now

    // Another file of the same size, or of another size: never served in its place.
    WriteFile(copy, Content(size, 12));
    ASSERT_TRUE(Replace(copy, path));
    EXPECT_EQ(packs.CheckFiles(), std::vector<PackId>{0});
    absl::Status other = packs.Reopen(0);
    EXPECT_NE(other.message().find("another file"), std::string::npos) << other;
    WriteFile(path, original + "x");
    other = packs.Reopen(0);
    EXPECT_NE(other.message().find("bytes"), std::string::npos) << other;
    EXPECT_TRUE(packs.failed(0));
  }

  // Removed.
  if (packs.failed(0)) {
    WriteFile(path, original);
    ASSERT_TRUE(packs.Reopen(0).ok());
  }
  ASSERT_TRUE(std::filesystem::remove(path));
  if (!RemovedNamesVanishAtOnce()) {
    std::printf("removal while open not checked: the name stays until the last handle closes\n");
    return;
  }
  EXPECT_EQ(packs.CheckFiles(), std::vector<PackId>{0});
  EXPECT_NE(packs.failure(0).message().find("no longer names a file"), std::string::npos)
      << packs.failure(0);
  EXPECT_NE(packs.failure(0).code(), absl::StatusCode::kUnavailable) << packs.failure(0);
  // Unreadable (mode 000) is checked through the daemon (daemon.packs, as a user other than
  // root, whom permissions do not stop).
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
  EXPECT_EQ(packs.groups()[0].name.rfind(kFileSystemGroupPrefix, 0), 0u) << packs.groups()[0].name;
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

}  // namespace
}  // namespace expertd
