#include "synth/synth.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <optional>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "format/ggml_types.h"
#include "format/gguf_writer.h"
#include "synth/presets.h"
#include "util/status.h"

namespace expertd {
namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ULL;

// splitmix64's output function (Steele, Lea, Flood 2014): a bijective 64-bit mixer.
uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// FNV-1a 64: trivially reimplemented by any tool that wants to check synthesized bytes.
uint64_t Fnv1a64(std::string_view s) {
  uint64_t h = 0xCBF29CE484222325ULL;
  for (const char c : s) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001B3ULL;
  }
  return h;
}

// Word i of a tensor's stream is splitmix64's i-th output from state `key`, so any word is
// computable on its own (counter-based).
inline uint64_t Word(uint64_t key, uint64_t index) { return Mix64(key + (index + 1) * kGolden); }

inline void StoreLe(uint8_t* p, uint64_t w, size_t n) {
  for (size_t b = 0; b < n; ++b) p[b] = static_cast<uint8_t>(w >> (8 * b));
}

// ---- Values a model runs with ---------------------------------------------------------------
// Random bytes are valid for the quantized values of every block, but not for its scales (a
// random fp16 is Inf or NaN one time in 32) nor for float tensors. So after the random stream,
// the fields that set magnitudes are overwritten with finite values of a sensible size, each a
// pure function of (key, position) so that any byte range still has one answer:
//   F32 / F16 element i: 1 + 0.1u for norm weights, 0.1u for the rest (u in [-0.5, 0.5));
//   the fp16 block scales (d, dmin) of Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q2_K..Q6_K: small positive
//   normal values (dequantized weights of a few hundredths, as in trained models);
//   MXFP4's E8M0 block exponent: 2^-9 .. 2^-7.

// IEEE binary16 bits of a finite float in the normal range (truncating the mantissa).
uint16_t HalfBits(float f) {
  uint32_t x = 0;
  std::memcpy(&x, &f, sizeof(x));
  const uint32_t sign = (x >> 16) & 0x8000u;
  const int32_t exp = static_cast<int32_t>((x >> 23) & 0xFFu) - 127 + 15;
  const uint32_t mant = (x >> 13) & 0x3FFu;
  if (exp <= 0) return static_cast<uint16_t>(sign);           // below the normal range: 0
  if (exp >= 31) return static_cast<uint16_t>(sign | 0x7BFFu);  // above: the largest finite
  return static_cast<uint16_t>(sign | (static_cast<uint32_t>(exp) << 10) | mant);
}

// u in [-0.5, 0.5) from a word.
float Unit(uint64_t w) { return static_cast<float>(w >> 40) / static_cast<float>(1u << 24) - 0.5F; }

struct ScaleField {
  uint32_t offset;  // in the block
  bool e8m0;        // else fp16
  float value;      // fp16: the base value; E8M0: unused
};

struct BlockLayout {
  uint32_t bytes = 0;
  std::vector<ScaleField> fields;
};

// ggml's block structs (ggml-common.h): where each type keeps its scales.
std::optional<BlockLayout> LayoutOf(uint32_t type) {
  switch (type) {
    case ggml::kQ4_0: return BlockLayout{18, {{0, false, 2e-3F}}};
    case ggml::kQ4_1: return BlockLayout{20, {{0, false, 2e-3F}, {2, false, 1e-2F}}};
    case ggml::kQ5_0: return BlockLayout{22, {{0, false, 1e-3F}}};
    case ggml::kQ5_1: return BlockLayout{24, {{0, false, 1e-3F}, {2, false, 1e-2F}}};
    case ggml::kQ8_0: return BlockLayout{34, {{0, false, 2.5e-4F}}};
    case ggml::kQ2_K: return BlockLayout{84, {{80, false, 2e-3F}, {82, false, 2e-3F}}};
    case ggml::kQ3_K: return BlockLayout{110, {{108, false, 1e-3F}}};
    case ggml::kQ4_K: return BlockLayout{144, {{0, false, 1e-4F}, {2, false, 1e-4F}}};
    case ggml::kQ5_K: return BlockLayout{176, {{0, false, 7e-5F}, {2, false, 1e-4F}}};
    case ggml::kQ6_K: return BlockLayout{210, {{208, false, 6.5e-5F}}};
    case ggml::kMXFP4: return BlockLayout{17, {{0, true, 0}}};
    default: return std::nullopt;
  }
}

// Writes the bytes of `field` (a value of `width` bytes at absolute tensor position `at`) that
// fall inside out = [offset, offset + out.size()).
void Overlay(uint64_t at, const uint8_t* field, size_t width, uint64_t offset,
             std::span<uint8_t> out) {
  for (size_t b = 0; b < width; ++b) {
    if (at + b >= offset && at + b < offset + out.size()) out[at + b - offset] = field[b];
  }
}

void OverwriteValueFields(uint64_t key, std::string_view name, uint32_t type, uint64_t offset,
                          std::span<uint8_t> out) {
  if (out.empty()) return;
  const uint64_t value_key = Mix64(key ^ 0x5CA1E5ULL);
  const bool norm = name.find("norm") != std::string_view::npos;
  if (type == ggml::kF32 || type == ggml::kF16) {
    const uint64_t width = type == ggml::kF32 ? 4 : 2;
    for (uint64_t i = offset / width; i * width < offset + out.size(); ++i) {
      const float v = (norm ? 1.0F : 0.0F) + 0.1F * Unit(Word(value_key, i));
      uint8_t bytes[4];
      if (type == ggml::kF32) {
        std::memcpy(bytes, &v, 4);
      } else {
        const uint16_t h = HalfBits(v);
        std::memcpy(bytes, &h, 2);
      }
      Overlay(i * width, bytes, width, offset, out);
    }
    return;
  }
  const std::optional<BlockLayout> layout = LayoutOf(type);
  if (!layout.has_value()) return;
  for (uint64_t block = offset / layout->bytes; block * layout->bytes < offset + out.size();
       ++block) {
    const uint64_t w = Word(value_key, block);
    for (size_t f = 0; f < layout->fields.size(); ++f) {
      const ScaleField& field = layout->fields[f];
      const uint64_t at = block * layout->bytes + field.offset;
      if (field.e8m0) {
        const uint8_t e = static_cast<uint8_t>(127 - 9 + ((w >> (8 * f)) % 3));
        Overlay(at, &e, 1, offset, out);
      } else {
        // The base value times 1 .. 2, by block.
        const float scale = 1.0F + static_cast<float>((w >> (16 * f)) & 0xFFFFu) / 65536.0F;
        const uint16_t h = HalfBits(field.value * scale);
        uint8_t bytes[2];
        std::memcpy(bytes, &h, 2);
        Overlay(at, bytes, 2, offset, out);
      }
    }
  }
}

// The writer's plan for one file: which tensors, under which name.
struct Shard {
  std::string path;
  GgufWriter writer;
};

std::string ShardName(uint32_t k, uint32_t n) {
  return n == 1 ? std::string("model.gguf") : absl::StrFormat("model-%05u-of-%05u.gguf", k + 1, n);
}

// Splits tensors [0, count) into `n` consecutive non-empty ranges of roughly equal bytes: shard k
// ends at the first tensor boundary where the running total reaches (k+1)/n of all bytes, but
// early enough to leave one tensor for each later shard. Returns the end index of each shard.
std::vector<size_t> ShardEnds(const std::vector<GgufWriterTensor>& tensors, uint64_t alignment,
                              uint32_t n) {
  std::vector<uint64_t> prefix(tensors.size() + 1, 0);
  for (size_t i = 0; i < tensors.size(); ++i) {
    prefix[i + 1] = prefix[i] + ((tensors[i].nbytes + alignment - 1) & ~(alignment - 1));
  }
  const uint64_t total = prefix.back();
  std::vector<size_t> ends;
  size_t start = 0;
  for (uint32_t k = 0; k + 1 < n; ++k) {
    // target = total * (k+1) / n without overflowing on multi-TiB totals.
    const uint64_t target = total / n * (k + 1) + total % n * (k + 1) / n;
    const size_t last_end = tensors.size() - (n - k - 1);
    size_t end = start + 1;
    while (end < last_end && prefix[end] < target) ++end;
    ends.push_back(end);
    start = end;
  }
  ends.push_back(tensors.size());
  return ends;
}

absl::Status AddTensors(GgufWriter& writer, const std::vector<synth::TensorSpec>& tensors,
                        size_t begin, size_t end) {
  for (size_t i = begin; i < end; ++i) {
    RETURN_IF_ERROR(writer.AddTensor(tensors[i].name, tensors[i].type, tensors[i].ne));
  }
  return absl::OkStatus();
}

// A SentencePiece-style vocabulary of `size` (>= 512) tokens, as llama.cpp's "llama" tokenizer
// reads it: <unk>, <s>, </s>, the 256 byte tokens <0x00>..<0xFF> (so any text can be encoded),
// then "▁" + letters, digits and punctuation, single characters, and two-letter pieces.
struct Vocab {
  std::vector<std::string> tokens;
  std::vector<GgufScalar> scores;
  std::vector<GgufScalar> types;  // 1 normal, 2 unknown, 3 control, 6 byte
};

Vocab SynthVocab(size_t size) {
  Vocab v;
  auto add = [&](std::string token, int32_t type) {
    if (v.tokens.size() >= size) return;
    v.scores.emplace_back(-static_cast<float>(v.tokens.size()));
    v.types.emplace_back(type);
    v.tokens.push_back(std::move(token));
  };
  add("<unk>", 2);
  add("<s>", 3);
  add("</s>", 3);
  for (int b = 0; b < 256; ++b) add(absl::StrFormat("<0x%02X>", b), 6);
  const std::string space = "\xE2\x96\x81";  // U+2581, SentencePiece's word boundary
  const std::string chars =
      "etaoinshrdlucmfwypvbgkjqxzETAOINSHRDLUCMFWYPVBGKJQXZ0123456789.,;:!?'\"-()";
  add(space, 1);
  for (char c : chars) add(space + c, 1);
  for (char c : chars) add(std::string(1, c), 1);
  for (char a : chars) {
    for (char b : chars) add(std::string(1, a) + b, 1);
  }
  return v;
}

absl::Status AddTokenizer(GgufWriter& writer) {
  const Vocab v = SynthVocab(synth::kSynthVocab);
  RETURN_IF_ERROR(writer.AddKv("tokenizer.ggml.model", GgufScalar(std::string("llama"))));
  RETURN_IF_ERROR(writer.AddStringArray("tokenizer.ggml.tokens", v.tokens));
  RETURN_IF_ERROR(writer.AddArray("tokenizer.ggml.scores", GgufType::kF32, v.scores));
  RETURN_IF_ERROR(writer.AddArray("tokenizer.ggml.token_type", GgufType::kI32, v.types));
  RETURN_IF_ERROR(writer.AddKv("tokenizer.ggml.unknown_token_id", GgufScalar(uint32_t{0})));
  RETURN_IF_ERROR(writer.AddKv("tokenizer.ggml.bos_token_id", GgufScalar(uint32_t{1})));
  RETURN_IF_ERROR(writer.AddKv("tokenizer.ggml.eos_token_id", GgufScalar(uint32_t{2})));
  return writer.AddKv("tokenizer.ggml.add_bos_token", GgufScalar(true));
}

absl::Status AddMetadata(GgufWriter& writer, const synth::ModelSpec& spec,
                         const SynthOptions& options) {
  for (const auto& [key, value] : spec.kvs) RETURN_IF_ERROR(writer.AddKv(key, value));
  RETURN_IF_ERROR(AddTokenizer(writer));
  // Lets a tool that finds the file recompute any tensor's bytes (SynthTensorBytes).
  RETURN_IF_ERROR(writer.AddKv("expertd.synth.preset", GgufScalar(options.preset)));
  RETURN_IF_ERROR(writer.AddKv("expertd.synth.seed", GgufScalar(options.seed)));
  return writer.AddKv("expertd.synth.scale", GgufScalar(options.scale));
}

// Plans every file: metadata in shard 0, llama.cpp's split KVs in every shard of a split model.
absl::StatusOr<std::vector<Shard>> PlanShards(const synth::ModelSpec& spec,
                                              const SynthOptions& options) {
  const uint32_t n = options.split;
  Shard whole{(std::filesystem::path(options.out_dir) / ShardName(0, 1)).string(), {}};
  RETURN_IF_ERROR(AddMetadata(whole.writer, spec, options));
  RETURN_IF_ERROR(AddTensors(whole.writer, spec.tensors, 0, spec.tensors.size()));
  std::vector<Shard> shards;
  if (n == 1) {
    shards.push_back(std::move(whole));
    return shards;
  }
  const std::vector<size_t> ends = ShardEnds(whole.writer.tensors(), whole.writer.alignment(), n);
  size_t begin = 0;
  for (uint32_t k = 0; k < n; ++k) {
    Shard shard{(std::filesystem::path(options.out_dir) / ShardName(k, n)).string(), {}};
    if (k == 0) RETURN_IF_ERROR(AddMetadata(shard.writer, spec, options));
    RETURN_IF_ERROR(shard.writer.AddKv("split.no", GgufScalar(static_cast<uint16_t>(k))));
    RETURN_IF_ERROR(shard.writer.AddKv("split.count", GgufScalar(static_cast<uint16_t>(n))));
    RETURN_IF_ERROR(shard.writer.AddKv("split.tensors.count",
                                       GgufScalar(static_cast<int32_t>(spec.tensors.size()))));
    RETURN_IF_ERROR(AddTensors(shard.writer, spec.tensors, begin, ends[k]));
    begin = ends[k];
    shards.push_back(std::move(shard));
  }
  return shards;
}

void RemoveAll(const std::vector<std::string>& paths) {
  for (const std::string& p : paths) {
    std::error_code ignored;  // cleanup after an error that is reported instead
    std::filesystem::remove(p, ignored);
  }
}

}  // namespace

void SynthTensorBytes(uint64_t seed, std::string_view tensor_name, uint32_t type,
                      uint64_t offset, std::span<uint8_t> out) {
  const uint64_t key = Mix64(Fnv1a64(tensor_name) ^ Mix64(seed + kGolden));
  uint8_t* p = out.data();
  size_t n = out.size();
  uint64_t index = offset / 8;
  if (const size_t lane = offset % 8; lane != 0 && n > 0) {
    const size_t take = std::min(n, 8 - lane);
    StoreLe(p, Word(key, index) >> (8 * lane), take);
    p += take;
    n -= take;
    ++index;
  }
  for (; n >= 8; p += 8, n -= 8) StoreLe(p, Word(key, index++), 8);
  if (n > 0) StoreLe(p, Word(key, index), n);
  OverwriteValueFields(key, tensor_name, type, offset, out);
}

absl::StatusOr<std::vector<std::string>> SynthesizeModel(const SynthOptions& options) {
  if (options.out_dir.empty()) {
    return InvalidError(ErrorKind::kBadValue, "synth: no output directory");
  }
  if (options.split == 0) {
    return InvalidError(ErrorKind::kBadValue, "synth: split must be at least 1");
  }
  ASSIGN_OR_RETURN(const synth::ModelSpec spec, synth::BuildPreset(options.preset, options.scale));
  if (options.split > spec.tensors.size()) {
    return InvalidError(ErrorKind::kBadValue,
                        absl::StrCat("synth: split ", options.split, " exceeds the ",
                                     spec.tensors.size(), " tensors of preset '", options.preset,
                                     "' (every shard holds at least one tensor)"));
  }
  ASSIGN_OR_RETURN(std::vector<Shard> shards, PlanShards(spec, options));
  uint64_t total = 0;
  for (const Shard& s : shards) total += s.writer.file_size();

  std::error_code ec;
  std::filesystem::create_directories(options.out_dir, ec);
  if (ec) {
    return ErrnoError(ErrorKind::kIo, absl::StrCat("synth: cannot create ", options.out_dir),
                      ec.value());
  }
  // Checked up front so that a large --scale fails at once rather than after filling the disk.
  if (const std::filesystem::space_info space = std::filesystem::space(options.out_dir, ec);
      !ec && space.available < total) {
    return MakeError(absl::StatusCode::kResourceExhausted, ErrorKind::kIo,
                     absl::StrCat("synth: ", options.out_dir, " has ", space.available,
                                  " bytes free; the model needs ", total));
  }

  // Shards are written under temporary names and renamed only when all succeeded, so an error
  // leaves no half-written model behind.
  std::vector<std::string> partial;
  uint64_t done_before = 0;
  for (const Shard& shard : shards) {
    const std::string tmp = shard.path + ".partial";
    const std::vector<GgufWriterTensor>& tensors = shard.writer.tensors();
    const auto fill = [&](size_t i, uint64_t offset, std::span<uint8_t> out) {
      SynthTensorBytes(options.seed, tensors[i].name, tensors[i].type.id, offset, out);
      return absl::OkStatus();
    };
    const auto progress = [&](uint64_t written) {
      if (options.progress) options.progress(done_before + written, total);
    };
    if (absl::Status st = shard.writer.Write(tmp, fill, progress); !st.ok()) {
      RemoveAll(partial);
      return st;
    }
    partial.push_back(tmp);
    done_before += shard.writer.file_size();
  }
  std::vector<std::string> paths;
  for (size_t i = 0; i < shards.size(); ++i) {
    std::filesystem::rename(partial[i], shards[i].path, ec);
    if (ec) {
      RemoveAll(partial);
      RemoveAll(paths);
      return ErrnoError(ErrorKind::kIo, absl::StrCat("synth: cannot rename ", partial[i]),
                        ec.value());
    }
    paths.push_back(shards[i].path);
  }
  return paths;
}

}  // namespace expertd
