// The model catalog: which layers are MoE layers, which expert projections they have, how large
// one expert of each projection is, how the projections of one expert are laid out in a bundle
// (the cache unit), which layers share a bundle layout (slot classes), and where every
// (layer, expert, projection) lives: in the GGUF (pack P) unless an index places it in a Q pack.
//
// Streamed: the routed experts' weights (`ffn_{gate,up,down,gate_up}_exps.weight` or the legacy
// per-expert `ffn_{gate,up,down}.E.weight`) and their per-expert biases (`ffn_*_exps.bias`,
// gpt-oss). Not streamed: dense FFN layers, shared experts (`*_shexp`), routers (`ffn_gate_inp`),
// attention and embeddings — they stay with the engine.
//
// Biases belong to the bundle: an engine selects an expert's bias rows with the same router ids
// as its weights (ggml's add_id), so once the ids are remapped to slot indexes the bias must be
// slot-indexed too; leaving it behind would force a second id space. They are tiny (a few KiB
// per expert against MiBs of weights), so carrying them costs nothing measurable.
//
// A catalog is immutable after Build and safe to share between threads.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "format/ggml_types.h"
#include "format/gguf_model.h"
#include "format/index.h"

namespace expertd {

enum class ProjectionKind { kGate, kUp, kGateUp, kDown, kGateBias, kUpBias, kGateUpBias, kDownBias };
std::string_view ProjectionKindName(ProjectionKind kind);  // "gate", "up", ..., "down_bias"

// Projections start at multiples of this inside a bundle, so every projection of a bundle in a
// staging buffer or a Q pack is aligned for vector copies.
inline constexpr uint64_t kBundleAlignment = 256;

struct Projection {
  ProjectionKind kind = ProjectionKind::kGate;
  // The stacked tensor name, used by index files: "blk.N.ffn_gate_exps.weight" — also for legacy
  // per-expert files, whose experts engines load into a stacked tensor of that name.
  std::string tensor;
  GgmlType type;
  uint64_t ne0 = 0;           // elements per row
  uint64_t ne1 = 1;           // rows per expert (1 for biases)
  uint64_t expert_bytes = 0;  // bytes of one expert (ggml's nb[2] of the stacked tensor)
  uint64_t bundle_offset = 0; // where this projection starts inside the bundle
  // Location in P: stacked tensors are strided; legacy files have one tensor per expert.
  uint32_t shard = 0;
  uint64_t file_offset = 0;  // expert 0 (stacked)
  std::vector<std::pair<uint32_t, uint64_t>> legacy_experts;  // (shard, offset) per expert
};

struct MoeLayer {
  uint32_t block = 0;  // N of blk.N
  uint32_t n_expert = 0;
  bool legacy_layout = false;
  std::vector<Projection> projections;  // in bundle order
  uint64_t bundle_bytes = 0;            // aligned size of one expert bundle
  uint64_t payload_bytes = 0;           // sum of expert_bytes over projections
  uint32_t slot_class = 0;
};

struct SlotClass {
  uint32_t id = 0;
  std::vector<uint32_t> layers;  // block numbers
  uint64_t bundle_bytes = 0;
};

struct PackInfo {
  enum class Kind { kGguf, kIndex };
  Kind kind;
  std::string label;  // "P" or "P2/3" for GGUF shards; the @pack label for index packs
  std::string path;
  uint64_t size = 0;
};

struct ExpertLocation {
  uint32_t pack = 0;  // position in ModelCatalog::packs()
  uint64_t offset = 0;
  uint64_t bytes = 0;
  int index_line = 0;  // the index row that placed it there; 0 = the GGUF itself
};

// An index row the catalog could not use, and why (a wrong size, an unknown tensor ...).
struct IgnoredIndexRow {
  int line = 0;
  std::string reason;
};

class ModelCatalog {
 public:
  // Builds the catalog of `model`, overlaid by `index` when not null. Errors: expert tensors with
  // inconsistent shapes or types, counts that disagree with the metadata.
  static absl::StatusOr<ModelCatalog> Build(const GgufModel& model, const ExpertIndex* index);

  const std::string& architecture() const { return architecture_; }
  uint32_t n_expert() const { return n_expert_; }
  uint32_t n_expert_used() const { return n_expert_used_; }
  const std::vector<MoeLayer>& layers() const { return layers_; }
  const std::vector<SlotClass>& slot_classes() const { return slot_classes_; }
  const std::vector<PackInfo>& packs() const { return packs_; }
  const std::vector<IgnoredIndexRow>& ignored_index_rows() const { return ignored_rows_; }
  // Largest bundle over all layers (the slot size a pool needs for every class).
  uint64_t max_bundle_bytes() const;
  // Bytes of all routed experts of all MoE layers (what streaming moves at most).
  uint64_t expert_bytes_total() const;

  const MoeLayer* FindLayer(uint32_t block) const;
  // Where projection `projection` (position in the layer's projections) of `expert` in layer
  // `block` is. NotFound for a layer that is not an MoE layer, OutOfRange for a bad expert or
  // projection.
  absl::StatusOr<ExpertLocation> Locate(uint32_t block, uint32_t expert, size_t projection) const;

 private:
  std::string architecture_;
  uint32_t n_expert_ = 0;
  uint32_t n_expert_used_ = 0;
  std::vector<MoeLayer> layers_;
  std::vector<int32_t> layer_of_block_;  // block -> position in layers_, -1 when dense
  std::vector<SlotClass> slot_classes_;
  std::vector<PackInfo> packs_;
  // Per layer: n_expert * projections locations, expert-major.
  std::vector<std::vector<ExpertLocation>> locations_;
  std::vector<IgnoredIndexRow> ignored_rows_;
};

}  // namespace expertd
