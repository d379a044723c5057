#include "served_model.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "format/ggml_types.h"
#include "util/status.h"

namespace expertd {
namespace {

absl::Status Annotate(const std::string& model, const absl::Status& st) {
  if (st.ok()) return st;
  return absl::Status(st.code(), absl::StrCat("model ", model, ": ", st.message()));
}

v1::SharedMemory ToProto(const SharedHandle& h) {
  v1::SharedMemory m;
  m.set_shm_name(h.shm_name);
  m.set_fd(h.fd);
  m.set_owner_pid(h.owner_pid);
  m.set_dev(h.dev);
  m.set_inode(h.inode);
  if (!h.ipc_handle.empty()) m.set_cuda_ipc_handle(h.ipc_handle);
  return m;
}

}  // namespace

FenceExport FromFenceHandle(const v1::FenceTableHandle& f) {
  const auto from = [](const v1::SharedMemory& m) {
    SharedHandle h;
    h.kind = m.cuda_ipc_handle().empty() ? SharedHandle::Kind::kHostShm
                                         : SharedHandle::Kind::kCudaIpc;
    h.shm_name = m.shm_name();
    h.fd = m.fd();
    h.owner_pid = m.owner_pid();
    h.dev = m.dev();
    h.inode = m.inode();
    h.ipc_handle = m.cuda_ipc_handle();
    return h;
  };
  FenceExport e;
  e.handle = from(f.memory());
  e.n_slots = f.n_slots();
  e.segment_bytes = f.segment_bytes();
  e.done_offset = f.done_offset();
  if (f.has_session_done()) e.session_done = from(f.session_done());
  return e;
}

v1::FenceTableHandle ToFenceHandle(const FenceExport& e) {
  v1::FenceTableHandle f;
  *f.mutable_memory() = ToProto(e.handle);
  f.set_n_slots(e.n_slots);
  f.set_segment_bytes(e.segment_bytes);
  f.set_done_offset(e.done_offset);
  if (e.session_done.has_value()) *f.mutable_session_done() = ToProto(*e.session_done);
  return f;
}

v1::ModelInfo ToModelInfo(const std::string& name, const ModelCatalog& catalog) {
  v1::ModelInfo info;
  info.set_name(name);
  info.set_architecture(catalog.architecture());
  info.set_n_expert(catalog.n_expert());
  info.set_n_expert_used(catalog.n_expert_used());
  for (const MoeLayer& layer : catalog.layers()) info.add_moe_layers(layer.block);
  for (const SlotClass& sc : catalog.slot_classes()) {
    v1::SlotClass* out = info.add_slot_classes();
    out->set_id(sc.id);
    for (uint32_t block : sc.layers) out->add_layers(block);
    out->set_bundle_bytes(sc.bundle_bytes);
    const MoeLayer* first = sc.layers.empty() ? nullptr : catalog.FindLayer(sc.layers.front());
    if (first == nullptr) continue;
    for (const Projection& p : first->projections) {
      v1::Projection* proj = out->add_projections();
      proj->set_kind(std::string(ProjectionKindName(p.kind)));
      proj->set_tensor(p.tensor);
      proj->set_type(std::string(p.type.name));
      proj->set_type_id(p.type.id);
      proj->set_ne0(p.ne0);
      proj->set_ne1(p.ne1);
      proj->set_expert_bytes(p.expert_bytes);
      proj->set_bundle_offset(p.bundle_offset);
    }
  }
  info.set_expert_bytes_total(catalog.expert_bytes_total());
  return info;
}

absl::StatusOr<std::unique_ptr<ServedModel>> ServedModel::Load(
    const ModelSpec& spec, Device& device, const PackSetOptions& pack_options,
    const EngineOptions& engine_options) {
  std::unique_ptr<ServedModel> m(new ServedModel());
  m->spec_ = spec;
  absl::Status st = m->Start(device, pack_options, engine_options);
  if (!st.ok()) return Annotate(spec.name, st);
  return m;
}

ServedModel::~ServedModel() {
  // The engine stops before the packs and the catalog it reads from go away.
  engine_.reset();
  packs_.reset();
}

absl::Status ServedModel::Start(Device& device, const PackSetOptions& pack_options,
                                const EngineOptions& engine_options) {
  device_ = &device;
  device_kind_ = device.name().starts_with("cuda") ? "cuda" : "host";
  device_uuid_ = device.hardware_id();
  session_fences_ = device.caps().session_fences;
  absl::StatusOr<GgufModel> gguf = GgufModel::Open(spec_.gguf);
  if (!gguf.ok()) return gguf.status();
  gguf_ = std::make_unique<GgufModel>(*std::move(gguf));
  if (!spec_.index.empty()) {
    IndexOptions io;
    io.v1_q_pack = spec_.v1_q_pack;
    absl::StatusOr<ExpertIndex> index = ExpertIndex::Read(spec_.index, io);
    if (!index.ok()) return index.status();
    index_ = std::make_unique<ExpertIndex>(*std::move(index));
  }
  absl::StatusOr<ModelCatalog> catalog = ModelCatalog::Build(*gguf_, index_.get());
  if (!catalog.ok()) return catalog.status();
  catalog_ = std::make_unique<ModelCatalog>(*std::move(catalog));
  if (catalog_->layers().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(spec_.gguf, ": no routed-expert (MoE) layers; nothing to stream"));
  }

  std::vector<PackSpec> specs;
  for (const PackInfo& p : catalog_->packs()) {
    PackSpec ps;
    ps.path = p.path;
    ps.label = p.label;
    for (const auto& [group, paths] : spec_.source_groups) {
      for (const std::string& path : paths) {
        if (path == p.path) ps.group = group;
      }
    }
    specs.push_back(std::move(ps));
  }
  absl::StatusOr<std::unique_ptr<PackSet>> packs = PackSet::Open(std::move(specs), pack_options);
  if (!packs.ok()) return packs.status();
  packs_ = *std::move(packs);
  if (absl::Status st = VerifyRanges(); !st.ok()) return st;

  absl::StatusOr<std::unique_ptr<Engine>> engine =
      Engine::Create(*catalog_, *packs_, device, engine_options);
  if (!engine.ok()) return engine.status();
  engine_ = *std::move(engine);
  info_ = ToModelInfo(spec_.name, *catalog_);
  return BuildHandles();
}

// Every (layer, expert, projection) must lie inside its pack: a short or replaced file is
// refused at start with its name, instead of failing acquires later.
absl::Status ServedModel::VerifyRanges() const {
  for (const MoeLayer& layer : catalog_->layers()) {
    for (uint32_t e = 0; e < layer.n_expert; ++e) {
      for (size_t p = 0; p < layer.projections.size(); ++p) {
        absl::StatusOr<ExpertLocation> loc = catalog_->Locate(layer.block, e, p);
        if (!loc.ok()) return loc.status();
        if (absl::Status st = packs_->CheckRange(loc->pack, loc->offset, loc->bytes); !st.ok()) {
          return absl::Status(st.code(), absl::StrCat("layer ", layer.block, " expert ", e, " ",
                                                      layer.projections[p].tensor, ": ",
                                                      st.message()));
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ServedModel::BuildHandles() {
  for (const SlotClass& sc : catalog_->slot_classes()) {
    v1::SlotClassHandles h;
    h.set_slot_class(sc.id);
    h.set_slots(engine_->slots(sc.id));
    const MoeLayer* first = catalog_->FindLayer(sc.layers.front());
    for (size_t p = 0; p < first->projections.size(); ++p) {
      const Arena& arena = engine_->arena(sc.id, p);
      absl::StatusOr<ArenaExport> ex = arena.Export();
      if (!ex.ok()) return ex.status();
      v1::ArenaHandle* a = h.add_arenas();
      a->set_projection(static_cast<uint32_t>(p));
      *a->mutable_memory() = ToProto(ex->handle);
      a->set_bytes(ex->bytes);
      a->set_reserved_bytes(ex->reserved_bytes);
      a->set_slot_stride(first->projections[p].expert_bytes);
      a->set_label(ex->label);
    }
    if (const Arena* table = engine_->residency(sc.id)) {
      absl::StatusOr<ArenaExport> ex = table->Export();
      if (!ex.ok()) return ex.status();
      v1::ArenaHandle* a = h.mutable_residency();
      *a->mutable_memory() = ToProto(ex->handle);
      a->set_bytes(ex->bytes);
      a->set_reserved_bytes(ex->reserved_bytes);
      a->set_label(ex->label);
    }
    absl::StatusOr<FenceExport> fx = engine_->fences(sc.id).Export();
    if (!fx.ok()) return fx.status();
    // Every session is sent its own fences (OpenSession replaces this with them).
    *h.mutable_fences() = ToFenceHandle(*fx);
    handles_.push_back(std::move(h));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::unique_ptr<SessionFences>>> ServedModel::CreateSessionFences()
    const {
  std::vector<std::unique_ptr<SessionFences>> out;
  for (const SlotClass& sc : catalog_->slot_classes()) {
    absl::StatusOr<std::unique_ptr<SessionFences>> f =
        device_->CreateSessionFences(engine_->fences(sc.id));
    if (!f.ok()) {
      return absl::Status(f.status().code(),
                          absl::StrCat("model ", spec_.name, " slot class ", sc.id,
                                       ": session done fences: ", f.status().message()));
    }
    out.push_back(*std::move(f));
  }
  return out;
}

void ServedModel::RecordStall(uint64_t nanoseconds) {
  std::lock_guard<std::mutex> lock(stall_mu_);
  stall_.Add(nanoseconds);
}

LatencyHistogram ServedModel::StallHistogram() const {
  std::lock_guard<std::mutex> lock(stall_mu_);
  return stall_;
}

std::vector<std::pair<std::string, uint64_t>> ServedModel::PackBytesRead() const {
  std::vector<std::pair<std::string, uint64_t>> out;
  for (PackId id = 0; id < packs_->size(); ++id) {
    out.emplace_back(packs_->pack(id).label, packs_->stats(id).bytes_read);
  }
  return out;
}

std::vector<std::string> ServedModel::CheckPacks() {
  std::vector<std::string> out;
  for (PackId id : packs_->CheckFiles()) out.emplace_back(packs_->failure(id).message());
  return out;
}

absl::Status ServedModel::PackHealth() const {
  for (PackId id = 0; id < packs_->size(); ++id) {
    if (absl::Status st = packs_->failure(id); !st.ok()) return st;
  }
  return absl::OkStatus();
}

std::vector<std::string> ServedModel::ReopenPacks() {
  std::vector<std::string> out;
  const std::vector<PackCopyPath> paths = engine_->CopyPaths();
  for (PackId id = 0; id < packs_->size(); ++id) {
    if (!packs_->failed(id)) continue;
    const PackEntry& e = packs_->pack(id);
    if (id < paths.size() && paths[id].direct) {
      out.push_back(absl::StrCat("pack ", e.label, " (", e.path, "): copied from a mapping "
                                 "registered with the device; restart the daemon to serve it"));
      continue;
    }
    absl::Status st = packs_->Reopen(id);
    out.push_back(st.ok() ? absl::StrCat("pack ", e.label, " (", e.path, "): serving again")
                          : std::string(st.message()));
  }
  return out;
}

}  // namespace expertd
