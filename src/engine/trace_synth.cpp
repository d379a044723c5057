#include "engine/trace_synth.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "util/status.h"

namespace expertd {
namespace {

// Popularity skew and reuse for the real families are guesses in the range reported for
// load-balanced routers; the mixtral preset is set near the real Mixtral traces here (top half
// of a layer's experts take about 60% of its routes, about 40% of routes repeat the previous
// token's).
constexpr std::array kPresets = {
    TraceSynthPreset{"deepseek", "DeepSeek-V3/R1: MoE blocks 3..60, 256 experts top-8", 3, 58, 256,
                     8, 0.8, 0.35, 0.3},
    TraceSynthPreset{"qwen3moe", "Qwen3-30B-A3B: 48 MoE blocks, 128 experts top-8", 0, 48, 128, 8,
                     0.8, 0.35, 0.3},
    TraceSynthPreset{"gptoss", "gpt-oss-120b: 36 MoE blocks, 128 experts top-4", 0, 36, 128, 4, 0.8,
                     0.35, 0.3},
    TraceSynthPreset{"mixtral", "Mixtral-8x7B: 32 MoE blocks, 8 experts top-2", 0, 32, 8, 2, 0.5,
                     0.25, 0.2},
    TraceSynthPreset{"mixtral-tiny", "as synth mixtral-tiny: blocks 0..31, 8 experts top-2", 0, 32,
                     8, 2, 0.5, 0.25, 0.2},
    TraceSynthPreset{"mixtral-legacy-tiny", "as synth mixtral-legacy-tiny: blocks 0..3, 8 top-2", 0,
                     4, 8, 2, 0.5, 0.25, 0.2},
    TraceSynthPreset{"deepseek-tiny", "as synth deepseek-tiny: MoE blocks 1..3, 256 top-8", 1, 3,
                     256, 8, 0.8, 0.35, 0.3},
    TraceSynthPreset{"qwen3moe-tiny", "as synth qwen3moe-tiny: blocks 0..3, 128 top-8", 0, 4, 128,
                     8, 0.8, 0.35, 0.3},
    TraceSynthPreset{"gptoss-tiny", "as synth gptoss-tiny: blocks 0..2, 32 experts top-4", 0, 3, 32,
                     4, 0.8, 0.35, 0.3},
};

constexpr uint32_t kMaxLayers = 4096;
constexpr uint32_t kMaxTokens = 1u << 24;

// SplitMix64: a fixed, portable generator (std:: distributions differ between libraries).
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }  // [0, 1)
  uint32_t Below(uint32_t n) { return static_cast<uint32_t>(Uniform() * n); }

 private:
  uint64_t state_;
};

// What stays fixed for a layer across tokens: its popularity order and its map to the next layer.
struct LayerModel {
  std::vector<uint32_t> by_rank;  // expert at popularity rank r
  std::vector<uint32_t> next;     // correlated choice at the next layer
};

LayerModel MakeLayerModel(uint64_t seed, uint32_t block, uint32_t n_expert) {
  // Seeded by (seed, block) only, so --tokens and --layers do not change a layer's structure.
  Rng rng(seed ^ (0xd1b54a32d192ed03ULL * (uint64_t{block} + 1)));
  LayerModel m;
  m.by_rank.resize(n_expert);
  std::iota(m.by_rank.begin(), m.by_rank.end(), 0u);
  for (uint32_t i = n_expert; i > 1; --i) std::swap(m.by_rank[i - 1], m.by_rank[rng.Below(i)]);
  m.next.resize(n_expert);
  for (uint32_t& e : m.next) e = rng.Below(n_expert);
  return m;
}

void AppendNumber(std::string& out, double v) {
  std::array<char, 32> buf;
  const auto [end, ec] =
      std::to_chars(buf.data(), buf.data() + buf.size(), v, std::chars_format::general, 6);
  out.append(buf.data(), ec == std::errc() ? end : buf.data());
}

}  // namespace

std::span<const TraceSynthPreset> TraceSynthPresets() { return kPresets; }

absl::StatusOr<std::vector<RouteRecord>> SynthesizeRouteTrace(const TraceSynthOptions& o) {
  const TraceSynthPreset* preset = nullptr;
  std::string names;
  for (const TraceSynthPreset& p : kPresets) {
    if (p.name == o.preset) preset = &p;
    absl::StrAppend(&names, names.empty() ? "" : ", ", AV(p.name));
  }
  if (preset == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown trace preset '", o.preset, "': use one of ", names));
  }
  const uint32_t layers = o.layers ? o.layers : preset->layers;
  const double zipf = o.zipf >= 0 ? o.zipf : preset->zipf;
  const double reuse = o.reuse >= 0 ? o.reuse : preset->reuse;
  const double corr = o.correlation >= 0 ? o.correlation : preset->correlation;
  if (layers > kMaxLayers) {
    return absl::InvalidArgumentError(absl::StrCat("--layers ", layers, " > ", kMaxLayers));
  }
  if (o.tokens == 0 || o.tokens > kMaxTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tokens ", o.tokens, " is not in 1..", kMaxTokens));
  }
  if (!(zipf <= 8) || !(reuse <= 1) || !(corr <= 1)) {
    return absl::InvalidArgumentError("zipf must be in [0, 8], reuse and correlation in [0, 1]");
  }
  const uint32_t n = preset->n_expert, k = preset->top_k;

  // Popularity CDF over ranks, shared by all layers (each permutes ranks to experts).
  std::vector<double> cdf(n);
  double sum = 0;
  for (uint32_t r = 0; r < n; ++r) cdf[r] = sum += std::pow(double(r + 1), -zipf);
  for (double& c : cdf) c /= sum;
  std::vector<LayerModel> model;
  for (uint32_t i = 0; i < layers; ++i) {
    model.push_back(MakeLayerModel(o.seed, preset->first_layer + i, n));
  }

  Rng rng(o.seed);
  std::vector<RouteRecord> out;
  out.reserve(size_t{o.tokens} * layers);
  std::vector<std::vector<uint32_t>> prev_token(layers);  // previous token's choices per layer
  std::vector<uint8_t> chosen(n, 0);
  for (uint32_t t = 0; t < o.tokens; ++t) {
    const std::vector<uint32_t>* below = nullptr;  // this token's choices one layer down
    for (uint32_t i = 0; i < layers; ++i) {
      RouteRecord r;
      r.token = t;
      r.layer = preset->first_layer + i;
      r.line = static_cast<int>(out.size() + 1);
      const auto take = [&](uint32_t e) {
        if (chosen[e]) return false;
        chosen[e] = 1;
        r.experts.push_back(e);
        return true;
      };
      for (uint32_t j = 0; j < k; ++j) {
        const std::vector<uint32_t>& prev = prev_token[i];
        if (!prev.empty() && rng.Uniform() < reuse &&
            take(prev[rng.Below(uint32_t(prev.size()))])) {
          continue;
        }
        if (below != nullptr && j < below->size() && rng.Uniform() < corr &&
            take(model[i - 1].next[(*below)[j]])) {
          continue;
        }
        bool done = false;
        for (int attempt = 0; attempt < 64 && !done; ++attempt) {
          const auto rank = static_cast<uint32_t>(
              std::upper_bound(cdf.begin(), cdf.end(), rng.Uniform()) - cdf.begin());
          done = take(model[i].by_rank[std::min(rank, n - 1)]);
        }
        for (uint32_t rank = 0; rank < n && !done; ++rank) done = take(model[i].by_rank[rank]);
      }
      for (uint32_t e : r.experts) chosen[e] = 0;
      // Router weights: a softmax of random logits, listed in descending order.
      std::vector<double> logits(r.experts.size());
      double z = 0;
      for (double& l : logits) z += l = std::exp(3.0 * rng.Uniform());
      std::sort(logits.begin(), logits.end(), std::greater<>());
      for (double l : logits) r.weights.push_back(static_cast<float>(l / z));
      prev_token[i] = r.experts;
      out.push_back(std::move(r));
      below = &prev_token[i];
    }
  }
  return out;
}

std::string FormatRouteTrace(std::span<const RouteRecord> records) {
  std::string out;
  for (const RouteRecord& r : records) {
    absl::StrAppend(&out, "{\"token\": ", r.token, ", \"layer\": ", r.layer, ", \"experts\": [");
    for (size_t i = 0; i < r.experts.size(); ++i) {
      absl::StrAppend(&out, i ? ", " : "", r.experts[i]);
    }
    out += "]";
    if (!r.weights.empty()) {
      out += ", \"weights\": [";
      for (size_t i = 0; i < r.weights.size(); ++i) {
        if (i) out += ", ";
        AppendNumber(out, r.weights[i]);
      }
      out += "]";
    }
    if (r.problem_id != -1) absl::StrAppend(&out, ", \"problem_id\": ", r.problem_id);
    out += "}\n";
  }
  return out;
}

}  // namespace expertd
