// Model catalog: MoE layer detection, projections, expert sizes from the type table, bundle
// layout, slot classes, Locate with and without an index overlay. Models are written with
// GgufWriter; every expected size below is computed by hand from ggml's block geometry.
#include "catalog/catalog.h"

#include <gtest/gtest.h>

#include <functional>

#include "format/gguf_writer.h"
#include "support/test_support.h"

namespace expertd {
namespace {

using ::expertd::testing::IsError;
using ::expertd::testing::TempDir;

absl::Status Zeros(size_t, uint64_t, std::span<uint8_t> out) {
  std::fill(out.begin(), out.end(), uint8_t{0});
  return absl::OkStatus();
}

class CatalogTest : public ::testing::Test {
 protected:
  // Writes a model whose tensors are declared by `declare`; returns its path.
  std::string Write(const std::string& name, uint32_t n_expert,
                    const std::function<void(GgufWriter&)>& declare) {
    GgufWriter w;
    EXPECT_TRUE(w.AddKv("general.architecture", std::string("llama")).ok());
    if (n_expert > 0) {
      EXPECT_TRUE(w.AddKv("llama.expert_count", uint32_t{n_expert}).ok());
      EXPECT_TRUE(w.AddKv("llama.expert_used_count", uint32_t{2}).ok());
    }
    declare(w);
    const std::string path = dir_.File(name);
    const absl::Status st = w.Write(path, Zeros);
    EXPECT_TRUE(st.ok()) << st;
    return path;
  }

  absl::StatusOr<ModelCatalog> Catalog(const std::string& path, const ExpertIndex* index = nullptr) {
    absl::StatusOr<GgufModel> model = GgufModel::Open(path);
    if (!model.ok()) return model.status();
    model_ = std::make_unique<GgufModel>(*std::move(model));
    return ModelCatalog::Build(*model_, index);
  }

  const GgufTensorInfo& Tensor(const std::string& name) {
    return *model_->FindTensor(name)->info;
  }

  TempDir dir_;
  std::unique_ptr<GgufModel> model_;
};

void AddLayer(GgufWriter& w, int block, uint32_t gate_type, uint64_t n_expert = 8) {
  const std::string b = "blk." + std::to_string(block) + ".";
  ASSERT_TRUE(w.AddTensor(b + "attn_q.weight", ggml::kF32, {64, 64}).ok());
  ASSERT_TRUE(w.AddTensor(b + "ffn_gate_inp.weight", ggml::kF32, {64, n_expert}).ok());
  ASSERT_TRUE(w.AddTensor(b + "ffn_gate_exps.weight", gate_type, {64, 4, n_expert}).ok());
  ASSERT_TRUE(w.AddTensor(b + "ffn_up_exps.weight", gate_type, {64, 4, n_expert}).ok());
  ASSERT_TRUE(w.AddTensor(b + "ffn_down_exps.weight", ggml::kQ4_0, {32, 8, n_expert}).ok());
}

TEST_F(CatalogTest, StackedLayersSizesAndBundleLayout) {
  const std::string path = Write("m.gguf", 8, [](GgufWriter& w) {
    ASSERT_TRUE(w.AddTensor("blk.0.ffn_gate.weight", ggml::kF32, {64, 16}).ok());  // dense
    AddLayer(w, 1, ggml::kQ8_0);
    AddLayer(w, 2, ggml::kQ8_0);
  });
  const auto c = Catalog(path);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture(), "llama");
  EXPECT_EQ(c->n_expert(), 8u);
  EXPECT_EQ(c->n_expert_used(), 2u);
  ASSERT_EQ(c->layers().size(), 2u);
  EXPECT_EQ(c->FindLayer(0), nullptr);  // dense layer: not streamed
  const MoeLayer& l = *c->FindLayer(1);
  ASSERT_EQ(l.projections.size(), 3u);
  // q8_0: 34 bytes per 32 elements; 64 elements = 68 bytes per row; 4 rows = 272 per expert.
  EXPECT_EQ(l.projections[0].kind, ProjectionKind::kGate);
  EXPECT_EQ(l.projections[0].expert_bytes, 272u);
  EXPECT_EQ(l.projections[0].bundle_offset, 0u);
  EXPECT_EQ(l.projections[1].kind, ProjectionKind::kUp);
  EXPECT_EQ(l.projections[1].bundle_offset, 512u);  // 272 rounded up to 256
  // q4_0: 18 bytes per 32 elements; 8 rows = 144 per expert.
  EXPECT_EQ(l.projections[2].kind, ProjectionKind::kDown);
  EXPECT_EQ(l.projections[2].expert_bytes, 144u);
  EXPECT_EQ(l.projections[2].bundle_offset, 1024u);
  EXPECT_EQ(l.bundle_bytes, 1280u);
  EXPECT_EQ(l.payload_bytes, 272u + 272u + 144u);
  EXPECT_EQ(c->expert_bytes_total(), 2u * 8u * (272u + 272u + 144u));
  // Both layers share one slot class.
  ASSERT_EQ(c->slot_classes().size(), 1u);
  EXPECT_EQ(c->slot_classes()[0].layers, (std::vector<uint32_t>{1, 2}));
  // Locate: stacked experts are strided by expert_bytes from the tensor's data.
  const GgufTensorInfo& down = Tensor("blk.2.ffn_down_exps.weight");
  const auto loc = c->Locate(2, 5, 2);
  ASSERT_TRUE(loc.ok()) << loc.status();
  EXPECT_EQ(loc->pack, 0u);
  EXPECT_EQ(loc->offset, down.file_offset + 5 * 144);
  EXPECT_EQ(loc->bytes, 144u);
  EXPECT_EQ(loc->index_line, 0);
}

TEST_F(CatalogTest, LocateErrors) {
  const std::string path = Write("m.gguf", 8, [](GgufWriter& w) { AddLayer(w, 1, ggml::kQ8_0); });
  const auto c = Catalog(path);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->Locate(0, 0, 0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(c->Locate(7, 0, 0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(c->Locate(1, 8, 0).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(c->Locate(1, 0, 3).status().code(), absl::StatusCode::kOutOfRange);
}

TEST_F(CatalogTest, TypesVaryingByLayerMakeSlotClasses) {
  const std::string path = Write("m.gguf", 8, [](GgufWriter& w) {
    AddLayer(w, 0, ggml::kQ8_0);
    AddLayer(w, 1, ggml::kQ4_0);
    AddLayer(w, 2, ggml::kQ8_0);
  });
  const auto c = Catalog(path);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->slot_classes().size(), 2u);
  EXPECT_EQ(c->slot_classes()[0].layers, (std::vector<uint32_t>{0, 2}));
  EXPECT_EQ(c->slot_classes()[1].layers, (std::vector<uint32_t>{1}));
  // q4_0 gate: 2 blocks * 18 = 36 per row, 4 rows = 144; bundle 256 + 256 + 144 -> 768.
  EXPECT_EQ(c->FindLayer(1)->bundle_bytes, 768u);
  EXPECT_EQ(c->max_bundle_bytes(), 1280u);
  EXPECT_EQ(c->FindLayer(1)->slot_class, 1u);
}

TEST_F(CatalogTest, SharedExpertsAndRoutersAreNotStreamed) {
  const std::string path = Write("m.gguf", 8, [](GgufWriter& w) {
    AddLayer(w, 0, ggml::kQ8_0);
    ASSERT_TRUE(w.AddTensor("blk.0.ffn_gate_shexp.weight", ggml::kQ8_0, {64, 4}).ok());
    ASSERT_TRUE(w.AddTensor("blk.0.ffn_up_shexp.weight", ggml::kQ8_0, {64, 4}).ok());
    ASSERT_TRUE(w.AddTensor("blk.0.ffn_down_shexp.weight", ggml::kQ8_0, {64, 4}).ok());
  });
  const auto c = Catalog(path);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->layers().size(), 1u);
  EXPECT_EQ(c->layers()[0].projections.size(), 3u);
}

TEST_F(CatalogTest, FusedGateUpAndBiasesBelongToTheBundle) {
  const std::string path = Write("m.gguf", 4, [](GgufWriter& w) {
    ASSERT_TRUE(w.AddTensor("blk.0.ffn_gate_up_exps.weight", ggml::kMXFP4, {64, 16, 4}).ok());
    ASSERT_TRUE(w.AddTensor("blk.0.ffn_gate_up_exps.bias", ggml::kF32, {16, 4}).ok());
    ASSERT_TRUE(w.AddTensor("blk.0.ffn_down_exps.weight", ggml::kMXFP4, {32, 64, 4}).ok());
    ASSERT_TRUE(w.AddTensor("blk.0.ffn_down_exps.bias", ggml::kF32, {64, 4}).ok());
  });
  const auto c = Catalog(path);
  ASSERT_TRUE(c.ok()) << c.status();
  const MoeLayer& l = c->layers()[0];
  ASSERT_EQ(l.projections.size(), 4u);
  // Order: gate_up, down, then biases. mxfp4: 17 bytes per 32 elements.
  EXPECT_EQ(l.projections[0].kind, ProjectionKind::kGateUp);
  EXPECT_EQ(l.projections[0].expert_bytes, 16u * 2 * 17);  // 544
  EXPECT_EQ(l.projections[1].kind, ProjectionKind::kDown);
  EXPECT_EQ(l.projections[1].expert_bytes, 64u * 17);  // 1088
  EXPECT_EQ(l.projections[1].bundle_offset, 768u);
  EXPECT_EQ(l.projections[2].kind, ProjectionKind::kGateUpBias);
  EXPECT_EQ(l.projections[2].expert_bytes, 16u * 4);
  EXPECT_EQ(l.projections[2].bundle_offset, 768u + 1280u);
  EXPECT_EQ(l.projections[3].kind, ProjectionKind::kDownBias);
  EXPECT_EQ(l.projections[3].expert_bytes, 64u * 4);
  EXPECT_EQ(l.projections[3].ne1, 1u);
  const GgufTensorInfo& bias = Tensor("blk.0.ffn_down_exps.bias");
  const auto loc = c->Locate(0, 3, 3);
  ASSERT_TRUE(loc.ok());
  EXPECT_EQ(loc->offset, bias.file_offset + 3 * 256);
}

TEST_F(CatalogTest, LegacyPerExpertTensors) {
  const std::string path = Write("m.gguf", 4, [](GgufWriter& w) {
    for (int e = 0; e < 4; ++e) {
      const std::string s = std::to_string(e);
      ASSERT_TRUE(w.AddTensor("blk.0.ffn_gate." + s + ".weight", ggml::kQ8_0, {64, 4}).ok());
      ASSERT_TRUE(w.AddTensor("blk.0.ffn_down." + s + ".weight", ggml::kQ8_0, {32, 8}).ok());
      ASSERT_TRUE(w.AddTensor("blk.0.ffn_up." + s + ".weight", ggml::kQ8_0, {64, 4}).ok());
    }
  });
  const auto c = Catalog(path);
  ASSERT_TRUE(c.ok()) << c.status();
  const MoeLayer& l = c->layers()[0];
  EXPECT_TRUE(l.legacy_layout);
  EXPECT_EQ(l.n_expert, 4u);
  ASSERT_EQ(l.projections.size(), 3u);
  EXPECT_EQ(l.projections[0].tensor, "blk.0.ffn_gate_exps.weight");  // the name indexes use
  EXPECT_EQ(l.projections[1].tensor, "blk.0.ffn_up_exps.weight");
  EXPECT_EQ(l.projections[2].tensor, "blk.0.ffn_down_exps.weight");
  EXPECT_EQ(l.projections[2].expert_bytes, 8u * 34);
  for (uint32_t e = 0; e < 4; ++e) {
    const auto loc = c->Locate(0, e, 1);
    ASSERT_TRUE(loc.ok());
    EXPECT_EQ(loc->offset, Tensor("blk.0.ffn_up." + std::to_string(e) + ".weight").file_offset);
  }
}

TEST_F(CatalogTest, LegacyMissingExpertIsAnError) {
  const std::string path = Write("m.gguf", 0, [](GgufWriter& w) {
    ASSERT_TRUE(w.AddTensor("blk.0.ffn_gate.0.weight", ggml::kQ8_0, {64, 4}).ok());
    ASSERT_TRUE(w.AddTensor("blk.0.ffn_gate.2.weight", ggml::kQ8_0, {64, 4}).ok());
  });
  EXPECT_TRUE(IsError(Catalog(path).status(), absl::StatusCode::kInvalidArgument,
                      ErrorKind::kBadValue, {"m.gguf", "missing expert 1"}));
}

TEST_F(CatalogTest, ExpertCountDisagreeingWithMetadata) {
  const std::string path = Write("m.gguf", 8, [](GgufWriter& w) { AddLayer(w, 0, ggml::kQ8_0, 6); });
  EXPECT_TRUE(IsError(Catalog(path).status(), absl::StatusCode::kInvalidArgument,
                      ErrorKind::kBadValue, {"m.gguf", "byte ", "holds 6 experts", "has 8"}));
}

TEST_F(CatalogTest, NoMoeLayers) {
  const auto c = Catalog(::expertd::testing::SharedDataDir() + "/gguf/ollama__llama-2-tiny-random.gguf");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->layers().empty());
  EXPECT_EQ(c->expert_bytes_total(), 0u);
}

TEST_F(CatalogTest, IndexOverlayV2) {
  const std::string path = Write("m.gguf", 8, [](GgufWriter& w) { AddLayer(w, 1, ggml::kQ8_0); });
  ::expertd::testing::WriteFile(dir_.File("q.pack"), std::string(8192, '\0'));
  ::expertd::testing::WriteFile(
      dir_.File("m.idx"),
      "# optane-moe-index-v2\n"
      "@pack\t7\tfast\tq.pack\n"
      "blk.1.ffn_gate_exps.weight\t3\t7\t4096\t272\n"   // line 3: used
      "blk.1.ffn_up_exps.weight\t3\t7\t0\t100\n"        // line 4: wrong size, ignored
      "blk.9.ffn_up_exps.weight\t0\t7\t0\t272\n"        // line 5: no such tensor
      "blk.1.ffn_down_exps.weight\t8\t7\t0\t144\n");    // line 6: expert out of range
  const auto index = ExpertIndex::Read(dir_.File("m.idx"), IndexOptions{});
  ASSERT_TRUE(index.ok()) << index.status();
  const auto c = Catalog(path, &*index);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->packs().size(), 2u);
  EXPECT_EQ(c->packs()[0].kind, PackInfo::Kind::kGguf);
  EXPECT_EQ(c->packs()[1].label, "fast");
  EXPECT_EQ(c->packs()[1].size, 8192u);
  const auto hit = c->Locate(1, 3, 0);
  ASSERT_TRUE(hit.ok());
  EXPECT_EQ(hit->pack, 1u);
  EXPECT_EQ(hit->offset, 4096u);
  EXPECT_EQ(hit->index_line, 3);
  const auto fallback = c->Locate(1, 3, 1);  // wrong-size row: read from P
  ASSERT_TRUE(fallback.ok());
  EXPECT_EQ(fallback->pack, 0u);
  EXPECT_EQ(fallback->offset, Tensor("blk.1.ffn_up_exps.weight").file_offset + 3 * 272);
  EXPECT_EQ(c->Locate(1, 2, 0)->pack, 0u);  // not in the index
  ASSERT_EQ(c->ignored_index_rows().size(), 3u);
  EXPECT_EQ(c->ignored_index_rows()[0].line, 4);
  EXPECT_NE(c->ignored_index_rows()[0].reason.find("differs"), std::string::npos);
  EXPECT_EQ(c->ignored_index_rows()[1].line, 5);
  EXPECT_EQ(c->ignored_index_rows()[2].line, 6);
}

TEST_F(CatalogTest, IndexOverlayV1Parity) {
  const std::string path = Write("m.gguf", 8, [](GgufWriter& w) { AddLayer(w, 0, ggml::kQ8_0); });
  ::expertd::testing::WriteFile(dir_.File("q.pack"), std::string(4 * 272, '\0'));
  ::expertd::testing::WriteFile(dir_.File("v1.idx"), "blk.0.ffn_gate_exps.weight\t0 272 1 8\n");
  IndexOptions options;
  options.v1_q_pack = dir_.File("q.pack");
  const auto index = ExpertIndex::Read(dir_.File("v1.idx"), options);
  ASSERT_TRUE(index.ok()) << index.status();
  const auto c = Catalog(path, &*index);
  ASSERT_TRUE(c.ok()) << c.status();
  for (uint32_t e = 0; e < 8; ++e) {
    const auto loc = c->Locate(0, e, 0);
    ASSERT_TRUE(loc.ok());
    if (e % 2 == 1) {
      EXPECT_EQ(loc->pack, 1u) << e;
      EXPECT_EQ(loc->offset, (e / 2) * 272u) << e;
    } else {
      EXPECT_EQ(loc->pack, 0u) << e;
    }
  }
  EXPECT_EQ(c->Locate(0, 1, 1)->pack, 0u);  // up has no v1 row
}

}  // namespace
}  // namespace expertd
