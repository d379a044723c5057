// GGUF writer and model synthesizer. Files are re-read with the project's GGUF reader for the
// header and with plain pread for the data; expected offsets, sizes and tensor counts are computed
// here from gguf.md's packing rule and from the preset definitions in docs/synth.md, not taken
// from the code under test.
#include "synth/synth.h"

#include <gtest/gtest.h>

#include <cmath>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "format/gguf.h"
#include "format/gguf_writer.h"
#include "support/test_support.h"
#include "synth/presets.h"
#include "util/file.h"

namespace expertd {
namespace {

using ::expertd::testing::IsError;
using ::expertd::testing::TempDir;

uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

std::vector<uint8_t> ReadRange(const std::string& path, uint64_t offset, uint64_t n) {
  std::vector<uint8_t> out(n);
  auto file = ReadFile::Open(path);
  EXPECT_TRUE(file.ok()) << file.status();
  if (file.ok()) {
    EXPECT_TRUE(file->ReadAt(offset, out).ok());
  }
  return out;
}

std::vector<uint8_t> Synth(uint64_t seed, const std::string& name, uint32_t type, uint64_t offset,
                           uint64_t n) {
  std::vector<uint8_t> out(n);
  SynthTensorBytes(seed, name, type, offset, out);
  return out;
}

// The test's own data for writer tests: a byte depending on tensor and position.
uint8_t Pattern(size_t tensor, uint64_t offset) {
  return static_cast<uint8_t>(tensor * 61 + offset * 7 + (offset >> 11));
}

// ---------------------------------------------------------------------------------------------
// GGUF writer

struct PlannedTensor {
  std::string name;
  uint32_t type;
  std::vector<uint64_t> ne;
  uint64_t nbytes;  // from the block geometry, computed by hand
};

void RoundTrip(uint32_t alignment) {
  TempDir dir;
  GgufWriter w;
  ASSERT_TRUE(w.AddKv("t.u8", GgufScalar(uint8_t{200})).ok());
  ASSERT_TRUE(w.AddKv("t.i8", GgufScalar(int8_t{-100})).ok());
  ASSERT_TRUE(w.AddKv("t.u16", GgufScalar(uint16_t{65000})).ok());
  ASSERT_TRUE(w.AddKv("t.i16", GgufScalar(int16_t{-32000})).ok());
  ASSERT_TRUE(w.AddKv("t.u32", GgufScalar(uint32_t{4000000000U})).ok());
  ASSERT_TRUE(w.SetAlignment(alignment).ok());
  ASSERT_TRUE(w.AddKv("t.i32", GgufScalar(int32_t{-2000000000})).ok());
  ASSERT_TRUE(w.AddKv("t.f32", GgufScalar(1.5F)).ok());
  ASSERT_TRUE(w.AddKv("t.bool", GgufScalar(true)).ok());
  ASSERT_TRUE(w.AddKv("t.string", GgufScalar(std::string("héllo\n"))).ok());
  ASSERT_TRUE(w.AddKv("t.u64", GgufScalar(uint64_t{1} << 60)).ok());
  ASSERT_TRUE(w.AddKv("t.i64", GgufScalar(int64_t{-(int64_t{1} << 60)})).ok());
  ASSERT_TRUE(w.AddKv("t.f64", GgufScalar(-2.25)).ok());
  const std::vector<GgufScalar> ints = {int32_t{1}, int32_t{-2}, int32_t{3}};
  ASSERT_TRUE(w.AddArray("t.arr_i32", GgufType::kI32, ints).ok());
  const std::vector<GgufScalar> floats = {0.5F, 2.0F};
  ASSERT_TRUE(w.AddArray("t.arr_f32", GgufType::kF32, floats).ok());
  ASSERT_TRUE(w.AddArray("t.arr_empty", GgufType::kU8, {}).ok());
  const std::vector<std::string> strings = {"a", "", "long string"};
  ASSERT_TRUE(w.AddStringArray("t.arr_str", strings).ok());

  const std::vector<PlannedTensor> planned = {
      {"f32.small", ggml::kF32, {5}, 20},
      {"q4k.matrix", ggml::kQ4_K, {512, 3}, 2UL * 144 * 3},
      {"q80.4d", ggml::kQ8_0, {64, 2, 3, 2}, 2UL * 34 * 2 * 3 * 2},
      {"f32.large", ggml::kF32, {1100003}, 4400012},  // crosses the writer's 4 MiB chunks
      {"mxfp4.x", ggml::kMXFP4, {32, 1, 5}, 17UL * 5},
  };
  for (const PlannedTensor& t : planned) ASSERT_TRUE(w.AddTensor(t.name, t.type, t.ne).ok());

  uint64_t expected_next = 0;  // tensor i's data offset, checked against the fill calls
  size_t expected_tensor = 0;
  const auto fill = [&](size_t i, uint64_t offset, std::span<uint8_t> out) {
    if (i != expected_tensor) expected_next = 0;
    EXPECT_EQ(offset, expected_next);
    EXPECT_LE(offset + out.size(), planned[i].nbytes);
    for (size_t k = 0; k < out.size(); ++k) out[k] = Pattern(i, offset + k);
    expected_tensor = i;
    expected_next = offset + out.size();
    return absl::OkStatus();
  };
  uint64_t last_progress = 0;
  const std::string path = dir.File("all.gguf");
  ASSERT_TRUE(w.Write(path, fill, [&](uint64_t n) {
                 EXPECT_GE(n, last_progress);
                 last_progress = n;
               }).ok());
  EXPECT_EQ(last_progress, w.file_size());

  const auto f = GgufFile::Read(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), alignment);
  EXPECT_EQ(f->FindKv("general.alignment") != nullptr, alignment != 32);
  if (alignment != 32) {
    EXPECT_EQ(f->GetUint("general.alignment"), alignment);
  }
  EXPECT_EQ(f->kvs().size(), alignment != 32 ? 17u : 16u);
  const auto scalar = [&](const char* key) { return f->FindKv(key)->scalar; };
  EXPECT_EQ(std::get<uint8_t>(scalar("t.u8")), 200);
  EXPECT_EQ(std::get<int8_t>(scalar("t.i8")), -100);
  EXPECT_EQ(std::get<uint16_t>(scalar("t.u16")), 65000);
  EXPECT_EQ(std::get<int16_t>(scalar("t.i16")), -32000);
  EXPECT_EQ(std::get<uint32_t>(scalar("t.u32")), 4000000000U);
  EXPECT_EQ(std::get<int32_t>(scalar("t.i32")), -2000000000);
  EXPECT_EQ(std::get<float>(scalar("t.f32")), 1.5F);
  EXPECT_EQ(std::get<bool>(scalar("t.bool")), true);
  EXPECT_EQ(std::get<std::string>(scalar("t.string")), "héllo\n");
  EXPECT_EQ(std::get<uint64_t>(scalar("t.u64")), uint64_t{1} << 60);
  EXPECT_EQ(std::get<int64_t>(scalar("t.i64")), -(int64_t{1} << 60));
  EXPECT_EQ(std::get<double>(scalar("t.f64")), -2.25);
  EXPECT_EQ(f->kvs()[0].key, "t.u8");  // declaration order is kept
  const GgufArray& ai = f->FindKv("t.arr_i32")->array;
  EXPECT_EQ(ai.element_type, GgufType::kI32);
  ASSERT_EQ(ai.elements.size(), 3u);
  EXPECT_EQ(std::get<int32_t>(ai.elements[1]), -2);
  const GgufArray& af = f->FindKv("t.arr_f32")->array;
  ASSERT_EQ(af.elements.size(), 2u);
  EXPECT_EQ(std::get<float>(af.elements[1]), 2.0F);
  EXPECT_EQ(f->FindKv("t.arr_empty")->array.count, 0u);
  const GgufArray& as = f->FindKv("t.arr_str")->array;
  EXPECT_EQ(as.element_type, GgufType::kString);
  ASSERT_EQ(as.elements.size(), 3u);
  EXPECT_EQ(std::get<std::string>(as.elements[2]), "long string");

  // gguf.md: data starts at the aligned end of the tensor infos; tensors are packed in order,
  // each padded to the alignment.
  EXPECT_EQ(f->data_offset() % alignment, 0u);
  EXPECT_EQ(f->data_offset(), w.data_offset());
  ASSERT_EQ(f->tensors().size(), planned.size());
  uint64_t offset = 0;
  for (size_t i = 0; i < planned.size(); ++i) {
    const GgufTensorInfo& t = f->tensors()[i];
    SCOPED_TRACE(t.name);
    EXPECT_EQ(t.name, planned[i].name);
    EXPECT_EQ(t.type.id, planned[i].type);
    EXPECT_EQ(t.n_dims, planned[i].ne.size());
    for (size_t d = 0; d < planned[i].ne.size(); ++d) EXPECT_EQ(t.ne[d], planned[i].ne[d]);
    EXPECT_EQ(t.nbytes, planned[i].nbytes);
    EXPECT_EQ(t.offset, offset);
    const uint64_t padded = AlignUp(t.nbytes, alignment);
    const std::vector<uint8_t> data = ReadRange(path, t.file_offset, padded);
    size_t mismatches = 0;
    for (uint64_t k = 0; k < padded; ++k) {
      mismatches += data[k] != (k < t.nbytes ? Pattern(i, k) : 0);
    }
    EXPECT_EQ(mismatches, 0u);
    offset += padded;
  }
  EXPECT_EQ(std::filesystem::file_size(path), f->data_offset() + offset);
  EXPECT_EQ(w.file_size(), f->data_offset() + offset);
}

TEST(GgufWriter, RoundTripsEveryKvTypeAndTensorDataDefaultAlignment) { RoundTrip(32); }
TEST(GgufWriter, RoundTripsEveryKvTypeAndTensorDataAlignment64) { RoundTrip(64); }

TEST(GgufWriter, ZeroTensorFile) {
  TempDir dir;
  GgufWriter w;
  ASSERT_TRUE(w.AddKv("general.architecture", GgufScalar(std::string("llama"))).ok());
  ASSERT_TRUE(w.Write(dir.File("meta.gguf"), nullptr).ok());
  const auto f = GgufFile::Read(dir.File("meta.gguf"));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE(f->tensors().empty());
  EXPECT_EQ(f->GetString("general.architecture"), "llama");
  // Like ggml's writer, the header is padded to the alignment even without tensor data.
  EXPECT_EQ(f->file_size(), AlignUp(24 + 8 + 20 + 4 + 8 + 5, 32));

  GgufWriter empty;
  ASSERT_TRUE(empty.Write(dir.File("empty.gguf"), nullptr).ok());
  const auto e = GgufFile::Read(dir.File("empty.gguf"));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_TRUE(e->kvs().empty());
  EXPECT_EQ(e->file_size(), 32u);
}

TEST(GgufWriter, RejectsInvalidInputAndStaysUnchanged) {
  using absl::StatusCode::kInvalidArgument;
  GgufWriter w;
  ASSERT_TRUE(w.AddKv("a", GgufScalar(uint32_t{1})).ok());
  ASSERT_TRUE(w.AddTensor(std::string(63, 'n'), ggml::kF32, {4}).ok());
  const uint64_t size_before = w.file_size();

  EXPECT_TRUE(
      IsError(w.AddKv("a", GgufScalar(1.0F)), kInvalidArgument, ErrorKind::kDuplicate, {"'a'"}));
  EXPECT_TRUE(IsError(w.AddKv("", GgufScalar(true)), kInvalidArgument, ErrorKind::kBadValue, {}));
  const std::vector<GgufScalar> mixed = {int32_t{1}, uint32_t{2}};
  EXPECT_TRUE(IsError(w.AddArray("m", GgufType::kI32, mixed), kInvalidArgument,
                      ErrorKind::kBadValue, {"'m'", "element 1"}));
  EXPECT_TRUE(IsError(w.AddArray("n", GgufType::kArray, {}), kInvalidArgument,
                      ErrorKind::kUnknownType, {"'n'"}));
  EXPECT_TRUE(IsError(w.AddKv("general.alignment", GgufScalar(uint64_t{64})), kInvalidArgument,
                      ErrorKind::kBadValue, {"general.alignment"}));
  EXPECT_TRUE(IsError(w.SetAlignment(64), kInvalidArgument, ErrorKind::kBadValue,
                      {"before the first tensor"}));

  EXPECT_TRUE(IsError(w.AddTensor(std::string(64, 'x'), ggml::kF32, {4}), kInvalidArgument,
                      ErrorKind::kBadValue, {"64 bytes"}));
  EXPECT_TRUE(IsError(w.AddTensor("", ggml::kF32, {4}), kInvalidArgument, ErrorKind::kBadValue,
                      {"empty tensor name"}));
  EXPECT_TRUE(IsError(w.AddTensor(std::string(63, 'n'), ggml::kF32, {4}), kInvalidArgument,
                      ErrorKind::kDuplicate, {"nnn"}));
  EXPECT_TRUE(IsError(w.AddTensor("d0", ggml::kF32, std::span<const uint64_t>()), kInvalidArgument,
                      ErrorKind::kBadValue, {"'d0'", "n_dims 0"}));
  EXPECT_TRUE(IsError(w.AddTensor("d5", ggml::kF32, {1, 1, 1, 1, 1}), kInvalidArgument,
                      ErrorKind::kBadValue, {"n_dims 5"}));
  EXPECT_TRUE(IsError(w.AddTensor("blk", ggml::kQ4_K, {100, 2}), kInvalidArgument,
                      ErrorKind::kBadValue, {"'blk'", "ne[0] = 100", "256"}));
  EXPECT_TRUE(IsError(w.AddTensor("zero", ggml::kF32, {4, 0}), kInvalidArgument,
                      ErrorKind::kBadValue, {"ne[1] is 0"}));
  EXPECT_TRUE(IsError(w.AddTensor("type", 4, {32}), kInvalidArgument, ErrorKind::kUnknownType,
                      {"ggml type 4"}));
  EXPECT_TRUE(IsError(w.AddTensor("huge", ggml::kF32, {uint64_t{1} << 40, uint64_t{1} << 40}),
                      kInvalidArgument, ErrorKind::kOverflow, {"'huge'"}));
  EXPECT_TRUE(IsError(w.AddTensor("big", ggml::kF64, {uint64_t{1} << 61}), kInvalidArgument,
                      ErrorKind::kOverflow, {"'big'"}));

  EXPECT_EQ(w.kv_count(), 1u);
  EXPECT_EQ(w.tensors().size(), 1u);
  EXPECT_EQ(w.file_size(), size_before);

  GgufWriter v;
  EXPECT_TRUE(IsError(v.SetAlignment(48), kInvalidArgument, ErrorKind::kBadValue, {"48"}));
  EXPECT_EQ(v.kv_count(), 0u);
  EXPECT_EQ(v.alignment(), 32u);
}

TEST(GgufWriter, WriteErrorsLeaveNoFile) {
  TempDir dir;
  GgufWriter w;
  ASSERT_TRUE(w.AddTensor("t", ggml::kF32, {8}).ok());
  EXPECT_TRUE(IsError(w.Write(dir.File("nofill.gguf"), nullptr), absl::StatusCode::kInvalidArgument,
                      ErrorKind::kBadValue, {"fill"}));
  const auto failing = [](size_t, uint64_t, std::span<uint8_t>) {
    return absl::DataLossError("source went away");
  };
  EXPECT_EQ(w.Write(dir.File("f.gguf"), failing).message(), "source went away");
  EXPECT_FALSE(std::filesystem::exists(dir.File("f.gguf")));
  EXPECT_FALSE(w.Write(dir.File("missing/dir/x.gguf"), failing).ok());
}

// ---------------------------------------------------------------------------------------------
// SynthTensorBytes

// Every type with value fields (scales overwritten at block positions) and a plain one.
class SynthTensorBytesTest : public ::testing::TestWithParam<uint32_t> {};

TEST_P(SynthTensorBytesTest, AnyRangeMatchesTheWholeStream) {
  const uint32_t type = GetParam();
  const std::vector<uint8_t> whole = Synth(7, "blk.0.ffn_up_exps.weight", type, 0, 1000);
  // Pieces with unaligned starts and lengths, including empty and single bytes.
  const std::vector<std::pair<uint64_t, uint64_t>> pieces = {
      {0, 0}, {0, 3}, {3, 1}, {4, 13}, {17, 8}, {25, 7}, {32, 500}, {532, 468}};
  std::vector<uint8_t> joined;
  for (const auto& [offset, n] : pieces) {
    const std::vector<uint8_t> part = Synth(7, "blk.0.ffn_up_exps.weight", type, offset, n);
    joined.insert(joined.end(), part.begin(), part.end());
  }
  EXPECT_EQ(joined, whole);
  EXPECT_EQ(Synth(7, "blk.0.ffn_up_exps.weight", type, 995, 5),
            std::vector<uint8_t>(whole.end() - 5, whole.end()));
  EXPECT_NE(Synth(8, "blk.0.ffn_up_exps.weight", type, 0, 64),
            Synth(7, "blk.0.ffn_up_exps.weight", type, 0, 64));
  EXPECT_NE(Synth(7, "blk.1.ffn_up_exps.weight", type, 0, 64),
            Synth(7, "blk.0.ffn_up_exps.weight", type, 0, 64));
  // Far offsets (multi-GiB tensors) need no preceding bytes.
  const uint64_t far = (uint64_t{5} << 32) + 3;
  const std::vector<uint8_t> around = Synth(7, "x", type, far - 3, 12);
  EXPECT_EQ(Synth(7, "x", type, far, 9), std::vector<uint8_t>(around.begin() + 3, around.end()));
}

INSTANTIATE_TEST_SUITE_P(Types, SynthTensorBytesTest,
                         ::testing::Values(ggml::kI8, ggml::kF32, ggml::kF16, ggml::kQ4_K,
                                           ggml::kQ6_K, ggml::kQ8_0, ggml::kQ5_0, ggml::kMXFP4));

// ---------------------------------------------------------------------------------------------
// Presets, as docs/synth.md defines them

struct ExpertTensor {
  std::string name;
  uint32_t type;
  std::vector<uint64_t> ne;
};

struct PresetCase {
  std::string preset;
  std::string arch;
  uint64_t layers, experts, used, tensors;
  std::vector<ExpertTensor> experts_list;  // every routed-expert projection
  std::vector<std::string> also_present;   // other tensors the layout needs
};

std::vector<ExpertTensor> Stacked(uint64_t first, uint64_t last, uint64_t embd, uint64_t ff,
                                  uint64_t experts, uint32_t gate_up, uint32_t down) {
  std::vector<ExpertTensor> out;
  for (uint64_t l = first; l <= last; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    out.push_back({p + "ffn_gate_exps.weight", gate_up, {embd, ff, experts}});
    out.push_back({p + "ffn_up_exps.weight", gate_up, {embd, ff, experts}});
    out.push_back({p + "ffn_down_exps.weight", down, {ff, embd, experts}});
  }
  return out;
}

PresetCase Case(std::string preset, std::string arch, uint64_t layers, uint64_t experts,
                uint64_t used, uint64_t tensors) {
  return {std::move(preset), std::move(arch), layers, experts, used, tensors, {}, {}};
}

std::vector<PresetCase> PresetCases() {
  std::vector<PresetCase> cases;
  // token_embd + 32 × (attn_norm, q, k, v, output, ffn_norm, router, 3 stacked) + norm + output.
  PresetCase mixtral = Case("mixtral-tiny", "llama", 32, 8, 2, 1 + 32 * 10 + 2);
  mixtral.experts_list = Stacked(0, 31, 256, 256, 8, ggml::kQ4_K, ggml::kQ6_K);
  mixtral.also_present = {"blk.31.ffn_gate_inp.weight", "token_embd.weight", "output.weight"};
  cases.push_back(mixtral);
  // 4 × (7 + 8 experts × 3 projections).
  PresetCase legacy = Case("mixtral-legacy-tiny", "llama", 4, 8, 2, 1 + 4 * (7 + 24) + 2);
  for (int l = 0; l < 4; ++l) {
    for (int e = 0; e < 8; ++e) {
      const auto name = [&](const char* projection) {
        return "blk." + std::to_string(l) + "." + projection + "." + std::to_string(e) + ".weight";
      };
      legacy.experts_list.push_back({name("ffn_gate"), ggml::kQ4_K, {256, 256}});
      legacy.experts_list.push_back({name("ffn_up"), ggml::kQ4_K, {256, 256}});
      legacy.experts_list.push_back({name("ffn_down"), ggml::kQ6_K, {256, 256}});
    }
  }
  legacy.also_present = {"blk.3.ffn_gate_inp.weight"};
  cases.push_back(legacy);
  // 9 attention/norm tensors per layer; blk.0 dense (3); blk.1-3: router, bias, 3 + 3 shexp.
  PresetCase ds = Case("deepseek-tiny", "deepseek2", 4, 256, 8, 1 + 9 * 4 + 3 + 3 * 8 + 2);
  const std::vector<std::tuple<int, uint32_t, uint32_t>> ds_types = {
      {1, ggml::kQ4_K, ggml::kQ8_0}, {2, ggml::kQ6_K, ggml::kQ5_0}, {3, ggml::kQ4_K, ggml::kQ8_0}};
  for (const auto& [l, gate_up, down] : ds_types) {
    for (ExpertTensor& t : Stacked(l, l, 256, 32, 256, gate_up, down)) {
      ds.experts_list.push_back(t);
    }
  }
  ds.also_present = {"blk.0.ffn_gate.weight",       "blk.0.ffn_down.weight",
                     "blk.1.ffn_gate_shexp.weight", "blk.3.ffn_down_shexp.weight",
                     "blk.2.ffn_gate_inp.weight",   "blk.1.exp_probs_b.bias",
                     "blk.0.attn_kv_b.weight"};
  cases.push_back(ds);
  // 4 × (4 attention + 2 head norms + 2 norms + router + 3 stacked).
  PresetCase qwen = Case("qwen3moe-tiny", "qwen3moe", 4, 128, 8, 1 + 4 * 12 + 2);
  qwen.experts_list = Stacked(0, 3, 256, 64, 128, ggml::kQ4_K, ggml::kQ8_0);
  qwen.also_present = {"blk.3.attn_q_norm.weight", "blk.0.ffn_gate_inp.weight"};
  cases.push_back(qwen);
  // 3 × (norm, 4 × weight+bias, sinks, post norm, router w+b, 3 × weight+bias).
  PresetCase oss = Case("gptoss-tiny", "gpt-oss", 3, 32, 4, 1 + 3 * 19 + 2);
  oss.experts_list = Stacked(0, 2, 256, 256, 32, ggml::kMXFP4, ggml::kMXFP4);
  for (int l = 0; l < 3; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    oss.experts_list.push_back({p + "ffn_gate_exps.bias", ggml::kF32, {256, 32}});
    oss.experts_list.push_back({p + "ffn_up_exps.bias", ggml::kF32, {256, 32}});
    oss.experts_list.push_back({p + "ffn_down_exps.bias", ggml::kF32, {256, 32}});
    oss.also_present.push_back(p + "attn_sinks.weight");
    oss.also_present.push_back(p + "ffn_gate_inp.bias");
  }
  cases.push_back(oss);
  return cases;
}

// Expert bytes at the start, an unaligned middle and the end equal SynthTensorBytes.
void ExpectSampledBytes(const std::string& path, const GgufTensorInfo& t, uint64_t seed) {
  const std::vector<std::pair<uint64_t, uint64_t>> samples = {
      {0, 64}, {t.nbytes / 2 + 3, 61}, {t.nbytes - 13, 13}};
  for (const auto& [offset, n] : samples) {
    EXPECT_EQ(ReadRange(path, t.file_offset + offset, n), Synth(seed, t.name, t.type.id, offset, n))
        << t.name << " at " << offset;
  }
}

absl::StatusOr<std::vector<std::string>> Make(const std::string& preset, const std::string& dir,
                                              uint64_t seed = 1, uint32_t split = 1,
                                              uint32_t scale = 1) {
  SynthOptions o;
  o.preset = preset;
  o.out_dir = dir;
  o.seed = seed;
  o.split = split;
  o.scale = scale;
  return SynthesizeModel(o);
}

TEST(SynthPreset, EveryPresetMatchesItsDefinition) {
  const std::vector<PresetCase> cases = PresetCases();
  ASSERT_EQ(SynthPresets().size(), cases.size());
  for (const PresetCase& c : cases) {
    SCOPED_TRACE(c.preset);
    TempDir dir;
    const auto paths = Make(c.preset, dir.path(), 42);
    ASSERT_TRUE(paths.ok()) << paths.status();
    ASSERT_EQ(*paths, std::vector<std::string>{dir.File("model.gguf")});
    const auto f = GgufFile::Read(paths->front());
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ(f->GetString("general.architecture"), c.arch);
    EXPECT_EQ(f->GetUint(c.arch + ".block_count"), c.layers);
    EXPECT_EQ(f->GetUint(c.arch + ".expert_count"), c.experts);
    EXPECT_EQ(f->GetUint(c.arch + ".expert_used_count"), c.used);
    EXPECT_EQ(f->GetUint(c.arch + ".embedding_length"), 256u);
    EXPECT_EQ(f->GetUint("expertd.synth.seed"), 42u);
    EXPECT_EQ(f->tensors().size(), c.tensors);
    for (const ExpertTensor& e : c.experts_list) {
      const GgufTensorInfo* t = f->FindTensor(e.name);
      ASSERT_NE(t, nullptr) << e.name;
      EXPECT_EQ(t->type.id, e.type) << e.name;
      ASSERT_EQ(t->n_dims, e.ne.size()) << e.name;
      for (size_t d = 0; d < e.ne.size(); ++d) EXPECT_EQ(t->ne[d], e.ne[d]) << e.name;
      ExpectSampledBytes(paths->front(), *t, 42);
    }
    for (const std::string& name : c.also_present) EXPECT_NE(f->FindTensor(name), nullptr) << name;
  }
}

// llama.cpp must get finite values: every float element, and every block scale (ggml-common.h's
// block structs: where each type keeps its fp16 d/dmin or its E8M0 exponent), in every preset.
float HalfToFloat(uint16_t h) {
  const int exp = (h >> 10) & 0x1F;
  const int mant = h & 0x3FF;
  const float sign = (h & 0x8000) != 0 ? -1.0F : 1.0F;
  if (exp == 0x1F) return mant != 0 ? std::numeric_limits<float>::quiet_NaN()
                                    : sign * std::numeric_limits<float>::infinity();
  if (exp == 0) return sign * std::ldexp(static_cast<float>(mant), -24);
  return sign * std::ldexp(static_cast<float>(mant + 1024), exp - 25);
}

TEST(SynthPreset, EveryScaleAndFloatIsFiniteAndSmall) {
  // Block bytes and the offsets of its fp16 scales (MXFP4: its exponent byte at 0).
  const std::map<uint32_t, std::pair<uint32_t, std::vector<uint32_t>>> layouts = {
      {ggml::kQ4_K, {144, {0, 2}}}, {ggml::kQ6_K, {210, {208}}}, {ggml::kQ8_0, {34, {0}}},
      {ggml::kQ5_0, {22, {0}}},     {ggml::kMXFP4, {17, {}}}};
  for (const SynthPresetInfo& preset : SynthPresets()) {
    SCOPED_TRACE(std::string(preset.name));
    TempDir dir;
    ASSERT_TRUE(Make(std::string(preset.name), dir.path(), 3).ok());
    const auto f = GgufFile::Read(dir.File("model.gguf"));
    ASSERT_TRUE(f.ok()) << f.status();
    for (const GgufTensorInfo& t : f->tensors()) {
      const std::vector<uint8_t> bytes = ReadRange(dir.File("model.gguf"), t.file_offset, t.nbytes);
      if (t.type.id == ggml::kF32) {
        for (size_t i = 0; i + 4 <= bytes.size(); i += 4) {
          float v = 0;
          std::memcpy(&v, &bytes[i], 4);
          ASSERT_TRUE(std::isfinite(v) && std::fabs(v) < 2.0F) << t.name << " element " << i / 4;
        }
        continue;
      }
      const auto it = layouts.find(t.type.id);
      ASSERT_NE(it, layouts.end()) << t.name << ": a type this test does not know";
      const auto& [block, scales] = it->second;
      ASSERT_EQ(bytes.size() % block, 0u) << t.name;
      for (size_t b = 0; b < bytes.size(); b += block) {
        if (t.type.id == ggml::kMXFP4) {
          // E8M0: 2^(e - 127); ggml reads half of it. Weights stay below 12 * 2^(e - 128).
          ASSERT_GE(bytes[b], 110) << t.name;
          ASSERT_LE(bytes[b], 127) << t.name;
          continue;
        }
        for (uint32_t at : scales) {
          const float d = HalfToFloat(static_cast<uint16_t>(bytes[b + at] | bytes[b + at + 1] << 8));
          ASSERT_TRUE(std::isfinite(d) && d > 0 && d < 0.01F) << t.name << " block " << b / block;
        }
      }
    }
  }
}

TEST(SynthPreset, ArchitectureSpecificMetadata) {
  TempDir dir;
  ASSERT_TRUE(Make("deepseek-tiny", dir.path()).ok());
  const auto f = GgufFile::Read(dir.File("model.gguf"));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->GetUint("deepseek2.leading_dense_block_count"), 1u);
  EXPECT_EQ(f->GetUint("deepseek2.expert_shared_count"), 1u);
  EXPECT_EQ(f->GetUint("deepseek2.expert_feed_forward_length"), 32u);
  EXPECT_EQ(f->FindTensor("blk.0.ffn_gate_exps.weight"), nullptr);  // the dense block
  // Layer 1 and 2 expert bundles differ in layout (slot classes).
  EXPECT_NE(f->FindTensor("blk.1.ffn_down_exps.weight")->nbytes,
            f->FindTensor("blk.2.ffn_down_exps.weight")->nbytes);
  // Every tensor, not only the experts, holds exactly SynthTensorBytes(seed, name, [0, nbytes)),
  // followed by zero padding.
  for (const GgufTensorInfo& t : f->tensors()) {
    const uint64_t padded = AlignUp(t.nbytes, f->alignment());
    std::vector<uint8_t> expected = Synth(1, t.name, t.type.id, 0, t.nbytes);
    expected.resize(padded, 0);
    ASSERT_EQ(ReadRange(dir.File("model.gguf"), t.file_offset, padded), expected) << t.name;
  }
}

TEST(SynthPreset, SameSeedSameFileOtherSeedOtherExperts) {
  TempDir a, b, c;
  ASSERT_TRUE(Make("mixtral-legacy-tiny", a.path(), 5).ok());
  ASSERT_TRUE(Make("mixtral-legacy-tiny", b.path(), 5).ok());
  ASSERT_TRUE(Make("mixtral-legacy-tiny", c.path(), 6).ok());
  const std::string fa = testing::ReadWholeFile(a.File("model.gguf"));
  EXPECT_TRUE(fa == testing::ReadWholeFile(b.File("model.gguf")));
  const auto f = GgufFile::Read(a.File("model.gguf"));
  ASSERT_TRUE(f.ok()) << f.status();
  const GgufTensorInfo* t = f->FindTensor("blk.2.ffn_down.5.weight");
  ASSERT_NE(t, nullptr);
  EXPECT_NE(ReadRange(a.File("model.gguf"), t->file_offset, 256),
            ReadRange(c.File("model.gguf"), t->file_offset, 256));
}

TEST(SynthPreset, SplitWritesShardsWithSplitKvs) {
  TempDir whole_dir, split_dir;
  ASSERT_TRUE(Make("qwen3moe-tiny", whole_dir.path()).ok());
  const auto whole = GgufFile::Read(whole_dir.File("model.gguf"));
  ASSERT_TRUE(whole.ok()) << whole.status();

  std::vector<std::pair<uint64_t, uint64_t>> progress;
  SynthOptions o;
  o.preset = "qwen3moe-tiny";
  o.out_dir = split_dir.path();
  o.split = 3;
  o.progress = [&](uint64_t done, uint64_t total) { progress.emplace_back(done, total); };
  const auto paths = SynthesizeModel(o);
  ASSERT_TRUE(paths.ok()) << paths.status();
  ASSERT_EQ(paths->size(), 3u);
  EXPECT_EQ((*paths)[0], split_dir.File("model-00001-of-00003.gguf"));
  EXPECT_EQ((*paths)[2], split_dir.File("model-00003-of-00003.gguf"));

  std::vector<std::string> names;
  uint64_t total_bytes = 0;
  for (uint16_t k = 0; k < 3; ++k) {
    const auto f = GgufFile::Read((*paths)[k]);
    ASSERT_TRUE(f.ok()) << f.status();
    total_bytes += f->file_size();
    EXPECT_EQ(std::get<uint16_t>(f->FindKv("split.no")->scalar), k);
    EXPECT_EQ(std::get<uint16_t>(f->FindKv("split.count")->scalar), 3);
    EXPECT_EQ(std::get<int32_t>(f->FindKv("split.tensors.count")->scalar), 51);
    if (k == 0) {
      EXPECT_EQ(f->GetString("general.architecture"), "qwen3moe");
      EXPECT_EQ(f->kvs().size(), whole->kvs().size() + 3);
    } else {
      EXPECT_EQ(f->kvs().size(), 3u);
    }
    ASSERT_FALSE(f->tensors().empty());
    // Roughly equal shares: within half a share of a third of the data.
    EXPECT_GT(f->data_size(), whole->data_size() / 6);
    EXPECT_LT(f->data_size(), whole->data_size() / 2);
    for (const GgufTensorInfo& t : f->tensors()) {
      names.push_back(t.name);
      const GgufTensorInfo* w = whole->FindTensor(t.name);
      ASSERT_NE(w, nullptr) << t.name;
      EXPECT_EQ(t.type.id, w->type.id);
      EXPECT_EQ(t.ne, w->ne);
      if (t.name.find("_exps") != std::string::npos) ExpectSampledBytes((*paths)[k], t, 1);
    }
  }
  std::vector<std::string> whole_names;
  for (const GgufTensorInfo& t : whole->tensors()) whole_names.push_back(t.name);
  EXPECT_EQ(names, whole_names);  // the union, in the original order

  ASSERT_FALSE(progress.empty());
  for (size_t i = 1; i < progress.size(); ++i) EXPECT_GE(progress[i].first, progress[i - 1].first);
  EXPECT_EQ(progress.back().first, total_bytes);
  EXPECT_EQ(progress.back().second, total_bytes);
}

TEST(SynthPreset, ScaleMultipliesExpertBytes) {
  TempDir one, two;
  ASSERT_TRUE(Make("mixtral-legacy-tiny", one.path(), 1, 1, 1).ok());
  ASSERT_TRUE(Make("mixtral-legacy-tiny", two.path(), 1, 1, 2).ok());
  const auto f1 = GgufFile::Read(one.File("model.gguf"));
  const auto f2 = GgufFile::Read(two.File("model.gguf"));
  ASSERT_TRUE(f1.ok() && f2.ok());
  ASSERT_EQ(f1->tensors().size(), f2->tensors().size());
  int experts = 0;
  for (size_t i = 0; i < f1->tensors().size(); ++i) {
    const GgufTensorInfo& a = f1->tensors()[i];
    const GgufTensorInfo& b = f2->tensors()[i];
    const bool expert = a.name.find("ffn_gate.") != std::string::npos ||
                        a.name.find("ffn_up.") != std::string::npos ||
                        a.name.find("ffn_down.") != std::string::npos;
    experts += expert;
    EXPECT_EQ(b.nbytes, expert ? 2 * a.nbytes : a.nbytes) << a.name;
  }
  EXPECT_EQ(experts, 4 * 8 * 3);
  EXPECT_EQ(f2->GetUint("llama.feed_forward_length"), 512u);
  ExpectSampledBytes(two.File("model.gguf"), *f2->FindTensor("blk.3.ffn_down.7.weight"), 1);
}

TEST(SynthPreset, LargeScalesUse64BitSizes) {
  // Planned, not written: past 4 GiB every size and offset needs 64 bits.
  for (const uint32_t scale : {64U, 256U}) {
    const auto spec = synth::BuildPreset("mixtral-tiny", scale);
    ASSERT_TRUE(spec.ok()) << spec.status();
    GgufWriter w;
    for (const synth::TensorSpec& t : spec->tensors) {
      ASSERT_TRUE(w.AddTensor(t.name, t.type, t.ne).ok());
    }
    // 32 layers × 8 experts × 256 rows × (256 × scale) / 256 blocks × (2 × 144 + 210) bytes.
    const uint64_t expert_bytes = uint64_t{32} * 8 * 256 * scale * (2 * 144 + 210);
    uint64_t sum = 0;
    for (const GgufWriterTensor& t : w.tensors()) {
      if (t.name.find("_exps") != std::string::npos) sum += t.nbytes;
    }
    EXPECT_EQ(sum, expert_bytes);
    EXPECT_GT(w.file_size(), expert_bytes);
    const GgufWriterTensor& down = w.tensors()[10];
    EXPECT_EQ(down.name, "blk.0.ffn_down_exps.weight");
    EXPECT_EQ(down.nbytes, uint64_t{256} * scale / 256 * 210 * 256 * 8);
    EXPECT_EQ(w.tensors().back().offset + AlignUp(w.tensors().back().nbytes, 32), w.data_size());
  }

  // A model larger than the disk fails before anything is written.
  TempDir dir;
  const auto huge = Make("mixtral-tiny", dir.path(), 1, 1, synth::kMaxSynthScale);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted) << huge.status();
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

TEST(SynthPreset, RejectsBadOptions) {
  using absl::StatusCode::kInvalidArgument;
  TempDir dir;
  const std::string out = dir.File("out");
  EXPECT_TRUE(IsError(Make("nope", out).status(), kInvalidArgument, ErrorKind::kBadValue,
                      {"'nope'", "mixtral-tiny", "mixtral-legacy-tiny", "deepseek-tiny",
                       "qwen3moe-tiny", "gptoss-tiny"}));
  EXPECT_TRUE(IsError(Make("deepseek-tiny", out, 1, 1, 0).status(), kInvalidArgument,
                      ErrorKind::kBadValue, {"scale 0"}));
  EXPECT_TRUE(IsError(Make("deepseek-tiny", out, 1, 1, synth::kMaxSynthScale + 1).status(),
                      kInvalidArgument, ErrorKind::kBadValue, {"scale"}));
  EXPECT_TRUE(IsError(Make("deepseek-tiny", out, 1, 0).status(), kInvalidArgument,
                      ErrorKind::kBadValue, {"split"}));
  EXPECT_TRUE(IsError(Make("qwen3moe-tiny", out, 1, 52).status(), kInvalidArgument,
                      ErrorKind::kBadValue, {"split 52", "51 tensors"}));
  EXPECT_FALSE(std::filesystem::exists(out));           // rejected before touching the disk
  EXPECT_TRUE(Make("qwen3moe-tiny", out, 1, 51).ok());  // one tensor per shard is fine
}

}  // namespace
}  // namespace expertd
