// Benchmark (run by scripts/gpu-check; not a ctest test): host→device streaming through the CUDA
// device's SubmitCopy (pinned staging, copy streams, fence signals, completion thread) against a
// plain cudaMemcpyAsync of the same bytes from the same pinned buffer in the same run — the limit
// the design measures against (DESIGN.md §7). Also the latency from SubmitCopy to its callback
// (what an acquire that misses waits for after its read) against cudaMemcpyAsync +
// cudaStreamSynchronize of the same size.
//
//   cuda_copy_bench [--total-mib N (1024)] [--segment-mib N (8)] [--reps N (5)]
//
// Prints "RESULT <name> <value> <unit>" lines and "GOAL ... met|missed" for the 0.9 ratio.
// Exits 77 without a GPU, 1 on an error or wrong bytes; a missed goal still exits 0.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "device/cuda_factory.h"
#include "device/device.h"
#include "gpu_test_util.h"
#include "util/status.h"

namespace expertd {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kMiB = uint64_t{1} << 20;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

struct Setup {
  std::unique_ptr<Device> device;
  std::unique_ptr<Arena> arena;
  std::unique_ptr<StagingBuffer> staging;
  std::unique_ptr<FenceTable> fences;
  void* plain = nullptr;  // the baseline's destination, cudaMalloc'd
  cudaStream_t stream = nullptr;
  uint64_t total = 0;
  uint64_t segment = 0;
  uint64_t generation = 0;
};

// One pass of every segment through SubmitCopy; `prefetch` spreads them over the prefetch
// streams (bounded in flight), else all go to the demand stream. Wall time to the last callback.
absl::StatusOr<double> DevicePass(Setup& s, bool prefetch) {
  ++s.generation;
  const uint64_t n = s.total / s.segment;
  std::atomic<uint64_t> failed{0};
  const auto start = Clock::now();
  for (uint64_t i = 0; i < n; ++i) {
    CopyRequest r;
    r.segments.push_back(CopySegment{s.staging->data().subspan(i * s.segment, s.segment),
                                     s.arena.get(), i * s.segment});
    r.priority = prefetch ? CopyPriority::kPrefetch : CopyPriority::kDemand;
    r.signals.push_back(FenceSignal{s.fences.get(), static_cast<SlotId>(i), s.generation});
    RETURN_IF_ERROR(s.device->SubmitCopy(std::move(r), [&failed](absl::Status st) {
      if (!st.ok()) failed.fetch_add(1);
    }));
  }
  RETURN_IF_ERROR(s.device->Drain(absl::Seconds(60)));
  const double t = Seconds(Clock::now() - start);
  if (failed.load() != 0) return absl::InternalError("a copy failed");
  return t;
}

absl::StatusOr<double> PlainPass(Setup& s) {
  const uint64_t n = s.total / s.segment;
  const auto start = Clock::now();
  for (uint64_t i = 0; i < n; ++i) {
    if (cudaMemcpyAsync(static_cast<uint8_t*>(s.plain) + i * s.segment,
                        s.staging->data().data() + i * s.segment, s.segment, cudaMemcpyHostToDevice,
                        s.stream) != cudaSuccess) {
      return absl::InternalError("cudaMemcpyAsync");
    }
  }
  if (cudaStreamSynchronize(s.stream) != cudaSuccess) {
    return absl::InternalError("cudaStreamSynchronize");
  }
  return Seconds(Clock::now() - start);
}

// Median and 99th percentile in microseconds.
std::pair<double, double> Percentiles(std::vector<double> us) {
  std::sort(us.begin(), us.end());
  return {us[us.size() / 2], us[std::min(us.size() - 1, us.size() * 99 / 100)]};
}

absl::Status Latency(Setup& s, uint64_t bytes, const char* label) {
  constexpr int kSamples = 200;
  std::vector<double> device_us;
  std::vector<double> plain_us;
  for (int k = 0; k < kSamples; ++k) {
    ++s.generation;
    std::atomic<bool> done{false};
    Clock::time_point finished;
    CopyRequest r;
    r.segments.push_back(CopySegment{s.staging->data().subspan(0, bytes), s.arena.get(), 0});
    r.priority = CopyPriority::kDemand;
    r.signals.push_back(FenceSignal{s.fences.get(), 0, s.generation});
    const auto start = Clock::now();
    RETURN_IF_ERROR(s.device->SubmitCopy(std::move(r), [&](absl::Status) {
      finished = Clock::now();
      done.store(true, std::memory_order_release);
    }));
    RETURN_IF_ERROR(s.device->Drain(absl::Seconds(10)));
    if (!done.load(std::memory_order_acquire)) return absl::InternalError("no callback");
    device_us.push_back(1e6 * Seconds(finished - start));

    const auto p0 = Clock::now();
    if (cudaMemcpyAsync(s.plain, s.staging->data().data(), bytes, cudaMemcpyHostToDevice,
                        s.stream) != cudaSuccess ||
        cudaStreamSynchronize(s.stream) != cudaSuccess) {
      return absl::InternalError("plain copy");
    }
    plain_us.push_back(1e6 * Seconds(Clock::now() - p0));
  }
  const auto [dm, d99] = Percentiles(device_us);
  const auto [pm, p99] = Percentiles(plain_us);
  std::printf("RESULT latency_submit_to_callback_%s_median %.1f us\n", label, dm);
  std::printf("RESULT latency_submit_to_callback_%s_p99 %.1f us\n", label, d99);
  std::printf("RESULT latency_plain_memcpy_sync_%s_median %.1f us\n", label, pm);
  std::printf("RESULT latency_plain_memcpy_sync_%s_p99 %.1f us\n", label, p99);
  return absl::OkStatus();
}

int Run(uint64_t total_mib, uint64_t segment_mib, int reps) {
  Setup s;
  s.segment = segment_mib * kMiB;
  s.total = (total_mib / segment_mib) * s.segment;
  auto device = MakeCudaDeviceIfBuilt(CudaDeviceOptions{});
  if (!device.ok()) return std::printf("ERROR %s\n", device.status().ToString().c_str()), 1;
  s.device = *std::move(device);
  auto arena = s.device->AllocateArena(s.total, "bench");
  auto staging = s.device->AllocateStaging(s.total);
  auto fences = s.device->CreateFences(static_cast<uint32_t>(s.total / s.segment));
  if (!arena.ok() || !staging.ok() || !fences.ok() ||
      cudaMalloc(&s.plain, s.total) != cudaSuccess ||
      cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking) != cudaSuccess) {
    std::printf("ERROR setup: %s %s %s\n", arena.status().ToString().c_str(),
                staging.status().ToString().c_str(), fences.status().ToString().c_str());
    return 1;
  }
  s.arena = *std::move(arena);
  s.staging = *std::move(staging);
  s.fences = *std::move(fences);
  for (uint64_t i = 0; i < s.total; i += 4096) s.staging->data()[i] = static_cast<uint8_t>(i >> 12);

  std::printf("bench: %llu MiB in %llu MiB segments, %d reps, device %.*s\n",
              static_cast<unsigned long long>(s.total / kMiB),
              static_cast<unsigned long long>(s.segment / kMiB), reps,
              static_cast<int>(s.device->name().size()), s.device->name().data());
  double best_plain = 1e30, best_demand = 1e30, best_prefetch = 1e30;
  for (int r = 0; r <= reps; ++r) {  // pass 0 warms up and is not counted
    auto plain = PlainPass(s);
    auto demand = DevicePass(s, /*prefetch=*/false);
    auto prefetch = DevicePass(s, /*prefetch=*/true);
    if (!plain.ok() || !demand.ok() || !prefetch.ok()) {
      std::printf("ERROR pass: %s %s %s\n", plain.status().ToString().c_str(),
                  demand.status().ToString().c_str(), prefetch.status().ToString().c_str());
      return 1;
    }
    if (r == 0) continue;
    best_plain = std::min(best_plain, *plain);
    best_demand = std::min(best_demand, *demand);
    best_prefetch = std::min(best_prefetch, *prefetch);
  }
  const double gb = static_cast<double>(s.total) / 1e9;
  std::printf("RESULT h2d_plain_cudaMemcpyAsync %.2f GB/s\n", gb / best_plain);
  std::printf("RESULT h2d_submitcopy_demand %.2f GB/s\n", gb / best_demand);
  std::printf("RESULT h2d_submitcopy_prefetch %.2f GB/s\n", gb / best_prefetch);
  const double ratio = std::min(best_plain / best_demand, best_plain / best_prefetch);
  std::printf("RESULT h2d_ratio_min %.3f x\n", ratio);
  std::printf("GOAL h2d ratio >= 0.9: %s\n", ratio >= 0.9 ? "met" : "missed");

  // The bytes arrived (last pass: prefetch).
  std::vector<uint8_t> back(s.segment);
  const uint64_t last = s.total - s.segment;
  if (!s.device->ReadArena(*s.arena, last, back).ok() ||
      std::memcmp(back.data(), s.staging->data().data() + last, s.segment) != 0) {
    std::printf("ERROR the arena does not hold the staged bytes\n");
    return 1;
  }
  for (const auto& [bytes, label] :
       {std::pair<uint64_t, const char*>{64 * 1024, "64KiB"}, {8 * kMiB, "8MiB"}}) {
    if (absl::Status st = Latency(s, std::min(bytes, s.total), label); !st.ok()) {
      std::printf("ERROR latency: %s\n", st.ToString().c_str());
      return 1;
    }
  }
  s.device->Shutdown();
  s.fences.reset();
  s.staging.reset();
  s.arena.reset();
  (void)cudaFree(s.plain);
  (void)cudaStreamDestroy(s.stream);
  return 0;
}

}  // namespace
}  // namespace expertd

int main(int argc, char** argv) {
  uint64_t total_mib = 1024;
  uint64_t segment_mib = 8;
  int reps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const long v = std::strtol(argv[i + 1], nullptr, 10);
    if (v <= 0) return std::printf("bad value for %s\n", argv[i]), 2;
    if (flag == "--total-mib")
      total_mib = static_cast<uint64_t>(v);
    else if (flag == "--segment-mib")
      segment_mib = static_cast<uint64_t>(v);
    else if (flag == "--reps")
      reps = static_cast<int>(v);
    else
      return std::printf("unknown flag %s\n", argv[i]), 2;
  }
  if (segment_mib > total_mib) return std::printf("--segment-mib exceeds --total-mib\n"), 2;
  ::alarm(300);
  expertd::gpu_test::SkipWithoutGpu();
  return expertd::Run(total_mib, segment_mib, reps);
}
