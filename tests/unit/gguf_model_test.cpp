// Split models: shard naming, finding every shard from any one, and consistency checks.
#include "format/gguf_model.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "format/gguf_writer.h"
#include "support/test_support.h"

namespace expertd {
namespace {

using ::expertd::testing::IsError;
using ::expertd::testing::TempDir;

TEST(SplitPath, NamesLikeLlamaCppSplitTool) {
  EXPECT_EQ(SplitShardPath("/m/model", 0, 3), "/m/model-00001-of-00003.gguf");
  EXPECT_EQ(SplitShardPath("x", 11, 12), "x-00012-of-00012.gguf");
  std::string prefix;
  uint32_t k = 0, n = 0;
  ASSERT_TRUE(ParseSplitShardPath("/m/DeepSeek-V3-Q4_K-00002-of-00009.gguf", &prefix, &k, &n));
  EXPECT_EQ(prefix, "/m/DeepSeek-V3-Q4_K");
  EXPECT_EQ(k, 1u);
  EXPECT_EQ(n, 9u);
  for (const char* bad : {"model.gguf", "m-00000-of-00003.gguf", "m-00004-of-00003.gguf",
                          "m-0001-of-00003.gguf", "m-00001-of-00003.bin", "m-0000a-of-00003.gguf",
                          "-00001-of-00003.gguf"}) {
    EXPECT_FALSE(ParseSplitShardPath(bad, &prefix, &k, &n)) << bad;
  }
}

absl::Status Zeros(size_t, uint64_t, std::span<uint8_t> out) {
  std::fill(out.begin(), out.end(), uint8_t{0});
  return absl::OkStatus();
}

// Writes shard k of n holding tensor "t<k>"; split KVs as given (no, count) unless absent (-1).
void WriteShard(const std::string& path, int no, int count, int total_tensors, bool with_tensor,
                int k) {
  GgufWriter w;
  if (no >= 0) {
    ASSERT_TRUE(w.AddKv("split.no", uint16_t(no)).ok());
  }
  if (count >= 0) {
    ASSERT_TRUE(w.AddKv("split.count", uint16_t(count)).ok());
  }
  if (total_tensors >= 0) {
    ASSERT_TRUE(w.AddKv("split.tensors.count", int32_t(total_tensors)).ok());
  }
  if (with_tensor) {
    ASSERT_TRUE(w.AddTensor("t" + std::to_string(k), ggml::kF32, {8}).ok());
  }
  ASSERT_TRUE(w.Write(path, Zeros).ok());
}

TEST(GgufModel, OpensEveryShardFromAnyShard) {
  TempDir dir;
  const std::string prefix = dir.File("m");
  for (int k = 0; k < 3; ++k) WriteShard(SplitShardPath(prefix, k, 3), k, 3, 3, true, k);
  for (int k = 0; k < 3; ++k) {
    const auto model = GgufModel::Open(SplitShardPath(prefix, k, 3));
    ASSERT_TRUE(model.ok()) << model.status();
    ASSERT_EQ(model->shards().size(), 3u);
    EXPECT_EQ(model->metadata().path(), SplitShardPath(prefix, 0, 3));
    ASSERT_EQ(model->tensors().size(), 3u);
    const ModelTensor* t2 = model->FindTensor("t2");
    ASSERT_NE(t2, nullptr);
    EXPECT_EQ(t2->shard, 2u);
    EXPECT_EQ(model->FindTensor("t9"), nullptr);
  }
}

TEST(GgufModel, MissingShard) {
  TempDir dir;
  const std::string prefix = dir.File("m");
  WriteShard(SplitShardPath(prefix, 0, 3), 0, 3, 3, true, 0);
  WriteShard(SplitShardPath(prefix, 2, 3), 2, 3, 3, true, 2);
  EXPECT_TRUE(IsError(GgufModel::Open(SplitShardPath(prefix, 0, 3)).status(),
                      absl::StatusCode::kNotFound, ErrorKind::kSplit,
                      {"shard 2 of 3", "m-00002-of-00003.gguf"}));
}

TEST(GgufModel, ShardsThatDisagree) {
  TempDir dir;
  const std::string prefix = dir.File("m");
  WriteShard(SplitShardPath(prefix, 0, 2), 0, 2, 2, true, 0);
  WriteShard(SplitShardPath(prefix, 1, 2), 0, 2, 2, true, 1);  // claims to be shard 0
  EXPECT_TRUE(IsError(GgufModel::Open(SplitShardPath(prefix, 0, 2)).status(),
                      absl::StatusCode::kInvalidArgument, ErrorKind::kSplit,
                      {"m-00002-of-00002.gguf", "split.no"}));
}

TEST(GgufModel, TensorCountDisagreesWithSplitKv) {
  TempDir dir;
  const std::string prefix = dir.File("m");
  WriteShard(SplitShardPath(prefix, 0, 2), 0, 2, 5, true, 0);
  WriteShard(SplitShardPath(prefix, 1, 2), 1, 2, -1, true, 1);
  EXPECT_TRUE(IsError(GgufModel::Open(SplitShardPath(prefix, 1, 2)).status(),
                      absl::StatusCode::kInvalidArgument, ErrorKind::kSplit,
                      {"split.tensors.count is 5", "hold 2"}));
}

TEST(GgufModel, SplitCountWithoutShardName) {
  TempDir dir;
  WriteShard(dir.File("renamed.gguf"), 0, 2, 2, true, 0);
  EXPECT_TRUE(IsError(GgufModel::Open(dir.File("renamed.gguf")).status(),
                      absl::StatusCode::kInvalidArgument, ErrorKind::kSplit,
                      {"renamed.gguf", "split.count is 2"}));
}

TEST(GgufModel, DuplicateTensorAcrossShards) {
  TempDir dir;
  const std::string prefix = dir.File("m");
  WriteShard(SplitShardPath(prefix, 0, 2), 0, 2, -1, true, 0);
  WriteShard(SplitShardPath(prefix, 1, 2), 1, 2, -1, true, 0);  // "t0" again
  EXPECT_TRUE(IsError(GgufModel::Open(SplitShardPath(prefix, 0, 2)).status(),
                      absl::StatusCode::kInvalidArgument, ErrorKind::kDuplicate,
                      {"'t0'", "shard 1"}));
}

TEST(GgufModel, SingleFile) {
  TempDir dir;
  WriteShard(dir.File("one.gguf"), -1, -1, -1, true, 0);
  const auto model = GgufModel::Open(dir.File("one.gguf"));
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->shards().size(), 1u);
  EXPECT_EQ(model->tensors().size(), 1u);
}

}  // namespace
}  // namespace expertd
