// Eviction policies, the trace-driven pool simulation (Belady included) and the route trace
// synthesizer: small hand-computed cases, then the real Mixtral traces.
#include "engine/eviction_policy.h"

#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <set>

#include "engine/policy_sim.h"
#include "engine/trace_synth.h"
#include "format/route_trace.h"
#include "support/test_support.h"

namespace expertd {
namespace {

using ::expertd::testing::SharedDataDir;

const auto kAll = [](SlotId) { return true; };

std::unique_ptr<EvictionPolicy> Make(std::string_view name, uint32_t capacity,
                                     PolicyModel model = {}) {
  auto p = MakeEvictionPolicy(name, model, capacity);
  EXPECT_TRUE(p.ok()) << p.status();
  return std::move(p).value();
}

// Inserts `key` into `slot` as a pool does on a miss: OnInsert, then OnAccess.
void Fill(EvictionPolicy& p, SlotId slot, BundleKey key, uint64_t now) {
  p.OnInsert(slot, key, now);
  p.OnAccess(slot, key, now);
}

// One record per expert id, layer 0, tokens in order: a plain page-reference string.
std::vector<RouteRecord> Sequence(std::initializer_list<uint32_t> experts) {
  std::vector<RouteRecord> out;
  for (uint32_t e : experts) {
    RouteRecord r;
    r.token = static_cast<int64_t>(out.size());
    r.experts = {e};
    out.push_back(r);
  }
  return out;
}

RouteRecord Record(int64_t problem, int64_t token, uint32_t layer, std::vector<uint32_t> experts) {
  RouteRecord r;
  r.problem_id = problem;
  r.token = token;
  r.layer = layer;
  r.experts = std::move(experts);
  return r;
}

SimResult Simulate(std::vector<RouteRecord> records, std::string_view policy, uint32_t capacity) {
  auto trace = MakeAccessTrace(std::move(records));
  EXPECT_TRUE(trace.ok()) << trace.status();
  auto r = SimulatePolicy(*trace, trace->model, policy, capacity);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : SimResult{};
}

TEST(EvictionPolicyTest, NamesAndUnknownName) {
  ASSERT_FALSE(EvictionPolicyNames().empty());
  EXPECT_EQ(EvictionPolicyNames()[0], kDefaultEvictionPolicy);
  for (std::string_view name : EvictionPolicyNames()) {
    EXPECT_EQ(Make(name, 4)->name(), name);
  }
  const auto bad = MakeEvictionPolicy("fifo", {}, 4);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("cycle, lru, lfu"), std::string_view::npos) << bad.status();
}

TEST(EvictionPolicyTest, LruEvictsLeastRecentlyUsed) {
  auto p = Make("lru", 3);
  Fill(*p, 0, {0, 0}, 0);
  Fill(*p, 1, {0, 1}, 1);
  Fill(*p, 2, {0, 2}, 2);
  p->OnAccess(0, {0, 0}, 3);  // order now 1, 2, 0
  EXPECT_EQ(p->ChooseVictim(kAll, 4), SlotId{1});
  EXPECT_EQ(p->ChooseVictim([](SlotId s) { return s != 1; }, 4), SlotId{2});
  p->OnRemove(1);
  EXPECT_EQ(p->ChooseVictim(kAll, 4), SlotId{2});
  EXPECT_EQ(p->ChooseVictim([](SlotId) { return false; }, 4), std::nullopt);
}

// LFU halves counts every 4 x capacity accesses (8 here) and ranks by the decayed count.
TEST(EvictionPolicyTest, LfuCountsDecay) {
  // A is used at ticks 0, 1, 2: c = 1, then 1 * 2^(-1/8) + 1 = 1.917, then 1.917 * 2^(-1/8) + 1
  // = 2.758. B is used once at tick 3: at tick 3, A's 2.758 * 2^(-1/8) = 2.53 > 1: B goes.
  auto p = Make("lfu", 2);
  Fill(*p, 0, {0, 0}, 0);
  p->OnAccess(0, {0, 0}, 1);
  p->OnAccess(0, {0, 0}, 2);
  Fill(*p, 1, {0, 1}, 3);
  EXPECT_EQ(p->ChooseVictim(kAll, 4), SlotId{1});
  // B used once more at tick 40 instead: A's count has decayed to 2.758 * 2^(-38/8) = 0.10,
  // below B's 1 + 2^(-37/8) = 1.04, so A goes.
  auto q = Make("lfu", 2);
  Fill(*q, 0, {0, 0}, 0);
  q->OnAccess(0, {0, 0}, 1);
  q->OnAccess(0, {0, 0}, 2);
  Fill(*q, 1, {0, 1}, 3);
  q->OnAccess(1, {0, 1}, 40);
  EXPECT_EQ(q->ChooseVictim(kAll, 41), SlotId{0});
  EXPECT_EQ(q->ChooseVictim([](SlotId s) { return s == 1; }, 41), SlotId{1});
  EXPECT_EQ(q->ChooseVictim([](SlotId) { return false; }, 41), std::nullopt);
}

// After one sweep over layers 0..3 (expert 0 each), the next token is at layer 0. The bundles of
// layers 1, 2 and 3 have the same history; the sweep reaches layer 3 last, so it goes first.
TEST(EvictionPolicyTest, CycleEvictsTheLayerFurthestAhead) {
  auto p = Make("cycle", 4, PolicyModel{{0, 1, 2, 3}, 8, 1});
  uint64_t now = 0;
  for (uint32_t layer = 0; layer < 4; ++layer) {
    p->OnLayer(layer, now);
    Fill(*p, layer, {layer, 0}, now++);
  }
  p->OnLayer(0, now);
  EXPECT_EQ(p->ChooseVictim([](SlotId s) { return s != 0; }, now), SlotId{3});
  EXPECT_EQ(p->ChooseVictim([](SlotId s) { return s == 1 || s == 2; }, now), SlotId{2});
  EXPECT_EQ(p->ChooseVictim([](SlotId s) { return s == 1; }, now), SlotId{1});
  EXPECT_EQ(p->ChooseVictim([](SlotId) { return false; }, now), std::nullopt);
  p->OnRemove(3);
  EXPECT_EQ(p->ChooseVictim([](SlotId s) { return s != 0; }, now), SlotId{2});
}

// Without a model the policy learns the layers as they come, also ones below the current one.
TEST(EvictionPolicyTest, CycleLearnsLayersItWasNotTold) {
  auto p = Make("cycle", 3);
  p->OnLayer(5, 0);
  Fill(*p, 0, {5, 1}, 0);
  p->OnLayer(7, 1);
  Fill(*p, 1, {7, 1}, 1);
  p->OnLayer(2, 2);  // a new token at a layer no one mentioned
  Fill(*p, 2, {2, 1}, 2);
  p->OnLayer(5, 3);
  // Layer 7 comes next, layer 2 only in the next sweep: 2 goes first.
  EXPECT_EQ(p->ChooseVictim([](SlotId s) { return s != 0; }, 3), SlotId{2});
}

TEST(EvictionPolicyTest, EveryPolicyRespectsEvictable) {
  for (std::string_view name : EvictionPolicyNames()) {
    auto p = Make(name, 4, PolicyModel{{0}, 8, 1});
    for (SlotId s = 0; s < 4; ++s) {
      p->OnLayer(0, s);
      Fill(*p, s, {0, s}, s);
    }
    for (SlotId only = 0; only < 4; ++only) {
      EXPECT_EQ(p->ChooseVictim([&](SlotId s) { return s == only; }, 4), only) << name;
    }
    EXPECT_EQ(p->ChooseVictim([](SlotId) { return false; }, 4), std::nullopt) << name;
  }
}

// Silberschatz's reference string with 3 frames: MIN takes 9 faults, LRU 12 (hand-computed in
// every operating systems textbook).
TEST(PolicySimTest, BeladyAndLruOnTheTextbookString) {
  const auto refs = [] {
    return Sequence({7, 0, 1, 2, 0, 3, 0, 4, 2, 3, 0, 3, 2, 1, 2, 0, 1, 7, 0, 1});
  };
  const SimResult min = Simulate(refs(), "belady", 3);
  EXPECT_EQ(min.accesses, 20u);
  EXPECT_EQ(min.misses, 9u);
  EXPECT_EQ(min.hits, 11u);
  EXPECT_DOUBLE_EQ(min.hit_rate, 11.0 / 20);
  EXPECT_EQ(Simulate(refs(), "lru", 3).misses, 12u);
  for (std::string_view p : SimPolicyNames()) EXPECT_GE(Simulate(refs(), p, 3).misses, 9u) << p;
}

TEST(PolicySimTest, AccessOrderIsProblemTokenLayerThenListed) {
  std::vector<RouteRecord> records = {Record(1, 0, 0, {5}),    Record(0, 1, 1, {4}),
                                      Record(0, 1, 0, {3, 2}), Record(-1, 7, 0, {1}),
                                      Record(0, 0, 3, {0}),    Record(0, 1, 0, {6})};
  for (size_t i = 0; i < records.size(); ++i) records[i].line = static_cast<int>(i + 1);
  const auto trace = MakeAccessTrace(records);
  ASSERT_TRUE(trace.ok()) << trace.status();
  std::vector<int> lines;
  for (const RouteRecord& r : trace->groups) lines.push_back(r.line);
  // No problem_id (-1) first; equal keys keep file order (lines 3 and 6).
  EXPECT_EQ(lines, (std::vector<int>{4, 5, 3, 6, 2, 1}));
  EXPECT_EQ(trace->groups[2].experts, (std::vector<uint32_t>{3, 2}));
  EXPECT_EQ(trace->accesses, 7u);
  EXPECT_EQ(trace->distinct_bundles, 7u);
  EXPECT_EQ(trace->max_group, 2u);
  EXPECT_EQ(trace->model.layers, (std::vector<uint32_t>{0, 1, 3}));
  EXPECT_EQ(trace->model.n_expert, 7u);
  // All seven bundles differ, so all miss; per-layer counts follow the records' layers.
  const auto r = SimulatePolicy(*trace, trace->model, "lru", 2);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->misses, 7u);
  ASSERT_EQ(r->per_layer.size(), 3u);
  EXPECT_EQ(r->per_layer[0].layer, 0u);
  EXPECT_EQ(r->per_layer[0].accesses, 5u);
}

// A group needs all its experts at once: a bundle it already touched is never a victim, even
// for Belady. Groups [A], [B], [A, C], [B] in 2 slots: at C's miss MIN would evict A (never used
// again) and hit B later; the rule forces B out, so only A's reuse hits.
TEST(PolicySimTest, NoVictimFromTheCurrentGroup) {
  std::vector<RouteRecord> records = {Record(-1, 0, 0, {0}), Record(-1, 1, 0, {1}),
                                      Record(-1, 2, 0, {0, 2}), Record(-1, 3, 0, {1})};
  for (std::string_view p : SimPolicyNames()) {
    const SimResult r = Simulate(records, p, 2);
    EXPECT_EQ(r.hits, 1u) << p;
    EXPECT_EQ(r.misses, 4u) << p;
  }
}

TEST(PolicySimTest, CapacityBelowTopKIsAnError) {
  auto trace = MakeAccessTrace({Record(-1, 0, 0, {0, 1, 2})});
  ASSERT_TRUE(trace.ok());
  for (uint32_t capacity : {0u, 2u}) {
    const auto r = SimulatePolicy(*trace, trace->model, "lru", capacity);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("top-k"), std::string_view::npos) << r.status();
  }
  EXPECT_TRUE(SimulatePolicy(*trace, trace->model, "lru", 3).ok());
  EXPECT_FALSE(SimulatePolicy(*trace, trace->model, "mru", 3).ok());
  EXPECT_FALSE(MakeAccessTrace({}).ok());
}

// Every token uses expert 0 of layers 0..5 with room for 4: LRU thrashes (no hit at all), MIN
// hits (c - 1) / (n - 1) = 3/5 of a loop's references; cycle learns to keep part of the loop.
TEST(PolicySimTest, SweepLargerThanThePool) {
  std::vector<RouteRecord> records;
  for (int64_t t = 0; t < 200; ++t) {
    for (uint32_t layer = 0; layer < 6; ++layer) records.push_back(Record(-1, t, layer, {0}));
  }
  EXPECT_EQ(Simulate(records, "lru", 4).hits, 0u);
  EXPECT_NEAR(Simulate(records, "belady", 4).hit_rate, 0.6, 0.01);
  EXPECT_GT(Simulate(records, "cycle", 4).hit_rate, 0.3);
}

TEST(TraceSynthTest, DeterministicPresetsAndFormat) {
  TraceSynthOptions o;
  o.preset = "deepseek";
  o.tokens = 20;
  o.seed = 7;
  const auto a = SynthesizeRouteTrace(o);
  const auto b = SynthesizeRouteTrace(o);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok());
  ASSERT_EQ(a->size(), 20u * 58);
  EXPECT_EQ(FormatRouteTrace(*a), FormatRouteTrace(*b));
  std::set<uint32_t> layers;
  for (const RouteRecord& r : *a) {
    layers.insert(r.layer);
    ASSERT_EQ(r.experts.size(), 8u);
    ASSERT_EQ(std::set<uint32_t>(r.experts.begin(), r.experts.end()).size(), 8u);
    float sum = 0;
    for (size_t i = 0; i < r.weights.size(); ++i) {
      sum += r.weights[i];
      if (i > 0) {
        EXPECT_LE(r.weights[i], r.weights[i - 1]);
      }
    }
    EXPECT_NEAR(sum, 1.0, 1e-5);
    for (uint32_t e : r.experts) EXPECT_LT(e, 256u);
  }
  EXPECT_EQ(*layers.begin(), 3u);
  EXPECT_EQ(*layers.rbegin(), 60u);
  o.seed = 8;
  EXPECT_NE(FormatRouteTrace(*SynthesizeRouteTrace(o)), FormatRouteTrace(*a));
  // --layers keeps the first block and the per-layer structure.
  o.seed = 7;
  o.layers = 4;
  const auto four = SynthesizeRouteTrace(o);
  ASSERT_TRUE(four.ok());
  EXPECT_EQ(four->size(), 80u);
  EXPECT_EQ(four->back().layer, 6u);
  // The text reads back as the same trace.
  const std::string text = FormatRouteTrace(*four);
  const auto parsed = ParseRouteTrace(text, "synth.jsonl");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->size(), four->size());
  for (size_t i = 0; i < parsed->size(); ++i) {
    EXPECT_EQ((*parsed)[i].token, (*four)[i].token);
    EXPECT_EQ((*parsed)[i].layer, (*four)[i].layer);
    EXPECT_EQ((*parsed)[i].experts, (*four)[i].experts);
  }
  o.preset = "gpt5";
  EXPECT_EQ(SynthesizeRouteTrace(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.preset = "deepseek";
  o.reuse = 1.5;
  EXPECT_FALSE(SynthesizeRouteTrace(o).ok());
}

// Skew, reuse and correlation show up in the statistics, within loose bounds.
TEST(TraceSynthTest, SkewReuseAndCorrelation) {
  TraceSynthOptions o;
  o.preset = "qwen3moe";
  o.tokens = 400;
  o.layers = 8;
  const auto t = SynthesizeRouteTrace(o);  // zipf 0.8, reuse 0.35, correlation 0.3
  ASSERT_TRUE(t.ok());
  std::map<std::pair<uint32_t, uint32_t>, int> count;
  std::map<std::pair<int64_t, uint32_t>, std::set<uint32_t>> route;
  for (const RouteRecord& r : *t) {
    for (uint32_t e : r.experts) ++count[{r.layer, e}];
    route[{r.token, r.layer}] = {r.experts.begin(), r.experts.end()};
  }
  // Skew: the 13 most used of 128 experts (10%) take well over 10% of a layer's routes.
  for (uint32_t layer = 0; layer < 8; ++layer) {
    std::vector<int> c;
    for (uint32_t e = 0; e < 128; ++e) c.push_back(count[{layer, e}]);
    std::sort(c.rbegin(), c.rend());
    const double top = std::accumulate(c.begin(), c.begin() + 13, 0.0) / (400.0 * 8);
    EXPECT_GT(top, 0.3) << layer;
    EXPECT_LT(top, 0.8) << layer;
  }
  // Reuse: about 35% of choices repeat the previous token's, plus chance overlap.
  double shared = 0, total = 0;
  for (const auto& [key, experts] : route) {
    const auto prev = route.find({key.first - 1, key.second});
    if (prev == route.end()) continue;
    for (uint32_t e : experts) shared += prev->second.count(e);
    total += experts.size();
  }
  EXPECT_GT(shared / total, 0.3);
  EXPECT_LT(shared / total, 0.6);
  // Correlation: with reuse off and flat popularity, choice 0 at layer L+1 follows choice 0 at
  // layer L through a fixed map; the map's most common image covers most occurrences.
  o.zipf = 0;
  o.reuse = 0;
  o.correlation = 0.9;
  const auto c = SynthesizeRouteTrace(o);
  ASSERT_TRUE(c.ok());
  std::map<uint32_t, std::map<uint32_t, int>> next;  // layer-0 expert -> layer-1 expert counts
  for (size_t i = 0; i + 1 < c->size(); ++i) {
    if ((*c)[i].layer == 0) ++next[(*c)[i].experts[0]][(*c)[i + 1].experts[0]];
  }
  int agree = 0, all = 0;
  for (const auto& [from, to] : next) {
    int best = 0;
    for (const auto& [e, n] : to) best = std::max(best, n), all += n;
    agree += best;
  }
  EXPECT_GT(double(agree) / all, 0.8);
}

TEST(TraceSynthTest, LargePoolsUseTheSampledPath) {
  TraceSynthOptions o;
  o.preset = "qwen3moe";
  o.tokens = 60;
  o.layers = 16;  // 2048 bundles: a pool of 1500 goes past the exact-scan limit
  auto records = SynthesizeRouteTrace(o);
  ASSERT_TRUE(records.ok());
  auto trace = MakeAccessTrace(*std::move(records));
  ASSERT_TRUE(trace.ok());
  const auto cycle = SimulatePolicy(*trace, trace->model, "cycle", 1500);
  const auto min = SimulatePolicy(*trace, trace->model, "belady", 1500);
  ASSERT_TRUE(cycle.ok()) << cycle.status();
  ASSERT_TRUE(min.ok());
  EXPECT_GT(cycle->hit_rate, 0.3);
  EXPECT_LE(cycle->hit_rate, min->hit_rate);
}

// The real Mixtral-8x7B traces (32 layers, 8 experts, top-2) at 128 of their 256 bundles:
// MIN bounds every policy, and the layer-aware default beats LRU.
TEST(PolicySimTest, RealMixtralTraces) {
  ASSERT_FALSE(SharedDataDir().empty()) << "tests/data is missing";
  for (const char* name : {"humaneval_2_routing.jsonl", "gsm8k_2_routing.jsonl"}) {
    auto records = ReadRouteTrace(SharedDataDir() + "/traces/mixtral-8x7b/" + name);
    ASSERT_TRUE(records.ok()) << records.status();
    auto trace = MakeAccessTrace(*std::move(records));
    ASSERT_TRUE(trace.ok());
    EXPECT_EQ(trace->distinct_bundles, 256u);
    std::map<std::string, double> rate;
    for (std::string_view p : SimPolicyNames()) {
      const auto r = SimulatePolicy(*trace, trace->model, p, 128);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->accesses, trace->accesses);
      EXPECT_EQ(r->hits + r->misses, r->accesses);
      rate[std::string(p)] = r->hit_rate;
    }
    for (const auto& [p, h] : rate) EXPECT_LE(h, rate["belady"]) << name << " " << p;
    EXPECT_GT(rate["cycle"], rate["lru"]) << name;
  }
}

}  // namespace
}  // namespace expertd
