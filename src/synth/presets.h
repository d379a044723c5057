// The model families SynthesizeModel can imitate, as plain data: metadata KVs and tensors in file
// order. Internal to src/synth; docs/synth.md describes each preset.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "format/gguf.h"

namespace expertd::synth {

struct TensorSpec {
  std::string name;
  uint32_t type = 0;         // ggml type id
  std::vector<uint64_t> ne;  // ne[0] innermost
};

struct ModelSpec {
  std::string architecture;
  // Model metadata in file order (the split KVs are added by the writer of each shard).
  std::vector<std::pair<std::string, GgufScalar>> kvs;
  std::vector<TensorSpec> tensors;
};

// Tokens in every preset's vocabulary (token_embd and output rows, the tokenizer's size).
inline constexpr uint64_t kSynthVocab = 1024;

// Widths are written as u32 KVs (as llama.cpp does); this bound keeps the widest one (256 × scale)
// inside u32 and is far beyond any file a disk holds.
inline constexpr uint32_t kMaxSynthScale = uint32_t{1} << 20;

// Builds preset `preset` with every expert feed-forward width multiplied by `scale`
// (1..kMaxSynthScale). An unknown name is InvalidArgument listing the valid names.
absl::StatusOr<ModelSpec> BuildPreset(std::string_view preset, uint32_t scale);

}  // namespace expertd::synth
