#include "format/ggml_types.h"

#include <array>

#include "absl/strings/match.h"
#include "util/checked.h"
#include "util/status.h"

namespace expertd {
namespace {

// Block geometry from ggml's block structs (ggml-common.h): QK_K = 256 super-blocks, 32-element
// legacy blocks, MXFP4 32 elements (e8m0 scale + 16 bytes), NVFP4 64 elements (4 ue4m3 scales +
// 32 bytes).
constexpr std::array kTypes = {
    GgmlType{0, "f32", 1, 4},          GgmlType{1, "f16", 1, 2},
    GgmlType{2, "q4_0", 32, 18},       GgmlType{3, "q4_1", 32, 20},
    GgmlType{6, "q5_0", 32, 22},       GgmlType{7, "q5_1", 32, 24},
    GgmlType{8, "q8_0", 32, 34},       GgmlType{9, "q8_1", 32, 36},
    GgmlType{10, "q2_K", 256, 84},     GgmlType{11, "q3_K", 256, 110},
    GgmlType{12, "q4_K", 256, 144},    GgmlType{13, "q5_K", 256, 176},
    GgmlType{14, "q6_K", 256, 210},    GgmlType{15, "q8_K", 256, 292},
    GgmlType{16, "iq2_xxs", 256, 66},  GgmlType{17, "iq2_xs", 256, 74},
    GgmlType{18, "iq3_xxs", 256, 98},  GgmlType{19, "iq1_s", 256, 50},
    GgmlType{20, "iq4_nl", 32, 18},    GgmlType{21, "iq3_s", 256, 110},
    GgmlType{22, "iq2_s", 256, 82},    GgmlType{23, "iq4_xs", 256, 136},
    GgmlType{24, "i8", 1, 1},          GgmlType{25, "i16", 1, 2},
    GgmlType{26, "i32", 1, 4},         GgmlType{27, "i64", 1, 8},
    GgmlType{28, "f64", 1, 8},         GgmlType{29, "iq1_m", 256, 56},
    GgmlType{30, "bf16", 1, 2},        GgmlType{34, "tq1_0", 256, 54},
    GgmlType{35, "tq2_0", 256, 66},    GgmlType{39, "mxfp4", 32, 17},
    GgmlType{40, "nvfp4", 64, 36},
};

}  // namespace

std::optional<GgmlType> FindGgmlType(uint32_t id) {
  for (const GgmlType& t : kTypes) {
    if (t.id == id) return t;
  }
  return std::nullopt;
}

std::optional<GgmlType> FindGgmlTypeByName(std::string_view name) {
  for (const GgmlType& t : kTypes) {
    if (absl::EqualsIgnoreCase(AV(t.name), AV(name))) return t;
  }
  return std::nullopt;
}

std::span<const GgmlType> AllGgmlTypes() { return kTypes; }

std::optional<uint64_t> GgmlRowBytes(const GgmlType& type, uint64_t elements) {
  if (elements % type.block_elements != 0) return std::nullopt;
  return CheckedMul(elements / type.block_elements, type.block_bytes);
}

}  // namespace expertd
