#include "format/gguf_model.h"

#include <charconv>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "util/status.h"

namespace expertd {
namespace {

constexpr std::string_view kSplitNo = "split.no";
constexpr std::string_view kSplitCount = "split.count";
constexpr std::string_view kSplitTensors = "split.tensors.count";

absl::Status SplitError(std::string_view message) {
  return InvalidError(ErrorKind::kSplit, message);
}

}  // namespace

std::string SplitShardPath(std::string_view prefix, uint32_t shard_index, uint32_t shard_count) {
  char suffix[64];
  std::snprintf(suffix, sizeof suffix, "-%05u-of-%05u.gguf", shard_index + 1, shard_count);
  return absl::StrCat(AV(prefix), suffix);
}

bool ParseSplitShardPath(std::string_view path, std::string* prefix, uint32_t* shard_index,
                         uint32_t* shard_count) {
  // "-NNNNN-of-NNNNN.gguf" is 20 characters.
  constexpr size_t kSuffix = 20;
  if (path.size() <= kSuffix) return false;
  const std::string_view s = path.substr(path.size() - kSuffix);
  if (s[0] != '-' || s.substr(6, 4) != "-of-" || s.substr(15) != ".gguf") return false;
  uint32_t k = 0, n = 0;
  const auto digits = [](std::string_view d, uint32_t* out) {
    for (char c : d) {
      if (c < '0' || c > '9') return false;
    }
    return std::from_chars(d.data(), d.data() + d.size(), *out).ec == std::errc();
  };
  if (!digits(s.substr(1, 5), &k) || !digits(s.substr(10, 5), &n)) return false;
  if (k == 0 || n == 0 || k > n) return false;
  *prefix = std::string(path.substr(0, path.size() - kSuffix));
  *shard_index = k - 1;
  *shard_count = n;
  return true;
}

absl::StatusOr<GgufModel> GgufModel::Open(const std::string& path) {
  ASSIGN_OR_RETURN(GgufFile first, GgufFile::Read(path));
  GgufModel model;
  std::string prefix;
  uint32_t index = 0, count = 0;
  const bool named_as_shard = ParseSplitShardPath(path, &prefix, &index, &count);
  const std::optional<uint64_t> kv_count = first.GetUint(kSplitCount);
  if (!named_as_shard) {
    if (kv_count.value_or(1) > 1) {
      return SplitError(absl::StrCat(path, ": split.count is ", *kv_count,
                                     " but the name is not NAME-0000K-of-0000N.gguf, so the "
                                     "other shards cannot be found"));
    }
    model.shards_.push_back(std::move(first));
  } else {
    model.shards_.resize(count);
    model.shards_[index] = std::move(first);
    for (uint32_t k = 0; k < count; ++k) {
      const std::string shard_path = SplitShardPath(prefix, k, count);
      if (k != index) {
        absl::StatusOr<GgufFile> read = GgufFile::Read(shard_path);
        if (!read.ok()) {
          if (read.status().code() == absl::StatusCode::kNotFound) {
            return MakeError(absl::StatusCode::kNotFound, ErrorKind::kSplit,
                             absl::StrCat("shard ", k + 1, " of ", count, " of ", path,
                                          " is missing: ", read.status().message()));
          }
          return read.status();
        }
        model.shards_[k] = *std::move(read);
      }
      const GgufFile& shard = model.shards_[k];
      const std::optional<uint64_t> no = shard.GetUint(kSplitNo);
      const std::optional<uint64_t> n = shard.GetUint(kSplitCount);
      if (count > 1 && (no != k || n != count)) {
        return SplitError(absl::StrCat(
            shard_path, ": split.no/split.count are ", no ? absl::StrCat(*no) : "absent", "/",
            n ? absl::StrCat(*n) : "absent", ", the name says ", k, "/", count));
      }
    }
  }
  for (uint32_t s = 0; s < model.shards_.size(); ++s) {
    for (const GgufTensorInfo& t : model.shards_[s].tensors()) {
      if (auto [it, inserted] = model.by_name_.emplace(t.name, model.tensors_.size()); !inserted) {
        return MakeError(absl::StatusCode::kInvalidArgument, ErrorKind::kDuplicate,
                         absl::StrCat(model.shards_[s].path(), ": byte ", t.info_offset,
                                      ": tensor '", t.name, "' is also in shard ",
                                      model.tensors_[it->second].shard + 1));
      }
      model.tensors_.push_back(ModelTensor{&t, s});
    }
  }
  if (const std::optional<uint64_t> total = model.metadata().GetUint(kSplitTensors);
      total && *total != model.tensors_.size()) {
    return SplitError(absl::StrCat(model.metadata().path(), ": split.tensors.count is ", *total,
                                   " but the shards hold ", model.tensors_.size(), " tensors"));
  }
  return model;
}

const ModelTensor* GgufModel::FindTensor(std::string_view name) const {
  const auto it = by_name_.find(AV(name));
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace expertd
