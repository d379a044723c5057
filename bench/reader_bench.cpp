// Reader throughput against the memcpy limit (docs/readers.md "Measurements").
//
// Reads one file (default 1 GiB, created if missing or of another size) with every read method
// and 1, 2, 4 reader threads, as read jobs of one bundle each (three projections with 256 bytes
// of padding, merged into one read), in a shuffled order, into a pre-faulted destination. In the
// same run it measures single-thread memcpy of the same number of bytes between two pre-faulted
// buffers and prints every result as GB/s and as a fraction of that memcpy figure. pread and mmap
// read the page cache (the file is read once before timing); direct bypasses it and measures the
// drive.
//
//   reader_bench [--file PATH] [--size-mib N] [--bundle-kib N] [--reps N]
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "pack/pack_set.h"
#include "pack/reader_pool.h"

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

bool EnsureFile(const std::string& path, uint64_t size) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && static_cast<uint64_t>(st.st_size) == size) return true;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  std::vector<uint8_t> chunk(8u << 20);
  std::mt19937_64 rng(1);
  for (uint64_t done = 0; done < size;) {
    for (size_t i = 0; i < chunk.size(); i += 8) {
      const uint64_t v = rng();
      std::memcpy(chunk.data() + i, &v, 8);
    }
    const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk.size(), size - done));
    if (::write(fd, chunk.data(), n) != static_cast<ssize_t>(n)) return false;
    done += n;
  }
  return ::close(fd) == 0;
}

// Reads the whole file once so pread and mmap find it in the page cache.
void WarmPageCache(const std::string& path, uint64_t size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  std::vector<uint8_t> chunk(8u << 20);
  for (uint64_t off = 0; off < size; off += chunk.size()) {
    if (::pread(fd, chunk.data(), chunk.size(), static_cast<off_t>(off)) <= 0) break;
  }
  ::close(fd);
}

double MemcpyGbps(uint64_t bytes, uint64_t piece, int reps) {
  std::vector<uint8_t> src(bytes, 1), dst(bytes, 2);  // both pre-faulted
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    for (uint64_t off = 0; off < bytes; off += piece) {
      std::memcpy(dst.data() + off, src.data() + off, std::min(piece, bytes - off));
    }
    best = std::min(best, Seconds(t0, Clock::now()));
  }
  if (dst[bytes / 2] != 1) std::printf("memcpy check failed\n");
  return static_cast<double>(bytes) / best / 1e9;
}

struct Result {
  double gbps = 0;
  bool ok = true;
};

Result ReadAll(const expertd::PackSet& packs, uint32_t threads, uint64_t bundle, int reps,
               uint8_t* dst) {
  expertd::ReaderPoolOptions options;
  options.threads_per_group = threads;
  expertd::ReaderPools pools(packs, options);
  const uint64_t size = packs.pack(0).size;
  const uint64_t n = size / bundle;
  std::vector<uint64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(3));
  // Three projections of one bundle: 3/8, 3/8 and the rest, 256 bytes of padding between them.
  const uint64_t p0 = bundle * 3 / 8 - 256;
  const uint64_t p1 = bundle * 3 / 8 - 256;
  const uint64_t p2 = bundle - p0 - p1 - 512;
  Result result;
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    std::mutex mu;
    std::condition_variable cv;
    uint64_t left = n;
    bool failed = false;
    const auto t0 = Clock::now();
    for (uint64_t b : order) {
      const uint64_t off = b * bundle;
      uint8_t* d = dst + off;
      expertd::ReadJob job;
      job.ranges = {{0, off, p0, d},
                    {0, off + p0 + 256, p1, d + p0 + 256},
                    {0, off + p0 + p1 + 512, p2, d + p0 + p1 + 512}};
      job.done = [&](absl::Status s) {
        std::lock_guard lock(mu);
        if (!s.ok()) failed = true;
        if (--left == 0) cv.notify_one();
      };
      if (!pools.Submit(std::move(job)).ok()) return {0, false};
    }
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return left == 0; });
    best = std::min(best, Seconds(t0, Clock::now()));
    if (failed) result.ok = false;
  }
  result.gbps = static_cast<double>(n * bundle) / best / 1e9;
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  std::string path = "/tmp/expertd-reader-bench.pack";
  uint64_t size_mib = 1024;
  uint64_t bundle_kib = 4096;
  int reps = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--file") {
      path = argv[i + 1];
    } else if (flag == "--size-mib") {
      size_mib = std::strtoull(argv[i + 1], nullptr, 10);
    } else if (flag == "--bundle-kib") {
      bundle_kib = std::strtoull(argv[i + 1], nullptr, 10);
    } else if (flag == "--reps") {
      reps = std::atoi(argv[i + 1]);
    } else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  const uint64_t size = size_mib << 20;
  const uint64_t bundle = bundle_kib << 10;
  if (!EnsureFile(path, size)) {
    std::fprintf(stderr, "cannot create %s\n", path.c_str());
    return 1;
  }
  WarmPageCache(path, size);
  const uint64_t bytes = size / bundle * bundle;
  // The machine may be shared: memcpy is measured before and after the reads, the better of the
  // two is the limit the ratios refer to.
  const double memcpy_before = MemcpyGbps(bytes, bundle, reps);
  std::printf("file %s, %llu MiB, bundles of %llu KiB, best of %d\n", path.c_str(),
              static_cast<unsigned long long>(size_mib),
              static_cast<unsigned long long>(bundle_kib), reps);
  std::printf("memcpy 1 thread, before: %.2f GB/s\n", memcpy_before);
  struct Row {
    std::string method, note;
    uint32_t threads;
    Result r;
  };
  std::vector<Row> rows;
  // Page-aligned and pre-faulted. Bundles start at multiples of the bundle size in the file, so
  // with `dst` O_DIRECT reads go straight to the destination; `dst + 64` forces the bounce buffer.
  void* mem = nullptr;
  if (::posix_memalign(&mem, 4096, bytes + 4096) != 0) return 1;
  auto* dst = static_cast<uint8_t*>(mem);
  std::memset(dst, 0, bytes + 4096);
  for (expertd::ReadMethod method :
       {expertd::ReadMethod::kPread, expertd::ReadMethod::kMmap, expertd::ReadMethod::kDirect}) {
    expertd::PackSetOptions options;
    options.method = method;
    absl::StatusOr<std::unique_ptr<expertd::PackSet>> packs =
        expertd::PackSet::Open({expertd::PackSpec{path, "B", "bench", std::nullopt, {}}}, options);
    if (!packs.ok()) {
      std::fprintf(stderr, "%s\n", packs.status().ToString().c_str());
      return 1;
    }
    const expertd::PackEntry& e = (*packs)->pack(0);
    for (const int shift : {0, 64}) {
      if (shift != 0 && e.method != expertd::ReadMethod::kDirect) continue;
      const std::string name = std::string(expertd::ReadMethodName(e.method)) +
                               (e.method == expertd::ReadMethod::kDirect
                                    ? (shift == 0 ? " (aligned dst)" : " (unaligned dst)")
                                    : "");
      for (uint32_t threads : {1u, 2u, 4u}) {
        rows.push_back(
            {name, e.method_note, threads, ReadAll(**packs, threads, bundle, reps, dst + shift)});
      }
    }
  }
  std::free(mem);
  const double memcpy_after = MemcpyGbps(bytes, bundle, reps);
  const double limit = std::max(memcpy_before, memcpy_after);
  std::printf("memcpy 1 thread, after: %.2f GB/s; limit used: %.2f GB/s\n", memcpy_after, limit);
  std::printf("%-22s %-7s %8s %8s  %s\n", "method", "threads", "GB/s", "/memcpy", "note");
  for (const Row& row : rows) {
    std::printf("%-22s %-7u %8.2f %8.2f  %s%s\n", row.method.c_str(), row.threads, row.r.gbps,
                row.r.gbps / limit, row.r.ok ? "" : "ERRORS ", row.note.c_str());
  }
  return 0;
}
