#include "device/device_probe.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

// The backend choice is made here, once; the engine never sees this #if.
#if defined(EXPERTD_HAVE_CUDA)
#include "device/cuda/cuda_probe.h"
#endif

namespace expertd {

BuildFeatures GetBuildFeatures() {
#if defined(EXPERTD_HAVE_CUDA)
  return BuildFeatures{true, cuda::RuntimeVersion()};
#else
  return BuildFeatures{false, "none"};
#endif
}

DeviceProbe ProbeDevices() {
  DeviceProbe probe;
#if defined(EXPERTD_HAVE_CUDA)
  const cuda::ProbeResult r = cuda::Probe();
  if (r.usable) {
    probe.kind = DeviceProbe::Kind::kCuda;
    probe.gpus = r.gpus;
    probe.log_line =
        absl::StrCat("device: CUDA, ", r.gpus.size(), " GPU(s): ", absl::StrJoin(r.gpus, "; "));
    return probe;
  }
  probe.log_line = absl::StrCat("device: host (no usable CUDA GPU: ", r.error,
                                "); expert slots live in host shared memory");
#else
  probe.log_line =
      "device: host (built without the CUDA backend); expert slots live in host shared memory";
#endif
  return probe;
}

}  // namespace expertd
