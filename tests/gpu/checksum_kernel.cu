// The consumer's kernel (two-process GPU test): reads a slot in place, after an optional delay
// that widens the window in which an unsafe overwrite would be caught, and adds its checksum
// (gpu_test_util.h: SlotChecksum) to *out.
#include <cuda_runtime.h>

#include <cstdint>

#include "checksum_kernel.h"

namespace {

__device__ uint64_t MixWord(uint64_t w, uint64_t i) {
  uint64_t x = w ^ (i * 0x9E3779B97F4A7C15ull);
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return x;
}

__device__ uint64_t GlobalTimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void ChecksumKernel(const uint64_t* words, uint64_t n_words, uint64_t delay_ns,
                               unsigned long long* out) {
  if (delay_ns > 0) {
    const uint64_t until = GlobalTimer() + delay_ns;
    while (GlobalTimer() < until) __nanosleep(10000);
  }
  uint64_t sum = 0;
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < n_words;
       i += uint64_t{gridDim.x} * blockDim.x) {
    sum += MixWord(words[i], i);
  }
  atomicAdd(out, static_cast<unsigned long long>(sum));
}

}  // namespace

int LaunchSlotChecksum(const void* slot, uint64_t bytes, uint64_t delay_ns, void* out,
                       void* stream) {
  ChecksumKernel<<<132, 256, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const uint64_t*>(slot), bytes / 8, delay_ns,
      static_cast<unsigned long long*>(out));
  return static_cast<int>(cudaGetLastError());
}

bool DestroyContextForTest() { return false; }
bool ContextReportForTest(unsigned*, int*, int*) { return false; }
