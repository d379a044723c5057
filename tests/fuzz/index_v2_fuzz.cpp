// Fuzz target for the v2 index grammar. The marker line is put in front when the input lacks it,
// so the fuzzer spends its time on v2 rows. Invariants: an OK index has packs and rows that
// resolve to themselves, and FormatIndexV2 of what was parsed parses back to the same index; an
// error has a message that starts with the index path.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "format/index.h"
#include "util/checked.h"

namespace {

// Absolute, so resolved pack paths are absolute and stay the same when parsed again.
constexpr char kPath[] = "/fuzz/index-v2.txt";

void Check(bool condition) {
  if (!condition) __builtin_trap();
}

void CheckRoundTrip(const expertd::ExpertIndex& index, const expertd::IndexOptions& options) {
  expertd::IndexV2Contents contents;
  for (const expertd::IndexPack& pack : index.packs()) {
    contents.packs.push_back({.id = pack.id, .label = pack.label, .path = pack.path});
  }
  for (const expertd::IndexRow& row : index.rows()) {
    contents.rows.push_back({.tensor = row.tensor,
                             .expert = row.expert,
                             .pack_id = index.packs()[row.pack].id,
                             .offset = row.offset,
                             .bytes = row.bytes});
  }
  const auto again = expertd::ExpertIndex::Parse(expertd::FormatIndexV2(contents), kPath, options);
  Check(again.ok() && again->version() == 2);
  Check(again->packs().size() == index.packs().size());
  for (size_t i = 0; i < index.packs().size(); ++i) {
    const expertd::IndexPack& a = index.packs()[i];
    const expertd::IndexPack& b = again->packs()[i];
    Check(a.id == b.id && a.label == b.label);
    // Only one trailing '\r' is stripped per line, so a PATH read from a line ending "\r\r"
    // keeps one '\r' that the next read strips.
    if (a.path.empty() || a.path.back() != '\r') Check(a.path == b.path);
  }
  Check(again->rows().size() == index.rows().size());
  for (size_t i = 0; i < index.rows().size(); ++i) {
    const expertd::IndexRow& a = index.rows()[i];
    const expertd::IndexRow& b = again->rows()[i];
    Check(a.tensor == b.tensor && a.expert == b.expert && a.pack == b.pack &&
          a.offset == b.offset && a.bytes == b.bytes);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  if (text.find(expertd::kIndexV2Marker) == std::string::npos) {
    text.insert(0, std::string(expertd::kIndexV2Marker) + "\n");
  }
  const expertd::IndexOptions options{.v1_q_pack = "", .check_packs = false};
  const auto index = expertd::ExpertIndex::Parse(text, kPath, options);
  if (!index.ok()) {
    const absl::string_view message = index.status().message();
    Check(message.size() > sizeof(kPath) && message.substr(0, sizeof(kPath) - 1) == kPath);
    Check(message[sizeof(kPath) - 1] == ':');
    return 0;
  }
  // The marker may appear only inside a line, which makes the text v1 without a Q pack: an
  // error above. So an OK index here is v2.
  Check(index->version() == 2);
  Check(!index->packs().empty() && index->v1_rows().empty());
  for (const expertd::IndexRow& row : index->rows()) {
    Check(!row.tensor.empty() && row.tensor[0] != '#');
    Check(row.pack < index->packs().size() && row.bytes > 0);
    Check(expertd::CheckedAdd(row.offset, row.bytes).has_value());
    const auto hit = index->Resolve(row.tensor, row.expert, row.bytes);
    Check(hit.has_value() && hit->pack == row.pack && hit->offset == row.offset &&
          hit->bytes == row.bytes && hit->line == row.line);
    Check(!index->Resolve(row.tensor, row.expert, row.bytes + 1).has_value());
  }
  CheckRoundTrip(*index, options);
  return 0;
}
