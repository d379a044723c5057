#include "format/ggml_types.h"

#include <gtest/gtest.h>

#include <set>

namespace expertd {
namespace {

// Block sizes from ggml-common.h's block structs, written out here as the expected values.
TEST(GgmlTypes, BlockGeometryOfTypesUsedByMoeModels) {
  struct Expect {
    const char* name;
    uint32_t id, elements, bytes;
  };
  for (const Expect& e : {Expect{"F32", 0, 1, 4}, Expect{"F16", 1, 1, 2},
                          Expect{"BF16", 30, 1, 2}, Expect{"Q4_0", 2, 32, 18},
                          Expect{"Q8_0", 8, 32, 34}, Expect{"Q2_K", 10, 256, 84},
                          Expect{"Q3_K", 11, 256, 110}, Expect{"Q4_K", 12, 256, 144},
                          Expect{"Q5_K", 13, 256, 176}, Expect{"Q6_K", 14, 256, 210},
                          Expect{"Q8_K", 15, 256, 292}, Expect{"IQ2_XXS", 16, 256, 66},
                          Expect{"IQ2_XS", 17, 256, 74}, Expect{"IQ3_XXS", 18, 256, 98},
                          Expect{"IQ1_S", 19, 256, 50}, Expect{"IQ4_NL", 20, 32, 18},
                          Expect{"IQ3_S", 21, 256, 110}, Expect{"IQ2_S", 22, 256, 82},
                          Expect{"IQ4_XS", 23, 256, 136}, Expect{"IQ1_M", 29, 256, 56},
                          Expect{"TQ1_0", 34, 256, 54}, Expect{"TQ2_0", 35, 256, 66},
                          Expect{"MXFP4", 39, 32, 17}, Expect{"NVFP4", 40, 64, 36}}) {
    const auto by_name = FindGgmlTypeByName(e.name);
    ASSERT_TRUE(by_name.has_value()) << e.name;
    EXPECT_EQ(by_name->id, e.id) << e.name;
    const auto t = FindGgmlType(e.id);
    ASSERT_TRUE(t.has_value()) << e.name;
    EXPECT_EQ(t->block_elements, e.elements) << e.name;
    EXPECT_EQ(t->block_bytes, e.bytes) << e.name;
  }
}

TEST(GgmlTypes, RemovedAndRepackedIdsAreUnknown) {
  for (uint32_t id : {4u, 5u, 31u, 32u, 33u, 36u, 37u, 38u, 41u, 255u}) {
    EXPECT_FALSE(FindGgmlType(id).has_value()) << id;
  }
}

TEST(GgmlTypes, IdsAndNamesAreUnique) {
  std::set<uint32_t> ids;
  std::set<std::string_view> names;
  for (const GgmlType& t : AllGgmlTypes()) {
    EXPECT_TRUE(ids.insert(t.id).second) << t.id;
    EXPECT_TRUE(names.insert(t.name).second) << t.name;
  }
  EXPECT_EQ(ids.size(), 33u);
}

TEST(GgmlTypes, RowBytes) {
  const GgmlType q4k = *FindGgmlType(ggml::kQ4_K);
  EXPECT_EQ(GgmlRowBytes(q4k, 4096), 16u * 144u);
  EXPECT_FALSE(GgmlRowBytes(q4k, 100).has_value());
  EXPECT_EQ(GgmlRowBytes(*FindGgmlType(ggml::kMXFP4), 2880), 90u * 17u);
  EXPECT_FALSE(GgmlRowBytes(*FindGgmlType(ggml::kF32), ~uint64_t{0}).has_value());
}

}  // namespace
}  // namespace expertd
