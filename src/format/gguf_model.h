// A GGUF model: one file, or the shards of a split model (NAME-0000K-of-0000N.gguf with
// split.no / split.count), seen as one set of tensors. Given any shard, the others are found
// next to it and checked for consistency.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "format/gguf.h"

namespace expertd {

// A tensor of the model and the shard holding it.
struct ModelTensor {
  const GgufTensorInfo* info;  // owned by the GgufModel's shard header
  uint32_t shard;              // position in GgufModel::shards()
};

class GgufModel {
 public:
  // Opens `path`; when it is a shard of a split model (by name or by its split.count KV), opens
  // every shard. Errors: a shard missing, or shards whose split.no / split.count disagree.
  static absl::StatusOr<GgufModel> Open(const std::string& path);

  GgufModel(GgufModel&&) = default;
  GgufModel& operator=(GgufModel&&) = default;

  // Shard headers in split.no order; a single-file model has one.
  const std::vector<GgufFile>& shards() const { return shards_; }
  // The header holding the model's metadata (shard 0).
  const GgufFile& metadata() const { return shards_.front(); }
  // Every tensor of every shard, in shard order then file order.
  const std::vector<ModelTensor>& tensors() const { return tensors_; }
  const ModelTensor* FindTensor(std::string_view name) const;

 private:
  GgufModel() = default;
  std::vector<GgufFile> shards_;
  std::vector<ModelTensor> tensors_;
  absl::flat_hash_map<std::string, size_t> by_name_;
};

// The shard naming of llama.cpp's split tool: "PREFIX-00002-of-00005.gguf" (1-based K).
std::string SplitShardPath(std::string_view prefix, uint32_t shard_index, uint32_t shard_count);

// Parses a shard path into (prefix, 0-based shard index, count); false when it is not one.
bool ParseSplitShardPath(std::string_view path, std::string* prefix, uint32_t* shard_index,
                         uint32_t* shard_count);

}  // namespace expertd
