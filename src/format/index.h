// Index files: the map (projection tensor, expert) -> (pack, offset, bytes) that overlays the
// GGUF's own layout. Two text formats, per docs/formats.md:
//   v2: "# optane-moe-index-v2" marker; "@pack ID LABEL PATH" and
//       "TENSOR EXPERT PACK_ID OFFSET BYTES" rows, TAB-separated;
//   v1: one Q pack given from outside; rows "TENSOR<TAB>Q_BASE EXPERT_BYTES Q_PARITY EXPERT_COUNT".
// Unlike the origin, nothing is dropped silently: every row that does not parse is an error that
// names the file and the 1-based line.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace expertd {

inline constexpr std::string_view kIndexV2Marker = "# optane-moe-index-v2";

struct IndexPack {
  int64_t id = 0;       // the @pack ID (v1: 0)
  std::string label;    // the @pack LABEL (v1: "legacy-Q")
  std::string path;     // resolved: a relative PATH is taken against the index file's folder
  uint64_t size = 0;    // file size, filled when packs are checked on open
  int line = 0;         // line of the @pack row (v1: 0)
};

// One v2 expert row.
struct IndexRow {
  std::string tensor;
  uint32_t expert = 0;
  size_t pack = 0;  // position in ExpertIndex::packs()
  uint64_t offset = 0;
  uint64_t bytes = 0;
  int line = 0;
};

// One v1 row: expert e of `tensor` is at q_base + (e / 2) * expert_bytes in the Q pack iff
// e < expert_count and (e & 1) == q_parity.
struct IndexV1Row {
  std::string tensor;
  uint64_t q_base = 0;
  uint64_t expert_bytes = 0;
  uint32_t q_parity = 0;
  uint64_t expert_count = 0;
  int line = 0;
};

// Where an expert's bytes are, according to the index.
struct IndexLocation {
  size_t pack = 0;  // position in ExpertIndex::packs()
  uint64_t offset = 0;
  uint64_t bytes = 0;
  int line = 0;     // the row that placed it
};

struct IndexOptions {
  // The Q pack of a v1 index (config key / --v1-q-pack). A v1 index without it is an error.
  std::string v1_q_pack;
  // Open every pack: it must exist, and (v2) every row's range must lie inside it. Off only for
  // parsing text alone (fuzzing, tests of the grammar).
  bool check_packs = true;
};

class ExpertIndex {
 public:
  // Reads and validates the index file at `path`.
  static absl::StatusOr<ExpertIndex> Read(const std::string& path, const IndexOptions& options);
  // Parses index text; `path` names the file in messages and anchors relative pack paths.
  static absl::StatusOr<ExpertIndex> Parse(std::string_view text, const std::string& path,
                                           const IndexOptions& options);

  int version() const { return version_; }
  const std::string& path() const { return path_; }
  const std::vector<IndexPack>& packs() const { return packs_; }
  const std::vector<IndexRow>& rows() const { return rows_; }        // v2, in file order
  const std::vector<IndexV1Row>& v1_rows() const { return v1_rows_; }  // v1, in file order

  // The origin's lookup rules: a v2 row is used only when its BYTES equals `expert_bytes`; a v1
  // row only when its EXPERT_BYTES equals `expert_bytes`, the parity and count match and the
  // range lies inside the Q pack (when its size is known). nullopt means: read it from P.
  std::optional<IndexLocation> Resolve(std::string_view tensor, uint32_t expert,
                                       uint64_t expert_bytes) const;

 private:
  int version_ = 2;
  std::string path_;
  std::vector<IndexPack> packs_;
  std::vector<IndexRow> rows_;
  std::vector<IndexV1Row> v1_rows_;
  // (tensor, expert) -> position in rows_; tensor -> position in v1_rows_.
  absl::flat_hash_map<std::pair<std::string, uint32_t>, size_t> row_of_;
  absl::flat_hash_map<std::string, size_t> v1_row_of_;
};

// A v2 index to write. Pack paths are written as given (make them relative to the index's
// folder to keep index and packs movable together).
struct IndexV2Contents {
  struct Pack {
    int64_t id;
    std::string label;
    std::string path;
  };
  struct Row {
    std::string tensor;
    uint32_t expert;
    int64_t pack_id;
    uint64_t offset;
    uint64_t bytes;
  };
  std::vector<std::string> comments;  // written as "# ..." lines after the marker
  std::vector<Pack> packs;
  std::vector<Row> rows;
};

// Renders the v2 text (marker, comments, @pack lines, rows).
std::string FormatIndexV2(const IndexV2Contents& contents);
// Writes it atomically to `path`.
absl::Status WriteIndexV2(const std::string& path, const IndexV2Contents& contents);

}  // namespace expertd
