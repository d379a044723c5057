// GPU check (label gpu): on a machine with a CUDA GPU, the probe must choose the CUDA device and
// describe every GPU. Elsewhere it exits 77, which ctest reports as skipped, printing why.
#include <cstdio>

#include "device/device_probe.h"

int main() {
  const expertd::BuildFeatures features = expertd::GetBuildFeatures();
  if (!features.cuda_backend) {
    std::printf("SKIP: built without the CUDA backend (EXPERTD_CUDA=OFF or no toolkit)\n");
    return 77;
  }
  const expertd::DeviceProbe probe = expertd::ProbeDevices();
  if (probe.kind != expertd::DeviceProbe::Kind::kCuda) {
    std::printf("SKIP: no usable GPU here: %s\n", probe.log_line.c_str());
    return 77;
  }
  int failures = 0;
  if (probe.gpus.empty()) {
    std::printf("FAIL: CUDA chosen but no GPU described\n");
    ++failures;
  }
  for (const std::string& gpu : probe.gpus) {
    if (gpu.find("sm_") == std::string::npos) {
      std::printf("FAIL: GPU line lacks its compute capability: %s\n", gpu.c_str());
      ++failures;
    }
  }
  if (probe.log_line.find("CUDA") == std::string::npos) {
    std::printf("FAIL: log line does not say CUDA: %s\n", probe.log_line.c_str());
    ++failures;
  }
  std::printf("%s\n%s\n", probe.log_line.c_str(), failures ? "FAILED" : "OK");
  return failures ? 1 : 0;
}
