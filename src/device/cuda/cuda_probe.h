// CUDA side of the device probe; compiled only into expertd_device_cuda. No CUDA types here, so
// callers need no CUDA headers.
#pragma once

#include <string>
#include <vector>

namespace expertd::cuda {

struct ProbeResult {
  bool usable = false;
  std::vector<std::string> gpus;
  std::string error;  // why no GPU can be used: "cudaGetDeviceCount: <text> (<code>)"
};

ProbeResult Probe();
std::string RuntimeVersion();

}  // namespace expertd::cuda
