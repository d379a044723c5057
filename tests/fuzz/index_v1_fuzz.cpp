// Fuzz target for the v1 index grammar: any input either parses into a usable index or fails with
// a message that names the file. Inputs that carry the v2 marker line are read as v2 and checked
// the same way, so v1/v2 detection is explored too.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "format/index.h"
#include "util/checked.h"

namespace {

constexpr char kPath[] = "/fuzz/index-v1.txt";

void Check(bool condition) {
  if (!condition) __builtin_trap();
}

void CheckV1(const expertd::ExpertIndex& index) {
  Check(index.packs().size() == 1);
  Check(index.packs()[0].id == 0 && index.packs()[0].path == "/fuzz/q.pack");
  Check(!index.v1_rows().empty() && index.rows().empty());
  int previous_line = 0;
  for (const expertd::IndexV1Row& row : index.v1_rows()) {
    Check(!row.tensor.empty() && row.tensor[0] != '#');
    Check(row.expert_bytes > 0 && row.q_parity <= 1);
    Check(row.line > previous_line);
    previous_line = row.line;
    // The first expert of the row's parity sits at Q_BASE when its range does not overflow; the
    // other parity and another size never resolve.
    const uint32_t first = row.q_parity;
    const auto hit = index.Resolve(row.tensor, first, row.expert_bytes);
    if (first < row.expert_count && expertd::CheckedAdd(row.q_base, row.expert_bytes)) {
      Check(hit.has_value() && hit->offset == row.q_base && hit->bytes == row.expert_bytes &&
            hit->pack == 0 && hit->line == row.line);
    } else {
      Check(!hit.has_value());
    }
    Check(!index.Resolve(row.tensor, first ^ 1u, row.expert_bytes).has_value());
    Check(!index.Resolve(row.tensor, first, row.expert_bytes + 1).has_value());
  }
}

void CheckV2(const expertd::ExpertIndex& index) {
  Check(!index.packs().empty() && index.v1_rows().empty());
  for (const expertd::IndexRow& row : index.rows()) {
    Check(row.pack < index.packs().size() && row.bytes > 0);
    Check(expertd::CheckedAdd(row.offset, row.bytes).has_value());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const expertd::IndexOptions options{.v1_q_pack = "q.pack", .check_packs = false};
  const auto index = expertd::ExpertIndex::Parse(text, kPath, options);
  if (!index.ok()) {
    const absl::string_view message = index.status().message();
    Check(message.size() > sizeof(kPath) && message.substr(0, sizeof(kPath) - 1) == kPath);
    Check(message[sizeof(kPath) - 1] == ':');
    return 0;
  }
  Check(index->path() == kPath);
  if (index->version() == 1) {
    CheckV1(*index);
  } else {
    Check(index->version() == 2);
    CheckV2(*index);
  }
  return 0;
}
