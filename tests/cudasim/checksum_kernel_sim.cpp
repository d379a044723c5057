// The checksum "kernel" of the GPU tests (tests/gpu/checksum_kernel.h) for the CUDA simulator:
// the same sum, computed on the stream's worker thread over the simulator's view of the slot.
// A slot range outside device memory is an illegal address, as it would be on a GPU.
#include <cstdint>
#include <cstdio>
#include <span>

#include "../gpu/checksum_kernel.h"
#include "../gpu/gpu_test_util.h"
#include "cudasim.h"

namespace {

struct Launch {
  const void* slot;
  uint64_t bytes;
  uint64_t delay_ns;
  void* out;
};

void Run(void* user) {
  const Launch* l = static_cast<const Launch*>(user);
  expertd_cudasim_kernel_delay(l->delay_ns);
  const auto* in = static_cast<const uint8_t*>(expertd_cudasim_device_bytes(l->slot, l->bytes));
  auto* out = static_cast<uint64_t*>(expertd_cudasim_device_bytes(l->out, sizeof(uint64_t)));
  if (in == nullptr || out == nullptr) {
    std::fprintf(stderr, "cudasim checksum kernel: illegal address (slot %p, %llu bytes)\n",
                 l->slot, static_cast<unsigned long long>(l->bytes));
  } else {
    *out += expertd::gpu_test::SlotChecksum(std::span<const uint8_t>(in, l->bytes));
  }
  delete l;
}

}  // namespace

int LaunchSlotChecksum(const void* slot, uint64_t bytes, uint64_t delay_ns, void* out,
                       void* stream) {
  auto* l = new Launch{slot, bytes, delay_ns, out};
  const cudaError_t e = cudaLaunchHostFunc(static_cast<cudaStream_t>(stream), Run, l);
  if (e != cudaSuccess) delete l;
  return static_cast<int>(e);
}

bool DestroyContextForTest() {
  expertd_cudasim_destroy_context(cudaErrorContextIsDestroyed);
  return true;
}

bool ContextReportForTest(unsigned* physical_mask, int* peer_mappings, int* wrong_device_records) {
  expertd_cudasim_contexts(physical_mask, peer_mappings, wrong_device_records);
  return true;
}
