// expertctl replay --trace T.jsonl --policy P (--capacity N | --capacity-fraction F) [--json]
// Replays a route trace through a simulated slot pool (one global pool of N bundles, demand
// fills only) and reports its hit rate; `--policy belady` is the offline optimum, `--policy all`
// runs every policy and Belady. With --model / --gguf the trace goes through the real engine.
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "commands.h"
#include "engine/policy_sim.h"
#include "format/route_trace.h"
#include "model_args.h"
#include "replay_model.h"
#include "util/status.h"

namespace expertd::ctl {
namespace {

struct ReplayArgs {
  std::string trace;
  std::string policy = std::string(kDefaultEvictionPolicy);
  uint32_t capacity = 0;
  double capacity_fraction = 0;
  std::string predictor = "none";
  std::string model;
  std::vector<std::string> ggufs;
  // Engine replay only (with --model / --gguf).
  std::string index;
  std::string v1_q_pack;
  std::string read_method = "pread";
  uint32_t reader_threads = 2;
  bool json = false;
};

nlohmann::json ResultJson(const SimResult& r) {
  nlohmann::json per_layer = nlohmann::json::object();
  for (const LayerHits& l : r.per_layer) per_layer[std::to_string(l.layer)] = l.hit_rate();
  // The engine-only counters are present with their "nothing measured" values, so a consumer can
  // read simulated and engine replays with the same code.
  return nlohmann::json{{"policy", r.policy},
                        {"capacity", r.capacity},
                        {"accesses", r.accesses},
                        {"hits", r.hits},
                        {"misses", r.misses},
                        {"evictions", r.evictions},
                        {"hit_rate", r.hit_rate},
                        {"prefetch_issued", 0},
                        {"prefetch_used", 0},
                        {"bytes_read", 0},
                        {"bytes_copied", 0},
                        {"stall_p50_us", nullptr},
                        {"stall_p99_us", nullptr},
                        {"per_layer_hit_rate", per_layer}};
}

absl::StatusOr<uint32_t> Capacity(const ReplayArgs& a, const AccessTrace& trace) {
  if ((a.capacity > 0) == (a.capacity_fraction > 0)) {
    return absl::InvalidArgumentError("give exactly one of --capacity N or --capacity-fraction F");
  }
  if (a.capacity > 0) return a.capacity;
  if (!(a.capacity_fraction <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--capacity-fraction ", a.capacity_fraction, " is not in (0, 1]"));
  }
  return static_cast<uint32_t>(
      std::llround(a.capacity_fraction * static_cast<double>(trace.distinct_bundles)));
}

absl::Status Run(const ReplayArgs& a) {
  if (a.predictor != "none") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--predictor '", a.predictor,
        "' needs the engine (--model or --gguf); the simulation replays demand only"));
  }
  std::vector<std::string> policies;
  if (a.policy == "all") {
    for (std::string_view p : SimPolicyNames()) policies.emplace_back(p);
  } else {
    policies.push_back(a.policy);
  }
  ASSIGN_OR_RETURN(std::vector<RouteRecord> records, ReadRouteTrace(a.trace));
  ASSIGN_OR_RETURN(const AccessTrace trace, MakeAccessTrace(std::move(records)));
  ASSIGN_OR_RETURN(const uint32_t capacity, Capacity(a, trace));
  std::vector<SimResult> results;
  for (const std::string& p : policies) {
    ASSIGN_OR_RETURN(SimResult r, SimulatePolicy(trace, trace.model, p, capacity));
    results.push_back(std::move(r));
  }
  if (a.json) {
    if (results.size() == 1) {
      std::cout << ResultJson(results[0]).dump(2) << "\n";
    } else {
      nlohmann::json all = nlohmann::json::array();
      for (const SimResult& r : results) all.push_back(ResultJson(r));
      std::cout << nlohmann::json{{"trace", a.trace},
                                  {"capacity", capacity},
                                  {"distinct_bundles", trace.distinct_bundles},
                                  {"results", all}}
                       .dump(2)
                << "\n";
    }
    return absl::OkStatus();
  }
  std::printf("trace %s: %llu accesses, %llu distinct bundles, %zu layers, top-%u\n",
              a.trace.c_str(), static_cast<unsigned long long>(trace.accesses),
              static_cast<unsigned long long>(trace.distinct_bundles), trace.model.layers.size(),
              trace.max_group);
  std::printf("simulated pool of %u bundles, demand fills only\n\n", capacity);
  std::printf("%-8s %10s %10s %9s\n", "policy", "hits", "misses", "hit rate");
  for (const SimResult& r : results) {
    std::printf("%-8s %10llu %10llu %9.4f\n", r.policy.c_str(),
                static_cast<unsigned long long>(r.hits),
                static_cast<unsigned long long>(r.misses), r.hit_rate);
  }
  return absl::OkStatus();
}

}  // namespace

void AddReplayCommand(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand(
      "replay", "Replay a route trace through a simulated slot pool and report its hit rate");
  auto a = std::make_shared<ReplayArgs>();
  cmd->add_option("--trace", a->trace, "Route trace (JSONL)")->required();
  std::string names;
  for (std::string_view p : SimPolicyNames()) names += std::string(p) + ", ";
  cmd->add_option("--policy", a->policy, "Eviction policy: " + names + "or all")
      ->capture_default_str();
  cmd->add_option("--capacity", a->capacity, "Pool size in bundles");
  cmd->add_option("--capacity-fraction", a->capacity_fraction,
                  "Pool size as a fraction of the trace's distinct (layer, expert) bundles");
  cmd->add_option("--predictor", a->predictor, "Route predictor (only none for now)")
      ->capture_default_str();
  cmd->add_option("--model", a->model,
                  "Replay through the real engine (host device) with the model in this folder");
  cmd->add_option("--gguf", a->ggufs, "Replay through the real engine with this GGUF (any shard)");
  cmd->add_option("--index", a->index, "Engine replay: index overlay");
  cmd->add_option("--v1-q-pack", a->v1_q_pack, "Engine replay: the Q pack of a v1 index");
  cmd->add_option("--read-method", a->read_method, "Engine replay: pread, direct or mmap")
      ->capture_default_str();
  cmd->add_option("--reader-threads", a->reader_threads,
                  "Engine replay: reader threads per source group")
      ->capture_default_str();
  cmd->add_flag("--json", a->json, "Print JSON");
  cmd->callback([a, exit_code] {
    if (!a->model.empty() || !a->ggufs.empty()) {
      // The real engine: reads, copies and verifies every granted bundle (replay_model.h).
      ReplayModelArgs m;
      m.trace = a->trace;
      m.model_dir = a->model;
      m.gguf = a->ggufs.empty() ? "" : a->ggufs.front();
      m.index = a->index;
      m.v1_q_pack = a->v1_q_pack;
      m.policy = a->policy;
      m.predictor = a->predictor;
      m.read_method = a->read_method;
      m.capacity = a->capacity;
      m.capacity_fraction = a->capacity_fraction;
      m.reader_threads = a->reader_threads;
      m.json = a->json;
      *exit_code = RunReplayWithModel(m);
      return;
    }
    const absl::Status st = Run(*a);
    if (!st.ok()) PrintError("replay", st);
    *exit_code = st.ok() ? 0 : 2;
  });
}

}  // namespace expertd::ctl
