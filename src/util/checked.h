// Overflow-checked unsigned arithmetic for sizes and offsets read from untrusted files.
#pragma once

#include <cstdint>
#include <optional>

namespace expertd {

inline std::optional<uint64_t> CheckedAdd(uint64_t a, uint64_t b) {
  uint64_t r;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

inline std::optional<uint64_t> CheckedMul(uint64_t a, uint64_t b) {
  uint64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// Rounds `value` up to a multiple of `alignment` (a power of two); nullopt on overflow.
inline std::optional<uint64_t> CheckedAlignUp(uint64_t value, uint64_t alignment) {
  const std::optional<uint64_t> bumped = CheckedAdd(value, alignment - 1);
  if (!bumped) return std::nullopt;
  return *bumped & ~(alignment - 1);
}

// True when [offset, offset + bytes) lies inside [0, size).
inline bool RangeInside(uint64_t offset, uint64_t bytes, uint64_t size) {
  const std::optional<uint64_t> end = CheckedAdd(offset, bytes);
  return end && *end <= size;
}

inline constexpr bool IsPowerOfTwo(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

}  // namespace expertd
