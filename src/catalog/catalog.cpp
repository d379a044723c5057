#include "catalog/catalog.h"

#include <algorithm>
#include <charconv>
#include <map>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "util/checked.h"
#include "util/status.h"

namespace expertd {
namespace {

struct NameParts {
  uint32_t block = 0;
  ProjectionKind kind = ProjectionKind::kGate;
  bool legacy = false;
  uint32_t expert = 0;  // legacy only
};

bool ParseUint(std::string_view s, uint32_t* out) {
  if (s.empty() || s.size() > 9) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return std::from_chars(s.data(), s.data() + s.size(), *out).ec == std::errc();
}

// Recognizes "blk.N.ffn_X_exps.{weight,bias}" and "blk.N.ffn_X.E.weight".
std::optional<NameParts> ParseExpertTensorName(std::string_view name) {
  if (!name.starts_with("blk.")) return std::nullopt;
  name.remove_prefix(4);
  const size_t dot = name.find('.');
  NameParts p;
  if (dot == std::string_view::npos || !ParseUint(name.substr(0, dot), &p.block)) {
    return std::nullopt;
  }
  name.remove_prefix(dot + 1);
  struct Stacked {
    std::string_view name;
    ProjectionKind weight, bias;
  };
  static constexpr Stacked kStacked[] = {
      {"ffn_gate_exps", ProjectionKind::kGate, ProjectionKind::kGateBias},
      {"ffn_up_exps", ProjectionKind::kUp, ProjectionKind::kUpBias},
      {"ffn_down_exps", ProjectionKind::kDown, ProjectionKind::kDownBias},
      {"ffn_gate_up_exps", ProjectionKind::kGateUp, ProjectionKind::kGateUpBias},
  };
  for (const Stacked& s : kStacked) {
    if (name.starts_with(s.name) && name.size() > s.name.size() && name[s.name.size()] == '.') {
      const std::string_view suffix = name.substr(s.name.size() + 1);
      if (suffix == "weight") p.kind = s.weight;
      else if (suffix == "bias") p.kind = s.bias;
      else return std::nullopt;
      return p;
    }
  }
  static constexpr std::pair<std::string_view, ProjectionKind> kLegacy[] = {
      {"ffn_gate.", ProjectionKind::kGate},
      {"ffn_up.", ProjectionKind::kUp},
      {"ffn_down.", ProjectionKind::kDown},
  };
  for (const auto& [prefix, kind] : kLegacy) {
    if (!name.starts_with(prefix)) continue;
    std::string_view rest = name.substr(prefix.size());
    const size_t d = rest.find('.');
    if (d == std::string_view::npos || rest.substr(d + 1) != "weight") return std::nullopt;
    if (!ParseUint(rest.substr(0, d), &p.expert)) return std::nullopt;
    p.kind = kind;
    p.legacy = true;
    return p;
  }
  return std::nullopt;
}

bool IsBias(ProjectionKind k) { return k >= ProjectionKind::kGateBias; }

std::string StackedName(uint32_t block, ProjectionKind kind) {
  static constexpr std::string_view kBase[] = {"ffn_gate_exps", "ffn_up_exps", "ffn_gate_up_exps",
                                               "ffn_down_exps"};
  const auto i = static_cast<size_t>(kind);
  return absl::StrCat("blk.", block, ".", AV(kBase[i % 4]), IsBias(kind) ? ".bias" : ".weight");
}

absl::Status ShapeError(const GgufModel& model, const ModelTensor& t, std::string_view what) {
  return InvalidError(ErrorKind::kBadValue,
                      absl::StrCat(model.shards()[t.shard].path(), ": byte ", t.info->info_offset,
                                   ": expert tensor '", t.info->name, "' ", AV(what)));
}

struct LayerTensors {
  std::map<ProjectionKind, const ModelTensor*> stacked;
  std::map<ProjectionKind, std::map<uint32_t, const ModelTensor*>> legacy;
};

}  // namespace

std::string_view ProjectionKindName(ProjectionKind kind) {
  static constexpr std::string_view kNames[] = {"gate",      "up",      "gate_up",
                                                "down",      "gate_bias", "up_bias",
                                                "gate_up_bias", "down_bias"};
  return kNames[static_cast<size_t>(kind)];
}

absl::StatusOr<ModelCatalog> ModelCatalog::Build(const GgufModel& model,
                                                 const ExpertIndex* index) {
  ModelCatalog c;
  const GgufFile& meta = model.metadata();
  c.architecture_ = meta.GetString("general.architecture").value_or("");
  const std::optional<uint64_t> kv_experts = meta.GetUint(c.architecture_ + ".expert_count");
  c.n_expert_used_ =
      static_cast<uint32_t>(meta.GetUint(c.architecture_ + ".expert_used_count").value_or(0));

  std::map<uint32_t, LayerTensors> blocks;
  for (const ModelTensor& t : model.tensors()) {
    const std::optional<NameParts> p = ParseExpertTensorName(t.info->name);
    if (!p) continue;
    LayerTensors& lt = blocks[p->block];
    if (p->legacy) lt.legacy[p->kind][p->expert] = &t;
    else lt.stacked[p->kind] = &t;
  }

  // The expert count: the metadata's, else the first expert tensor's; every tensor must agree.
  std::optional<uint64_t> n_expert = kv_experts;
  const auto check_count = [&](const ModelTensor& t, uint64_t n) -> absl::Status {
    if (n == 0) return ShapeError(model, t, "has no experts");
    if (!n_expert) n_expert = n;
    if (n != *n_expert) {
      return ShapeError(model, t, absl::StrCat("holds ", n, " experts, the model has ", *n_expert,
                                               kv_experts ? " (expert_count)" : ""));
    }
    return absl::OkStatus();
  };

  for (auto& [block, lt] : blocks) {
    MoeLayer layer;
    layer.block = block;
    if (!lt.stacked.empty() && !lt.legacy.empty()) {
      return InvalidError(ErrorKind::kBadValue,
                          absl::StrCat(meta.path(), ": layer ", block,
                                       " mixes stacked and per-expert expert tensors"));
    }
    for (const auto& [kind, t] : lt.stacked) {
      const GgufTensorInfo& info = *t->info;
      const uint32_t want_dims = IsBias(kind) ? 2 : 3;
      if (info.n_dims != want_dims) {
        return ShapeError(model, *t, absl::StrCat("has ", info.n_dims, " dimensions, expected ",
                                                  want_dims));
      }
      RETURN_IF_ERROR(check_count(*t, info.ne[want_dims - 1]));
      Projection p;
      p.kind = kind;
      p.tensor = info.name;
      p.type = info.type;
      p.ne0 = info.ne[0];
      p.ne1 = IsBias(kind) ? 1 : info.ne[1];
      p.expert_bytes = info.nb(want_dims - 1);
      p.shard = t->shard;
      p.file_offset = info.file_offset;
      layer.projections.push_back(std::move(p));
    }
    for (const auto& [kind, experts] : lt.legacy) {
      const ModelTensor& first = *experts.begin()->second;
      RETURN_IF_ERROR(check_count(first, experts.rbegin()->first + 1));
      Projection p;
      p.kind = kind;
      p.tensor = StackedName(block, kind);
      p.type = first.info->type;
      p.ne0 = first.info->ne[0];
      p.ne1 = first.info->ne[1];
      p.expert_bytes = first.info->nbytes;
      uint32_t expect = 0;
      for (const auto& [e, t] : experts) {
        if (e != expect) {
          return ShapeError(model, first, absl::StrCat("is missing expert ", expect, " of layer ",
                                                       block));
        }
        ++expect;
        if (t->info->n_dims != 2 || t->info->type.id != p.type.id || t->info->ne[0] != p.ne0 ||
            t->info->ne[1] != p.ne1) {
          return ShapeError(model, *t, "differs in type or shape from expert 0 of its layer");
        }
        p.legacy_experts.emplace_back(t->shard, t->info->file_offset);
      }
      layer.legacy_layout = true;
      layer.projections.push_back(std::move(p));
    }
    layer.n_expert = static_cast<uint32_t>(*n_expert);
    uint64_t offset = 0;
    for (Projection& p : layer.projections) {  // std::map iteration gave bundle order
      p.bundle_offset = offset;
      const auto end = CheckedAdd(offset, p.expert_bytes);
      const auto next = end ? CheckedAlignUp(*end, kBundleAlignment) : std::nullopt;
      if (!next) return InvalidError(ErrorKind::kOverflow, "bundle size overflows");
      layer.payload_bytes += p.expert_bytes;
      offset = *next;
    }
    layer.bundle_bytes = offset;
    c.layers_.push_back(std::move(layer));
  }
  c.n_expert_ = static_cast<uint32_t>(n_expert.value_or(kv_experts.value_or(0)));

  // Slot classes: layers whose bundles have the same projections, types and shapes.
  std::map<std::vector<std::tuple<int, uint32_t, uint64_t, uint64_t>>, uint32_t> class_of;
  for (MoeLayer& layer : c.layers_) {
    std::vector<std::tuple<int, uint32_t, uint64_t, uint64_t>> key;
    for (const Projection& p : layer.projections) {
      key.emplace_back(static_cast<int>(p.kind), p.type.id, p.ne0, p.ne1);
    }
    const auto [it, inserted] = class_of.emplace(key, static_cast<uint32_t>(c.slot_classes_.size()));
    if (inserted) c.slot_classes_.push_back(SlotClass{it->second, {}, layer.bundle_bytes});
    layer.slot_class = it->second;
    c.slot_classes_[it->second].layers.push_back(layer.block);
  }

  for (uint32_t s = 0; s < model.shards().size(); ++s) {
    const GgufFile& shard = model.shards()[s];
    c.packs_.push_back(PackInfo{
        PackInfo::Kind::kGguf,
        model.shards().size() == 1 ? "P" : absl::StrCat("P", s + 1, "/", model.shards().size()),
        shard.path(), shard.file_size()});
  }
  const auto first_index_pack = static_cast<uint32_t>(c.packs_.size());
  if (index != nullptr) {
    for (const IndexPack& p : index->packs()) {
      c.packs_.push_back(PackInfo{PackInfo::Kind::kIndex, p.label, p.path, p.size});
    }
  }

  uint32_t max_block = 0;
  for (const MoeLayer& l : c.layers_) max_block = std::max(max_block, l.block);
  c.layer_of_block_.assign(c.layers_.empty() ? 0 : max_block + 1, -1);
  absl::flat_hash_map<std::string, std::pair<size_t, size_t>> projection_of;
  for (size_t li = 0; li < c.layers_.size(); ++li) {
    const MoeLayer& layer = c.layers_[li];
    c.layer_of_block_[layer.block] = static_cast<int32_t>(li);
    const size_t np = layer.projections.size();
    std::vector<ExpertLocation>& locs = c.locations_.emplace_back(layer.n_expert * np);
    for (size_t pi = 0; pi < np; ++pi) {
      const Projection& p = layer.projections[pi];
      projection_of[p.tensor] = {li, pi};
      for (uint32_t e = 0; e < layer.n_expert; ++e) {
        ExpertLocation& loc = locs[e * np + pi];
        loc.bytes = p.expert_bytes;
        if (layer.legacy_layout) {
          loc.pack = p.legacy_experts[e].first;
          loc.offset = p.legacy_experts[e].second;
        } else {
          loc.pack = p.shard;
          loc.offset = p.file_offset + e * p.expert_bytes;
        }
        if (index == nullptr) continue;
        if (const auto hit = index->Resolve(p.tensor, e, p.expert_bytes)) {
          loc = ExpertLocation{first_index_pack + static_cast<uint32_t>(hit->pack), hit->offset,
                               hit->bytes, hit->line};
        }
      }
    }
  }

  // Report index rows the overlay could not use, so `index verify` and start-up can say why.
  if (index != nullptr) {
    const auto ignore = [&](int line, std::string reason) {
      c.ignored_rows_.push_back(IgnoredIndexRow{line, std::move(reason)});
    };
    for (const IndexRow& r : index->rows()) {
      const auto it = projection_of.find(r.tensor);
      if (it == projection_of.end()) {
        ignore(r.line, absl::StrCat("'", r.tensor, "' is not an expert projection of the model"));
        continue;
      }
      const MoeLayer& layer = c.layers_[it->second.first];
      const Projection& p = layer.projections[it->second.second];
      if (r.expert >= layer.n_expert) {
        ignore(r.line, absl::StrCat("expert ", r.expert, " >= the layer's ", layer.n_expert,
                                    " experts"));
      } else if (r.bytes != p.expert_bytes) {
        ignore(r.line, absl::StrCat("BYTES ", r.bytes, " differs from the expert size ",
                                    p.expert_bytes, " of '", r.tensor, "' (read from P instead)"));
      }
    }
    for (const IndexV1Row& r : index->v1_rows()) {
      const auto it = projection_of.find(r.tensor);
      if (it == projection_of.end()) {
        ignore(r.line, absl::StrCat("'", r.tensor, "' is not an expert projection of the model"));
        continue;
      }
      const Projection& p = c.layers_[it->second.first].projections[it->second.second];
      if (r.expert_bytes != p.expert_bytes) {
        ignore(r.line, absl::StrCat("EXPERT_BYTES ", r.expert_bytes, " differs from the expert size ",
                                    p.expert_bytes, " of '", r.tensor, "' (read from P instead)"));
      }
    }
    std::sort(c.ignored_rows_.begin(), c.ignored_rows_.end(),
              [](const auto& a, const auto& b) { return a.line < b.line; });
  }
  return c;
}

uint64_t ModelCatalog::max_bundle_bytes() const {
  uint64_t m = 0;
  for (const MoeLayer& l : layers_) m = std::max(m, l.bundle_bytes);
  return m;
}

uint64_t ModelCatalog::expert_bytes_total() const {
  uint64_t total = 0;
  for (const MoeLayer& l : layers_) total += l.payload_bytes * l.n_expert;
  return total;
}

const MoeLayer* ModelCatalog::FindLayer(uint32_t block) const {
  if (block >= layer_of_block_.size() || layer_of_block_[block] < 0) return nullptr;
  return &layers_[static_cast<size_t>(layer_of_block_[block])];
}

absl::StatusOr<ExpertLocation> ModelCatalog::Locate(uint32_t block, uint32_t expert,
                                                    size_t projection) const {
  const MoeLayer* layer = FindLayer(block);
  if (layer == nullptr) {
    return absl::NotFoundError(absl::StrCat("layer ", block, " is not an MoE layer"));
  }
  if (expert >= layer->n_expert || projection >= layer->projections.size()) {
    return absl::OutOfRangeError(absl::StrCat("layer ", block, " has ", layer->n_expert,
                                              " experts and ", layer->projections.size(),
                                              " projections; asked for expert ", expert,
                                              ", projection ", projection));
  }
  const size_t li = static_cast<size_t>(layer - layers_.data());
  return locations_[li][expert * layer->projections.size() + projection];
}

}  // namespace expertd
