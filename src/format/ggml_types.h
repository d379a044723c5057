// The ggml tensor types that can appear in a GGUF file: id, name and block geometry. The table
// decides how many bytes an expert of a quantized projection occupies.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

namespace expertd {

struct GgmlType {
  uint32_t id;
  std::string_view name;     // ggml's type name, lower case as ggml prints it (e.g. "q4_K")
  uint32_t block_elements;   // elements per block (1 for plain types)
  uint32_t block_bytes;      // bytes per block
};

// Type ids as GGUF stores them (ggml's enum ggml_type).
namespace ggml {
inline constexpr uint32_t kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7,
                          kQ8_0 = 8, kQ8_1 = 9, kQ2_K = 10, kQ3_K = 11, kQ4_K = 12, kQ5_K = 13,
                          kQ6_K = 14, kQ8_K = 15, kIQ2_XXS = 16, kIQ2_XS = 17, kIQ3_XXS = 18,
                          kIQ1_S = 19, kIQ4_NL = 20, kIQ3_S = 21, kIQ2_S = 22, kIQ4_XS = 23,
                          kI8 = 24, kI16 = 25, kI32 = 26, kI64 = 27, kF64 = 28, kIQ1_M = 29,
                          kBF16 = 30, kTQ1_0 = 34, kTQ2_0 = 35, kMXFP4 = 39, kNVFP4 = 40;
}  // namespace ggml

// The type with this id, or nullopt for ids ggml never assigned or has removed
// (4, 5: Q4_2/Q4_3; 31-33, 36-38: the repacked CPU layouts, which never appear in files).
std::optional<GgmlType> FindGgmlType(uint32_t id);

// Lookup by name, case-insensitive ("Q4_K", "q4_k", "mxfp4").
std::optional<GgmlType> FindGgmlTypeByName(std::string_view name);

// Every known type, in id order.
std::span<const GgmlType> AllGgmlTypes();

// Bytes of one row of `elements` elements; nullopt when `elements` is not a multiple of the
// block size or the product overflows.
std::optional<uint64_t> GgmlRowBytes(const GgmlType& type, uint64_t elements);

}  // namespace expertd
