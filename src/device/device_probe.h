// Which device backend this process can serve from. The only place that knows whether the CUDA
// backend was built; everything else asks here.
#pragma once

#include <string>
#include <vector>

namespace expertd {

struct BuildFeatures {
  bool cuda_backend = false;         // the CUDA device backend was compiled in
  std::string cuda_runtime_version;  // "13.0" or "none"
};

BuildFeatures GetBuildFeatures();

struct DeviceProbe {
  enum class Kind { kCuda, kHost };
  Kind kind = Kind::kHost;
  std::vector<std::string> gpus;  // "0: NVIDIA H200 (139.8 GiB, sm_90)"
  // One line for the log: the GPUs found, or why the host device is used instead.
  std::string log_line;
};

// Asks the CUDA runtime for devices when the backend is built; falls back to the host device
// (with the reason in log_line) when it is not built, no driver is loaded or no GPU is present.
DeviceProbe ProbeDevices();

}  // namespace expertd
