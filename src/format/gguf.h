// GGUF header reader (v3, v2 accepted). Reads only the header — KV section and tensor infos —
// through a small buffer, so inspecting a 400 GiB model costs a few reads and a few MB; tensor
// data is never touched. Every structural rule of ggml's reference reader is enforced with
// overflow-checked arithmetic, and every error names the file and the byte offset.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "format/ggml_types.h"

namespace expertd {

// GGUF value type ids (gguf.md).
enum class GgufType : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
  kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};
std::string_view GgufTypeName(GgufType type);

// One scalar value; the alternative held matches the KV's GgufType.
using GgufScalar = std::variant<uint8_t, int8_t, uint16_t, int16_t, uint32_t, int32_t, float, bool,
                                std::string, uint64_t, int64_t, double>;

// An array value. Arrays of up to kKeepAll elements are kept whole; longer ones (tokenizer
// vocabularies of 150k strings) keep their first kKeepHead elements and where they start, so the
// header stays small in memory.
struct GgufArray {
  static constexpr uint64_t kKeepAll = 4096;
  static constexpr uint64_t kKeepHead = 8;
  GgufType element_type = GgufType::kU8;
  uint64_t count = 0;
  uint64_t file_offset = 0;  // absolute offset of the first element
  std::vector<GgufScalar> elements;  // all elements, or the first kKeepHead
  bool complete() const { return elements.size() == count; }
};

struct GgufKv {
  std::string key;
  GgufType type = GgufType::kU8;
  uint64_t file_offset = 0;  // absolute offset of the KV record (its key length)
  GgufScalar scalar;         // when type != kArray
  GgufArray array;           // when type == kArray
};

struct GgufTensorInfo {
  std::string name;
  uint32_t n_dims = 0;
  std::array<uint64_t, 4> ne{1, 1, 1, 1};  // elements per dimension; unused dims are 1
  GgmlType type{};
  uint64_t offset = 0;       // relative to the data section, as stored
  uint64_t file_offset = 0;  // absolute byte offset of the tensor's data in its file
  uint64_t nbytes = 0;       // bytes of tensor data (unpadded)
  uint64_t info_offset = 0;  // absolute offset of the tensor-info record, for messages
  // Byte stride of dimension i (ggml's nb[i]): nb[0] = block bytes, nb[1] = row bytes, ...
  uint64_t nb(int i) const;
};

// Where the parser reads from: a file or, for fuzzing and tests, a byte buffer.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  virtual uint64_t size() const = 0;
  // Reads exactly out.size() bytes at offset; the caller never reads past size().
  virtual absl::Status ReadAt(uint64_t offset, std::span<uint8_t> out) const = 0;
};

class GgufFile {
 public:
  // Opens `path` and parses its header.
  static absl::StatusOr<GgufFile> Read(const std::string& path);
  // Parses a header from `source`; `name` is used in messages.
  static absl::StatusOr<GgufFile> Parse(const ByteSource& source, const std::string& name);
  // Parses an in-memory image (tests, fuzzing).
  static absl::StatusOr<GgufFile> ParseBytes(std::span<const uint8_t> bytes,
                                             const std::string& name);

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  uint64_t file_size() const { return file_size_; }
  // Bytes of the data section the tensors use, with each tensor padded to the alignment.
  uint64_t data_size() const { return data_size_; }
  const std::vector<GgufKv>& kvs() const { return kvs_; }
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }

  const GgufKv* FindKv(std::string_view key) const;
  const GgufTensorInfo* FindTensor(std::string_view name) const;
  // Any integer-typed scalar KV as uint64 (negative values give nullopt).
  std::optional<uint64_t> GetUint(std::string_view key) const;
  std::optional<std::string> GetString(std::string_view key) const;

 private:
  friend class GgufParser;
  std::string path_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  uint64_t file_size_ = 0;
  uint64_t data_size_ = 0;
  std::vector<GgufKv> kvs_;
  std::vector<GgufTensorInfo> tensors_;
};

// Formats a scalar for display ("3", "0.5", "true", a quoted string).
std::string FormatGgufScalar(const GgufScalar& value);

}  // namespace expertd
