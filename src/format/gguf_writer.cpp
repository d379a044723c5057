#include "format/gguf_writer.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <system_error>
#include <type_traits>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "util/checked.h"
#include "util/file.h"
#include "util/status.h"

namespace expertd {
namespace {

constexpr std::string_view kAlignmentKey = "general.alignment";
constexpr uint32_t kGgufVersion = 3;
// Fixed part of the header: magic, version, tensor count, KV count.
constexpr uint64_t kFixedHeaderBytes = 4 + 4 + 8 + 8;
// Data is produced and written in chunks of this size: large enough that a write costs far
// more than the call, small enough to keep memory bounded.
constexpr size_t kChunkBytes = size_t{4} << 20;

template <typename T>
void PutLe(std::vector<uint8_t>& out, T value) {
  using U = std::make_unsigned_t<T>;
  const U bits = static_cast<U>(value);
  for (size_t i = 0; i < sizeof(U); ++i) out.push_back(static_cast<uint8_t>(bits >> (8 * i)));
}

void PutString(std::vector<uint8_t>& out, std::string_view s) {
  PutLe<uint64_t>(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}

// GgufScalar's alternatives are in GGUF type order with kArray (9) left out.
GgufType TypeOf(const GgufScalar& value) {
  const auto index = static_cast<uint32_t>(value.index());
  return static_cast<GgufType>(index < 9 ? index : index + 1);
}

void PutScalar(std::vector<uint8_t>& out, const GgufScalar& value) {
  std::visit(
      [&out](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::string>) {
          PutString(out, v);
        } else if constexpr (std::is_same_v<T, bool>) {
          out.push_back(v ? 1 : 0);
        } else if constexpr (std::is_same_v<T, float>) {
          PutLe(out, std::bit_cast<uint32_t>(v));
        } else if constexpr (std::is_same_v<T, double>) {
          PutLe(out, std::bit_cast<uint64_t>(v));
        } else {
          PutLe(out, v);
        }
      },
      value);
}

bool IsValueType(GgufType type) {
  return static_cast<uint32_t>(type) <= static_cast<uint32_t>(GgufType::kF64);
}

uint64_t AlignUp(uint64_t value, uint64_t alignment) {
  return (value + alignment - 1) & ~(alignment - 1);
}

}  // namespace

absl::Status GgufWriter::CheckNewKey(std::string_view key) const {
  if (key.empty()) return InvalidError(ErrorKind::kBadValue, "GGUF writer: empty KV key");
  if (key.size() > kMaxKeyBytes) {
    return InvalidError(ErrorKind::kBadValue, absl::StrCat("GGUF writer: KV key of ", key.size(),
                                                           " bytes (at most ", kMaxKeyBytes, ")"));
  }
  if (keys_.contains(AV(key))) {
    return InvalidError(ErrorKind::kDuplicate,
                        absl::StrCat("GGUF writer: duplicate KV key '", AV(key), "'"));
  }
  return absl::OkStatus();
}

void GgufWriter::AppendKeyAndType(std::string_view key, GgufType type) {
  keys_.emplace(std::string(key), static_cast<size_t>(kv_count_));
  ++kv_count_;
  PutString(kv_bytes_, key);
  PutLe(kv_bytes_, static_cast<uint32_t>(type));
}

absl::Status GgufWriter::AddKv(std::string_view key, GgufScalar value) {
  RETURN_IF_ERROR(CheckNewKey(key));
  if (key == kAlignmentKey) {
    // ggml's reader reads the alignment with gguf_get_val_u32, so any other type is unreadable.
    const uint32_t* alignment = std::get_if<uint32_t>(&value);
    if (alignment == nullptr || !IsPowerOfTwo(*alignment)) {
      return InvalidError(ErrorKind::kBadValue, absl::StrCat("GGUF writer: '", AV(kAlignmentKey),
                                                             "' must be a u32 power of two, got ",
                                                             FormatGgufScalar(value)));
    }
    if (!tensors_.empty()) {
      return InvalidError(ErrorKind::kBadValue,
                          absl::StrCat("GGUF writer: '", AV(kAlignmentKey),
                                       "' must be set before the first tensor"));
    }
    alignment_ = *alignment;
  }
  AppendKeyAndType(key, TypeOf(value));
  PutScalar(kv_bytes_, value);
  return absl::OkStatus();
}

absl::Status GgufWriter::AddArray(std::string_view key, GgufType element_type,
                                  std::span<const GgufScalar> elements) {
  RETURN_IF_ERROR(CheckNewKey(key));
  if (!IsValueType(element_type) || element_type == GgufType::kArray) {
    return InvalidError(
        ErrorKind::kUnknownType,
        absl::StrCat("GGUF writer: array '", AV(key), "' has element type ",
                     static_cast<uint32_t>(element_type), " (nested arrays are not supported)"));
  }
  for (size_t i = 0; i < elements.size(); ++i) {
    if (TypeOf(elements[i]) != element_type) {
      return InvalidError(ErrorKind::kBadValue,
                          absl::StrCat("GGUF writer: array '", AV(key), "' element ", i, " is ",
                                       AV(GgufTypeName(TypeOf(elements[i]))), ", expected ",
                                       AV(GgufTypeName(element_type))));
    }
  }
  if (key == kAlignmentKey) {
    return InvalidError(ErrorKind::kBadValue,
                        absl::StrCat("GGUF writer: '", AV(kAlignmentKey), "' cannot be an array"));
  }
  AppendKeyAndType(key, GgufType::kArray);
  PutLe(kv_bytes_, static_cast<uint32_t>(element_type));
  PutLe<uint64_t>(kv_bytes_, elements.size());
  for (const GgufScalar& element : elements) PutScalar(kv_bytes_, element);
  return absl::OkStatus();
}

absl::Status GgufWriter::AddStringArray(std::string_view key,
                                        std::span<const std::string> elements) {
  RETURN_IF_ERROR(CheckNewKey(key));
  if (key == kAlignmentKey) {
    return InvalidError(ErrorKind::kBadValue,
                        absl::StrCat("GGUF writer: '", AV(kAlignmentKey), "' cannot be an array"));
  }
  AppendKeyAndType(key, GgufType::kArray);
  PutLe(kv_bytes_, static_cast<uint32_t>(GgufType::kString));
  PutLe<uint64_t>(kv_bytes_, elements.size());
  for (const std::string& element : elements) PutString(kv_bytes_, element);
  return absl::OkStatus();
}

absl::Status GgufWriter::SetAlignment(uint32_t alignment) {
  if (!IsPowerOfTwo(alignment)) {
    return InvalidError(ErrorKind::kBadValue, absl::StrCat("GGUF writer: alignment ", alignment,
                                                           " is not a power of two"));
  }
  if (!tensors_.empty()) {
    return InvalidError(ErrorKind::kBadValue,
                        "GGUF writer: the alignment must be set before the first tensor");
  }
  // The default needs no KV, unless one was written already (then AddKv reports the duplicate).
  if (alignment == kDefaultAlignment && !keys_.contains(AV(kAlignmentKey))) {
    alignment_ = alignment;
    return absl::OkStatus();
  }
  return AddKv(kAlignmentKey, GgufScalar(alignment));
}

absl::Status GgufWriter::AddTensor(std::string_view name, uint32_t type,
                                   std::span<const uint64_t> ne) {
  const auto bad = [name](ErrorKind kind, std::string_view what) {
    return InvalidError(kind, absl::StrCat("GGUF writer: tensor '", AV(name), "': ", AV(what)));
  };
  if (name.empty()) return InvalidError(ErrorKind::kBadValue, "GGUF writer: empty tensor name");
  if (name.size() > kMaxTensorName) {
    return bad(ErrorKind::kBadValue,
               absl::StrCat("name is ", name.size(), " bytes (at most ", kMaxTensorName, ")"));
  }
  if (tensor_index_.contains(AV(name))) return bad(ErrorKind::kDuplicate, "duplicate tensor name");
  if (ne.empty() || ne.size() > kMaxDims) {
    return bad(ErrorKind::kBadValue, absl::StrCat("n_dims ", ne.size(), " (must be 1..4)"));
  }
  const std::optional<GgmlType> ggml_type = FindGgmlType(type);
  if (!ggml_type) return bad(ErrorKind::kUnknownType, absl::StrCat("unknown ggml type ", type));

  // ggml keeps ne and the element count in int64_t.
  constexpr uint64_t kMaxInt64 = std::numeric_limits<int64_t>::max();
  GgufWriterTensor tensor;
  tensor.name = std::string(name);
  tensor.type = *ggml_type;
  tensor.n_dims = static_cast<uint32_t>(ne.size());
  uint64_t elements = 1;
  for (size_t d = 0; d < ne.size(); ++d) {
    if (ne[d] == 0) return bad(ErrorKind::kBadValue, absl::StrCat("ne[", d, "] is 0"));
    const std::optional<uint64_t> product = CheckedMul(elements, ne[d]);
    if (!product || *product > kMaxInt64) {
      return bad(ErrorKind::kOverflow, "element count overflows int64");
    }
    elements = *product;
    tensor.ne[d] = ne[d];
  }
  if (ne[0] % ggml_type->block_elements != 0) {
    return bad(ErrorKind::kBadValue,
               absl::StrCat("ne[0] = ", ne[0], " is not a multiple of the ", AV(ggml_type->name),
                            " block size ", ggml_type->block_elements));
  }
  const std::optional<uint64_t> row_bytes = GgmlRowBytes(*ggml_type, ne[0]);
  const std::optional<uint64_t> nbytes =
      row_bytes ? CheckedMul(*row_bytes, elements / ne[0]) : std::nullopt;
  const std::optional<uint64_t> padded =
      nbytes ? CheckedAlignUp(*nbytes, alignment_) : std::nullopt;
  const std::optional<uint64_t> data_size = padded ? CheckedAdd(data_size_, *padded) : std::nullopt;
  if (!data_size || *data_size > kMaxInt64) {
    return bad(ErrorKind::kOverflow, "data size overflows int64");
  }
  tensor.nbytes = *nbytes;
  tensor.offset = data_size_;

  data_size_ = *data_size;
  tensor_info_bytes_ += 8 + name.size() + 4 + 8 * ne.size() + 4 + 8;
  tensor_index_.emplace(tensor.name, tensors_.size());
  tensors_.push_back(std::move(tensor));
  return absl::OkStatus();
}

uint64_t GgufWriter::data_offset() const {
  return AlignUp(kFixedHeaderBytes + kv_bytes_.size() + tensor_info_bytes_, alignment_);
}

std::vector<uint8_t> GgufWriter::EncodeHeader() const {
  std::vector<uint8_t> out;
  const uint64_t size = data_offset();
  out.reserve(size);
  for (const char c : std::string_view("GGUF")) out.push_back(static_cast<uint8_t>(c));
  PutLe(out, kGgufVersion);
  PutLe<uint64_t>(out, tensors_.size());
  PutLe<uint64_t>(out, kv_count_);
  out.insert(out.end(), kv_bytes_.begin(), kv_bytes_.end());
  for (const GgufWriterTensor& t : tensors_) {
    PutString(out, t.name);
    PutLe(out, t.n_dims);
    for (uint32_t d = 0; d < t.n_dims; ++d) PutLe(out, t.ne[d]);
    PutLe(out, t.type.id);
    PutLe(out, t.offset);
  }
  out.resize(size, 0);
  return out;
}

absl::Status GgufWriter::WriteBody(WriteFile& file, const FillFn& fill,
                                   const ProgressFn& progress) const {
  RETURN_IF_ERROR(file.Append(EncodeHeader()));
  if (progress) progress(file.written());

  // Tensor data and padding are gathered into one buffer so that small tensors and padding cost
  // no extra system calls.
  std::vector<uint8_t> chunk(std::min<uint64_t>(kChunkBytes, std::max<uint64_t>(data_size_, 1)));
  size_t used = 0;
  const auto flush = [&]() -> absl::Status {
    if (used == 0) return absl::OkStatus();
    RETURN_IF_ERROR(file.Append(std::span<const uint8_t>(chunk.data(), used)));
    used = 0;
    if (progress) progress(file.written());
    return absl::OkStatus();
  };
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const GgufWriterTensor& t = tensors_[i];
    for (uint64_t done = 0; done < t.nbytes;) {
      if (used == chunk.size()) RETURN_IF_ERROR(flush());
      const size_t n =
          static_cast<size_t>(std::min<uint64_t>(chunk.size() - used, t.nbytes - done));
      RETURN_IF_ERROR(fill(i, done, std::span<uint8_t>(chunk.data() + used, n)));
      used += n;
      done += n;
    }
    for (uint64_t pad = AlignUp(t.nbytes, alignment_) - t.nbytes; pad > 0;) {
      if (used == chunk.size()) RETURN_IF_ERROR(flush());
      const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk.size() - used, pad));
      std::memset(chunk.data() + used, 0, n);
      used += n;
      pad -= n;
    }
  }
  RETURN_IF_ERROR(flush());
  if (file.written() != file_size()) {
    return absl::InternalError(absl::StrCat("GGUF writer: ", file.path(), " has ", file.written(),
                                            " bytes, planned ", file_size()));
  }
  return absl::OkStatus();
}

absl::Status GgufWriter::Write(const std::string& path, const FillFn& fill,
                               const ProgressFn& progress) const {
  if (!tensors_.empty() && !fill) {
    return InvalidError(ErrorKind::kBadValue,
                        absl::StrCat("GGUF writer: ", path, ": tensors but no fill function"));
  }
  absl::Status status;
  {
    absl::StatusOr<WriteFile> file = WriteFile::Create(path);
    if (!file.ok()) return file.status();
    status = WriteBody(*file, fill, progress);
    if (status.ok()) status = file->Close();
  }
  if (!status.ok()) {
    std::error_code ignored;  // the write error is the one worth reporting
    std::filesystem::remove(path, ignored);
  }
  return status;
}

}  // namespace expertd
