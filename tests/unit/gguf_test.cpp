// GGUF reader: the real files in tests/data/gguf (values checked by hand with a hex dump against
// gguf.md and the files' PROVENANCE.txt) and one test per malformed-input class, built byte by
// byte here so the tests do not depend on the project's own writer.
#include "format/gguf.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "support/test_support.h"

namespace expertd {
namespace {

using ::expertd::testing::IsError;
using ::expertd::testing::SharedDataDir;

std::string RealFile(const std::string& name) { return SharedDataDir() + "/gguf/" + name; }

TEST(GgufReal, TinyRandomLlama) {
  const auto f = GgufFile::Read(RealFile("ollama__llama-2-tiny-random.gguf"));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->kvs().size(), 18u);
  EXPECT_EQ(f->tensors().size(), 12u);
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->data_offset(), 724416u);  // PROVENANCE.txt; tensor infos end at 724398
  EXPECT_EQ(f->file_size(), 1750560u);
  EXPECT_EQ(f->GetString("general.architecture"), "llama");
  const GgufTensorInfo& first = f->tensors().front();
  EXPECT_EQ(first.name, "token_embd.weight");
  EXPECT_EQ(first.type.name, "f16");
  EXPECT_EQ(first.n_dims, 2u);
  EXPECT_EQ(first.ne[0], 8u);
  EXPECT_EQ(first.ne[1], 32000u);
  EXPECT_EQ(first.offset, 0u);
  EXPECT_EQ(first.file_offset, 724416u);
  EXPECT_EQ(first.nbytes, 8u * 32000u * 2u);
  EXPECT_EQ(first.nb(1), 16u);
  const GgufTensorInfo& second = f->tensors()[1];
  EXPECT_EQ(second.name, "blk.0.attn_q.weight");
  EXPECT_EQ(second.offset, 512000u);
  const GgufTensorInfo& last = f->tensors().back();
  EXPECT_EQ(last.name, "output.weight");
  EXPECT_EQ(last.offset, 514144u);
  EXPECT_EQ(last.file_offset + last.nbytes, f->file_size());  // the data ends the file
  const GgufKv* tokens = f->FindKv("tokenizer.ggml.tokens");
  ASSERT_NE(tokens, nullptr);
  EXPECT_EQ(tokens->type, GgufType::kArray);
  EXPECT_EQ(tokens->array.element_type, GgufType::kString);
  EXPECT_EQ(tokens->array.count, 32000u);
  ASSERT_FALSE(tokens->array.elements.empty());
  EXPECT_EQ(std::get<std::string>(tokens->array.elements[0]), "<unk>");
  EXPECT_FALSE(tokens->array.complete());  // long arrays keep only their head
}

struct VocabCase {
  const char* file;
  const char* arch;
  uint64_t kv_count;
  uint64_t tokens;
  const char* first_token;
};

class GgufVocab : public ::testing::TestWithParam<VocabCase> {};

TEST_P(GgufVocab, ParsesVocabOnlyFile) {
  const VocabCase& c = GetParam();
  const auto f = GgufFile::Read(RealFile(c.file));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->kvs().size(), c.kv_count);
  EXPECT_TRUE(f->tensors().empty());
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->GetString("general.architecture"), c.arch);
  const GgufKv* tokens = f->FindKv("tokenizer.ggml.tokens");
  ASSERT_NE(tokens, nullptr);
  EXPECT_EQ(tokens->array.count, c.tokens);
  EXPECT_EQ(std::get<std::string>(tokens->array.elements[0]), c.first_token);
}

INSTANTIATE_TEST_SUITE_P(
    Real, GgufVocab,
    ::testing::Values(VocabCase{"llamacpp__ggml-vocab-bert-bge.gguf", "bert", 20, 30522, "[PAD]"},
                      VocabCase{"llamacpp__ggml-vocab-gpt-2.gguf", "gpt2", 16, 50257, "!"},
                      VocabCase{"llamacpp__ggml-vocab-llama-spm.gguf", "llama", 22, 32000,
                                "<unk>"}));

// Builds GGUF images by hand.
class Image {
 public:
  Image& Raw(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    bytes_.insert(bytes_.end(), b, b + n);
    return *this;
  }
  Image& U32(uint32_t v) { return Raw(&v, 4); }
  Image& U64(uint64_t v) { return Raw(&v, 8); }
  Image& I64(int64_t v) { return Raw(&v, 8); }
  Image& Str(const std::string& s) { return U64(s.size()).Raw(s.data(), s.size()); }
  Image& Header(uint64_t tensors, uint64_t kvs, uint32_t version = 3) {
    return Raw("GGUF", 4).U32(version).U64(tensors).U64(kvs);
  }
  Image& KvU32(const std::string& key, uint32_t v) { return Str(key).U32(4).U32(v); }
  Image& KvStr(const std::string& key, const std::string& v) { return Str(key).U32(8).Str(v); }
  Image& Tensor(const std::string& name, std::vector<int64_t> ne, uint32_t type, uint64_t offset) {
    Str(name).U32(static_cast<uint32_t>(ne.size()));
    for (int64_t n : ne) I64(n);
    return U32(type).U64(offset);
  }
  Image& PadTo(uint64_t alignment) {
    while (bytes_.size() % alignment != 0) bytes_.push_back(0);
    return *this;
  }
  Image& Zeros(size_t n) {
    bytes_.insert(bytes_.end(), n, 0);
    return *this;
  }
  size_t size() const { return bytes_.size(); }
  absl::StatusOr<GgufFile> Parse() const { return GgufFile::ParseBytes(bytes_, "t.gguf"); }
  std::vector<uint8_t>& bytes() { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;

TEST(GgufParse, MinimalValidFileWithTwoTensors) {
  Image img;
  // f32 [8] = 32 bytes (padded to 32); q8_0 [64, 2] = 2 blocks * 34 * 2 rows = 136 bytes.
  img.Header(2, 1).KvStr("general.architecture", "x");
  img.Tensor("a", {8}, 0, 0).Tensor("b", {64, 2}, 8, 32).PadTo(32).Zeros(32 + 136);
  const auto f = img.Parse();
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->tensors()[1].nbytes, 136u);
  EXPECT_EQ(f->tensors()[1].nb(1), 68u);
  EXPECT_EQ(f->tensors()[1].file_offset, f->data_offset() + 32);
  EXPECT_EQ(f->data_offset() % 32, 0u);
}

TEST(GgufParse, AcceptsVersion2) {
  Image img;
  img.Header(0, 1, 2).KvU32("a", 1);
  const auto f = img.Parse();
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->version(), 2u);
}

TEST(GgufParse, CustomAlignment) {
  Image img;
  img.Header(2, 1).KvU32("general.alignment", 64);
  img.Tensor("a", {8}, 0, 0).Tensor("b", {8}, 0, 64).PadTo(64).Zeros(64 + 32);
  const auto f = img.Parse();
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->alignment(), 64u);
  EXPECT_EQ(f->data_offset() % 64, 0u);
}

TEST(GgufErrors, TruncatedHeader) {
  Image img;
  img.Raw("GGUF", 4).U32(3).U32(0);  // tensor count cut in half
  EXPECT_TRUE(IsError(img.Parse().status(), absl::StatusCode::kDataLoss, ErrorKind::kTruncated,
                      {"t.gguf", "byte 8", "tensor count"}));
}

TEST(GgufErrors, TruncatedTensorInfo) {
  Image img;
  img.Header(1, 0).Str("a").U32(4).I64(1).I64(1);  // file ends inside the shape
  EXPECT_TRUE(IsError(img.Parse().status(), absl::StatusCode::kDataLoss, ErrorKind::kTruncated,
                      {"t.gguf", "byte 53", "tensor shape"}));
}

TEST(GgufErrors, BadMagic) {
  Image img;
  img.Raw("GGML", 4).U32(3).U64(0).U64(0);
  EXPECT_TRUE(IsError(img.Parse().status(), kInvalid, ErrorKind::kBadMagic, {"t.gguf", "byte 0"}));
}

TEST(GgufErrors, UnsupportedVersions) {
  for (uint32_t v : {1u, 4u, 0x03000000u}) {
    Image img;
    img.Header(0, 0, v);
    EXPECT_TRUE(IsError(img.Parse().status(), kInvalid, ErrorKind::kBadVersion, {"byte 4"}))
        << v;
  }
}

TEST(GgufErrors, AbsurdCounts) {
  Image a;
  a.Header(0, uint64_t{1} << 60);
  EXPECT_TRUE(IsError(a.Parse().status(), kInvalid, ErrorKind::kAbsurdCount, {"byte 16"}));
  Image b;
  b.Header(uint64_t{1} << 40, 0);
  EXPECT_TRUE(IsError(b.Parse().status(), kInvalid, ErrorKind::kAbsurdCount, {"byte 8"}));
  Image c;  // an array claiming more elements than the file holds
  c.Header(0, 1).Str("arr").U32(9).U32(4).U64(uint64_t{1} << 61);
  EXPECT_TRUE(IsError(c.Parse().status(), kInvalid, ErrorKind::kAbsurdCount, {"arr", "byte 43"}));
  Image d;  // a string longer than the file
  d.Header(0, 1).Str("s").U32(8).U64(uint64_t{1} << 62);
  EXPECT_TRUE(IsError(d.Parse().status(), absl::StatusCode::kDataLoss, ErrorKind::kTruncated,
                      {"byte 37"}));
}

TEST(GgufErrors, UnknownValueTypes) {
  Image a;
  a.Header(0, 1).Str("k").U32(13).U32(0);
  EXPECT_TRUE(IsError(a.Parse().status(), kInvalid, ErrorKind::kUnknownType, {"'k'", "byte 33"}));
  Image b;  // nested array
  b.Header(0, 1).Str("k").U32(9).U32(9).U64(0);
  EXPECT_TRUE(IsError(b.Parse().status(), kInvalid, ErrorKind::kUnknownType, {"nests"}));
}

TEST(GgufErrors, UnknownTensorType) {
  for (uint32_t type : {4u, 31u, 41u, 1000u}) {
    Image img;
    img.Header(1, 0).Tensor("w", {32}, type, 0).PadTo(32).Zeros(128);
    EXPECT_TRUE(IsError(img.Parse().status(), kInvalid, ErrorKind::kUnknownType,
                        {"'w'", "byte 45"}))
        << type;
  }
}

TEST(GgufErrors, DuplicateKeyAndTensor) {
  Image a;
  a.Header(0, 2).KvU32("k", 1).KvU32("k", 2);
  EXPECT_TRUE(IsError(a.Parse().status(), kInvalid, ErrorKind::kDuplicate,
                      {"'k'", "byte 41", "first at byte 24"}));
  Image b;
  b.Header(2, 0).Tensor("w", {8}, 0, 0).Tensor("w", {8}, 0, 32).PadTo(32).Zeros(64);
  EXPECT_TRUE(IsError(b.Parse().status(), kInvalid, ErrorKind::kDuplicate, {"'w'", "byte 57"}));
}

TEST(GgufErrors, BadTensorShapes) {
  Image dims;
  dims.Header(1, 0).Tensor("w", {1, 1, 1, 1, 1}, 0, 0);
  EXPECT_TRUE(IsError(dims.Parse().status(), kInvalid, ErrorKind::kBadValue,
                      {"5 dimensions", "byte 33"}));
  Image negative;
  negative.Header(1, 0).Tensor("w", {8, -1}, 0, 0);
  EXPECT_TRUE(IsError(negative.Parse().status(), kInvalid, ErrorKind::kBadValue, {"negative"}));
  Image block;  // q4_K needs ne[0] % 256 == 0
  block.Header(1, 0).Tensor("w", {128, 2}, 12, 0);
  EXPECT_TRUE(IsError(block.Parse().status(), kInvalid, ErrorKind::kBadValue,
                      {"block size 256"}));
  Image name;
  name.Header(1, 0).Tensor(std::string(64, 'n'), {8}, 0, 0);
  EXPECT_TRUE(IsError(name.Parse().status(), kInvalid, ErrorKind::kBadValue, {"byte 24", "64"}));
}

TEST(GgufErrors, OverflowingShapeAndOffset) {
  Image shape;
  shape.Header(1, 0).Tensor("w", {int64_t{1} << 40, int64_t{1} << 40}, 0, 0);
  EXPECT_TRUE(IsError(shape.Parse().status(), kInvalid, ErrorKind::kOverflow, {"'w'"}));
  Image offset;  // an offset near 2^64 must not wrap around into the file
  offset.Header(1, 0).Tensor("w", {8}, 0, ~uint64_t{31}).PadTo(32).Zeros(32);
  const absl::Status st = offset.Parse().status();
  EXPECT_FALSE(st.ok());
  EXPECT_NE(std::string(st.message()).find("'w'"), std::string::npos) << st;
}

TEST(GgufErrors, MisalignedAndUnpackedOffsets) {
  Image misaligned;
  misaligned.Header(1, 0).Tensor("w", {8}, 0, 16).PadTo(32).Zeros(64);
  EXPECT_TRUE(IsError(misaligned.Parse().status(), kInvalid, ErrorKind::kMisaligned,
                      {"'w'", "byte 24", "multiple of the alignment 32"}));
  Image gap;  // aligned, but leaves a hole: ggml requires packed data
  gap.Header(2, 0).Tensor("a", {8}, 0, 0).Tensor("b", {8}, 0, 64).PadTo(32).Zeros(96);
  EXPECT_TRUE(IsError(gap.Parse().status(), kInvalid, ErrorKind::kMisaligned,
                      {"'b'", "expected 32"}));
}

TEST(GgufErrors, BadAlignmentKey) {
  Image zero;
  zero.Header(0, 1).KvU32("general.alignment", 0);
  EXPECT_TRUE(IsError(zero.Parse().status(), kInvalid, ErrorKind::kBadValue,
                      {"power of two", "byte 24"}));
  Image odd;
  odd.Header(0, 1).KvU32("general.alignment", 48);
  EXPECT_TRUE(IsError(odd.Parse().status(), kInvalid, ErrorKind::kBadValue, {"48"}));
  Image wrong_type;
  wrong_type.Header(0, 1).Str("general.alignment").U32(10).U64(32);
  EXPECT_TRUE(IsError(wrong_type.Parse().status(), kInvalid, ErrorKind::kBadValue, {"u32"}));
}

TEST(GgufErrors, TensorOutsideFile) {
  Image img;
  img.Header(1, 0).Tensor("w", {64}, 0, 0).PadTo(32).Zeros(100);  // needs 256 bytes
  EXPECT_TRUE(IsError(img.Parse().status(), absl::StatusCode::kOutOfRange,
                      ErrorKind::kOutOfBounds, {"'w'", "outside the file"}));
}

TEST(GgufErrors, MissingFileNamesPath) {
  const absl::Status st = GgufFile::Read("/nonexistent/dir/model.gguf").status();
  EXPECT_TRUE(IsError(st, absl::StatusCode::kNotFound, ErrorKind::kMissingFile,
                      {"/nonexistent/dir/model.gguf"}));
}

// Every strict prefix of a valid image is rejected — kTruncated, kAbsurdCount (a count that no
// longer fits) or kOutOfBounds (a cut data section) — never accepted and never crashing.
TEST(GgufErrors, EveryPrefixOfAValidFileFails) {
  Image img;
  img.Header(1, 2).KvStr("general.architecture", "x").KvU32("n", 3);
  img.Tensor("w", {32}, 8, 0).PadTo(32).Zeros(34);
  ASSERT_TRUE(img.Parse().ok());
  const std::vector<uint8_t> full = img.bytes();
  for (size_t n = 0; n < full.size(); ++n) {
    const std::vector<uint8_t> prefix(full.begin(), full.begin() + static_cast<ptrdiff_t>(n));
    const absl::Status st = GgufFile::ParseBytes(prefix, "p.gguf").status();
    ASSERT_FALSE(st.ok()) << "prefix of " << n << " bytes was accepted";
    const auto kind = ErrorKindOf(st);
    EXPECT_TRUE(kind == ErrorKind::kTruncated || kind == ErrorKind::kAbsurdCount ||
                kind == ErrorKind::kOutOfBounds)
        << st;
  }
}

// A DeepSeek-V3-shaped model (58 MoE layers of 256 Q4_K/Q6_K experts, ~396 GiB of tensor data,
// a 129,280-token vocabulary) served by a source that counts what is read: parsing must read the
// header and nothing of the data section.
class CountingSource final : public ByteSource {
 public:
  CountingSource(std::vector<uint8_t> header, uint64_t size)
      : header_(std::move(header)), size_(size) {}
  uint64_t size() const override { return size_; }
  absl::Status ReadAt(uint64_t offset, std::span<uint8_t> out) const override {
    bytes_read_ += out.size();
    max_end_ = std::max<uint64_t>(max_end_, offset + out.size());
    for (size_t i = 0; i < out.size(); ++i) {
      out[i] = offset + i < header_.size() ? header_[offset + i] : 0;
    }
    return absl::OkStatus();
  }
  uint64_t bytes_read() const { return bytes_read_; }
  uint64_t max_end() const { return max_end_; }

 private:
  std::vector<uint8_t> header_;
  uint64_t size_;
  mutable uint64_t bytes_read_ = 0;
  mutable uint64_t max_end_ = 0;
};

TEST(GgufBounded, HugeModelReadsOnlyItsHeader) {
  constexpr int kLayers = 58;
  constexpr uint64_t kEmbd = 7168, kFf = 2048, kExperts = 256, kVocab = 129280;
  const uint64_t gate_bytes = kEmbd / 256 * 144 * kFf * kExperts;  // q4_K
  const uint64_t down_bytes = kFf / 256 * 210 * kEmbd * kExperts;  // q6_K
  Image img;
  img.Header(3 * kLayers, 2).KvStr("general.architecture", "deepseek2");
  img.Str("tokenizer.ggml.tokens").U32(9).U32(8).U64(kVocab);
  for (uint64_t i = 0; i < kVocab; ++i) img.Str("tok" + std::to_string(i));
  uint64_t offset = 0;
  for (int l = 0; l < kLayers; ++l) {
    const std::string b = "blk." + std::to_string(l + 3) + ".";
    img.Tensor(b + "ffn_gate_exps.weight", {int64_t{kEmbd}, int64_t{kFf}, int64_t{kExperts}}, 12,
               offset);
    offset += gate_bytes;  // multiples of 32 already
    img.Tensor(b + "ffn_up_exps.weight", {int64_t{kEmbd}, int64_t{kFf}, int64_t{kExperts}}, 12,
               offset);
    offset += gate_bytes;
    img.Tensor(b + "ffn_down_exps.weight", {int64_t{kFf}, int64_t{kEmbd}, int64_t{kExperts}}, 14,
               offset);
    offset += down_bytes;
  }
  img.PadTo(32);
  const uint64_t header = img.size();
  const uint64_t total = header + offset;
  ASSERT_GT(total, uint64_t{390} << 30);
  const CountingSource source(img.bytes(), total);
  const auto f = GgufFile::Parse(source, "deepseek.gguf");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->tensors().size(), 3u * kLayers);
  EXPECT_EQ(f->data_offset(), header);
  EXPECT_EQ(f->tensors().back().file_offset + f->tensors().back().nbytes, total);
  EXPECT_EQ(f->FindKv("tokenizer.ggml.tokens")->array.count, kVocab);
  // At most one buffer (1 MiB) past the header is fetched, and never the data itself.
  EXPECT_LE(source.max_end(), header + (1 << 20));
  EXPECT_LE(source.bytes_read(), header + (1 << 20));
}

}  // namespace
}  // namespace expertd
