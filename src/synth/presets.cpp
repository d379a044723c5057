#include "synth/presets.h"

#include <array>
#include <string>

#include "absl/strings/str_cat.h"
#include "format/ggml_types.h"
#include "synth/synth.h"
#include "util/status.h"

namespace expertd {
namespace {

using synth::ModelSpec;

// llama.cpp's LLAMA_FTYPE values for general.file_type.
constexpr uint32_t kFtypeQ4KM = 15;
constexpr uint32_t kFtypeMxfp4Moe = 38;

// Shared small dimensions. Non-expert tensors only need realistic names, types and ranks; their
// sizes are kept small so that the experts dominate the file as in real MoE models.
constexpr uint64_t kEmbd = 256;  // n_embd: a multiple of 256 so K-quants fit ne[0]
constexpr uint64_t kVocab = synth::kSynthVocab;

constexpr std::array kPresets = {
    SynthPresetInfo{"mixtral-tiny",
                    "llama arch, 32 layers, 8 experts top-2, stacked Q4_K/Q6_K experts "
                    "(Mixtral-8x7B layout at n_embd 256)"},
    SynthPresetInfo{"mixtral-legacy-tiny",
                    "llama arch, 4 layers, 8 experts top-2, one 2-D tensor per expert "
                    "(pre-2024 Mixtral layout)"},
    SynthPresetInfo{"deepseek-tiny",
                    "deepseek2 arch, 1 dense + 3 MoE layers, 256 experts top-8, shared expert, "
                    "expert types varying by layer"},
    SynthPresetInfo{"qwen3moe-tiny",
                    "qwen3moe arch, 4 layers, 128 experts top-8, stacked experts, no shared "
                    "expert"},
    SynthPresetInfo{"gptoss-tiny",
                    "gpt-oss arch, 3 layers, 32 experts top-4, MXFP4 experts with F32 biases"},
};

// Accumulates a ModelSpec; `Arch` keys are prefixed with the architecture as llama.cpp does.
class Builder {
 public:
  Builder(std::string_view arch, std::string_view name, uint32_t file_type) {
    spec_.architecture = std::string(arch);
    Kv("general.architecture", std::string(arch));
    Kv("general.name", std::string(name));
    Kv("general.file_type", file_type);
    Kv("general.quantization_version", uint32_t{2});
  }

  void Kv(std::string key, GgufScalar value) {
    spec_.kvs.emplace_back(std::move(key), std::move(value));
  }
  void Arch(std::string_view key, GgufScalar value) {
    Kv(absl::StrCat(AV(spec_.architecture), ".", AV(key)), std::move(value));
  }
  void Tensor(std::string name, uint32_t type, std::vector<uint64_t> ne) {
    spec_.tensors.push_back({std::move(name), type, std::move(ne)});
  }
  // A tensor of block `layer`: "blk.N.<suffix>".
  void Layer(int layer, std::string_view suffix, uint32_t type, std::vector<uint64_t> ne) {
    Tensor(absl::StrCat("blk.", layer, ".", AV(suffix)), type, std::move(ne));
  }

  ModelSpec Take() { return std::move(spec_); }

 private:
  ModelSpec spec_;
};

// Metadata every preset shares.
void CommonKvs(Builder& b, uint32_t layers, uint32_t context, uint32_t n_ff, uint32_t experts,
               uint32_t used, float rope_base, float rms_eps) {
  b.Arch("vocab_size", static_cast<uint32_t>(kVocab));
  b.Arch("context_length", context);
  b.Arch("embedding_length", static_cast<uint32_t>(kEmbd));
  b.Arch("block_count", layers);
  b.Arch("feed_forward_length", n_ff);
  b.Arch("expert_count", experts);
  b.Arch("expert_used_count", used);
  b.Arch("rope.freq_base", rope_base);
  b.Arch("attention.layer_norm_rms_epsilon", rms_eps);
}

// Mixtral-8x7B in llama.cpp's arch "llama": GQA 4:1 like the original's 32:8 heads.
ModelSpec Mixtral(uint64_t n_ff, int layers, bool legacy) {
  Builder b("llama", legacy ? "Mixtral Legacy Tiny (synthetic)" : "Mixtral Tiny (synthetic)",
            kFtypeQ4KM);
  constexpr uint64_t kHeads = 4, kHeadsKv = 1, kHeadDim = 64, kExperts = 8;
  CommonKvs(b, layers, 32768, static_cast<uint32_t>(n_ff), kExperts, 2, 1e6F, 1e-5F);
  b.Arch("attention.head_count", static_cast<uint32_t>(kHeads));
  b.Arch("attention.head_count_kv", static_cast<uint32_t>(kHeadsKv));
  b.Arch("rope.dimension_count", static_cast<uint32_t>(kHeadDim));

  const uint64_t kv_dim = kHeadsKv * kHeadDim;
  b.Tensor("token_embd.weight", ggml::kQ4_K, {kEmbd, kVocab});
  for (int l = 0; l < layers; ++l) {
    b.Layer(l, "attn_norm.weight", ggml::kF32, {kEmbd});
    b.Layer(l, "attn_q.weight", ggml::kQ4_K, {kEmbd, kHeads * kHeadDim});
    b.Layer(l, "attn_k.weight", ggml::kQ4_K, {kEmbd, kv_dim});
    b.Layer(l, "attn_v.weight", ggml::kQ6_K, {kEmbd, kv_dim});
    b.Layer(l, "attn_output.weight", ggml::kQ4_K, {kHeads * kHeadDim, kEmbd});
    b.Layer(l, "ffn_norm.weight", ggml::kF32, {kEmbd});
    b.Layer(l, "ffn_gate_inp.weight", ggml::kF32, {kEmbd, kExperts});
    if (legacy) {
      for (uint64_t e = 0; e < kExperts; ++e) {
        b.Layer(l, absl::StrCat("ffn_gate.", e, ".weight"), ggml::kQ4_K, {kEmbd, n_ff});
        b.Layer(l, absl::StrCat("ffn_up.", e, ".weight"), ggml::kQ4_K, {kEmbd, n_ff});
        b.Layer(l, absl::StrCat("ffn_down.", e, ".weight"), ggml::kQ6_K, {n_ff, kEmbd});
      }
    } else {
      b.Layer(l, "ffn_gate_exps.weight", ggml::kQ4_K, {kEmbd, n_ff, kExperts});
      b.Layer(l, "ffn_up_exps.weight", ggml::kQ4_K, {kEmbd, n_ff, kExperts});
      b.Layer(l, "ffn_down_exps.weight", ggml::kQ6_K, {n_ff, kEmbd, kExperts});
    }
  }
  b.Tensor("output_norm.weight", ggml::kF32, {kEmbd});
  b.Tensor("output.weight", ggml::kQ6_K, {kEmbd, kVocab});
  return b.Take();
}

// DeepSeek-V3 in llama.cpp's arch "deepseek2": MLA attention, one leading dense block, then MoE
// blocks with a shared expert, a sigmoid router with a selection bias, and grouped routing.
ModelSpec DeepSeek(uint64_t expert_ff) {
  Builder b("deepseek2", "DeepSeek Tiny (synthetic)", kFtypeQ4KM);
  constexpr int kLayers = 4, kDense = 1;
  constexpr uint64_t kHeads = 4, kQLora = 64, kKvLora = 64, kNope = 32, kRope = 32, kVHead = 32;
  constexpr uint64_t kDenseFf = 512, kExperts = 256;
  CommonKvs(b, kLayers, 163840, kDenseFf, kExperts, 8, 10000.0F, 1e-6F);
  b.Arch("expert_feed_forward_length", static_cast<uint32_t>(expert_ff));
  b.Arch("expert_shared_count", uint32_t{1});
  b.Arch("leading_dense_block_count", static_cast<uint32_t>(kDense));
  b.Arch("expert_weights_scale", 2.5F);
  b.Arch("expert_weights_norm", true);
  b.Arch("expert_gating_func", uint32_t{2});  // LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID
  b.Arch("expert_group_count", uint32_t{8});
  b.Arch("expert_group_used_count", uint32_t{4});
  b.Arch("attention.head_count", static_cast<uint32_t>(kHeads));
  b.Arch("attention.head_count_kv", static_cast<uint32_t>(kHeads));
  b.Arch("attention.q_lora_rank", static_cast<uint32_t>(kQLora));
  b.Arch("attention.kv_lora_rank", static_cast<uint32_t>(kKvLora));
  b.Arch("attention.key_length", static_cast<uint32_t>(kNope + kRope));
  b.Arch("attention.value_length", static_cast<uint32_t>(kVHead));
  b.Arch("rope.dimension_count", static_cast<uint32_t>(kRope));

  // Expert types per MoE layer, so that layers have different bundle layouts (slot classes).
  struct ExpertTypes {
    uint32_t gate_up, down;
  };
  constexpr std::array<ExpertTypes, 3> kTypes = {ExpertTypes{ggml::kQ4_K, ggml::kQ8_0},
                                                 {ggml::kQ6_K, ggml::kQ5_0},
                                                 {ggml::kQ4_K, ggml::kQ8_0}};

  b.Tensor("token_embd.weight", ggml::kQ4_K, {kEmbd, kVocab});
  for (int l = 0; l < kLayers; ++l) {
    b.Layer(l, "attn_norm.weight", ggml::kF32, {kEmbd});
    b.Layer(l, "attn_q_a.weight", ggml::kQ8_0, {kEmbd, kQLora});
    b.Layer(l, "attn_q_a_norm.weight", ggml::kF32, {kQLora});
    b.Layer(l, "attn_q_b.weight", ggml::kQ8_0, {kQLora, kHeads * (kNope + kRope)});
    b.Layer(l, "attn_kv_a_mqa.weight", ggml::kQ8_0, {kEmbd, kKvLora + kRope});
    b.Layer(l, "attn_kv_a_norm.weight", ggml::kF32, {kKvLora});
    b.Layer(l, "attn_kv_b.weight", ggml::kQ8_0, {kKvLora, kHeads * (kNope + kVHead)});
    b.Layer(l, "attn_output.weight", ggml::kQ8_0, {kHeads * kVHead, kEmbd});
    b.Layer(l, "ffn_norm.weight", ggml::kF32, {kEmbd});
    if (l < kDense) {
      b.Layer(l, "ffn_gate.weight", ggml::kQ8_0, {kEmbd, kDenseFf});
      b.Layer(l, "ffn_up.weight", ggml::kQ8_0, {kEmbd, kDenseFf});
      b.Layer(l, "ffn_down.weight", ggml::kQ8_0, {kDenseFf, kEmbd});
      continue;
    }
    const ExpertTypes& t = kTypes[static_cast<size_t>(l - kDense)];
    b.Layer(l, "ffn_gate_inp.weight", ggml::kF32, {kEmbd, kExperts});
    b.Layer(l, "exp_probs_b.bias", ggml::kF32, {kExperts});
    b.Layer(l, "ffn_gate_exps.weight", t.gate_up, {kEmbd, expert_ff, kExperts});
    b.Layer(l, "ffn_up_exps.weight", t.gate_up, {kEmbd, expert_ff, kExperts});
    b.Layer(l, "ffn_down_exps.weight", t.down, {expert_ff, kEmbd, kExperts});
    b.Layer(l, "ffn_gate_shexp.weight", ggml::kQ8_0, {kEmbd, expert_ff});
    b.Layer(l, "ffn_up_shexp.weight", ggml::kQ8_0, {kEmbd, expert_ff});
    b.Layer(l, "ffn_down_shexp.weight", ggml::kQ8_0, {expert_ff, kEmbd});
  }
  b.Tensor("output_norm.weight", ggml::kF32, {kEmbd});
  b.Tensor("output.weight", ggml::kQ6_K, {kEmbd, kVocab});
  return b.Take();
}

// Qwen3-30B-A3B in llama.cpp's arch "qwen3moe": GQA with per-head q/k norms, no shared expert.
ModelSpec Qwen3Moe(uint64_t expert_ff) {
  Builder b("qwen3moe", "Qwen3-MoE Tiny (synthetic)", kFtypeQ4KM);
  constexpr int kLayers = 4;
  constexpr uint64_t kHeads = 4, kHeadsKv = 2, kHeadDim = 64, kExperts = 128;
  CommonKvs(b, kLayers, 40960, 768, kExperts, 8, 1e6F, 1e-6F);
  b.Arch("expert_feed_forward_length", static_cast<uint32_t>(expert_ff));
  b.Arch("attention.head_count", static_cast<uint32_t>(kHeads));
  b.Arch("attention.head_count_kv", static_cast<uint32_t>(kHeadsKv));
  b.Arch("attention.key_length", static_cast<uint32_t>(kHeadDim));
  b.Arch("attention.value_length", static_cast<uint32_t>(kHeadDim));

  b.Tensor("token_embd.weight", ggml::kQ4_K, {kEmbd, kVocab});
  for (int l = 0; l < kLayers; ++l) {
    b.Layer(l, "attn_norm.weight", ggml::kF32, {kEmbd});
    b.Layer(l, "attn_q.weight", ggml::kQ4_K, {kEmbd, kHeads * kHeadDim});
    b.Layer(l, "attn_k.weight", ggml::kQ4_K, {kEmbd, kHeadsKv * kHeadDim});
    b.Layer(l, "attn_v.weight", ggml::kQ6_K, {kEmbd, kHeadsKv * kHeadDim});
    b.Layer(l, "attn_output.weight", ggml::kQ4_K, {kHeads * kHeadDim, kEmbd});
    b.Layer(l, "attn_q_norm.weight", ggml::kF32, {kHeadDim});
    b.Layer(l, "attn_k_norm.weight", ggml::kF32, {kHeadDim});
    b.Layer(l, "ffn_norm.weight", ggml::kF32, {kEmbd});
    b.Layer(l, "ffn_gate_inp.weight", ggml::kF32, {kEmbd, kExperts});
    b.Layer(l, "ffn_gate_exps.weight", ggml::kQ4_K, {kEmbd, expert_ff, kExperts});
    b.Layer(l, "ffn_up_exps.weight", ggml::kQ4_K, {kEmbd, expert_ff, kExperts});
    b.Layer(l, "ffn_down_exps.weight", ggml::kQ8_0, {expert_ff, kEmbd, kExperts});
  }
  b.Tensor("output_norm.weight", ggml::kF32, {kEmbd});
  b.Tensor("output.weight", ggml::kQ6_K, {kEmbd, kVocab});
  return b.Take();
}

// gpt-oss-20b in llama.cpp's arch "gpt-oss": biased attention and router, attention sinks,
// MXFP4 experts with per-expert F32 biases.
ModelSpec GptOss(uint64_t expert_ff) {
  Builder b("gpt-oss", "gpt-oss Tiny (synthetic)", kFtypeMxfp4Moe);
  constexpr int kLayers = 3;
  constexpr uint64_t kHeads = 4, kHeadsKv = 1, kHeadDim = 64, kExperts = 32;
  CommonKvs(b, kLayers, 131072, static_cast<uint32_t>(expert_ff), kExperts, 4, 150000.0F, 1e-5F);
  b.Arch("expert_feed_forward_length", static_cast<uint32_t>(expert_ff));
  b.Arch("attention.head_count", static_cast<uint32_t>(kHeads));
  b.Arch("attention.head_count_kv", static_cast<uint32_t>(kHeadsKv));
  b.Arch("attention.key_length", static_cast<uint32_t>(kHeadDim));
  b.Arch("attention.value_length", static_cast<uint32_t>(kHeadDim));
  b.Arch("attention.sliding_window", uint32_t{128});

  const uint64_t q_dim = kHeads * kHeadDim, kv_dim = kHeadsKv * kHeadDim;
  b.Tensor("token_embd.weight", ggml::kQ8_0, {kEmbd, kVocab});
  for (int l = 0; l < kLayers; ++l) {
    b.Layer(l, "attn_norm.weight", ggml::kF32, {kEmbd});
    b.Layer(l, "attn_q.weight", ggml::kQ8_0, {kEmbd, q_dim});
    b.Layer(l, "attn_q.bias", ggml::kF32, {q_dim});
    b.Layer(l, "attn_k.weight", ggml::kQ8_0, {kEmbd, kv_dim});
    b.Layer(l, "attn_k.bias", ggml::kF32, {kv_dim});
    b.Layer(l, "attn_v.weight", ggml::kQ8_0, {kEmbd, kv_dim});
    b.Layer(l, "attn_v.bias", ggml::kF32, {kv_dim});
    b.Layer(l, "attn_output.weight", ggml::kQ8_0, {q_dim, kEmbd});
    b.Layer(l, "attn_output.bias", ggml::kF32, {kEmbd});
    b.Layer(l, "attn_sinks.weight", ggml::kF32, {kHeads});
    b.Layer(l, "post_attention_norm.weight", ggml::kF32, {kEmbd});
    b.Layer(l, "ffn_gate_inp.weight", ggml::kF32, {kEmbd, kExperts});
    b.Layer(l, "ffn_gate_inp.bias", ggml::kF32, {kExperts});
    b.Layer(l, "ffn_gate_exps.weight", ggml::kMXFP4, {kEmbd, expert_ff, kExperts});
    b.Layer(l, "ffn_gate_exps.bias", ggml::kF32, {expert_ff, kExperts});
    b.Layer(l, "ffn_up_exps.weight", ggml::kMXFP4, {kEmbd, expert_ff, kExperts});
    b.Layer(l, "ffn_up_exps.bias", ggml::kF32, {expert_ff, kExperts});
    b.Layer(l, "ffn_down_exps.weight", ggml::kMXFP4, {expert_ff, kEmbd, kExperts});
    b.Layer(l, "ffn_down_exps.bias", ggml::kF32, {kEmbd, kExperts});
  }
  b.Tensor("output_norm.weight", ggml::kF32, {kEmbd});
  b.Tensor("output.weight", ggml::kQ8_0, {kEmbd, kVocab});
  return b.Take();
}

}  // namespace

std::span<const SynthPresetInfo> SynthPresets() { return kPresets; }

namespace synth {

absl::StatusOr<ModelSpec> BuildPreset(std::string_view preset, uint32_t scale) {
  if (scale == 0 || scale > kMaxSynthScale) {
    return InvalidError(ErrorKind::kBadValue,
                        absl::StrCat("synth: scale ", scale, " is outside 1..", kMaxSynthScale));
  }
  // Widths are 64-bit so that large scales give multi-GiB tensors without wrapping.
  const uint64_t s = scale;
  if (preset == "mixtral-tiny") return Mixtral(256 * s, 32, /*legacy=*/false);
  if (preset == "mixtral-legacy-tiny") return Mixtral(256 * s, 4, /*legacy=*/true);
  if (preset == "deepseek-tiny") return DeepSeek(32 * s);
  if (preset == "qwen3moe-tiny") return Qwen3Moe(64 * s);
  if (preset == "gptoss-tiny") return GptOss(256 * s);
  std::string valid;
  for (const SynthPresetInfo& p : kPresets) {
    absl::StrAppend(&valid, valid.empty() ? "" : ", ", AV(p.name));
  }
  return InvalidError(ErrorKind::kBadValue, absl::StrCat("synth: unknown preset '", AV(preset),
                                                         "' (valid: ", valid, ")"));
}

}  // namespace synth
}  // namespace expertd
