// Synthetic MoE models: valid GGUF files with the real tensor names, ggml types and layer
// structure of a model family, scaled down so they build in seconds, with a tokenizer and finite
// weights so that llama.cpp runs them. Tensor bytes are a pure function of (seed, tensor name,
// type, byte offset), so any expert's bytes can be recomputed to verify what a pack, a staging
// buffer or a slot holds.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace expertd {

struct SynthOptions {
  std::string preset;     // one of SynthPresetNames()
  std::string out_dir;    // created if missing; gets model.gguf or model-0000K-of-0000N.gguf
  uint64_t seed = 1;
  uint32_t split = 1;     // number of shards (1 = a single model.gguf)
  uint32_t scale = 1;     // multiplies each expert's feed-forward width (and so its bytes)
  // Called as bytes are written (done, total); may be empty.
  std::function<void(uint64_t done, uint64_t total)> progress;
};

struct SynthPresetInfo {
  std::string_view name;
  std::string_view description;
};

std::span<const SynthPresetInfo> SynthPresets();

// Writes the model; returns the paths written (shard order).
absl::StatusOr<std::vector<std::string>> SynthesizeModel(const SynthOptions& options);

// Fills `out` with the bytes at [offset, offset + out.size()) of tensor `tensor_name`'s data (of
// ggml type `type`) in a model synthesized with `seed`. Independent of preset, scale and split.
// The bytes are pseudo-random except where a type keeps its magnitudes: block scales and float
// elements hold finite values of a sensible size (docs/synth.md, "Values"), so llama.cpp runs
// the models with finite logits.
void SynthTensorBytes(uint64_t seed, std::string_view tensor_name, uint32_t type, uint64_t offset,
                      std::span<uint8_t> out);

}  // namespace expertd
