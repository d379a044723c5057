// GGUF v3 writer (little-endian, ggml's docs/gguf.md). The header — KVs and tensor infos — is
// built in memory as things are added; tensor data is produced by a caller-supplied fill function
// in bounded chunks while the file is written, so multi-GiB files stream with a few MiB of memory.
//
// Layout written, as ggml's own writer does: header, KVs, tensor infos, zero padding to the
// alignment (also when there are no tensors), then each tensor's data followed by zero padding to
// the alignment. Offsets are packed in declaration order:
//   offset_i = sum over j < i of align_up(nbytes_j, alignment).
//
// Everything added is validated (key and name lengths, duplicates, n_dims, block multiples,
// size overflow) and rejected with an InvalidArgument status carrying an ErrorKind; a rejected
// addition leaves the writer unchanged. Not thread-safe.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "format/ggml_types.h"
#include "format/gguf.h"

namespace expertd {

class WriteFile;

// One tensor as it will be written.
struct GgufWriterTensor {
  std::string name;
  GgmlType type{};
  uint32_t n_dims = 0;
  std::array<uint64_t, 4> ne{1, 1, 1, 1};  // unused dims are 1
  uint64_t nbytes = 0;                     // unpadded data bytes
  uint64_t offset = 0;                     // relative to the data section
};

class GgufWriter {
 public:
  static constexpr uint64_t kDefaultAlignment = 32;
  // ggml's GGML_MAX_NAME is 64 including the terminating NUL.
  static constexpr size_t kMaxTensorName = 63;
  static constexpr size_t kMaxKeyBytes = 65535;
  static constexpr uint32_t kMaxDims = 4;

  // Produces the bytes [offset, offset + out.size()) of tensor `tensor_index`'s data. Called in
  // order, in chunks of at most a few MiB; an error aborts the write.
  using FillFn =
      std::function<absl::Status(size_t tensor_index, uint64_t offset, std::span<uint8_t> out)>;
  // Called after each chunk reaches the file with the bytes of this file written so far.
  using ProgressFn = std::function<void(uint64_t bytes_written)>;

  // Adds a scalar KV; the alternative `value` holds decides the GGUF type (uint32_t → u32,
  // std::string → string, ...), so write `GgufScalar(uint32_t{4})` rather than a bare literal.
  // Adding `general.alignment` (u32, a power of two) sets the alignment; it must come before the
  // first tensor.
  absl::Status AddKv(std::string_view key, GgufScalar value);
  // Adds an array KV whose elements all hold the alternative of `element_type`. Nested arrays are
  // not supported.
  absl::Status AddArray(std::string_view key, GgufType element_type,
                        std::span<const GgufScalar> elements);
  absl::Status AddStringArray(std::string_view key, std::span<const std::string> elements);

  // Sets the data alignment (a power of two). A non-default value is written as the u32 KV
  // `general.alignment` at this point of the KV list. Must precede the first AddTensor.
  absl::Status SetAlignment(uint32_t alignment);

  // Declares a tensor with ggml type id `type` and dims `ne` (ne[0] innermost, 1..4 dims, each
  // at least 1, ne[0] a multiple of the type's block size). Its data comes from FillFn.
  absl::Status AddTensor(std::string_view name, uint32_t type, std::span<const uint64_t> ne);
  absl::Status AddTensor(std::string_view name, uint32_t type, std::initializer_list<uint64_t> ne) {
    return AddTensor(name, type, std::span<const uint64_t>(ne.begin(), ne.size()));
  }

  uint64_t alignment() const { return alignment_; }
  uint64_t kv_count() const { return kv_count_; }
  const std::vector<GgufWriterTensor>& tensors() const { return tensors_; }
  // Absolute offset of the data section (header, KVs and tensor infos, padded).
  uint64_t data_offset() const;
  // Bytes of the data section, each tensor padded to the alignment.
  uint64_t data_size() const { return data_size_; }
  // Size of the file Write() produces.
  uint64_t file_size() const { return data_offset() + data_size_; }

  // Creates (truncating) `path` and writes the whole file. `fill` may be empty when there are no
  // tensors; `progress` may be empty. On error the partial file is removed.
  absl::Status Write(const std::string& path, const FillFn& fill,
                     const ProgressFn& progress = nullptr) const;

 private:
  absl::Status CheckNewKey(std::string_view key) const;
  void AppendKeyAndType(std::string_view key, GgufType type);
  absl::Status WriteBody(WriteFile& file, const FillFn& fill, const ProgressFn& progress) const;
  std::vector<uint8_t> EncodeHeader() const;

  uint64_t alignment_ = kDefaultAlignment;
  uint64_t kv_count_ = 0;
  std::vector<uint8_t> kv_bytes_;  // the encoded KV section
  absl::flat_hash_map<std::string, size_t> keys_;
  std::vector<GgufWriterTensor> tensors_;
  absl::flat_hash_map<std::string, size_t> tensor_index_;
  uint64_t tensor_info_bytes_ = 0;  // encoded size of the tensor infos
  uint64_t data_size_ = 0;
};

}  // namespace expertd
