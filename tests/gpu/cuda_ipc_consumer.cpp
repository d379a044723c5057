// Process B of the two-process GPU test (cuda_ipc_pair_gpu.cpp is A, the "daemon"): an engine
// stand-in that opens the arena's IPC memory handle and the session's IPC events through the
// client helpers (device/cuda_factory.h), and for each READ waits on the ready events on its own
// stream, runs a checksum kernel over the slots in place, records done, reports.
//
// Protocol, one line each way (stdin from A, stdout to A):
//   ARENA <hex handle> <bytes> <reserved_bytes> <slot_stride> <slots>
//   FENCES <n_slots> <hex handles: n ready then n done, 64 bytes each>
//   READ <generation> <delay_us> <slot>...  → RELEASED <generation>   (right after queuing)
//                                           → SUMS <generation> <slot>:<hex checksum>...
//   QUIT
// Errors: "ERROR <text>" and exit 1.
#include <cuda_runtime_api.h>

#include <cinttypes>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "checksum_kernel.h"
#include "device/cuda_factory.h"
#include "gpu_test_util.h"

namespace expertd {
namespace {

int Fail(const std::string& why) {
  std::printf("ERROR %s\n", why.c_str());
  std::fflush(stdout);
  return 1;
}

int Run() {
  std::shared_ptr<const CudaArenaView> arena;
  std::shared_ptr<CudaSessionEvents> events;
  uint64_t stride = 0;
  uint32_t slots = 0;
  cudaStream_t stream = nullptr;
  if (cudaSetDevice(0) != cudaSuccess ||
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
    return Fail("cannot create a stream");
  }
  unsigned long long* sums = nullptr;
  std::string line;
  while (gpu_test::ReadLine(stdin, &line)) {
    std::istringstream in(line);
    std::string verb;
    in >> verb;
    if (verb == "QUIT") break;
    if (verb == "ARENA") {
      std::string hex;
      ArenaExport e;
      in >> hex >> e.bytes >> e.reserved_bytes >> stride >> slots;
      e.handle.kind = SharedHandle::Kind::kCudaIpc;
      e.label = "pair arena";
      if (!gpu_test::Unhex(hex, &e.handle.ipc_handle)) return Fail("bad arena hex");
      auto opened = OpenCudaArenaIfBuilt(e, 0);
      if (!opened.ok()) return Fail(opened.status().ToString());
      arena = *opened;
      // Opening again in the same process must give the same mapping (the refcounted cache).
      auto again = OpenCudaArenaIfBuilt(e, 0);
      if (!again.ok() || again->get() != arena.get()) return Fail("second open is not cached");
      if (cudaMalloc(reinterpret_cast<void**>(&sums), sizeof(unsigned long long) * slots) !=
          cudaSuccess) {
        return Fail("cudaMalloc of the sums");
      }
      continue;
    }
    if (verb == "FENCES") {
      std::string hex;
      FenceExport e;
      in >> e.n_slots >> hex;
      e.handle.kind = SharedHandle::Kind::kCudaIpc;
      if (!gpu_test::Unhex(hex, &e.handle.ipc_handle)) return Fail("bad fence hex");
      e.done_offset = uint64_t{e.n_slots} * 64;
      e.segment_bytes = 2 * e.done_offset;
      auto opened = OpenCudaEventsIfBuilt(e, 0);
      if (!opened.ok()) return Fail(opened.status().ToString());
      events = *opened;
      continue;
    }
    if (verb != "READ" || !arena || !events) return Fail("unexpected line: " + line);
    uint64_t generation = 0;
    uint64_t delay_us = 0;
    in >> generation >> delay_us;
    std::vector<uint32_t> read;
    for (uint32_t s; in >> s;) read.push_back(s);
    if (cudaMemsetAsync(sums, 0, sizeof(unsigned long long) * slots, stream) != cudaSuccess) {
      return Fail("cudaMemsetAsync");
    }
    const auto* base = static_cast<const uint8_t*>(arena->device_ptr());
    for (uint32_t s : read) {
      if (s >= slots) return Fail("slot out of range");
      if (absl::Status st = events->WaitReady(s, generation, stream); !st.ok()) {
        return Fail(st.ToString());
      }
      if (const int e =
              LaunchSlotChecksum(base + s * stride, stride, delay_us * 1000, sums + s, stream);
          e != 0) {
        return Fail("kernel launch: " +
                    std::string(cudaGetErrorString(static_cast<cudaError_t>(e))));
      }
      if (absl::Status st = events->RecordDone(s, generation, stream); !st.ok()) {
        return Fail(st.ToString());
      }
    }
    // Released before the kernels finished: the daemon must rely on the done events.
    std::printf("RELEASED %" PRIu64 "\n", generation);
    std::fflush(stdout);
    if (const cudaError_t e = cudaStreamSynchronize(stream); e != cudaSuccess) {
      return Fail(std::string("cudaStreamSynchronize: ") + cudaGetErrorString(e));
    }
    std::vector<unsigned long long> host(slots);
    if (cudaMemcpy(host.data(), sums, sizeof(unsigned long long) * slots, cudaMemcpyDeviceToHost) !=
        cudaSuccess) {
      return Fail("cudaMemcpy of the sums");
    }
    std::printf("SUMS %" PRIu64, generation);
    for (uint32_t s : read) std::printf(" %u:%llx", s, host[s]);
    std::printf("\n");
    std::fflush(stdout);
  }
  events.reset();
  arena.reset();
  if (sums != nullptr) (void)cudaFree(sums);
  (void)cudaStreamDestroy(stream);
  return 0;
}

}  // namespace
}  // namespace expertd

int main() {
  ::alarm(300);
  return expertd::Run();
}
