#include <cuda_runtime.h>

#include <cstdio>

#include "device/cuda/cuda_probe.h"

namespace expertd::cuda {

ProbeResult Probe() {
  ProbeResult r;
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    char text[256];
    std::snprintf(text, sizeof text, "cudaGetDeviceCount: %s (%s)", cudaGetErrorString(err),
                  cudaGetErrorName(err));
    r.error = text;
    return r;
  }
  if (count == 0) {
    r.error = "the CUDA driver reports no devices";
    return r;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    char text[320];
    std::snprintf(text, sizeof text, "%d: %s (%.1f GiB, sm_%d%d)", i, prop.name,
                  static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024 * 1024), prop.major,
                  prop.minor);
    r.gpus.emplace_back(text);
  }
  r.usable = !r.gpus.empty();
  if (!r.usable) r.error = "no device answered cudaGetDeviceProperties";
  return r;
}

std::string RuntimeVersion() {
  int v = 0;
  cudaRuntimeGetVersion(&v);
  char text[32];
  std::snprintf(text, sizeof text, "%d.%d", v / 1000, (v % 1000) / 10);
  return text;
}

}  // namespace expertd::cuda
