// Content hashes for verification (xxHash XXH3-64).
#pragma once

#include <cstdint>
#include <span>

namespace expertd {

uint64_t Xxh3(std::span<const uint8_t> bytes);

// Streaming XXH3-64 for data read in chunks.
class Xxh3Stream {
 public:
  Xxh3Stream();
  ~Xxh3Stream();
  Xxh3Stream(const Xxh3Stream&) = delete;
  Xxh3Stream& operator=(const Xxh3Stream&) = delete;
  void Update(std::span<const uint8_t> bytes);
  uint64_t Digest() const;

 private:
  void* state_;
};

}  // namespace expertd
