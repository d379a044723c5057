// GPU test (label gpu), two processes: this one plays the daemon (a CUDA device, an arena, a
// fence table of IPC events), cuda_ipc_consumer plays an engine in another process (IPC-opened
// arena and events, a checksum kernel reading slots in place). Checks:
//   1. bytes copied through SubmitCopy reach the other process (checksums match the host's);
//   2. the consumer's stream really waits on the ready events of copies still in flight;
//   3. an overwrite waits for the consumer's done events on the GPU: the consumer releases
//      right after queuing slow kernels, the daemon overwrites at once, and the kernels must
//      still see the old bytes (and the overwrites must finish only after them);
//   4. an overwrite whose done was not declared yet stays on the CPU (no ready record).
// Usage: cuda_ipc_pair_gpu [PATH_OF_cuda_ipc_consumer]   (default: next to this executable).
// Exits 77 without a GPU.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "device/cuda_factory.h"
#include "device/device.h"
#include "gpu_test_util.h"

namespace expertd {
namespace {

using Clock = std::chrono::steady_clock;
using gpu_test::Checks;

constexpr uint32_t kSlots = 6;
constexpr uint64_t kStride = (uint64_t{4} << 20) + 65536;  // a multiple of 8, not of 2 MiB
constexpr uint64_t kDelayUs = 100000;  // per consumer kernel in round 2 (they run in sequence)

struct Pair {
  Checks checks;
  std::unique_ptr<Device> device;
  std::unique_ptr<Arena> arena;
  std::unique_ptr<StagingBuffer> staging;
  std::unique_ptr<FenceTable> fences;
  gpu_test::Child child;
  std::atomic<int> completed{0};
  std::vector<Clock::time_point> finished_at = std::vector<Clock::time_point>(3 * kSlots);
  std::vector<absl::Status> statuses = std::vector<absl::Status>(3 * kSlots);

  std::span<uint8_t> Source(uint32_t slot, uint64_t generation) {
    const uint64_t region = generation == 1 ? 0 : 1;
    return staging->data().subspan((region * kSlots + slot) * kStride, kStride);
  }

  void Submit(uint32_t slot, uint64_t generation, uint64_t wait, CopyPriority priority) {
    CopyRequest r;
    r.segments.push_back(CopySegment{Source(slot, generation), arena.get(), slot * kStride});
    r.priority = priority;
    if (wait > 0) r.waits.push_back(FenceWait{fences.get(), slot, wait});
    r.signals.push_back(FenceSignal{fences.get(), slot, generation});
    const size_t index = generation * kSlots + slot - kSlots;  // gen 1 → 0.., gen 3 → 12..
    checks.Ok(device->SubmitCopy(std::move(r),
                                 [this, index](absl::Status st) {
                                   statuses[index] = std::move(st);
                                   finished_at[index] = Clock::now();
                                   completed.fetch_add(1);
                                 }),
              absl::StrCat("SubmitCopy slot ", slot, " gen ", generation));
  }

  // A grant may go out once its ready record was made (ready() reached it), not earlier: the
  // consumer would otherwise wait on an older record.
  void AwaitRecorded(uint64_t generation) {
    const auto deadline = Clock::now() + std::chrono::seconds(20);
    for (uint32_t s = 0; s < kSlots; ++s) {
      while (fences->ready(s) < generation && Clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
      checks.Expect(fences->ready(s) >= generation, absl::StrCat("ready[", s, "] recorded"));
    }
  }

  void Send(const std::string& line) {
    std::fprintf(child.to, "%s\n", line.c_str());
    std::fflush(child.to);
  }

  // The next line from the consumer, which must start with `verb`.
  std::string Expect(const std::string& verb) {
    std::string line;
    if (!gpu_test::ReadLine(child.from, &line)) line = "(consumer closed its output)";
    checks.Expect(line.rfind(verb, 0) == 0, absl::StrCat("expected ", verb, ", got: ", line));
    return line;
  }

  void ExpectSums(const std::string& line, uint64_t data_generation, const std::string& what) {
    std::istringstream in(line);
    std::string verb;
    uint64_t gen = 0;
    in >> verb >> gen;
    uint32_t seen = 0;
    for (std::string item; in >> item; ++seen) {
      const size_t colon = item.find(':');
      const uint32_t slot = static_cast<uint32_t>(std::stoul(item.substr(0, colon)));
      const uint64_t got = std::stoull(item.substr(colon + 1), nullptr, 16);
      const uint64_t want = gpu_test::SlotChecksum(Source(slot, data_generation));
      checks.Expect(got == want,
                    absl::StrCat(what, ": slot ", slot, " checksum ", absl::Hex(got), ", expected ",
                                 absl::Hex(want), " (generation ", data_generation, " bytes)"));
    }
    checks.Expect(seen == kSlots, absl::StrCat(what, ": ", seen, " checksums"));
  }

  void DeclareAll(uint64_t generation) {
    for (uint32_t s = 0; s < kSlots; ++s) {
      checks.Ok(DeclareCudaDoneRecorded(*fences, s, generation), "DeclareCudaDoneRecorded");
    }
  }
};

std::string ReadList(uint64_t generation, uint64_t delay_us) {
  std::string line = absl::StrCat("READ ", generation, " ", delay_us);
  for (uint32_t s = 0; s < kSlots; ++s) absl::StrAppend(&line, " ", s);
  return line;
}

int Run(const std::string& consumer) {
  Pair p;
  auto device = MakeCudaDeviceIfBuilt(CudaDeviceOptions{});
  if (!p.checks.Ok(device.status(), "MakeCudaDeviceIfBuilt")) return p.checks.Finish("pair");
  p.device = *std::move(device);
  auto arena = p.device->AllocateArena(kSlots * kStride, "pair arena");
  auto staging = p.device->AllocateStaging(2 * kSlots * kStride);
  auto fences = p.device->CreateFences(kSlots);
  if (!p.checks.Ok(arena.status(), "arena") || !p.checks.Ok(staging.status(), "staging") ||
      !p.checks.Ok(fences.status(), "fences")) {
    return p.checks.Finish("pair");
  }
  p.arena = *std::move(arena);
  p.staging = *std::move(staging);
  p.fences = *std::move(fences);
  for (uint32_t s = 0; s < kSlots; ++s) {
    gpu_test::FillPattern(p.Source(s, 1), s, 1);
    gpu_test::FillPattern(p.Source(s, 3), s, 3);
  }
  auto ax = p.arena->Export();
  auto fx = p.fences->Export();
  if (!p.checks.Ok(ax.status(), "arena export") || !p.checks.Ok(fx.status(), "fence export")) {
    return p.checks.Finish("pair");
  }
  if (!p.checks.Ok(gpu_test::Spawn({consumer}, /*pipes=*/true, &p.child), "spawn")) {
    return p.checks.Finish("pair");
  }
  p.Send(absl::StrCat("ARENA ", gpu_test::Hex(ax->handle.ipc_handle), " ", ax->bytes, " ",
                      ax->reserved_bytes, " ", kStride, " ", kSlots));
  p.Send(absl::StrCat("FENCES ", fx->n_slots, " ", gpu_test::Hex(fx->handle.ipc_handle)));

  // Round 1: copies of generation 1 go out; the grants follow at once, while they may still be
  // in flight: the consumer's stream waits on the ready events.
  for (uint32_t s = 0; s < kSlots; ++s) {
    p.Submit(s, 1, 0, s % 2 ? CopyPriority::kPrefetch : CopyPriority::kDemand);
  }
  p.AwaitRecorded(1);
  p.Send(ReadList(1, 0));
  p.Expect("RELEASED 1");
  p.DeclareAll(1);
  p.ExpectSums(p.Expect("SUMS 1"), 1, "round 1");

  // Round 2: every slot re-granted as generation 2 (resident, no copy); the consumer's kernels
  // sleep before reading. Overwrites with generation 3 bytes: slots 3..5 are submitted before
  // the release (held on the CPU), slots 0..2 right after it (GPU waits on the done events).
  for (uint32_t s = 0; s < kSlots; ++s) p.checks.Ok(p.fences->AdvanceReady(s, 2), "AdvanceReady");
  p.Send(ReadList(2, kDelayUs));
  for (uint32_t s = 3; s < kSlots; ++s) p.Submit(s, 3, 2, CopyPriority::kPrefetch);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  for (uint32_t s = 3; s < kSlots; ++s) {
    p.checks.Expect(p.fences->ready(s) == 2, "an undeclared overwrite makes no ready record");
  }
  p.Expect("RELEASED 2");
  const Clock::time_point released = Clock::now();
  p.DeclareAll(2);
  for (uint32_t s = 0; s < 3; ++s) p.Submit(s, 3, 2, CopyPriority::kDemand);
  p.ExpectSums(p.Expect("SUMS 2"), 1, "round 2 (overwrites must wait for the readers)");
  p.checks.Ok(p.device->Drain(absl::Seconds(30)), "Drain");
  for (uint32_t s = 0; s < kSlots; ++s) {
    p.checks.Ok(p.statuses[2 * kSlots + s], absl::StrCat("overwrite of slot ", s));
  }
  // The last reader finishes about kSlots * kDelayUs after the release; its overwrite cannot
  // have finished much before that.
  const double last_ms =
      std::chrono::duration<double, std::milli>(p.finished_at[3 * kSlots - 1] - released).count();
  std::printf("overwrite of slot %u finished %.1f ms after the release (readers: %u x %" PRIu64
              " ms)\n",
              kSlots - 1, last_ms, kSlots, kDelayUs / 1000);
  p.checks.Expect(last_ms >= 0.5 * kSlots * kDelayUs / 1000.0,
                  "the overwrite waited for the reader's done event on the GPU");

  // Round 3: the new bytes are granted and read.
  p.Send(ReadList(3, 0));
  p.Expect("RELEASED 3");
  p.DeclareAll(3);
  p.ExpectSums(p.Expect("SUMS 3"), 3, "round 3");
  p.Send("QUIT");
  const int rc = p.child.Wait();
  p.checks.Expect(rc == 0, absl::StrCat("consumer exit status ", rc));
  p.checks.Ok(p.device->Health(), "Health");
  p.device->Shutdown();
  p.fences.reset();
  p.staging.reset();
  p.arena.reset();
  return p.checks.Finish("cuda_ipc_pair");
}

}  // namespace
}  // namespace expertd

int main(int argc, char** argv) {
  ::alarm(300);
  ::signal(SIGPIPE, SIG_IGN);  // a dead consumer shows as a failed check, not a silent exit
  expertd::gpu_test::SkipWithoutGpu();
  const std::string consumer =
      argc > 1 ? argv[1] : expertd::gpu_test::SelfDir() + "/cuda_ipc_consumer";
  return expertd::Run(consumer);
}
