// See client_handles.h.
#include "client_handles.h"

#include "absl/strings/str_cat.h"

namespace expertd::client::internal {

absl::Status FromGrpc(const grpc::Status& s, std::string_view what) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(absl::string_view(what.data(), what.size()), ": ",
                                   s.error_message()));
}

// `passed`: the descriptors the handle socket sent this session (SharedMemory.passed).
SharedHandle ToHandle(const v1::SharedMemory& m, const PassedDescriptors& passed) {
  SharedHandle h;
  h.passed_fd = passed.ForPassed(m.passed());
  h.kind = m.cuda_ipc_handle().empty() ? SharedHandle::Kind::kHostShm : SharedHandle::Kind::kCudaIpc;
  h.shm_name = m.shm_name();
  h.fd = m.fd();
  h.owner_pid = m.owner_pid();
  h.dev = m.dev();
  h.inode = m.inode();
  h.ipc_handle = m.cuda_ipc_handle();
  return h;
}

ArenaExport ToArenaExport(const v1::ArenaHandle& a, const PassedDescriptors& passed) {
  ArenaExport ex;
  ex.handle = ToHandle(a.memory(), passed);
  ex.bytes = a.bytes();
  ex.reserved_bytes = a.reserved_bytes();
  ex.label = a.label();
  return ex;
}

FenceExport ToFenceExport(const v1::FenceTableHandle& f, const PassedDescriptors& passed) {
  FenceExport fx;
  fx.handle = ToHandle(f.memory(), passed);
  fx.n_slots = f.n_slots();
  fx.segment_bytes = f.segment_bytes();
  fx.done_offset = f.done_offset();
  if (f.has_session_done()) fx.session_done = ToHandle(f.session_done(), passed);
  return fx;
}

ArenaCache& ArenaCache::Get() {
  static ArenaCache* cache = new ArenaCache();  // never destroyed: sessions may outlive main
  return *cache;
}

absl::StatusOr<std::shared_ptr<MappedArena>> ArenaCache::Map(const v1::ArenaHandle& h,
                                                             const PassedDescriptors& passed) {
  const auto key = std::make_tuple(h.memory().dev(), h.memory().inode(), h.memory().owner_pid());
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = arenas_.find(key); it != arenas_.end()) {
    if (std::shared_ptr<MappedArena> live = it->second.lock()) return live;
  }
  absl::StatusOr<MappedArena> mapped = MapArena(ToArenaExport(h, passed));
  if (!mapped.ok()) return mapped.status();
  auto shared = std::make_shared<MappedArena>(*std::move(mapped));
  arenas_[key] = shared;
  return shared;
}

absl::Status AddSlotProjections(const SlotClassView& c, bool cuda, uint32_t slot, SlotView* v) {
  const size_t n = cuda ? c.cuda_arenas.size() : c.arenas.size();
  for (size_t p = 0; p < n; ++p) {
    const uint64_t off = uint64_t{slot} * c.strides[p];
    const uint64_t arena_bytes = cuda ? c.cuda_arenas[p]->bytes() : c.arenas[p]->data().size();
    if (off + c.strides[p] > arena_bytes) {
      v->projections.clear();
      v->device_projections.clear();
      return absl::InternalError(absl::StrCat("slot ", slot, " lies outside its arena"));
    }
    if (cuda) {
      v->device_projections.push_back(static_cast<const uint8_t*>(c.cuda_arenas[p]->device_ptr()) +
                                      off);
    } else {
      v->projections.push_back(c.arenas[p]->data().subspan(off, c.strides[p]));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ClientLane>> MapLane(const v1::LaneHandle& h,
                                                    const PassedDescriptors& passed) {
  lane::LaneGeometry g;
  g.request_bytes = h.request_bytes();
  g.response_bytes = h.response_bytes();
  g.pin_words = h.pin_words();
  if (g.segment_bytes() != h.segment_bytes()) {
    return absl::InternalError("the lane handle's sizes do not add up");
  }
  absl::StatusOr<ShmMapping> map =
      MapSharedSegment(ToHandle(h.memory(), passed), h.segment_bytes());
  if (!map.ok()) {
    return absl::Status(map.status().code(),
                        absl::StrCat("request lane: ", map.status().message()));
  }
  absl::StatusOr<lane::LaneClientEnd> end =
      lane::LaneClientEnd::Attach(map->data(), map->bytes(), g);
  if (!end.ok()) return end.status();
  return std::unique_ptr<ClientLane>(new ClientLane{*std::move(map), *std::move(end), {}, {}, {}});
}

}  // namespace expertd::client::internal
