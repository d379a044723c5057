// expertctl replay --trace T.jsonl --policy P (--capacity N | --capacity-fraction F) [--json]
// Replays a route trace through a simulated slot pool (one global pool of N bundles, demand
// fills only) and reports its hit rate; `--policy belady` is the offline optimum, `--policy all`
// runs every policy and Belady. The real engine (--model / --gguf) is not wired in yet.
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
  if (!a.model.empty() || !a.ggufs.empty()) {
    return absl::UnimplementedError(
        "replay through the engine (--model / --gguf) is not supported yet; without them the "
        "trace is replayed through a simulated pool");
  }
  if (a.predictor != "none") {
    return absl::InvalidArgumentError(
        absl::StrCat("--predictor '", a.predictor, "' is not supported yet: use none"));
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
  cmd->add_option("--model", a->model, "Replay through the engine with this model (not yet)");
  cmd->add_option("--gguf", a->ggufs, "Replay through the engine with this GGUF (not yet)");
  cmd->add_flag("--json", a->json, "Print JSON");
  cmd->callback([a, exit_code] {
    const absl::Status st = Run(*a);
    if (!st.ok()) PrintError("replay", st);
    *exit_code = st.ok() ? 0 : 2;
  });
}

}  // namespace expertd::ctl
