// expertd: until the service lands, the binary reports its version, its build features and which
// device it would serve from (a CUDA GPU, or the host device when no driver is present).
#include <cstdio>
#include <cstring>

#include "device/device_probe.h"

int main(int argc, char** argv) {
  const bool version_only = argc > 1 && std::strcmp(argv[1], "--version") == 0;
  const expertd::BuildFeatures features = expertd::GetBuildFeatures();
  std::printf("expertd %s (cuda backend: %s, cuda runtime: %s)\n", EXPERTD_VERSION,
              features.cuda_backend ? "built" : "not built",
              features.cuda_runtime_version.c_str());
  if (version_only) return 0;
  const expertd::DeviceProbe probe = expertd::ProbeDevices();
  std::printf("%s\n", probe.log_line.c_str());
  return 0;
}
