// The client library's view of what OpenSession sends (internal to client/lib): descriptors of
// the daemon's shared objects turned into the device layer's export types, the process-wide
// cache of mapped host arenas, a slot class as this process reaches it, and this process's end of
// a session's request lane. The session (session.cpp) and its client-side hits (local_hits.cpp)
// are their users.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string_view>
#include <tuple>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client.h"
#include "device/cuda_factory.h"
#include "device/host/handle_passing.h"
#include "device/host/host_device.h"
#include "engine/residency.h"
#include "expertd/v1/service.pb.h"
#include "lane/lane.h"

namespace expertd::client::internal {

// A gRPC status as an absl one, its message prefixed with `what`.
absl::Status FromGrpc(const grpc::Status& s, std::string_view what);

// `passed`: the descriptors the handle socket sent this session (SharedMemory.passed).
SharedHandle ToHandle(const v1::SharedMemory& m, const PassedDescriptors& passed);
ArenaExport ToArenaExport(const v1::ArenaHandle& a, const PassedDescriptors& passed);
FenceExport ToFenceExport(const v1::FenceTableHandle& f, const PassedDescriptors& passed);

// Arenas mapped by this process, shared by all its sessions: an engine with several sessions on
// one model maps each arena once. Keyed by the object's identity; entries die with their last
// session.
class ArenaCache {
 public:
  static ArenaCache& Get();
  absl::StatusOr<std::shared_ptr<MappedArena>> Map(const v1::ArenaHandle& h,
                                                    const PassedDescriptors& passed);

 private:
  std::mutex mu_;
  std::map<std::tuple<uint64_t, uint64_t, int64_t>, std::weak_ptr<MappedArena>> arenas_;
};

// One slot class as this process reaches it: host mappings, or CUDA IPC views and events.
struct SlotClassView {
  std::vector<std::shared_ptr<MappedArena>> arenas;                // host
  std::vector<std::shared_ptr<const CudaArenaView>> cuda_arenas;   // CUDA
  std::vector<uint64_t> strides;
  std::unique_ptr<MappedFences> fences;        // host
  std::shared_ptr<CudaSessionEvents> events;   // CUDA: this session's ready/done events
  // Client-side hits (engine/residency.h): the class's residency table, read-only, and where
  // this class's pin words start in the session's row; unset without client-side hits.
  std::shared_ptr<MappedArena> residency;
  uint64_t pin_base = 0;
  std::vector<uint32_t> layers;  // the class's layers, in the table's order
  uint32_t n_expert = 0;
};

// Fills `v`'s projections (host mappings) or device_projections (CUDA views) for slot `slot` of
// class `c`; an error when the slot lies outside an arena (nothing is left in `v` then).
absl::Status AddSlotProjections(const SlotClassView& c, bool cuda, uint32_t slot, SlotView* v);

// This process's end of a session's request lane (src/lane/lane.h). Writers take write_mu;
// one thread at a time reads answers (read_mu), handing other threads' answers to them.
struct ClientLane {
  ShmMapping map;
  lane::LaneClientEnd end;
  std::mutex write_mu;
  std::vector<uint8_t> record;  // guarded by write_mu
  std::mutex read_mu;
};

absl::StatusOr<std::unique_ptr<ClientLane>> MapLane(const v1::LaneHandle& h,
                                                    const PassedDescriptors& passed);

}  // namespace expertd::client::internal
