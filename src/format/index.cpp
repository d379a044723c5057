#include "format/index.h"

#include <array>
#include <charconv>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "util/checked.h"
#include "util/file.h"
#include "util/status.h"

namespace expertd {
namespace {

constexpr std::string_view kPackKeyword = "@pack";
constexpr std::string_view kV1PackLabel = "legacy-Q";

// One line of index text. A trailing '\r' is dropped so CRLF files read like LF files.
struct Line {
  std::string_view text;
  int number = 0;  // 1-based
};

// Yields the lines of `text` in order, including empty ones (they still count for numbering).
class LineCursor {
 public:
  explicit LineCursor(std::string_view text) : rest_(text) {}

  bool Next(Line* line) {
    if (done_) return false;
    const size_t end = rest_.find('\n');
    std::string_view text = rest_.substr(0, end);
    if (end == std::string_view::npos) {
      done_ = true;
      // Text ending in '\n' has no further line; do not report an empty phantom one.
      if (text.empty()) return false;
    } else {
      rest_.remove_prefix(end + 1);
    }
    if (!text.empty() && text.back() == '\r') text.remove_suffix(1);
    line->text = text;
    line->number = ++number_;
    return true;
  }

 private:
  std::string_view rest_;
  int number_ = 0;
  bool done_ = false;
};

bool IsV2(std::string_view text) {
  LineCursor cursor(text);
  Line line;
  while (cursor.Next(&line)) {
    if (line.text == kIndexV2Marker) return true;
  }
  return false;
}

// Strict decimal: the whole field, no spaces, no '+'; '-' only where T is signed.
template <typename T>
std::optional<T> ParseDecimal(std::string_view field) {
  T value{};
  const char* end = field.data() + field.size();
  const auto [ptr, ec] = std::from_chars(field.data(), end, value, 10);
  if (ec != std::errc() || ptr != end) return std::nullopt;
  return value;
}

// A field as it appears in a message: quoted, escaped, and cut so a fuzzed megabyte-long field
// does not become a megabyte-long message.
std::string Quote(std::string_view field) {
  constexpr size_t kMaxShown = 64;
  const bool cut = field.size() > kMaxShown;
  return absl::StrCat("'", absl::CHexEscape(AV(field.substr(0, kMaxShown))), cut ? "...'" : "'");
}

// Splits at every TAB (so "a\t\tb" is three fields). Stores at most out.size() fields and returns
// the full count.
size_t SplitTabs(std::string_view line, std::span<std::string_view> out) {
  size_t count = 0;
  while (true) {
    const size_t tab = line.find('\t');
    if (count < out.size()) out[count] = line.substr(0, tab);
    ++count;
    if (tab == std::string_view::npos) return count;
    line.remove_prefix(tab + 1);
  }
}

// Splits at runs of spaces; leading and trailing spaces make no empty fields. Stores at most
// out.size() fields and returns the full count.
size_t SplitSpaces(std::string_view text, std::span<std::string_view> out) {
  size_t count = 0;
  while (true) {
    const size_t start = text.find_first_not_of(' ');
    if (start == std::string_view::npos) return count;
    text.remove_prefix(start);
    const size_t end = text.find(' ');
    if (count < out.size()) out[count] = text.substr(0, end);
    ++count;
    if (end == std::string_view::npos) return count;
    text.remove_prefix(end);
  }
}

std::string ResolvePackPath(const std::string& index_path, std::string_view pack_path) {
  const std::filesystem::path path(pack_path);
  if (path.is_absolute()) return std::string(pack_path);
  // In the platform's own separators: on Windows C:\m\rel\c.pack rather than C:\m\rel/c.pack.
  return (std::filesystem::path(index_path).parent_path() / path).make_preferred().string();
}

// What a parse produces; moved into the ExpertIndex once complete.
struct Parsed {
  std::vector<IndexPack> packs;
  std::vector<IndexRow> rows;
  std::vector<IndexV1Row> v1_rows;
  absl::flat_hash_map<std::pair<std::string, uint32_t>, size_t> row_of;
  absl::flat_hash_map<std::string, size_t> v1_row_of;
};

class IndexParser {
 public:
  IndexParser(const std::string& path, const IndexOptions& options)
      : path_(path), options_(options) {}

  absl::Status ParseV2(std::string_view text, Parsed* out);
  absl::Status ParseV1(std::string_view text, Parsed* out);
  absl::Status CheckPacks(Parsed* out) const;

 private:
  // "PATH:LINE: " (or "PATH: " for line 0) followed by the message.
  template <typename... Args>
  absl::Status Fail(absl::StatusCode code, ErrorKind kind, int line, const Args&... args) const {
    if (line > 0) return MakeError(code, kind, absl::StrCat(path_, ":", line, ": ", args...));
    return MakeError(code, kind, absl::StrCat(path_, ": ", args...));
  }
  template <typename... Args>
  absl::Status Invalid(ErrorKind kind, int line, const Args&... args) const {
    return Fail(absl::StatusCode::kInvalidArgument, kind, line, args...);
  }

  absl::Status ParsePackLine(const Line& line, Parsed* out);
  absl::Status ParseV2Row(const Line& line, Parsed* out);
  absl::Status ParseV1Row(const Line& line, Parsed* out);
  absl::Status CheckNotEmpty(const Parsed& parsed, size_t rows) const;

  const std::string& path_;
  const IndexOptions& options_;
  absl::flat_hash_map<int64_t, size_t> pack_of_id_;  // @pack ID -> position in packs
};

absl::Status IndexParser::ParseV2(std::string_view text, Parsed* out) {
  LineCursor cursor(text);
  Line line;
  while (cursor.Next(&line)) {
    if (line.text.empty() || line.text.front() == '#') continue;
    if (line.text.substr(0, line.text.find('\t')) == kPackKeyword) {
      RETURN_IF_ERROR(ParsePackLine(line, out));
    } else {
      RETURN_IF_ERROR(ParseV2Row(line, out));
    }
  }
  // A v2 index with packs but no rows is valid: it places nothing (`index build --placement
  // none`, the all-from-P baseline). Without a @pack line it is not an index at all.
  if (out->packs.empty()) return Invalid(ErrorKind::kBadValue, 0, "index has no @pack line");
  return absl::OkStatus();
}

absl::Status IndexParser::ParsePackLine(const Line& line, Parsed* out) {
  std::array<std::string_view, 4> f;
  const size_t n = SplitTabs(line.text, f);
  if (n != f.size()) {
    return Invalid(ErrorKind::kBadRow, line.number,
                   "@pack needs 4 TAB-separated fields (@pack, ID, LABEL, PATH), got ", n);
  }
  const std::optional<int64_t> id = ParseDecimal<int64_t>(f[1]);
  if (!id) {
    return Invalid(ErrorKind::kBadRow, line.number, "@pack ID ", Quote(f[1]),
                   " is not a decimal 64-bit integer");
  }
  if (f[3].empty())
    return Invalid(ErrorKind::kBadValue, line.number, "@pack ", *id, ": empty PATH");
  const auto [it, inserted] = pack_of_id_.try_emplace(*id, out->packs.size());
  if (!inserted) {
    return Invalid(ErrorKind::kDuplicate, line.number, "duplicate @pack ID ", *id,
                   " (first declared at line ", out->packs[it->second].line, ")");
  }
  out->packs.push_back(IndexPack{.id = *id,
                                 .label = std::string(f[2]),
                                 .path = ResolvePackPath(path_, f[3]),
                                 .size = 0,
                                 .line = line.number});
  return absl::OkStatus();
}

absl::Status IndexParser::ParseV2Row(const Line& line, Parsed* out) {
  std::array<std::string_view, 5> f;
  const size_t n = SplitTabs(line.text, f);
  if (n != f.size()) {
    return Invalid(ErrorKind::kBadRow, line.number,
                   "expert row needs 5 TAB-separated fields (TENSOR, EXPERT, PACK_ID, OFFSET, "
                   "BYTES), got ",
                   n);
  }
  const std::string_view tensor = f[0];
  if (tensor.empty()) return Invalid(ErrorKind::kBadValue, line.number, "empty TENSOR");
  const std::optional<uint32_t> expert = ParseDecimal<uint32_t>(f[1]);
  if (!expert) {
    return Invalid(ErrorKind::kBadRow, line.number, "EXPERT ", Quote(f[1]),
                   " is not a decimal integer in [0, 4294967295]");
  }
  const std::optional<int64_t> pack_id = ParseDecimal<int64_t>(f[2]);
  if (!pack_id) {
    return Invalid(ErrorKind::kBadRow, line.number, "PACK_ID ", Quote(f[2]),
                   " is not a decimal 64-bit integer");
  }
  const auto pack = pack_of_id_.find(*pack_id);
  if (pack == pack_of_id_.end()) {
    return Invalid(ErrorKind::kUndeclaredPack, line.number, "PACK_ID ", *pack_id,
                   " is not declared by an earlier @pack line");
  }
  const std::optional<uint64_t> offset = ParseDecimal<uint64_t>(f[3]);
  if (!offset) {
    return Invalid(ErrorKind::kBadRow, line.number, "OFFSET ", Quote(f[3]),
                   " is not an unsigned 64-bit decimal");
  }
  const std::optional<uint64_t> bytes = ParseDecimal<uint64_t>(f[4]);
  if (!bytes) {
    return Invalid(ErrorKind::kBadRow, line.number, "BYTES ", Quote(f[4]),
                   " is not an unsigned 64-bit decimal");
  }
  if (*bytes == 0) return Invalid(ErrorKind::kBadValue, line.number, "BYTES is 0");
  if (!CheckedAdd(*offset, *bytes)) {
    return Invalid(ErrorKind::kOverflow, line.number, "OFFSET ", *offset, " + BYTES ", *bytes,
                   " overflows 64 bits");
  }
  const auto [it, inserted] =
      out->row_of.try_emplace(std::make_pair(std::string(tensor), *expert), out->rows.size());
  if (!inserted) {
    return Invalid(ErrorKind::kDuplicate, line.number, "second row for ", Quote(tensor), " expert ",
                   *expert, " (first at line ", out->rows[it->second].line, ")");
  }
  out->rows.push_back(IndexRow{.tensor = std::string(tensor),
                               .expert = *expert,
                               .pack = pack->second,
                               .offset = *offset,
                               .bytes = *bytes,
                               .line = line.number});
  return absl::OkStatus();
}

absl::Status IndexParser::ParseV1(std::string_view text, Parsed* out) {
  if (options_.v1_q_pack.empty()) {
    return Fail(absl::StatusCode::kFailedPrecondition, ErrorKind::kMissingQPack, 0,
                "a v1 index (no '", AV(kIndexV2Marker),
                "' line) needs the path of its Q pack (v1_q_pack / --v1-q-pack)");
  }
  out->packs.push_back(IndexPack{.id = 0,
                                 .label = std::string(kV1PackLabel),
                                 .path = ResolvePackPath(path_, options_.v1_q_pack),
                                 .size = 0,
                                 .line = 0});
  LineCursor cursor(text);
  Line line;
  while (cursor.Next(&line)) {
    if (line.text.empty() || line.text.front() == '#') continue;
    RETURN_IF_ERROR(ParseV1Row(line, out));
  }
  return CheckNotEmpty(*out, out->v1_rows.size());
}

absl::Status IndexParser::ParseV1Row(const Line& line, Parsed* out) {
  constexpr std::string_view kShape =
      "v1 rows are TENSOR<TAB>Q_BASE EXPERT_BYTES Q_PARITY EXPERT_COUNT (the file has no '# "
      "optane-moe-index-v2' line, so it is read as v1)";
  const size_t tab = line.text.find('\t');
  if (tab == std::string_view::npos) {
    return Invalid(ErrorKind::kBadRow, line.number, "no TAB; ", AV(kShape));
  }
  const std::string_view tensor = line.text.substr(0, tab);
  const std::string_view rest = line.text.substr(tab + 1);
  if (rest.find('\t') != std::string_view::npos) {
    return Invalid(ErrorKind::kBadRow, line.number, "more than one TAB; ", AV(kShape));
  }
  if (tensor.empty()) return Invalid(ErrorKind::kBadValue, line.number, "empty TENSOR");
  std::array<std::string_view, 4> f;
  const size_t n = SplitSpaces(rest, f);
  if (n != f.size()) {
    return Invalid(ErrorKind::kBadRow, line.number, "expected 4 space-separated numbers, got ", n,
                   "; ", AV(kShape));
  }
  std::array<uint64_t, 4> v{};
  constexpr std::array<std::string_view, 4> kNames = {"Q_BASE", "EXPERT_BYTES", "Q_PARITY",
                                                      "EXPERT_COUNT"};
  for (size_t i = 0; i < f.size(); ++i) {
    const std::optional<uint64_t> value = ParseDecimal<uint64_t>(f[i]);
    if (!value) {
      return Invalid(ErrorKind::kBadRow, line.number, AV(kNames[i]), " ", Quote(f[i]),
                     " is not an unsigned 64-bit decimal");
    }
    v[i] = *value;
  }
  if (v[1] == 0) return Invalid(ErrorKind::kBadValue, line.number, "EXPERT_BYTES is 0");
  if (v[2] > 1) {
    return Invalid(ErrorKind::kBadValue, line.number, "Q_PARITY is ", v[2], ", must be 0 or 1");
  }
  const auto [it, inserted] = out->v1_row_of.try_emplace(std::string(tensor), out->v1_rows.size());
  if (!inserted) {
    return Invalid(ErrorKind::kDuplicate, line.number, "second row for ", Quote(tensor),
                   " (first at line ", out->v1_rows[it->second].line, ")");
  }
  out->v1_rows.push_back(IndexV1Row{.tensor = std::string(tensor),
                                    .q_base = v[0],
                                    .expert_bytes = v[1],
                                    .q_parity = static_cast<uint32_t>(v[2]),
                                    .expert_count = v[3],
                                    .line = line.number});
  return absl::OkStatus();
}

absl::Status IndexParser::CheckNotEmpty(const Parsed& parsed, size_t rows) const {
  // The origin disabled an empty index. A v1 file has no marker, so one without rows is most
  // likely not an index at all: name it.
  if (parsed.packs.empty()) return Invalid(ErrorKind::kBadValue, 0, "index has no @pack line");
  if (rows == 0) return Invalid(ErrorKind::kBadValue, 0, "index has no rows");
  return absl::OkStatus();
}

absl::Status IndexParser::CheckPacks(Parsed* out) const {
  for (IndexPack& pack : out->packs) {
    absl::StatusOr<ReadFile> file = ReadFile::Open(pack.path);
    if (!file.ok()) {
      return Fail(file.status().code(), ErrorKind::kMissingFile, pack.line, "pack ", pack.id, " (",
                  pack.label, "): ", file.status().message());
    }
    // As in the origin, an empty pack is refused; it also keeps size 0 meaning "not checked".
    if (file->size() == 0) {
      return Invalid(ErrorKind::kBadValue, pack.line, "pack ", pack.id, " (", pack.label, ") ",
                     pack.path, " is empty");
    }
    pack.size = file->size();
  }
  for (const IndexRow& row : out->rows) {
    const IndexPack& pack = out->packs[row.pack];
    if (!RangeInside(row.offset, row.bytes, pack.size)) {
      return Fail(absl::StatusCode::kOutOfRange, ErrorKind::kOutOfBounds, row.line,
                  Quote(row.tensor), " expert ", row.expert, ": bytes [", row.offset, ", ",
                  row.offset + row.bytes, ") lie outside pack ", pack.id, " (", pack.path, ", ",
                  pack.size, " bytes)");
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ExpertIndex> ExpertIndex::Read(const std::string& path,
                                              const IndexOptions& options) {
  ASSIGN_OR_RETURN(const std::string text, ReadTextFile(path, "the index"));
  return Parse(text, path, options);
}

absl::StatusOr<ExpertIndex> ExpertIndex::Parse(std::string_view text, const std::string& path,
                                               const IndexOptions& options) {
  IndexParser parser(path, options);
  Parsed parsed;
  const int version = IsV2(text) ? 2 : 1;
  RETURN_IF_ERROR(version == 2 ? parser.ParseV2(text, &parsed) : parser.ParseV1(text, &parsed));
  if (options.check_packs) RETURN_IF_ERROR(parser.CheckPacks(&parsed));

  ExpertIndex index;
  index.version_ = version;
  index.path_ = path;
  index.packs_ = std::move(parsed.packs);
  index.rows_ = std::move(parsed.rows);
  index.v1_rows_ = std::move(parsed.v1_rows);
  index.row_of_ = std::move(parsed.row_of);
  index.v1_row_of_ = std::move(parsed.v1_row_of);
  return index;
}

std::optional<IndexLocation> ExpertIndex::Resolve(std::string_view tensor, uint32_t expert,
                                                  uint64_t expert_bytes) const {
  if (version_ == 2) {
    const auto it = row_of_.find(std::make_pair(std::string(tensor), expert));
    if (it == row_of_.end()) return std::nullopt;
    const IndexRow& row = rows_[it->second];
    if (row.bytes != expert_bytes) return std::nullopt;
    return IndexLocation{
        .pack = row.pack, .offset = row.offset, .bytes = row.bytes, .line = row.line};
  }
  const auto it = v1_row_of_.find(AV(tensor));
  if (it == v1_row_of_.end()) return std::nullopt;
  const IndexV1Row& row = v1_rows_[it->second];
  if (row.expert_bytes != expert_bytes || expert >= row.expert_count ||
      (expert & 1u) != row.q_parity) {
    return std::nullopt;
  }
  const std::optional<uint64_t> step = CheckedMul(expert / 2, row.expert_bytes);
  const std::optional<uint64_t> offset = step ? CheckedAdd(row.q_base, *step) : std::nullopt;
  if (!offset || !CheckedAdd(*offset, expert_bytes)) return std::nullopt;
  // Pack sizes are known only when packs were checked (size 0 = not checked; empty packs are
  // refused on open).
  const uint64_t pack_size = packs_[0].size;
  if (pack_size != 0 && !RangeInside(*offset, expert_bytes, pack_size)) return std::nullopt;
  return IndexLocation{.pack = 0, .offset = *offset, .bytes = expert_bytes, .line = row.line};
}

std::string FormatIndexV2(const IndexV2Contents& contents) {
  std::string out = absl::StrCat(AV(kIndexV2Marker), "\n");
  for (const std::string& comment : contents.comments) absl::StrAppend(&out, "# ", comment, "\n");
  for (const IndexV2Contents::Pack& pack : contents.packs) {
    absl::StrAppend(&out, AV(kPackKeyword), "\t", pack.id, "\t", pack.label, "\t", pack.path, "\n");
  }
  for (const IndexV2Contents::Row& row : contents.rows) {
    absl::StrAppend(&out, row.tensor, "\t", row.expert, "\t", row.pack_id, "\t", row.offset, "\t",
                    row.bytes, "\n");
  }
  return out;
}

absl::Status WriteIndexV2(const std::string& path, const IndexV2Contents& contents) {
  // Refuse to write a file that would read back differently (a TAB or newline inside a field, a
  // tensor named like a comment, a duplicate row ...). The text is parsed under the bare file
  // name so pack paths stay as written; messages then get the full path in front.
  const std::string text = FormatIndexV2(contents);
  const auto invalid = [&](std::string_view why) {
    return InvalidError(ErrorKind::kBadValue,
                        absl::StrCat(path, ": refusing to write the index: ", AV(why)));
  };
  for (const std::string& comment : contents.comments) {
    if (comment.find('\n') != std::string::npos) {
      return invalid(absl::StrCat("comment ", Quote(comment), " holds a line break"));
    }
  }
  const std::string name = std::filesystem::path(path).filename().string();
  const absl::StatusOr<ExpertIndex> back =
      ExpertIndex::Parse(text, name, IndexOptions{.v1_q_pack = "", .check_packs = false});
  if (!back.ok()) {
    return MakeError(
        back.status().code(), ErrorKindOf(back.status()).value_or(ErrorKind::kBadValue),
        absl::StrCat(path, ": refusing to write the index: ", back.status().message()));
  }
  bool same =
      back->packs().size() == contents.packs.size() && back->rows().size() == contents.rows.size();
  for (size_t i = 0; same && i < contents.packs.size(); ++i) {
    const IndexPack& p = back->packs()[i];
    const IndexV2Contents::Pack& want = contents.packs[i];
    same = p.id == want.id && p.label == want.label && p.path == want.path;
  }
  for (size_t i = 0; same && i < contents.rows.size(); ++i) {
    const IndexRow& r = back->rows()[i];
    const IndexV2Contents::Row& want = contents.rows[i];
    same = r.tensor == want.tensor && r.expert == want.expert &&
           back->packs()[r.pack].id == want.pack_id && r.offset == want.offset &&
           r.bytes == want.bytes;
  }
  if (!same) {
    return invalid(
        "the text would not read back as written (a field holds a TAB, a line break or a "
        "trailing '\\r', or a TENSOR starts with '#')");
  }
  return WriteTextFileAtomic(path, text);
}

}  // namespace expertd
