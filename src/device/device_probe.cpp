#include "device/device_probe.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "device/cuda_factory.h"

// The backend choice is made here, once; the engine never sees this #if.
#if defined(EXPERTD_HAVE_CUDA)
#include "device/cuda/cuda_client.h"
#include "device/cuda/cuda_device.h"
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

// ---- The CUDA backend's entry points (device/cuda_factory.h) ---------------------------------

#if defined(EXPERTD_HAVE_CUDA)

absl::StatusOr<std::unique_ptr<Device>> MakeCudaDeviceIfBuilt(const CudaDeviceOptions& options) {
  return cuda::MakeCudaDevice(options);
}
absl::Status DeclareCudaDoneRecorded(FenceTable& fences, SlotId slot, uint64_t generation) {
  return cuda::DeclareDone(fences, slot, generation, /*recorded=*/true);
}
absl::Status DeclareCudaClientGone(FenceTable& fences, SlotId slot, uint64_t generation) {
  return cuda::DeclareDone(fences, slot, generation, /*recorded=*/false);
}
absl::StatusOr<std::shared_ptr<const CudaArenaView>> OpenCudaArenaIfBuilt(
    const ArenaExport& descriptor, int device_ordinal) {
  return cuda::OpenArena(descriptor, device_ordinal);
}
absl::StatusOr<std::shared_ptr<CudaSessionEvents>> OpenCudaEventsIfBuilt(
    const FenceExport& descriptor, int device_ordinal) {
  return cuda::OpenEvents(descriptor, device_ordinal);
}
absl::StatusOr<int> ResolveCudaDeviceIfBuilt(std::string_view uuid, int requested) {
  return cuda::ResolveDevice(uuid, requested);
}
absl::StatusOr<std::unique_ptr<CudaStreamMark>> MakeCudaStreamMarkIfBuilt(int device_ordinal) {
  return cuda::MakeStreamMark(device_ordinal);
}
absl::Status CheckCudaStreamIfBuilt(void* cuda_stream, int device_ordinal) {
  return cuda::CheckStream(cuda_stream, device_ordinal);
}

#else

namespace {
absl::Status NotBuilt() {
  return absl::UnimplementedError("built without the CUDA device backend (EXPERTD_CUDA=OFF or no "
                                  "toolkit at build time)");
}
}  // namespace

absl::StatusOr<std::unique_ptr<Device>> MakeCudaDeviceIfBuilt(const CudaDeviceOptions&) {
  return NotBuilt();
}
// Without the backend no table is a CUDA one: nothing to declare.
absl::Status DeclareCudaDoneRecorded(FenceTable&, SlotId, uint64_t) { return absl::OkStatus(); }
absl::Status DeclareCudaClientGone(FenceTable&, SlotId, uint64_t) { return absl::OkStatus(); }
absl::StatusOr<std::shared_ptr<const CudaArenaView>> OpenCudaArenaIfBuilt(const ArenaExport&,
                                                                          int) {
  return NotBuilt();
}
absl::StatusOr<std::shared_ptr<CudaSessionEvents>> OpenCudaEventsIfBuilt(const FenceExport&,
                                                                         int) {
  return NotBuilt();
}
absl::StatusOr<int> ResolveCudaDeviceIfBuilt(std::string_view, int) { return NotBuilt(); }
absl::StatusOr<std::unique_ptr<CudaStreamMark>> MakeCudaStreamMarkIfBuilt(int) {
  return NotBuilt();
}
absl::Status CheckCudaStreamIfBuilt(void*, int) { return NotBuilt(); }

#endif

}  // namespace expertd
