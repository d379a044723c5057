// expertctl inspect FILE.gguf [--json]: header, metadata (arrays summarized), tensors and the MoE
// summary of a model. Reads headers only, so it is instant on any model size.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "catalog/catalog.h"
#include "commands.h"
#include "format/gguf_model.h"
#include "progress.h"

namespace expertd::ctl {
namespace {

using nlohmann::json;

json ScalarJson(const GgufScalar& v) {
  return std::visit([](const auto& x) -> json { return x; }, v);
}

json KvJson(const GgufKv& kv) {
  if (kv.type != GgufType::kArray) return ScalarJson(kv.scalar);
  json head = json::array();
  for (const GgufScalar& e : kv.array.elements) head.push_back(ScalarJson(e));
  if (kv.array.complete()) return head;
  return json{{"type", "array"},
              {"element_type", GgufTypeName(kv.array.element_type)},
              {"count", kv.array.count},
              {"head", head}};
}

std::string ShapeText(const uint64_t* ne, uint32_t n) {
  std::string s = "[";
  for (uint32_t i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "]";
}

std::string KvText(const GgufKv& kv) {
  if (kv.type != GgufType::kArray) return FormatGgufScalar(kv.scalar);
  std::string s = "[" + std::string(GgufTypeName(kv.array.element_type)) + " x " +
                  std::to_string(kv.array.count) + "]";
  const size_t show = std::min<size_t>(kv.array.elements.size(), 4);
  for (size_t i = 0; i < show; ++i) s += (i ? ", " : " ") + FormatGgufScalar(kv.array.elements[i]);
  if (kv.array.count > show) s += ", ...";
  return s;
}

json MoeJson(const ModelCatalog& c) {
  if (c.layers().empty()) return nullptr;
  json classes = json::array();
  for (const SlotClass& sc : c.slot_classes()) {
    const MoeLayer& l = *c.FindLayer(sc.layers.front());
    json projections = json::array();
    for (const Projection& p : l.projections) {
      projections.push_back({{"kind", ProjectionKindName(p.kind)},
                             {"type", p.type.name},
                             {"ne", {p.ne0, p.ne1}},
                             {"expert_bytes", p.expert_bytes},
                             {"bundle_offset", p.bundle_offset}});
    }
    classes.push_back({{"id", sc.id},
                       {"layers", sc.layers},
                       {"bundle_bytes", sc.bundle_bytes},
                       {"projections", projections}});
  }
  json layers = json::array();
  for (const MoeLayer& l : c.layers()) layers.push_back(l.block);
  return {{"architecture", c.architecture()},
          {"layers", c.layers().size()},
          {"layer_blocks", layers},
          {"n_expert", c.n_expert()},
          {"n_expert_used", c.n_expert_used()},
          {"bundle_bytes", c.max_bundle_bytes()},
          {"expert_bytes_total", c.expert_bytes_total()},
          {"legacy_layout", c.layers().front().legacy_layout},
          {"slot_classes", classes}};
}

void PrintHuman(const GgufModel& model, const ModelCatalog& c) {
  const GgufFile& f = model.metadata();
  std::printf("%s\n", f.path().c_str());
  if (model.shards().size() > 1) {
    std::printf("  split model, %zu shards:\n", model.shards().size());
    for (const GgufFile& s : model.shards()) {
      std::printf("    %s (%s, %zu tensors)\n", s.path().c_str(), HumanBytes(s.file_size()).c_str(),
                  s.tensors().size());
    }
  }
  std::printf("  GGUF v%u, alignment %llu, data offset %llu, file size %llu (%s)\n", f.version(),
              static_cast<unsigned long long>(f.alignment()),
              static_cast<unsigned long long>(f.data_offset()),
              static_cast<unsigned long long>(f.file_size()), HumanBytes(f.file_size()).c_str());
  std::printf("\nmetadata (%zu keys)\n", f.kvs().size());
  for (const GgufKv& kv : f.kvs()) {
    std::string v = KvText(kv);
    if (v.size() > 120) v = v.substr(0, 117) + "...";
    std::printf("  %-40s %s\n", kv.key.c_str(), v.c_str());
  }
  std::printf("\ntensors (%zu)\n", model.tensors().size());
  std::printf("  %-36s %-8s %-24s %14s %12s\n", "name", "type", "shape", "offset", "bytes");
  for (const ModelTensor& mt : model.tensors()) {
    const GgufTensorInfo& t = *mt.info;
    std::printf("  %-36s %-8s %-24s %14llu %12llu%s\n", t.name.c_str(),
                std::string(t.type.name).c_str(), ShapeText(t.ne.data(), t.n_dims).c_str(),
                static_cast<unsigned long long>(t.file_offset),
                static_cast<unsigned long long>(t.nbytes),
                model.shards().size() > 1 ? (" shard " + std::to_string(mt.shard + 1)).c_str()
                                          : "");
  }
  std::printf("\nMoE\n");
  if (c.layers().empty()) {
    std::printf("  none: no routed-expert tensors\n");
    return;
  }
  std::printf("  architecture %s, %zu MoE layers, %u experts, top-%u%s\n", c.architecture().c_str(),
              c.layers().size(), c.n_expert(), c.n_expert_used(),
              c.layers().front().legacy_layout ? ", legacy per-expert tensors" : "");
  std::printf("  largest bundle %s (%llu B); all routed experts %s\n",
              HumanBytes(c.max_bundle_bytes()).c_str(),
              static_cast<unsigned long long>(c.max_bundle_bytes()),
              HumanBytes(c.expert_bytes_total()).c_str());
  for (const SlotClass& sc : c.slot_classes()) {
    // Runs of consecutive blocks as "a-b": DeepSeek has 58 MoE layers in one class.
    std::ostringstream layers;
    for (size_t i = 0; i < sc.layers.size();) {
      size_t j = i;
      while (j + 1 < sc.layers.size() && sc.layers[j + 1] == sc.layers[j] + 1) ++j;
      layers << (i ? "," : "") << sc.layers[i];
      if (j > i) layers << "-" << sc.layers[j];
      i = j + 1;
    }
    std::printf("  slot class %u: bundle %llu B, layers %s\n", sc.id,
                static_cast<unsigned long long>(sc.bundle_bytes), layers.str().c_str());
    for (const Projection& p : c.FindLayer(sc.layers.front())->projections) {
      std::printf("    %-13s %-8s [%llu, %llu]  %llu B/expert at +%llu\n",
                  std::string(ProjectionKindName(p.kind)).c_str(), std::string(p.type.name).c_str(),
                  static_cast<unsigned long long>(p.ne0), static_cast<unsigned long long>(p.ne1),
                  static_cast<unsigned long long>(p.expert_bytes),
                  static_cast<unsigned long long>(p.bundle_offset));
    }
  }
}

int RunInspect(const std::string& path, bool as_json) {
  absl::StatusOr<GgufModel> model = GgufModel::Open(path);
  if (!model.ok()) {
    std::fprintf(stderr, "expertctl inspect: %s\n", std::string(model.status().message()).c_str());
    return 2;
  }
  absl::StatusOr<ModelCatalog> catalog = ModelCatalog::Build(*model, nullptr);
  if (!catalog.ok()) {
    std::fprintf(stderr, "expertctl inspect: %s\n",
                 std::string(catalog.status().message()).c_str());
    return 2;
  }
  if (!as_json) {
    PrintHuman(*model, *catalog);
    return 0;
  }
  const GgufFile& f = model->metadata();
  json kv = json::object();
  for (const GgufKv& k : f.kvs()) kv[k.key] = KvJson(k);
  json tensors = json::array();
  for (const ModelTensor& mt : model->tensors()) {
    const GgufTensorInfo& t = *mt.info;
    json ne = json::array();
    for (uint32_t d = 0; d < t.n_dims; ++d) ne.push_back(t.ne[d]);
    tensors.push_back({{"name", t.name},
                       {"type", t.type.name},
                       {"ne", ne},
                       {"offset", t.file_offset},
                       {"nbytes", t.nbytes},
                       {"shard", mt.shard}});
  }
  json shards = json::array();
  for (const GgufFile& s : model->shards()) shards.push_back(s.path());
  const json out = {{"path", f.path()},
                    {"shards", shards},
                    {"version", f.version()},
                    {"alignment", f.alignment()},
                    {"data_offset", f.data_offset()},
                    {"file_size", f.file_size()},
                    {"kv_count", f.kvs().size()},
                    {"tensor_count", model->tensors().size()},
                    {"kv", kv},
                    {"tensors", tensors},
                    {"moe", MoeJson(*catalog)}};
  std::cout << out.dump(2) << "\n";
  return 0;
}

}  // namespace

void AddInspectCommand(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("inspect", "Show a GGUF model's header, tensors and MoE layout");
  struct Args {
    std::string path;
    bool json = false;
  };
  auto args = std::make_shared<Args>();  // owned by the callback, which the app keeps
  cmd->add_option("file", args->path, "GGUF file (any shard of a split model)")->required();
  cmd->add_flag("--json", args->json, "Print JSON for scripts");
  cmd->callback([args, exit_code] { *exit_code = RunInspect(args->path, args->json); });
}

}  // namespace expertd::ctl
