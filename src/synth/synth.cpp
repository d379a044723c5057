#include "synth/synth.h"

#include <algorithm>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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

absl::Status AddMetadata(GgufWriter& writer, const synth::ModelSpec& spec,
                         const SynthOptions& options) {
  for (const auto& [key, value] : spec.kvs) RETURN_IF_ERROR(writer.AddKv(key, value));
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

void SynthTensorBytes(uint64_t seed, std::string_view tensor_name, uint64_t offset,
                      std::span<uint8_t> out) {
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
      SynthTensorBytes(options.seed, tensors[i].name, offset, out);
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
