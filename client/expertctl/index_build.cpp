// expertctl index build: copies chosen experts from the GGUF into a Q pack (the "fast drive")
// and writes the index that places them there.
//
// Q pack layout. Without --bundle, the chosen experts of one projection tensor are contiguous, in
// expert order, each run starting at a 4 KiB boundary (the origin's layout: a v1 row's experts are
// at Q_BASE + (e/2) * EXPERT_BYTES). With --bundle, each chosen (layer, expert) is one bundle at a
// 4 KiB boundary with its projections at the catalog's bundle offsets, so one read fetches it.
// The pack is written to PATH.tmp and renamed when complete; the index is written last, also
// atomically, so an interrupted build never leaves an index pointing at a partial pack.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "catalog/catalog.h"
#include "commands.h"
#include "format/index.h"
#include "format/route_trace.h"
#include "model_args.h"
#include "progress.h"
#include "util/checked.h"
#include "util/file.h"
#include "util/status.h"

namespace expertd::ctl {
namespace {

constexpr uint64_t kRunAlignment = 4096;
constexpr size_t kCopyChunk = 8 << 20;

struct BuildArgs {
  std::vector<std::string> ggufs;
  std::string out;
  std::string q_pack;
  std::string placement = "parity";
  std::string format = "v2";
  bool bundle = false;
  bool quiet = false;
  bool json = false;
};

// (layer position in the catalog, expert)
using Choice = std::pair<size_t, uint32_t>;

absl::StatusOr<std::vector<Choice>> HotChoices(const ModelCatalog& c, const std::string& trace,
                                               double fraction) {
  ASSIGN_OR_RETURN(const std::vector<RouteRecord> records, ReadRouteTrace(trace));
  std::map<Choice, uint64_t> counts;
  for (const RouteRecord& r : records) {
    const MoeLayer* layer = c.FindLayer(r.layer);
    if (layer == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          trace, ":", r.line, ": layer ", r.layer, " is not an MoE layer of the model"));
    }
    const size_t li = static_cast<size_t>(layer - c.layers().data());
    for (uint32_t e : r.experts) {
      if (e >= layer->n_expert) {
        return absl::InvalidArgumentError(absl::StrCat(trace, ":", r.line, ": expert ", e,
                                                       " >= the layer's ", layer->n_expert));
      }
      ++counts[{li, e}];
    }
  }
  std::vector<std::pair<uint64_t, Choice>> ranked;
  uint64_t pairs = 0;
  for (const MoeLayer& l : c.layers()) pairs += l.n_expert;
  for (const auto& [choice, n] : counts) ranked.emplace_back(n, choice);
  // Most routed first; ties in (layer, expert) order so the result is deterministic.
  std::stable_sort(ranked.begin(), ranked.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  const auto keep = static_cast<size_t>(std::ceil(fraction * static_cast<double>(pairs)));
  std::vector<Choice> out;
  for (size_t i = 0; i < ranked.size() && i < keep; ++i) out.push_back(ranked[i].second);
  std::sort(out.begin(), out.end());
  return out;
}

absl::StatusOr<std::vector<Choice>> ChooseExperts(const ModelCatalog& c, const std::string& p) {
  std::vector<Choice> out;
  const auto every = [&](auto keep) {
    for (size_t li = 0; li < c.layers().size(); ++li) {
      for (uint32_t e = 0; e < c.layers()[li].n_expert; ++e) {
        if (keep(e)) out.emplace_back(li, e);
      }
    }
  };
  if (p == "all") {
    every([](uint32_t) { return true; });
  } else if (p == "parity") {
    every([](uint32_t e) { return (e & 1) == 1; });  // odd experts to Q, even stay in P
  } else if (p == "none") {
  } else if (p.starts_with("hot:")) {
    std::string trace = p.substr(4);
    double fraction = 0.5;
    if (const size_t colon = trace.rfind(':'); colon != std::string::npos) {
      const std::string tail = trace.substr(colon + 1);
      double f = 0;
      const auto [end, ec] = std::from_chars(tail.data(), tail.data() + tail.size(), f);
      if (ec == std::errc() && end == tail.data() + tail.size()) {
        if (!(f > 0 && f <= 1)) {
          return absl::InvalidArgumentError(
              absl::StrCat("hot placement fraction ", tail, " is not in (0, 1]"));
        }
        fraction = f;
        trace.resize(colon);
      }
    }
    return HotChoices(c, trace, fraction);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown placement '", p, "': use parity, all, none or hot:TRACE.jsonl[:FRACTION]"));
  }
  return out;
}

struct CopyOp {
  uint32_t src_pack;
  uint64_t src_offset;
  uint64_t bytes;
  uint64_t dst_offset;
};

struct Plan {
  std::vector<CopyOp> copies;
  IndexV2Contents index;
  std::string v1_text;  // --format v1
  uint64_t pack_bytes = 0;
  uint64_t copy_bytes = 0;
};

absl::StatusOr<Plan> MakePlan(const ModelCatalog& c, const std::vector<Choice>& chosen,
                              const BuildArgs& a) {
  Plan plan;
  uint64_t end = 0;
  const auto place = [&](uint64_t bytes, uint64_t align) -> absl::StatusOr<uint64_t> {
    const auto start = CheckedAlignUp(end, align);
    const auto next = start ? CheckedAdd(*start, bytes) : std::nullopt;
    if (!next) return absl::OutOfRangeError("Q pack size overflows");
    end = *next;
    return *start;
  };
  const auto copy = [&](size_t li, uint32_t e, size_t pi, uint64_t dst) -> absl::Status {
    ASSIGN_OR_RETURN(const ExpertLocation src, c.Locate(c.layers()[li].block, e, pi));
    plan.copies.push_back(CopyOp{src.pack, src.offset, src.bytes, dst});
    plan.copy_bytes += src.bytes;
    const Projection& p = c.layers()[li].projections[pi];
    plan.index.rows.push_back({p.tensor, e, 0, dst, p.expert_bytes});
    return absl::OkStatus();
  };
  if (a.bundle) {
    for (const auto& [li, e] : chosen) {
      const MoeLayer& layer = c.layers()[li];
      ASSIGN_OR_RETURN(const uint64_t base, place(layer.bundle_bytes, kRunAlignment));
      for (size_t pi = 0; pi < layer.projections.size(); ++pi) {
        RETURN_IF_ERROR(copy(li, e, pi, base + layer.projections[pi].bundle_offset));
      }
    }
  } else {
    std::map<size_t, std::vector<uint32_t>> by_layer;
    for (const auto& [li, e] : chosen) by_layer[li].push_back(e);
    for (const auto& [li, experts] : by_layer) {
      const MoeLayer& layer = c.layers()[li];
      for (size_t pi = 0; pi < layer.projections.size(); ++pi) {
        const Projection& p = layer.projections[pi];
        ASSIGN_OR_RETURN(const uint64_t base, place(0, kRunAlignment));
        for (size_t k = 0; k < experts.size(); ++k) {
          ASSIGN_OR_RETURN(const uint64_t dst, place(p.expert_bytes, 1));
          RETURN_IF_ERROR(copy(li, experts[k], pi, dst));
        }
        if (a.format == "v1") {
          // Parity layout: expert e at base + (e / 2) * bytes, so the run holds experts 1, 3, ...
          absl::StrAppend(&plan.v1_text, p.tensor, "\t", base, " ", p.expert_bytes, " 1 ",
                          layer.n_expert, "\n");
        }
      }
    }
  }
  plan.pack_bytes = end;
  return plan;
}

absl::Status Copy(const ModelCatalog& c, const Plan& plan, const std::string& tmp_path,
                  bool quiet) {
  std::vector<std::unique_ptr<ReadFile>> sources;
  for (const PackInfo& p : c.packs()) {
    ASSIGN_OR_RETURN(ReadFile f, ReadFile::Open(p.path));
    sources.push_back(std::make_unique<ReadFile>(std::move(f)));
  }
  ASSIGN_OR_RETURN(WriteFile out, WriteFile::Create(tmp_path));
  std::vector<uint8_t> buf(kCopyChunk);
  Progress progress("copy experts", plan.copy_bytes, quiet);
  uint64_t done = 0;
  for (const CopyOp& op : plan.copies) {
    for (uint64_t at = 0; at < op.bytes; at += kCopyChunk) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(kCopyChunk, op.bytes - at));
      const std::span<uint8_t> chunk(buf.data(), n);
      RETURN_IF_ERROR(sources[op.src_pack]->ReadAt(op.src_offset + at, chunk));
      RETURN_IF_ERROR(out.WriteAt(op.dst_offset + at, chunk));
      done += n;
      progress.Update(done);
    }
  }
  // Pad to the planned size so the last run's alignment holds in the file too.
  if (out.written() < plan.pack_bytes) {
    const std::vector<uint8_t> zeros(plan.pack_bytes - out.written());
    RETURN_IF_ERROR(out.Append(zeros));
  }
  progress.Finish();
  return out.Close();
}

std::string PackPathForIndex(const std::string& q_pack, const std::string& index_path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path dir = fs::absolute(index_path, ec).parent_path();
  const fs::path rel = fs::absolute(q_pack, ec).lexically_relative(dir);
  if (!rel.empty() && !rel.string().starts_with("..")) return rel.string();
  return fs::absolute(q_pack, ec).string();
}

int RunBuild(const BuildArgs& a) {
  if (a.format != "v2" && a.format != "v1") {
    PrintError("index build", absl::InvalidArgumentError("--format must be v1 or v2"));
    return 2;
  }
  if (a.format == "v1" && (a.bundle || a.placement != "parity")) {
    PrintError("index build", absl::InvalidArgumentError(
                                  "--format v1 describes only the parity layout without --bundle"));
    return 2;
  }
  absl::StatusOr<GgufModel> model = OpenModelArgs(a.ggufs);
  if (!model.ok()) return PrintError("index build", model.status()), 2;
  for (const GgufFile& s : model->shards()) {
    std::error_code ec;
    if (std::filesystem::equivalent(s.path(), a.q_pack, ec)) {
      PrintError("index build", absl::InvalidArgumentError(
                                    absl::StrCat("--q-pack ", a.q_pack, " is a model file")));
      return 2;
    }
  }
  absl::StatusOr<ModelCatalog> catalog = ModelCatalog::Build(*model, nullptr);
  if (!catalog.ok()) return PrintError("index build", catalog.status()), 2;
  if (catalog->layers().empty()) {
    PrintError("index build", absl::InvalidArgumentError(
                                  absl::StrCat(a.ggufs.front(), " has no MoE expert tensors")));
    return 2;
  }
  absl::StatusOr<std::vector<Choice>> chosen = ChooseExperts(*catalog, a.placement);
  if (!chosen.ok()) return PrintError("index build", chosen.status()), 2;
  absl::StatusOr<Plan> plan = MakePlan(*catalog, *chosen, a);
  if (!plan.ok()) return PrintError("index build", plan.status()), 2;

  const std::string tmp = a.q_pack + ".tmp";
  if (absl::Status st = Copy(*catalog, *plan, tmp, a.quiet); !st.ok()) {
    std::filesystem::remove(tmp);
    return PrintError("index build", st), 2;
  }
  std::error_code ec;
  std::filesystem::rename(tmp, a.q_pack, ec);
  if (ec) {
    PrintError("index build", absl::UnavailableError(absl::StrCat("rename ", tmp, ": ", ec.message())));
    return 2;
  }
  const std::string pack_in_index = PackPathForIndex(a.q_pack, a.out);
  const std::string comment =
      absl::StrCat("expertctl index build: placement=", a.placement,
                   a.bundle ? " bundle" : "", " experts=", chosen->size(),
                   " model=", std::filesystem::path(a.ggufs.front()).filename().string());
  absl::Status written;
  if (a.format == "v1") {
    written = WriteTextFileAtomic(
        a.out, absl::StrCat("# ", comment, "\n# Q pack: ", pack_in_index, "\n", plan->v1_text));
  } else {
    plan->index.comments.push_back(comment);
    plan->index.packs.push_back({0, "Q", pack_in_index});
    written = WriteIndexV2(a.out, plan->index);
  }
  if (!written.ok()) return PrintError("index build", written), 2;
  if (a.json) {
    std::cout << nlohmann::json{{"index", a.out},
                                {"q_pack", a.q_pack},
                                {"format", a.format},
                                {"placement", a.placement},
                                {"bundle", a.bundle},
                                {"experts", chosen->size()},
                                {"rows", plan->index.rows.size()},
                                {"bytes_copied", plan->copy_bytes},
                                {"pack_bytes", plan->pack_bytes}}
                     .dump(2)
              << "\n";
  } else {
    std::printf("%s: %zu experts (%zu rows) of %zu MoE layers, %s copied into %s (%s)\n",
                a.out.c_str(), chosen->size(), plan->index.rows.size(), catalog->layers().size(),
                HumanBytes(plan->copy_bytes).c_str(), a.q_pack.c_str(),
                HumanBytes(plan->pack_bytes).c_str());
  }
  return 0;
}

}  // namespace

void AddIndexCommands(CLI::App& app, int* exit_code) {
  auto* index = app.add_subcommand("index", "Build and verify index files and Q packs");
  index->require_subcommand(1);
  auto* cmd = index->add_subcommand("build", "Copy chosen experts into a Q pack and index them");
  auto a = std::make_shared<BuildArgs>();
  cmd->add_option("--gguf", a->ggufs, "Model file (any shard; repeat for shards)")->required();
  cmd->add_option("--out", a->out, "Index file to write")->required();
  cmd->add_option("--q-pack", a->q_pack, "Q pack file to write")->required();
  cmd->add_option("--placement", a->placement,
                  "parity (odd experts), all, none, or hot:TRACE.jsonl[:FRACTION] (the most "
                  "routed FRACTION of all experts, default 0.5)")
      ->capture_default_str();
  cmd->add_option("--format", a->format, "Index format: v2, or v1 for the parity layout")
      ->capture_default_str();
  cmd->add_flag("--bundle", a->bundle, "Store each expert's projections contiguously");
  cmd->add_flag("--quiet", a->quiet, "No progress output");
  cmd->add_flag("--json", a->json, "Print a JSON summary");
  cmd->callback([a, exit_code] { *exit_code = RunBuild(*a); });
  AddIndexVerifyCommand(*index, exit_code);
}

}  // namespace expertd::ctl
