#include "format/gguf.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "util/checked.h"
#include "util/file.h"
#include "util/status.h"

namespace expertd {
namespace {

constexpr uint32_t kMaxDims = 4;
constexpr uint64_t kMaxTensorName = 63;          // ggml: GGML_MAX_NAME (64) incl. the NUL
constexpr uint64_t kMaxKeyBytes = 64 * 1024;     // far above any real key
constexpr uint64_t kMaxStringBytes = uint64_t{16} << 20;   // chat templates are ~100 KB; bound memory
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;      // empty key, type, one-byte value
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 4 + 8;  // empty name, n_dims 0, type, offset
constexpr uint64_t kBufferBytes = uint64_t{1} << 20;

uint64_t FixedSize(GgufType t) {
  switch (t) {
    case GgufType::kU8: case GgufType::kI8: case GgufType::kBool: return 1;
    case GgufType::kU16: case GgufType::kI16: return 2;
    case GgufType::kU32: case GgufType::kI32: case GgufType::kF32: return 4;
    case GgufType::kU64: case GgufType::kI64: case GgufType::kF64: return 8;
    case GgufType::kString: case GgufType::kArray: return 0;
  }
  return 0;
}

class MemorySource final : public ByteSource {
 public:
  explicit MemorySource(std::span<const uint8_t> bytes) : bytes_(bytes) {}
  uint64_t size() const override { return bytes_.size(); }
  absl::Status ReadAt(uint64_t offset, std::span<uint8_t> out) const override {
    std::memcpy(out.data(), bytes_.data() + offset, out.size());
    return absl::OkStatus();
  }

 private:
  std::span<const uint8_t> bytes_;
};

class FileSource final : public ByteSource {
 public:
  explicit FileSource(const ReadFile& file) : file_(file) {}
  uint64_t size() const override { return file_.size(); }
  absl::Status ReadAt(uint64_t offset, std::span<uint8_t> out) const override {
    return file_.ReadAt(offset, out);
  }

 private:
  const ReadFile& file_;
};

}  // namespace

// Sequential reader over a ByteSource with a bounded buffer. Every read is checked against the
// source size before it happens, so a lying count fails with kTruncated / kAbsurdCount instead of
// allocating or reading past the end.
class GgufParser {
 public:
  GgufParser(const ByteSource& source, const std::string& name) : src_(source), name_(name) {}

  absl::StatusOr<GgufFile> Run();

 private:
  template <typename... Args>
  absl::Status Fail(ErrorKind kind, uint64_t at, const Args&... args) const {
    const absl::StatusCode code = kind == ErrorKind::kOutOfBounds ? absl::StatusCode::kOutOfRange
                                  : kind == ErrorKind::kTruncated ? absl::StatusCode::kDataLoss
                                                                  : absl::StatusCode::kInvalidArgument;
    return MakeError(code, kind, absl::StrCat(name_, ": byte ", at, ": ", args...));
  }

  uint64_t remaining() const { return src_.size() - pos_; }

  absl::Status Need(uint64_t n, std::string_view what) const {
    if (n > remaining()) {
      return Fail(ErrorKind::kTruncated, pos_, "file ends while reading ", AV(what), " (need ", n,
                  " bytes, ", remaining(), " left of ", src_.size(), ")");
    }
    return absl::OkStatus();
  }

  absl::Status Read(void* out, uint64_t n, std::string_view what) {
    RETURN_IF_ERROR(Need(n, what));
    auto* dst = static_cast<uint8_t*>(out);
    while (n > 0) {
      if (pos_ < buf_start_ || pos_ >= buf_start_ + buf_.size()) {
        const uint64_t len = std::min<uint64_t>(kBufferBytes, src_.size() - pos_);
        buf_.resize(len);
        RETURN_IF_ERROR(src_.ReadAt(pos_, buf_));
        buf_start_ = pos_;
      }
      const uint64_t in_buf = pos_ - buf_start_;
      const uint64_t take = std::min<uint64_t>(n, buf_.size() - in_buf);
      std::memcpy(dst, buf_.data() + in_buf, take);
      dst += take;
      pos_ += take;
      n -= take;
    }
    return absl::OkStatus();
  }

  absl::Status Skip(uint64_t n, std::string_view what) {
    RETURN_IF_ERROR(Need(n, what));
    pos_ += n;
    return absl::OkStatus();
  }

  template <typename T>
  absl::StatusOr<T> Get(std::string_view what) {
    T v;
    RETURN_IF_ERROR(Read(&v, sizeof v, what));
    return v;
  }

  // A GGUF string: u64 length + bytes. Strings longer than `max` are rejected.
  absl::StatusOr<std::string> GetString(std::string_view what, uint64_t max) {
    const uint64_t at = pos_;
    ASSIGN_OR_RETURN(const uint64_t len, Get<uint64_t>(what));
    if (len > remaining()) {
      return Fail(ErrorKind::kTruncated, at, AV(what), " length ", len, " exceeds the ", remaining(),
                  " bytes left in the file");
    }
    if (len > max) return Fail(ErrorKind::kBadValue, at, AV(what), " length ", len, " exceeds ", max);
    std::string s(len, '\0');
    RETURN_IF_ERROR(Read(s.data(), len, what));
    return s;
  }

  absl::StatusOr<GgufScalar> GetScalar(GgufType t);
  absl::Status ReadKv(GgufFile& out);
  absl::Status ReadTensorInfo(GgufFile& out);
  absl::Status CheckLayout(GgufFile& out);

  const ByteSource& src_;
  const std::string& name_;
  uint64_t pos_ = 0;
  std::vector<uint8_t> buf_;
  uint64_t buf_start_ = 0;
  absl::flat_hash_map<std::string, uint64_t> key_at_;
  absl::flat_hash_map<std::string, uint64_t> tensor_at_;
};

absl::StatusOr<GgufScalar> GgufParser::GetScalar(GgufType t) {
  switch (t) {
    case GgufType::kU8: return Get<uint8_t>("u8 value");
    case GgufType::kI8: return Get<int8_t>("i8 value");
    case GgufType::kU16: return Get<uint16_t>("u16 value");
    case GgufType::kI16: return Get<int16_t>("i16 value");
    case GgufType::kU32: return Get<uint32_t>("u32 value");
    case GgufType::kI32: return Get<int32_t>("i32 value");
    case GgufType::kF32: return Get<float>("f32 value");
    case GgufType::kU64: return Get<uint64_t>("u64 value");
    case GgufType::kI64: return Get<int64_t>("i64 value");
    case GgufType::kF64: return Get<double>("f64 value");
    case GgufType::kBool: {
      const uint64_t at = pos_;
      ASSIGN_OR_RETURN(const uint8_t b, Get<uint8_t>("bool value"));
      if (b > 1) return Fail(ErrorKind::kBadValue, at, "bool value ", int{b}, " is not 0 or 1");
      return GgufScalar(b == 1);
    }
    case GgufType::kString: return GetString("string value", kMaxStringBytes);
    case GgufType::kArray: break;
  }
  return Fail(ErrorKind::kUnknownType, pos_, "no scalar of type ", static_cast<uint32_t>(t));
}

absl::Status GgufParser::ReadKv(GgufFile& out) {
  GgufKv kv;
  kv.file_offset = pos_;
  ASSIGN_OR_RETURN(kv.key, GetString("key", kMaxKeyBytes));
  if (auto [it, inserted] = key_at_.emplace(kv.key, kv.file_offset); !inserted) {
    return Fail(ErrorKind::kDuplicate, kv.file_offset, "duplicate key '", kv.key,
                "' (first at byte ", it->second, ")");
  }
  const uint64_t type_at = pos_;
  ASSIGN_OR_RETURN(const uint32_t type, Get<uint32_t>("value type"));
  if (type > static_cast<uint32_t>(GgufType::kF64)) {
    return Fail(ErrorKind::kUnknownType, type_at, "key '", kv.key, "' has unknown value type ",
                type);
  }
  kv.type = static_cast<GgufType>(type);
  if (kv.type != GgufType::kArray) {
    ASSIGN_OR_RETURN(kv.scalar, GetScalar(kv.type));
  } else {
    const uint64_t elem_at = pos_;
    ASSIGN_OR_RETURN(const uint32_t elem, Get<uint32_t>("array element type"));
    if (elem > static_cast<uint32_t>(GgufType::kF64)) {
      return Fail(ErrorKind::kUnknownType, elem_at, "array '", kv.key,
                  "' has unknown element type ", elem);
    }
    if (elem == static_cast<uint32_t>(GgufType::kArray)) {
      return Fail(ErrorKind::kUnknownType, elem_at, "array '", kv.key,
                  "' nests arrays, which GGUF does not allow");
    }
    GgufArray& a = kv.array;
    a.element_type = static_cast<GgufType>(elem);
    const uint64_t count_at = pos_;
    ASSIGN_OR_RETURN(a.count, Get<uint64_t>("array count"));
    const uint64_t min_bytes = a.element_type == GgufType::kString ? 8 : FixedSize(a.element_type);
    if (a.count > remaining() / min_bytes) {
      return Fail(ErrorKind::kAbsurdCount, count_at, "array '", kv.key, "' claims ", a.count,
                  " elements but only ", remaining(), " bytes are left");
    }
    a.file_offset = pos_;
    const uint64_t keep = a.count <= GgufArray::kKeepAll ? a.count : GgufArray::kKeepHead;
    a.elements.reserve(keep);
    for (uint64_t i = 0; i < a.count; ++i) {
      if (i < keep) {
        ASSIGN_OR_RETURN(GgufScalar v, GetScalar(a.element_type));
        a.elements.push_back(std::move(v));
      } else if (a.element_type == GgufType::kString) {
        const uint64_t at = pos_;
        ASSIGN_OR_RETURN(const uint64_t len, Get<uint64_t>("string length"));
        if (len > remaining()) {
          return Fail(ErrorKind::kTruncated, at, "array '", kv.key, "' element ", i, " length ",
                      len, " exceeds the ", remaining(), " bytes left");
        }
        pos_ += len;
      } else {
        // Fixed-size tail: skip it in one step (count was bounded against the file above).
        RETURN_IF_ERROR(Skip((a.count - i) * min_bytes, "array elements"));
        break;
      }
    }
  }
  if (kv.key == "general.alignment") {
    const auto* v = std::get_if<uint32_t>(&kv.scalar);
    if (kv.type != GgufType::kU32 || v == nullptr) {
      return Fail(ErrorKind::kBadValue, kv.file_offset, "general.alignment must be a u32, not ",
                  AV(GgufTypeName(kv.type)));
    }
    if (!IsPowerOfTwo(*v)) {
      return Fail(ErrorKind::kBadValue, kv.file_offset, "general.alignment ", *v,
                  " is not a power of two");
    }
    out.alignment_ = *v;
  }
  out.kvs_.push_back(std::move(kv));
  return absl::OkStatus();
}

absl::Status GgufParser::ReadTensorInfo(GgufFile& out) {
  GgufTensorInfo t;
  t.info_offset = pos_;
  ASSIGN_OR_RETURN(t.name, GetString("tensor name", std::numeric_limits<uint64_t>::max()));
  if (t.name.size() > kMaxTensorName) {
    return Fail(ErrorKind::kBadValue, t.info_offset, "tensor name of ", t.name.size(),
                " bytes exceeds ggml's limit of ", kMaxTensorName);
  }
  if (auto [it, inserted] = tensor_at_.emplace(t.name, t.info_offset); !inserted) {
    return Fail(ErrorKind::kDuplicate, t.info_offset, "duplicate tensor '", t.name,
                "' (first at byte ", it->second, ")");
  }
  const uint64_t dims_at = pos_;
  ASSIGN_OR_RETURN(t.n_dims, Get<uint32_t>("n_dims"));
  if (t.n_dims > kMaxDims) {
    return Fail(ErrorKind::kBadValue, dims_at, "tensor '", t.name, "' has ", t.n_dims,
                " dimensions (at most ", kMaxDims, ")");
  }
  uint64_t elements = 1;
  for (uint32_t d = 0; d < t.n_dims; ++d) {
    const uint64_t at = pos_;
    ASSIGN_OR_RETURN(const int64_t ne, Get<int64_t>("tensor shape"));
    if (ne < 0) {
      return Fail(ErrorKind::kBadValue, at, "tensor '", t.name, "' ne[", d, "] = ", ne,
                  " is negative");
    }
    t.ne[d] = static_cast<uint64_t>(ne);
    const std::optional<uint64_t> product = CheckedMul(elements, t.ne[d]);
    if (!product || *product > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return Fail(ErrorKind::kOverflow, at, "tensor '", t.name, "' element count overflows");
    }
    elements = *product;
  }
  const uint64_t type_at = pos_;
  ASSIGN_OR_RETURN(const uint32_t type_id, Get<uint32_t>("tensor type"));
  const std::optional<GgmlType> type = FindGgmlType(type_id);
  if (!type) {
    return Fail(ErrorKind::kUnknownType, type_at, "tensor '", t.name, "' has unknown ggml type ",
                type_id);
  }
  t.type = *type;
  const std::optional<uint64_t> row = GgmlRowBytes(t.type, t.ne[0]);
  if (!row) {
    return Fail(ErrorKind::kBadValue, type_at, "tensor '", t.name, "' ne[0] = ", t.ne[0],
                " is not a multiple of ", AV(t.type.name), "'s block size ", t.type.block_elements);
  }
  const std::optional<uint64_t> nbytes = CheckedMul(*row, elements / std::max<uint64_t>(t.ne[0], 1));
  if (!nbytes) return Fail(ErrorKind::kOverflow, type_at, "tensor '", t.name, "' size overflows");
  t.nbytes = t.ne[0] == 0 ? 0 : *nbytes;
  ASSIGN_OR_RETURN(t.offset, Get<uint64_t>("tensor offset"));
  out.tensors_.push_back(std::move(t));
  return absl::OkStatus();
}

// ggml's reference reader requires tensor data packed in declaration order, each tensor starting
// at the running size and padded to the alignment; expertd enforces the same so every file it
// accepts loads in llama.cpp, and additionally requires every tensor to lie inside its file.
absl::Status GgufParser::CheckLayout(GgufFile& out) {
  const std::optional<uint64_t> data_offset = CheckedAlignUp(pos_, out.alignment_);
  if (!data_offset) return Fail(ErrorKind::kOverflow, pos_, "data offset overflows");
  out.data_offset_ = *data_offset;
  uint64_t expected = 0;
  for (GgufTensorInfo& t : out.tensors_) {
    if (t.offset % out.alignment_ != 0) {
      return Fail(ErrorKind::kMisaligned, t.info_offset, "tensor '", t.name, "' data offset ",
                  t.offset, " is not a multiple of the alignment ", out.alignment_);
    }
    if (t.offset != expected) {
      return Fail(ErrorKind::kMisaligned, t.info_offset, "tensor '", t.name, "' data offset ",
                  t.offset, ", expected ", expected,
                  " (tensors are packed in order, each padded to the alignment)");
    }
    const std::optional<uint64_t> padded = CheckedAlignUp(t.nbytes, out.alignment_);
    const std::optional<uint64_t> next = padded ? CheckedAdd(expected, *padded) : std::nullopt;
    const std::optional<uint64_t> at = CheckedAdd(out.data_offset_, t.offset);
    if (!next || !at) {
      return Fail(ErrorKind::kOverflow, t.info_offset, "tensor '", t.name, "' offset overflows");
    }
    t.file_offset = *at;
    if (!RangeInside(t.file_offset, t.nbytes, out.file_size_)) {
      return Fail(ErrorKind::kOutOfBounds, t.info_offset, "tensor '", t.name, "' data [",
                  t.file_offset, ", +", t.nbytes, ") lies outside the file of ", out.file_size_,
                  " bytes");
    }
    expected = *next;
  }
  out.data_size_ = expected;
  return absl::OkStatus();
}

absl::StatusOr<GgufFile> GgufParser::Run() {
  GgufFile out;
  out.path_ = name_;
  out.file_size_ = src_.size();
  char magic[4];
  RETURN_IF_ERROR(Read(magic, 4, "magic"));
  if (std::memcmp(magic, "GGUF", 4) != 0) {
    return Fail(ErrorKind::kBadMagic, 0, "not a GGUF file (magic is not \"GGUF\")");
  }
  ASSIGN_OR_RETURN(out.version_, Get<uint32_t>("version"));
  if (out.version_ != 2 && out.version_ != 3) {
    if ((out.version_ & 0xFFFF) == 0 && out.version_ != 0) {
      return Fail(ErrorKind::kBadVersion, 4, "version ", out.version_,
                  " looks byte-swapped: big-endian GGUF files are not supported");
    }
    return Fail(ErrorKind::kBadVersion, 4, "unsupported GGUF version ", out.version_,
                " (2 and 3 are supported)");
  }
  ASSIGN_OR_RETURN(const uint64_t n_tensors, Get<uint64_t>("tensor count"));
  ASSIGN_OR_RETURN(const uint64_t n_kv, Get<uint64_t>("key-value count"));
  if (n_kv > remaining() / kMinKvBytes) {
    return Fail(ErrorKind::kAbsurdCount, 16, "key-value count ", n_kv, " cannot fit in the ",
                remaining(), " bytes left");
  }
  if (n_tensors > remaining() / kMinTensorInfoBytes) {
    return Fail(ErrorKind::kAbsurdCount, 8, "tensor count ", n_tensors, " cannot fit in the ",
                remaining(), " bytes left");
  }
  out.kvs_.reserve(n_kv);
  for (uint64_t i = 0; i < n_kv; ++i) RETURN_IF_ERROR(ReadKv(out));
  out.tensors_.reserve(n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) RETURN_IF_ERROR(ReadTensorInfo(out));
  RETURN_IF_ERROR(CheckLayout(out));
  return out;
}

absl::StatusOr<GgufFile> GgufFile::Parse(const ByteSource& source, const std::string& name) {
  return GgufParser(source, name).Run();
}

absl::StatusOr<GgufFile> GgufFile::ParseBytes(std::span<const uint8_t> bytes,
                                              const std::string& name) {
  const MemorySource source(bytes);
  return Parse(source, name);
}

absl::StatusOr<GgufFile> GgufFile::Read(const std::string& path) {
  ASSIGN_OR_RETURN(const ReadFile file, ReadFile::Open(path));
  const FileSource source(file);
  return Parse(source, path);
}

uint64_t GgufTensorInfo::nb(int i) const {
  uint64_t stride = type.block_bytes;
  if (i >= 1) stride = ne[0] / type.block_elements * type.block_bytes;
  for (int d = 1; d < i; ++d) stride *= ne[d];
  return stride;
}

const GgufKv* GgufFile::FindKv(std::string_view key) const {
  for (const GgufKv& kv : kvs_) {
    if (kv.key == key) return &kv;
  }
  return nullptr;
}

const GgufTensorInfo* GgufFile::FindTensor(std::string_view name) const {
  for (const GgufTensorInfo& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

std::optional<uint64_t> GgufFile::GetUint(std::string_view key) const {
  const GgufKv* kv = FindKv(key);
  if (kv == nullptr || kv->type == GgufType::kArray) return std::nullopt;
  return std::visit(
      [](const auto& v) -> std::optional<uint64_t> {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
          if constexpr (std::is_signed_v<T>) {
            if (v < 0) return std::nullopt;
          }
          return static_cast<uint64_t>(v);
        } else {
          return std::nullopt;
        }
      },
      kv->scalar);
}

std::optional<std::string> GgufFile::GetString(std::string_view key) const {
  const GgufKv* kv = FindKv(key);
  if (kv == nullptr) return std::nullopt;
  if (const auto* s = std::get_if<std::string>(&kv->scalar)) return *s;
  return std::nullopt;
}

std::string_view GgufTypeName(GgufType type) {
  static constexpr std::string_view kNames[] = {"u8",  "i8",     "u16",   "i16", "u32",
                                                "i32", "f32",    "bool",  "string",
                                                "array", "u64",  "i64",   "f64"};
  const auto i = static_cast<size_t>(type);
  return i < std::size(kNames) ? kNames[i] : "unknown";
}

std::string FormatGgufScalar(const GgufScalar& value) {
  return std::visit(
      [](const auto& v) -> std::string {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::string>) {
          return absl::StrCat("\"", v, "\"");
        } else if constexpr (std::is_same_v<T, bool>) {
          return v ? "true" : "false";
        } else if constexpr (std::is_same_v<T, int8_t> || std::is_same_v<T, uint8_t>) {
          return absl::StrCat(static_cast<int>(v));
        } else {
          return absl::StrCat(v);
        }
      },
      value);
}

}  // namespace expertd
