// One served model: its GGUF (and optional index), the catalog, the open packs and the engine
// that owns its slot pools. Loading verifies that every expert range lies inside its pack, so a
// model that starts serving cannot fault on a short file later (truncation after start is the
// engine's fault path, and CheckPacks notices it, a replaced or a vanished file, for the
// model's health; ReopenPacks serves such a pack again once its file is back). gRPC-free apart
// from the ModelInfo message it precomputes.
#pragma once

#include <map>
#include <mutex>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "catalog/catalog.h"
#include "device/device.h"
#include "device/host/host_device.h"
#include "engine/engine.h"
#include "expertd/v1/service.pb.h"
#include "format/gguf_model.h"
#include "format/index.h"
#include "pack/pack_set.h"
#include "util/latency_histogram.h"

namespace expertd {

struct ModelSpec {
  std::string name;
  std::string gguf;       // any shard of the model
  std::string index;      // optional index file (v1 or v2)
  std::string v1_q_pack;  // the Q pack of a v1 index
  // Source group name -> pack paths. Packs not listed are grouped by their drive (st_dev).
  std::map<std::string, std::vector<std::string>> source_groups;
};

class ServedModel {
 public:
  // Opens, checks and starts the engine on `device` (which must outlive the model). Errors name
  // the model and the file.
  static absl::StatusOr<std::unique_ptr<ServedModel>> Load(const ModelSpec& spec, Device& device,
                                                           const PackSetOptions& pack_options,
                                                           const EngineOptions& engine_options);
  ~ServedModel();

  const std::string& name() const { return spec_.name; }
  // The device the model's slots live on ("host", "cuda:0") and its kind ("host", "cuda").
  std::string_view device_name() const { return device_->name(); }
  const std::string& device_kind() const { return device_kind_; }
  const std::string& device_uuid() const { return device_uuid_; }  // Device::hardware_id()
  const ModelCatalog& catalog() const { return *catalog_; }
  const PackSet& packs() const { return *packs_; }
  // Packs whose files changed under the daemon (PackSet::CheckFiles): marks them failed and
  // returns why, one line per pack newly failed. Acquires that need to read a failed pack
  // fail with that reason; bundles already in slots still serve.
  std::vector<std::string> CheckPacks();
  // The first failed pack's reason; OK while every pack serves (the model's health).
  absl::Status PackHealth() const;
  // SIGHUP: serves each failed pack again whose file is back (PackSet::Reopen). Returns one
  // line per failed pack: "pack P (PATH): serving again", or why not. A pack read through a
  // mapping registered with the device is never swapped (the daemon must restart).
  std::vector<std::string> ReopenPacks();
  Engine& engine() const { return *engine_; }
  const v1::ModelInfo& info() const { return info_; }
  // The handles a session maps (one entry per slot class), built once at load.
  const std::vector<v1::SlotClassHandles>& handles() const { return handles_; }
  // Every session gets its own done fences per slot class (Device::CreateSessionFences: host
  // done words or CUDA events), and the handles it is sent name them beside the class table.
  // A device without session fences cannot serve sessions (OpenSession says so).
  bool session_fences() const { return session_fences_; }
  absl::StatusOr<std::vector<std::unique_ptr<SessionFences>>> CreateSessionFences() const;
  // Acquire stalls as the daemon saw them (request to grant), over every session, for the
  // metrics histogram.
  void RecordStall(uint64_t nanoseconds);
  LatencyHistogram StallHistogram() const;
  // Bytes read per pack label, for statistics.
  std::vector<std::pair<std::string, uint64_t>> PackBytesRead() const;

 private:
  ServedModel() = default;
  absl::Status Start(Device& device, const PackSetOptions& pack_options,
                     const EngineOptions& engine_options);
  absl::Status VerifyRanges() const;
  absl::Status BuildHandles();

  ModelSpec spec_;
  Device* device_ = nullptr;
  std::string device_kind_;
  std::string device_uuid_;
  bool session_fences_ = false;
  std::unique_ptr<GgufModel> gguf_;
  std::unique_ptr<ExpertIndex> index_;
  std::unique_ptr<ModelCatalog> catalog_;
  std::unique_ptr<PackSet> packs_;
  std::unique_ptr<Engine> engine_;
  v1::ModelInfo info_;
  std::vector<v1::SlotClassHandles> handles_;
  mutable std::mutex stall_mu_;
  LatencyHistogram stall_;
};

// A fence export as the protocol carries it, and back (what a client reads; the daemon's tests
// signal done as a client would with it).
v1::FenceTableHandle ToFenceHandle(const FenceExport& e);
FenceExport FromFenceHandle(const v1::FenceTableHandle& f);

// The catalog as the protocol describes it.
v1::ModelInfo ToModelInfo(const std::string& name, const ModelCatalog& catalog);

}  // namespace expertd
