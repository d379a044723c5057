// GPU test (label gpu): the CUDA device through the Device interface — arenas (zeroed, tail
// padding), pinned staging, copies with both priorities, fences (a copy held on the CPU until
// done is declared, the client-gone path, a stale signal), IPC exports, host registration,
// shutdown. Exits 77 without a GPU.
//
//   cuda_device_gpu                      the checks
//   cuda_device_gpu --cupy-check CMD...  fills an arena, writes its IPC handle and the expected
//                                        bytes to a temp dir, runs CMD... DIR (the CuPy consumer,
//                                        tests/gpu/cupy_ipc_check.py) while the arena lives, and
//                                        exits with CMD's status
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "device/cuda_factory.h"
#include "device/device.h"
#include "device/host/host_device.h"
#include "gpu_test_util.h"

namespace expertd {
namespace {

using gpu_test::Checks;
using gpu_test::FillPattern;
using gpu_test::PatternByte;

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kStride = 3 * kMiB + 4096 + 64;  // not a multiple of anything in particular
constexpr uint32_t kSlots = 4;

// Counts callbacks and remembers their statuses.
struct Completions {
  std::atomic<int> calls{0};
  std::vector<absl::Status> statuses = std::vector<absl::Status>(64);
  CopyCallback Callback(int index) {
    return [this, index](absl::Status st) {
      statuses[index] = std::move(st);
      calls.fetch_add(1);
    };
  }
};

CopyRequest OneSlotCopy(std::span<const uint8_t> source, Arena* arena, FenceTable* fences,
                        uint32_t slot, uint64_t generation, uint64_t wait_generation,
                        CopyPriority priority) {
  CopyRequest r;
  r.segments.push_back(CopySegment{source, arena, uint64_t{slot} * kStride});
  r.priority = priority;
  if (wait_generation > 0) r.waits.push_back(FenceWait{fences, slot, wait_generation});
  r.signals.push_back(FenceSignal{fences, slot, generation});
  return r;
}

bool SlotHolds(Device& device, const Arena& arena, uint32_t slot, uint64_t generation,
               Checks& checks) {
  std::vector<uint8_t> back(kStride);
  if (!checks.Ok(device.ReadArena(arena, uint64_t{slot} * kStride, back), "ReadArena")) {
    return false;
  }
  for (uint64_t i = 0; i < kStride; ++i) {
    if (back[i] != PatternByte(slot, generation, i)) return false;
  }
  return true;
}

int RunChecks() {
  Checks checks;
  absl::StatusOr<std::unique_ptr<Device>> made = MakeCudaDeviceIfBuilt(CudaDeviceOptions{});
  if (!checks.Ok(made.status(), "MakeCudaDeviceIfBuilt")) return checks.Finish("cuda_device");
  Device& device = **made;
  const Capabilities& caps = device.caps();
  std::printf("device %.*s: copy_engines=%u registers_host_memory=%d "
              "registers_read_only_memory=%d max_arena=%llu\n%s\n",
              static_cast<int>(device.name().size()), device.name().data(), caps.copy_engines,
              caps.registers_host_memory, caps.registers_read_only_memory,
              static_cast<unsigned long long>(caps.max_arena_bytes), device.notes().c_str());
  checks.Expect(device.hardware_id().starts_with("GPU-") && device.hardware_id().size() == 40,
                "the device names its GPU by UUID (GPU- and 36 characters)");
  {
    // More copy streams than CUDA_DEVICE_MAX_CONNECTIONS hardware queues are capped.
    CudaDeviceOptions many;
    many.copy_streams = 16;
    const char* env = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
    if (env != nullptr) many.max_connections = env;
    absl::StatusOr<std::unique_ptr<Device>> capped = MakeCudaDeviceIfBuilt(many);
    if (checks.Ok(capped.status(), "MakeCudaDeviceIfBuilt(copy_streams = 16)")) {
      const uint32_t queues = env == nullptr ? 8 : std::min(16u, static_cast<uint32_t>(std::atoi(env)));
      checks.Expect((*capped)->caps().copy_engines == queues,
                    absl::StrCat("16 copy streams asked for: ", (*capped)->caps().copy_engines,
                                 " made (the hardware queues: ", queues, ")"));
    }
  }
  checks.Expect(!caps.arenas_host_visible && caps.exports_to_other_processes && caps.async_copies &&
                    caps.copy_priorities && !caps.fences_host_visible && caps.staging_pinned &&
                    caps.copy_engines == 2,
                "capabilities as documented");

  // Arenas: rounded to 2 MiB, zeroed including the tail.
  const uint64_t arena_bytes = kSlots * kStride;
  auto arena = device.AllocateArena(arena_bytes, "test arena");
  if (!checks.Ok(arena.status(), "AllocateArena")) return checks.Finish("cuda_device");
  checks.Expect((*arena)->reserved_bytes() % kArenaAlignment == 0 &&
                    (*arena)->reserved_bytes() >= arena_bytes,
                "reserved bytes a multiple of 2 MiB");
  {
    std::vector<uint8_t> all((*arena)->reserved_bytes(), 0xff);
    checks.Ok(device.ReadArena(**arena, 0, all), "ReadArena all");
    bool zero = true;
    for (uint8_t b : all) zero = zero && b == 0;
    checks.Expect(zero, "a new arena is all zero");
  }
  checks.Expect(
      device.AllocateArena(0, "zero").status().code() == absl::StatusCode::kInvalidArgument,
      "0-byte arena is InvalidArgument");
  checks.Expect(device.AllocateArena(caps.max_arena_bytes + 1, "huge").status().code() ==
                    absl::StatusCode::kResourceExhausted,
                "arena above max_arena_bytes is ResourceExhausted");

  // Staging: pinned, page-aligned.
  auto staging = device.AllocateStaging(3 * kSlots * kStride);
  if (!checks.Ok(staging.status(), "AllocateStaging")) return checks.Finish("cuda_device");
  const std::span<uint8_t> stage = (*staging)->data();
  checks.Expect(reinterpret_cast<uintptr_t>(stage.data()) % ::sysconf(_SC_PAGESIZE) == 0,
                "staging is page-aligned");
  auto fences = device.CreateFences(kSlots);
  if (!checks.Ok(fences.status(), "CreateFences")) return checks.Finish("cuda_device");
  FenceTable& f = **fences;

  // Round 1: generation 1 into every slot, demand and prefetch.
  Completions done;
  for (uint32_t s = 0; s < kSlots; ++s) {
    std::span<uint8_t> src = stage.subspan(s * kStride, kStride);
    FillPattern(src, s, 1);
    checks.Ok(
        device.SubmitCopy(OneSlotCopy(src, arena->get(), &f, s, 1, 0,
                                      s % 2 ? CopyPriority::kPrefetch : CopyPriority::kDemand),
                          done.Callback(s)),
        "SubmitCopy round 1");
  }
  checks.Ok(device.Drain(absl::Seconds(20)), "Drain round 1");
  checks.Expect(done.calls.load() == static_cast<int>(kSlots), "one callback per copy");
  for (uint32_t s = 0; s < kSlots; ++s) {
    checks.Ok(done.statuses[s], absl::StrCat("copy ", s));
    checks.Expect(SlotHolds(device, **arena, s, 1, checks), absl::StrCat("slot ", s, " gen 1"));
    checks.Expect(f.ready(s) == 1, absl::StrCat("ready[", s, "] = 1"));
  }
  {
    std::vector<uint8_t> tail((*arena)->reserved_bytes() - arena_bytes);
    checks.Ok(device.ReadArena(**arena, arena_bytes, tail), "ReadArena tail");
    bool zero = true;
    for (uint8_t b : tail) zero = zero && b == 0;
    checks.Expect(zero, "tail padding stays zero after copies");
  }

  // A copy over slot 0 that waits for done of generation 1: held on the CPU until declared.
  std::span<uint8_t> src2 = stage.subspan(kSlots * kStride, kStride);
  FillPattern(src2, 0, 2);
  checks.Ok(device.SubmitCopy(OneSlotCopy(src2, arena->get(), &f, 0, 2, 1, CopyPriority::kDemand),
                              done.Callback(10)),
            "SubmitCopy waiting");
  checks.Expect(device.Drain(absl::Milliseconds(300)).code() == absl::StatusCode::kDeadlineExceeded,
                "an undeclared wait holds the copy");
  checks.Expect(SlotHolds(device, **arena, 0, 1, checks), "slot 0 untouched while held");
  checks.Ok(DeclareCudaDoneRecorded(f, 0, 1), "DeclareCudaDoneRecorded");
  checks.Ok(device.Drain(absl::Seconds(20)), "Drain after declaration");
  checks.Ok(done.statuses[10], "held copy");
  checks.Expect(SlotHolds(device, **arena, 0, 2, checks), "slot 0 gen 2 after declaration");
  checks.Expect(f.ready(0) == 2 && f.done(0) == 1, "ready 2, done 1");

  // The client-gone path on slot 1.
  std::span<uint8_t> src3 = stage.subspan((kSlots + 1) * kStride, kStride);
  FillPattern(src3, 1, 2);
  checks.Ok(device.SubmitCopy(OneSlotCopy(src3, arena->get(), &f, 1, 2, 1, CopyPriority::kPrefetch),
                              done.Callback(11)),
            "SubmitCopy client gone");
  checks.Ok(DeclareCudaClientGone(f, 1, 1), "DeclareCudaClientGone");
  checks.Ok(device.Drain(absl::Seconds(20)), "Drain client gone");
  checks.Expect(SlotHolds(device, **arena, 1, 2, checks), "slot 1 gen 2");

  // A stale signal: bytes land, the callback says FailedPrecondition, ready stays.
  checks.Ok(device.SubmitCopy(OneSlotCopy(stage.subspan(0, kStride), arena->get(), &f, 0, 1, 0,
                                          CopyPriority::kDemand),
                              done.Callback(12)),
            "SubmitCopy stale");
  checks.Ok(device.Drain(absl::Seconds(20)), "Drain stale");
  checks.Expect(done.statuses[12].code() == absl::StatusCode::kFailedPrecondition,
                "stale signal is FailedPrecondition");
  checks.Expect(f.ready(0) == 2, "ready not lowered");

  // Exports.
  auto ex = (*arena)->Export();
  if (checks.Ok(ex.status(), "Arena::Export")) {
    bool nonzero = false;
    for (char c : ex->handle.ipc_handle) nonzero = nonzero || c != 0;
    checks.Expect(ex->handle.kind == SharedHandle::Kind::kCudaIpc &&
                      ex->handle.ipc_handle.size() == 64 && nonzero,
                  "arena export: 64 non-zero IPC handle bytes");
    auto again = (*arena)->Export();
    checks.Expect(again.ok() && again->handle.ipc_handle == ex->handle.ipc_handle,
                  "arena export is cached");
  }
  auto fx = f.Export();
  if (checks.Ok(fx.status(), "FenceTable::Export")) {
    checks.Expect(fx->n_slots == kSlots && fx->done_offset == 64 * kSlots &&
                      fx->segment_bytes == 128 * kSlots &&
                      fx->handle.ipc_handle.size() == 128 * kSlots,
                  "fence export layout");
  }

  // Errors: an arena of another device, reads out of range.
  auto host = MakeHostDevice();
  if (host.ok()) {
    auto host_arena = (*host)->AllocateArena(kMiB, "host");
    if (host_arena.ok()) {
      CopyRequest r;
      r.segments.push_back(CopySegment{stage.subspan(0, 64), host_arena->get(), 0});
      checks.Expect(device.SubmitCopy(std::move(r), [](absl::Status) {}).code() ==
                        absl::StatusCode::kInvalidArgument,
                    "a host arena is refused");
    }
  }
  std::vector<uint8_t> one(1);
  checks.Expect(!device.ReadArena(**arena, (*arena)->reserved_bytes(), one).ok(),
                "ReadArena past the end is refused");

  // Host registration: a writable anonymous mapping, and a read-only file mapping.
  const uint64_t reg_bytes = kStride;
  void* anon =
      ::mmap(nullptr, reg_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (anon != MAP_FAILED) {
    std::span<uint8_t> mem(static_cast<uint8_t*>(anon), reg_bytes);
    FillPattern(mem, 2, 3);
    auto reg = device.RegisterHostMemory(mem);
    if (!caps.registers_host_memory) {
      checks.Expect(reg.status().code() == absl::StatusCode::kUnimplemented,
                    "no registration: Unimplemented");
    } else if (checks.Ok(reg.status(), "RegisterHostMemory (anonymous)")) {
      checks.Ok(device.SubmitCopy(
                    OneSlotCopy((*reg)->data(), arena->get(), &f, 2, 3, 0, CopyPriority::kDemand),
                    done.Callback(13)),
                "SubmitCopy from registered memory");
      checks.Ok(device.Drain(absl::Seconds(20)), "Drain registered");
      checks.Expect(SlotHolds(device, **arena, 2, 3, checks), "slot 2 from registered memory");
    }
    reg = absl::UnknownError("released");
    ::munmap(anon, reg_bytes);
  }
  const int fd = ::memfd_create("expertd-gpu-test", MFD_CLOEXEC);
  if (fd >= 0 && ::ftruncate(fd, static_cast<off_t>(reg_bytes)) == 0) {
    std::vector<uint8_t> bytes(reg_bytes);
    FillPattern(bytes, 3, 4);
    if (::pwrite(fd, bytes.data(), bytes.size(), 0) == static_cast<ssize_t>(bytes.size())) {
      void* ro = ::mmap(nullptr, reg_bytes, PROT_READ, MAP_SHARED, fd, 0);
      if (ro != MAP_FAILED) {
        auto reg = device.RegisterHostMemory({static_cast<uint8_t*>(ro), reg_bytes});
        std::printf("read-only file mapping: %s\n",
                    reg.ok() ? "registered" : reg.status().ToString().c_str());
        // Each outcome the device announced is right; the other one is wrong. Without
        // read-only support the refusal must leave the device healthy (staging remains).
        if (caps.registers_read_only_memory) {
          checks.Ok(reg.status(), "RegisterHostMemory (read-only file mapping, supported)");
        } else if (caps.registers_host_memory) {
          checks.Expect(!reg.ok() && device.Health().ok(),
                        "a read-only mapping is refused without read-only support, and the "
                        "device stays healthy");
        }
        if (reg.ok()) {
          checks.Ok(device.SubmitCopy(OneSlotCopy((*reg)->data(), arena->get(), &f, 3, 4, 0,
                                                  CopyPriority::kPrefetch),
                                      done.Callback(14)),
                    "SubmitCopy from a read-only registration");
          checks.Ok(device.Drain(absl::Seconds(20)), "Drain read-only registration");
          checks.Expect(SlotHolds(device, **arena, 3, 4, checks), "slot 3 from read-only mapping");
        }
        reg = absl::UnknownError("released");
        ::munmap(ro, reg_bytes);
      }
    }
  }
  if (fd >= 0) ::close(fd);

  // Shutdown cancels a held copy; later submissions are refused.
  checks.Ok(device.SubmitCopy(OneSlotCopy(src2, arena->get(), &f, 0, 5, 2, CopyPriority::kDemand),
                              done.Callback(15)),
            "SubmitCopy before shutdown");
  const int before = done.calls.load();
  device.Shutdown();
  checks.Expect(
      done.calls.load() == before + 1 && done.statuses[15].code() == absl::StatusCode::kCancelled,
      "shutdown cancels the held copy");
  checks.Expect(
      device.SubmitCopy(OneSlotCopy(src2, arena->get(), &f, 0, 6, 0, CopyPriority::kDemand),
                        [](absl::Status) {})
              .code() == absl::StatusCode::kFailedPrecondition,
      "SubmitCopy after shutdown is FailedPrecondition");
  checks.Ok(device.Health(), "Health");
  return checks.Finish("cuda_device");
}

// --cupy-check: keeps an arena alive while an independent consumer opens its IPC handle.
int RunConsumer(const std::vector<std::string>& command) {
  Checks checks;
  auto made = MakeCudaDeviceIfBuilt(CudaDeviceOptions{});
  if (!checks.Ok(made.status(), "MakeCudaDeviceIfBuilt")) return 1;
  Device& device = **made;
  auto arena = device.AllocateArena(kSlots * kStride, "cupy arena");
  auto staging = device.AllocateStaging(kSlots * kStride);
  auto fences = device.CreateFences(kSlots);
  if (!checks.Ok(arena.status(), "arena") || !checks.Ok(staging.status(), "staging") ||
      !checks.Ok(fences.status(), "fences")) {
    return 1;
  }
  char dir_template[] = "/tmp/expertd-cupy-XXXXXX";
  const char* dir = ::mkdtemp(dir_template);
  if (dir == nullptr) return 1;
  for (uint32_t s = 0; s < kSlots; ++s) {
    std::span<uint8_t> src = (*staging)->data().subspan(s * kStride, kStride);
    FillPattern(src, s, 7);
    checks.Ok(device.SubmitCopy(
                  OneSlotCopy(src, arena->get(), fences->get(), s, 1, 0, CopyPriority::kDemand),
                  [](absl::Status) {}),
              "SubmitCopy");
    std::ofstream(absl::StrCat(dir, "/slot", s, ".bin"), std::ios::binary)
        .write(reinterpret_cast<const char*>(src.data()), static_cast<std::streamsize>(kStride));
  }
  checks.Ok(device.Drain(absl::Seconds(20)), "Drain");
  auto ex = (*arena)->Export();
  if (!checks.Ok(ex.status(), "Export")) return 1;
  std::ofstream(absl::StrCat(dir, "/arena.txt"))
      << "handle=" << gpu_test::Hex(ex->handle.ipc_handle) << "\nbytes=" << ex->bytes
      << "\nreserved_bytes=" << ex->reserved_bytes << "\nslot_stride=" << kStride
      << "\nslots=" << kSlots << "\nowner_pid=" << ex->handle.owner_pid << "\n";
  std::vector<std::string> argv = command;
  argv.emplace_back(dir);
  gpu_test::Child child;
  if (!checks.Ok(gpu_test::Spawn(argv, /*pipes=*/false, &child), "spawn consumer")) return 1;
  const int rc = child.Wait();
  std::printf("consumer exited with %d\n", rc);
  for (uint32_t s = 0; s < kSlots; ++s) ::unlink(absl::StrCat(dir, "/slot", s, ".bin").c_str());
  ::unlink(absl::StrCat(dir, "/arena.txt").c_str());
  ::rmdir(dir);
  return checks.failures() == 0 ? rc : 1;
}

}  // namespace
}  // namespace expertd

int main(int argc, char** argv) {
  ::alarm(300);  // a hung GPU call ends the test instead of the test run
  expertd::gpu_test::SkipWithoutGpu();
  if (argc > 2 && std::string(argv[1]) == "--cupy-check") {
    return expertd::RunConsumer(std::vector<std::string>(argv + 2, argv + argc));
  }
  return expertd::RunChecks();
}
