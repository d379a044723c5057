#include "bench_verify.h"

#include <memory>
#include <string_view>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "catalog/catalog.h"
#include "format/gguf_model.h"
#include "progress.h"
#include "util/file.h"
#include "util/hash.h"
#include "util/status.h"

namespace expertd::ctl {
namespace {

// For one layer: the catalog projection index of each slot class projection (matched by kind
// and size), so the oracle does not depend on both sides listing projections in one order.
absl::StatusOr<std::vector<size_t>> ProjectionMap(const MoeLayer& layer, const v1::SlotClass& sc,
                                                  const std::string& gguf) {
  std::vector<size_t> map;
  for (const v1::Projection& want : sc.projections()) {
    size_t found = layer.projections.size();
    for (size_t j = 0; j < layer.projections.size(); ++j) {
      const Projection& p = layer.projections[j];
      if (ProjectionKindName(p.kind) == std::string_view(want.kind()) &&
          p.expert_bytes == want.expert_bytes()) {
        found = j;
        break;
      }
    }
    if (found == layer.projections.size()) {
      return absl::FailedPreconditionError(
          absl::StrCat(gguf, " is not the served model: layer ", layer.block, " has no ",
                       want.kind(), " projection of ", want.expert_bytes(), " bytes per expert"));
    }
    map.push_back(found);
  }
  return map;
}

}  // namespace

absl::StatusOr<ExpectedHashes> ExpectedHashes::Build(const std::string& gguf,
                                                     const v1::ModelInfo& served,
                                                     const std::vector<RouteRecord>& groups,
                                                     bool quiet) {
  ASSIGN_OR_RETURN(const GgufModel model, GgufModel::Open(gguf));
  // The model's own bytes (pack P): a bad copy into a Q pack by the daemon is caught too.
  ASSIGN_OR_RETURN(const ModelCatalog catalog, ModelCatalog::Build(model, nullptr));
  if (catalog.n_expert() != served.n_expert() ||
      catalog.layers().size() != static_cast<size_t>(served.moe_layers_size())) {
    return absl::FailedPreconditionError(absl::StrCat(
        gguf, " is not the served model '", served.name(), "': ", catalog.layers().size(),
        " MoE layers x ", catalog.n_expert(), " experts, the daemon serves ",
        served.moe_layers_size(), " x ", served.n_expert()));
  }
  // Per served layer: its slot class's projections mapped onto the catalog's.
  std::unordered_map<uint32_t, std::vector<size_t>> maps;
  for (const v1::SlotClass& sc : served.slot_classes()) {
    for (uint32_t block : sc.layers()) {
      const MoeLayer* layer = catalog.FindLayer(block);
      if (layer == nullptr) {
        return absl::FailedPreconditionError(
            absl::StrCat(gguf, " is not the served model: blk.", block, " is not an MoE layer"));
      }
      ASSIGN_OR_RETURN(maps[block], ProjectionMap(*layer, sc, gguf));
    }
  }

  std::unordered_set<uint64_t> wanted;
  uint64_t total = 0;
  for (const RouteRecord& r : groups) {
    const MoeLayer* layer = catalog.FindLayer(r.layer);
    if (layer == nullptr) continue;  // the bench refuses such traces before it gets here
    for (uint32_t e : r.experts) {
      if (wanted.insert(Key(r.layer, e)).second) total += layer->payload_bytes;
    }
  }
  std::vector<std::unique_ptr<ReadFile>> files;
  for (const PackInfo& p : catalog.packs()) {
    ASSIGN_OR_RETURN(ReadFile f, ReadFile::Open(p.path));
    files.push_back(std::make_unique<ReadFile>(std::move(f)));
  }
  ExpectedHashes out;
  Progress progress("hash expected bundles", total, quiet);
  std::vector<uint8_t> buf;
  for (uint64_t key : wanted) {
    const auto block = static_cast<uint32_t>(key >> 32);
    const auto expert = static_cast<uint32_t>(key & 0xffffffffu);
    auto it = maps.find(block);
    if (it == maps.end()) continue;
    std::vector<uint64_t>& hashes = out.hashes_[key];
    for (size_t j : it->second) {
      ASSIGN_OR_RETURN(const ExpertLocation loc, catalog.Locate(block, expert, j));
      buf.resize(loc.bytes);
      RETURN_IF_ERROR(files[loc.pack]->ReadAt(loc.offset, buf));
      hashes.push_back(Xxh3(buf));
      out.bytes_hashed_ += loc.bytes;
    }
    progress.Update(out.bytes_hashed_);
  }
  progress.Finish();
  return out;
}

const std::vector<uint64_t>* ExpectedHashes::Find(uint32_t layer, uint32_t expert) const {
  auto it = hashes_.find(Key(layer, expert));
  return it == hashes_.end() ? nullptr : &it->second;
}

}  // namespace expertd::ctl
