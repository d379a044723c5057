// Index v1/v2 reader and v2 writer (docs/formats.md "Index"). Expected values are derived from
// the grammar and the resolution rules, not from running the code.
#include "format/index.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <limits>
#include <string>

#include "support/test_support.h"

namespace expertd {
namespace {

// A path in the platform's separators, as the index resolves pack paths ("/m/q.pack" is
// \m\q.pack on Windows: rooted on the index's drive).
std::string Native(const std::string& path) {
  return std::filesystem::path(path).make_preferred().string();
}

using ::expertd::testing::IsError;
using ::expertd::testing::TempDir;
using ::expertd::testing::WriteFile;

constexpr std::string_view kUp = "blk.0.ffn_up_exps.weight";
constexpr std::string_view kDown = "blk.0.ffn_down_exps.weight";

IndexOptions NoPacks() { return IndexOptions{.v1_q_pack = "", .check_packs = false}; }
IndexOptions V1NoPacks() { return IndexOptions{.v1_q_pack = "q.pack", .check_packs = false}; }

class IndexTest : public ::testing::Test {
 protected:
  // Writes `text` as idx.txt in the temp dir and reads it.
  absl::StatusOr<ExpertIndex> ReadText(std::string_view text, const IndexOptions& options) {
    WriteFile(index_path(), text);
    return ExpertIndex::Read(index_path(), options);
  }
  std::string index_path() const { return dir_.File("idx.txt"); }
  // A pack file of `size` bytes in the temp dir.
  std::string MakePack(std::string_view name, size_t size) {
    const std::string path = dir_.File(name);
    WriteFile(path, std::string(size, 'x'));
    return path;
  }

  TempDir dir_;
};

// ---------------------------------------------------------------- v2

using IndexV2Test = IndexTest;

TEST_F(IndexV2Test, ParsesPacksAndRows) {
  const std::string text =
      "# optane-moe-index-v2\n"                       // 1
      "# written by a test\n"                         // 2
      "\n"                                            // 3
      "@pack\t7\tQ8 hot\t/abs/q.pack\n"               // 4
      "@pack\t-2\tcold\trel/c.pack\n"                 // 5
      "blk.0.ffn_up_exps.weight\t3\t7\t4096\t1024\n"  // 6
      "blk.0.ffn_up_exps.weight\t4\t-2\t0\t1024\n"    // 7
      "blk.0.ffn_down_exps.weight\t3\t7\t5120\t2048\n";
  absl::StatusOr<ExpertIndex> index = ExpertIndex::Parse(text, "/models/m/idx.txt", NoPacks());
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->version(), 2);
  EXPECT_EQ(index->path(), "/models/m/idx.txt");
  ASSERT_EQ(index->packs().size(), 2u);
  EXPECT_EQ(index->packs()[0].id, 7);
  EXPECT_EQ(index->packs()[0].label, "Q8 hot");
  EXPECT_EQ(index->packs()[0].path, Native("/abs/q.pack"));
  EXPECT_EQ(index->packs()[0].line, 4);
  EXPECT_EQ(index->packs()[0].size, 0u);  // packs not checked
  EXPECT_EQ(index->packs()[1].id, -2);
  EXPECT_EQ(index->packs()[1].path, Native("/models/m/rel/c.pack"));
  ASSERT_EQ(index->rows().size(), 3u);
  const IndexRow& r = index->rows()[1];
  EXPECT_EQ(r.tensor, kUp);
  EXPECT_EQ(r.expert, 4u);
  EXPECT_EQ(r.pack, 1u);
  EXPECT_EQ(r.offset, 0u);
  EXPECT_EQ(r.bytes, 1024u);
  EXPECT_EQ(r.line, 7);
  EXPECT_EQ(index->rows()[2].tensor, kDown);
  EXPECT_EQ(index->rows()[2].line, 8);
  EXPECT_TRUE(index->v1_rows().empty());
}

TEST_F(IndexV2Test, MarkerAnywhereMakesV2) {
  const std::string text =
      "@pack\t1\tp\tp.bin\n"
      "t\t0\t1\t0\t8\n"
      "# optane-moe-index-v2\n";
  absl::StatusOr<ExpertIndex> index = ExpertIndex::Parse(text, "idx.txt", NoPacks());
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->version(), 2);
  EXPECT_EQ(index->rows().size(), 1u);
  // A bare index name has no folder: the relative path stays as written.
  EXPECT_EQ(index->packs()[0].path, "p.bin");
}

TEST_F(IndexV2Test, CrlfLineEnds) {
  const std::string text =
      "# optane-moe-index-v2\r\n"
      "@pack\t1\tp\t/x/p.bin\r\n"
      "\r\n"
      "t\t0\t1\t0\t8\r\n";
  absl::StatusOr<ExpertIndex> index = ExpertIndex::Parse(text, "idx.txt", NoPacks());
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->version(), 2);
  EXPECT_EQ(index->packs()[0].path, Native("/x/p.bin"));
  ASSERT_EQ(index->rows().size(), 1u);
  EXPECT_EQ(index->rows()[0].bytes, 8u);
  EXPECT_EQ(index->rows()[0].line, 4);
}

TEST_F(IndexV2Test, RelativePackPathResolvedAgainstIndexFolder) {
  std::filesystem::create_directories(dir_.File("sub/packs"));
  const std::string pack = dir_.File("sub/packs/a.bin");
  WriteFile(pack, std::string(64, 'x'));
  const std::string abs_pack = MakePack("b.bin", 32);
  const std::string index_path = dir_.File("sub/idx.txt");
  WriteFile(index_path, "# optane-moe-index-v2\n@pack\t1\ta\tpacks/a.bin\n@pack\t2\tb\t" +
                            abs_pack + "\nt\t0\t1\t0\t64\nt\t1\t2\t0\t32\n");
  absl::StatusOr<ExpertIndex> index = ExpertIndex::Read(index_path, IndexOptions{});
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_TRUE(std::filesystem::equivalent(index->packs()[0].path, pack));
  EXPECT_EQ(index->packs()[0].path, dir_.File("sub/packs/a.bin"));
  EXPECT_EQ(index->packs()[1].path, abs_pack);
  EXPECT_EQ(index->packs()[0].size, 64u);
  EXPECT_EQ(index->packs()[1].size, 32u);
}

TEST_F(IndexV2Test, DuplicatePackId) {
  const auto index = ReadText(
      "# optane-moe-index-v2\n@pack\t1\ta\ta.bin\n@pack\t1\tb\tb.bin\nt\t0\t1\t0\t8\n", NoPacks());
  EXPECT_TRUE(IsError(index.status(), absl::StatusCode::kInvalidArgument, ErrorKind::kDuplicate,
                      {"idx.txt:3:", "line 2"}));
}

TEST_F(IndexV2Test, PackLineNeedsFourFields) {
  for (const std::string line : {"@pack\t1\ta", "@pack\t1\ta\tp.bin\textra", "@pack"}) {
    const auto index = ReadText("# optane-moe-index-v2\n" + line + "\n", NoPacks());
    EXPECT_TRUE(IsError(index.status(), absl::StatusCode::kInvalidArgument, ErrorKind::kBadRow,
                        {"idx.txt:2:", "@pack"}))
        << line;
  }
}

TEST_F(IndexV2Test, PackIdMustBeDecimal) {
  for (const std::string id : {"1x", "", "+1", " 1", "0x10", "99999999999999999999"}) {
    const auto index =
        ReadText("# optane-moe-index-v2\n@pack\t" + id + "\ta\ta.bin\nt\t0\t1\t0\t8\n", NoPacks());
    EXPECT_TRUE(IsError(index.status(), absl::StatusCode::kInvalidArgument, ErrorKind::kBadRow,
                        {"idx.txt:2:", "ID"}))
        << "id '" << id << "'";
  }
}

TEST_F(IndexV2Test, EmptyPackPath) {
  const auto index = ReadText("# optane-moe-index-v2\n@pack\t1\ta\t\nt\t0\t1\t0\t8\n", NoPacks());
  EXPECT_TRUE(IsError(index.status(), absl::StatusCode::kInvalidArgument, ErrorKind::kBadValue,
                      {"idx.txt:2:", "PATH"}));
}

TEST_F(IndexV2Test, UndeclaredPack) {
  const auto index = ReadText(
      "# optane-moe-index-v2\n@pack\t1\ta\ta.bin\nt\t0\t2\t0\t8\n@pack\t2\tb\tb.bin\n", NoPacks());
  EXPECT_TRUE(IsError(index.status(), absl::StatusCode::kInvalidArgument,
                      ErrorKind::kUndeclaredPack, {"idx.txt:3:", "PACK_ID 2"}));
}

TEST_F(IndexV2Test, FourFieldRow) {
  const auto index = ReadText("# optane-moe-index-v2\n@pack\t1\ta\ta.bin\nt\t0\t1\t0\n", NoPacks());
  EXPECT_TRUE(IsError(index.status(), absl::StatusCode::kInvalidArgument, ErrorKind::kBadRow,
                      {"idx.txt:3:", "got 4"}));
}

TEST_F(IndexV2Test, EmptyFieldBetweenTabsIsAField) {
  // Two TABs in a row make an extra, empty field: 6 fields.
  auto index = ReadText("# optane-moe-index-v2\n@pack\t1\ta\ta.bin\nt\t0\t1\t\t0\t8\n", NoPacks());
  EXPECT_TRUE(IsError(index.status(), absl::StatusCode::kInvalidArgument, ErrorKind::kBadRow,
                      {"idx.txt:3:", "got 6"}));
  // Five fields, EXPERT empty.
  index = ReadText("# optane-moe-index-v2\n@pack\t1\ta\ta.bin\nt\t\t1\t0\t8\n", NoPacks());
  EXPECT_TRUE(IsError(index.status(), absl::StatusCode::kInvalidArgument, ErrorKind::kBadRow,
                      {"idx.txt:3:", "EXPERT"}));
  // A trailing TAB also starts an (empty) field.
  index = ReadText("# optane-moe-index-v2\n@pack\t1\ta\ta.bin\nt\t0\t1\t0\t8\t\n", NoPacks());
  EXPECT_TRUE(IsError(index.status(), absl::StatusCode::kInvalidArgument, ErrorKind::kBadRow,
                      {"idx.txt:3:", "got 6"}));
}

TEST_F(IndexV2Test, NumbersMustBeStrictDecimal) {
  struct Case {
    std::string row;
    std::string field;
  };
  const Case cases[] = {
      {"t\t-1\t1\t0\t8", "EXPERT"}, {"t\t4294967296\t1\t0\t8", "EXPERT"},
      {"t\t+1\t1\t0\t8", "EXPERT"}, {"t\t 1\t1\t0\t8", "EXPERT"},
      {"t\t1x\t1\t0\t8", "EXPERT"}, {"t\t0\t1x\t0\t8", "PACK_ID"},
      {"t\t0\t1\t1x\t8", "OFFSET"}, {"t\t0\t1\t0x10\t8", "OFFSET"},
      {"t\t0\t1\t-5\t8", "OFFSET"}, {"t\t0\t1\t0\t-8", "BYTES"},
      {"t\t0\t1\t0\t8 ", "BYTES"},  {"t\t0\t1\t0\t18446744073709551616", "BYTES"},
  };
  for (const Case& c : cases) {
    const auto index =
        ReadText("# optane-moe-index-v2\n@pack\t1\ta\ta.bin\n" + c.row + "\n", NoPacks());
    EXPECT_TRUE(IsError(index.status(), absl::StatusCode::kInvalidArgument, ErrorKind::kBadRow,
                        {"idx.txt:3:", c.field}))
        << c.row;
  }
}

TEST_F(IndexV2Test, LargestExpertIdIsAccepted) {
  const auto index =
      ReadText("# optane-moe-index-v2\n@pack\t1\ta\ta.bin\nt\t4294967295\t1\t0\t8\n", NoPacks());
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->rows()[0].expert, 4294967295u);
}

TEST_F(IndexV2Test, ZeroBytes) {
  const auto index =
      ReadText("# optane-moe-index-v2\n@pack\t1\ta\ta.bin\nt\t0\t1\t0\t0\n", NoPacks());
  EXPECT_TRUE(IsError(index.status(), absl::StatusCode::kInvalidArgument, ErrorKind::kBadValue,
                      {"idx.txt:3:", "BYTES"}));
}

TEST_F(IndexV2Test, EmptyTensor) {
  const auto index =
      ReadText("# optane-moe-index-v2\n@pack\t1\ta\ta.bin\n\t0\t1\t0\t8\n", NoPacks());
  EXPECT_TRUE(IsError(index.status(), absl::StatusCode::kInvalidArgument, ErrorKind::kBadValue,
                      {"idx.txt:3:", "TENSOR"}));
}

TEST_F(IndexV2Test, OffsetPlusBytesOverflow) {
  // 2^64 - 8 + 8 = 2^64 does not fit.
  const auto index = ReadText(
      "# optane-moe-index-v2\n@pack\t1\ta\ta.bin\nt\t0\t1\t18446744073709551608\t8\n", NoPacks());
  EXPECT_TRUE(IsError(index.status(), absl::StatusCode::kInvalidArgument, ErrorKind::kOverflow,
                      {"idx.txt:3:"}));
}

TEST_F(IndexV2Test, DuplicateExpertRow) {
  const auto index = ReadText(
      "# optane-moe-index-v2\n@pack\t1\ta\ta.bin\n"
      "t\t0\t1\t0\t8\n"  // 3
      "u\t0\t1\t8\t8\n"  // 4: same expert, other tensor: fine
      "t\t1\t1\t16\t8\n"
      "t\t0\t1\t24\t8\n",  // 6
      NoPacks());
  EXPECT_TRUE(IsError(index.status(), absl::StatusCode::kInvalidArgument, ErrorKind::kDuplicate,
                      {"idx.txt:6:", "line 3", "expert 0"}));
}

TEST_F(IndexV2Test, NoPackLine) {
  const auto index = ReadText("# optane-moe-index-v2\n# nothing\n", NoPacks());
  EXPECT_TRUE(IsError(index.status(), absl::StatusCode::kInvalidArgument, ErrorKind::kBadValue,
                      {"idx.txt: ", "no @pack"}));
  EXPECT_EQ(index.status().message().substr(0, index_path().size() + 2), index_path() + ": ");
}

// Packs without rows: a valid index that places nothing (index build --placement none).
TEST_F(IndexV2Test, NoRowsPlacesNothing) {
  const auto index = ReadText("# optane-moe-index-v2\n@pack\t1\ta\ta.bin\n", NoPacks());
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->packs().size(), 1u);
  EXPECT_TRUE(index->rows().empty());
  EXPECT_FALSE(index->Resolve("t", 0, 8).has_value());
}

TEST_F(IndexV2Test, MissingPackFile) {
  MakePack("a.bin", 64);
  const auto index = ReadText(
      "# optane-moe-index-v2\n@pack\t1\ta\ta.bin\n@pack\t2\tb\tmissing.bin\nt\t0\t1\t0\t8\n",
      IndexOptions{});
  EXPECT_TRUE(IsError(index.status(), absl::StatusCode::kNotFound, ErrorKind::kMissingFile,
                      {"idx.txt:3:", dir_.File("missing.bin")}));
}

TEST_F(IndexV2Test, RowOutsidePack) {
  MakePack("a.bin", 100);
  const auto index = ReadText(
      "# optane-moe-index-v2\n@pack\t1\ta\ta.bin\n"
      "t\t0\t1\t0\t50\n"
      "t\t1\t1\t50\t50\n"   // ends exactly at the end: inside
      "t\t2\t1\t60\t50\n",  // 5: ends at 110 > 100
      IndexOptions{});
  EXPECT_TRUE(IsError(index.status(), absl::StatusCode::kOutOfRange, ErrorKind::kOutOfBounds,
                      {"idx.txt:5:", dir_.File("a.bin"), "100 bytes"}));
}

TEST_F(IndexV2Test, RowEndingAtPackEndIsInside) {
  MakePack("a.bin", 100);
  const auto index =
      ReadText("# optane-moe-index-v2\n@pack\t1\ta\ta.bin\nt\t0\t1\t36\t64\n", IndexOptions{});
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->packs()[0].size, 100u);
}

TEST_F(IndexV2Test, EmptyPackFileIsRefused) {
  MakePack("a.bin", 0);
  MakePack("b.bin", 16);
  const auto index =
      ReadText("# optane-moe-index-v2\n@pack\t1\ta\ta.bin\n@pack\t2\tb\tb.bin\nt\t0\t2\t0\t8\n",
               IndexOptions{});
  EXPECT_TRUE(IsError(index.status(), absl::StatusCode::kInvalidArgument, ErrorKind::kBadValue,
                      {"idx.txt:2:", "empty"}));
}

TEST_F(IndexV2Test, MissingIndexFile) {
  const auto index = ExpertIndex::Read(dir_.File("nope.txt"), IndexOptions{});
  EXPECT_TRUE(IsError(index.status(), absl::StatusCode::kNotFound, ErrorKind::kMissingFile,
                      {dir_.File("nope.txt") + ": "}));
}

TEST_F(IndexV2Test, ParsesDeepSeekSizedIndex) {
  // 58 layers x 256 experts x 3 projections: must parse in linear time.
  std::string text = "# optane-moe-index-v2\n@pack\t0\tq\tq.pack\n";
  uint64_t offset = 0;
  for (int layer = 0; layer < 58; ++layer) {
    for (const char* proj : {"up", "gate", "down"}) {
      const std::string tensor = "blk." + std::to_string(layer) + ".ffn_" + proj + "_exps.weight";
      for (int e = 0; e < 256; ++e) {
        text += tensor + "\t" + std::to_string(e) + "\t0\t" + std::to_string(offset) + "\t4096\n";
        offset += 4096;
      }
    }
  }
  const auto index = ExpertIndex::Parse(text, "idx.txt", NoPacks());
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->rows().size(), 44544u);
  const auto loc = index->Resolve("blk.57.ffn_down_exps.weight", 255, 4096);
  ASSERT_TRUE(loc.has_value());
  EXPECT_EQ(loc->offset, (44544u - 1) * 4096);
}

// ---------------------------------------------------------------- v1

using IndexV1Test = IndexTest;

TEST_F(IndexV1Test, ParsesRows) {
  const std::string text =
      "# a v1 index\n"
      "blk.0.ffn_up_exps.weight\t4096 1024 1 8\n"
      "\n"
      "blk.0.ffn_down_exps.weight\t0  2048 0   8\n";
  const auto index = ExpertIndex::Parse(text, "/m/idx.txt", V1NoPacks());
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->version(), 1);
  ASSERT_EQ(index->packs().size(), 1u);
  EXPECT_EQ(index->packs()[0].id, 0);
  EXPECT_EQ(index->packs()[0].label, "legacy-Q");
  EXPECT_EQ(index->packs()[0].path, Native("/m/q.pack"));
  EXPECT_EQ(index->packs()[0].line, 0);
  ASSERT_EQ(index->v1_rows().size(), 2u);
  const IndexV1Row& r = index->v1_rows()[0];
  EXPECT_EQ(r.tensor, kUp);
  EXPECT_EQ(r.q_base, 4096u);
  EXPECT_EQ(r.expert_bytes, 1024u);
  EXPECT_EQ(r.q_parity, 1u);
  EXPECT_EQ(r.expert_count, 8u);
  EXPECT_EQ(r.line, 2);
  EXPECT_EQ(index->v1_rows()[1].expert_bytes, 2048u);
  EXPECT_EQ(index->v1_rows()[1].line, 4);
  EXPECT_TRUE(index->rows().empty());
}

TEST_F(IndexV1Test, MarkerMustBeAWholeLine) {
  for (const std::string marker : {"# optane-moe-index-v2 ", "#optane-moe-index-v2",
                                   "# optane-moe-index-v2x", "# optane-moe-index-v1"}) {
    const auto index = ExpertIndex::Parse(marker + "\nt\t0 8 0 2\n", "idx.txt", V1NoPacks());
    ASSERT_TRUE(index.ok()) << index.status();
    EXPECT_EQ(index->version(), 1) << marker;
  }
}

TEST_F(IndexV1Test, NeedsQPack) {
  const auto index = ReadText("t\t0 8 0 2\n", NoPacks());
  EXPECT_TRUE(IsError(index.status(), absl::StatusCode::kFailedPrecondition,
                      ErrorKind::kMissingQPack, {index_path() + ": ", "v1_q_pack"}));
}

TEST_F(IndexV1Test, UnparsableRows) {
  for (const std::string row :
       {"t 0 8 0 2", "t\t0 8 0", "t\t0 8 0 2 9", "t\t0 8x 0 2", "t\t0\t8 0 2", "t\t0 8 0 -2", "t\t",
        "@pack\t1\tlabel\tp.bin", "t\t0 8 0 99999999999999999999"}) {
    const auto index = ReadText("# v1\n" + row + "\n", V1NoPacks());
    EXPECT_TRUE(IsError(index.status(), absl::StatusCode::kInvalidArgument, ErrorKind::kBadRow,
                        {"idx.txt:2:"}))
        << row;
  }
}

TEST_F(IndexV1Test, BadParity) {
  const auto index = ReadText("a\t0 8 0 2\nt\t0 8 2 2\n", V1NoPacks());
  EXPECT_TRUE(IsError(index.status(), absl::StatusCode::kInvalidArgument, ErrorKind::kBadValue,
                      {"idx.txt:2:", "Q_PARITY"}));
}

TEST_F(IndexV1Test, ZeroExpertBytes) {
  const auto index = ReadText("t\t0 0 0 2\n", V1NoPacks());
  EXPECT_TRUE(IsError(index.status(), absl::StatusCode::kInvalidArgument, ErrorKind::kBadValue,
                      {"idx.txt:1:", "EXPERT_BYTES"}));
}

TEST_F(IndexV1Test, DuplicateTensor) {
  const auto index = ReadText("t\t0 8 0 2\nu\t0 8 0 2\nt\t64 8 1 2\n", V1NoPacks());
  EXPECT_TRUE(IsError(index.status(), absl::StatusCode::kInvalidArgument, ErrorKind::kDuplicate,
                      {"idx.txt:3:", "line 1"}));
}

TEST_F(IndexV1Test, NoRows) {
  const auto index = ReadText("# only a comment\n\n", V1NoPacks());
  EXPECT_TRUE(IsError(index.status(), absl::StatusCode::kInvalidArgument, ErrorKind::kBadValue,
                      {"idx.txt: ", "index has no rows"}));
}

TEST_F(IndexV1Test, CrlfAndComments) {
  const auto index = ReadText("# c\r\n\r\nt\t16 8 1 4\r\n", V1NoPacks());
  ASSERT_TRUE(index.ok()) << index.status();
  ASSERT_EQ(index->v1_rows().size(), 1u);
  EXPECT_EQ(index->v1_rows()[0].expert_count, 4u);
  EXPECT_EQ(index->v1_rows()[0].line, 3);
}

TEST_F(IndexV1Test, QPackResolvedAndChecked) {
  MakePack("q.pack", 40);
  // Rows are not bounds-checked at open: Q_BASE far beyond the 40-byte pack is accepted.
  const auto index = ReadText("t\t1000000 8 0 4\n", IndexOptions{.v1_q_pack = "q.pack"});
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->packs()[0].path, dir_.File("q.pack"));
  EXPECT_EQ(index->packs()[0].size, 40u);
}

TEST_F(IndexV1Test, MissingQPack) {
  const auto index = ReadText("t\t0 8 0 4\n", IndexOptions{.v1_q_pack = "gone.pack"});
  EXPECT_TRUE(IsError(index.status(), absl::StatusCode::kNotFound, ErrorKind::kMissingFile,
                      {index_path() + ": ", dir_.File("gone.pack")}));
}

// ---------------------------------------------------------------- Resolve

using IndexResolveTest = IndexTest;

TEST_F(IndexResolveTest, V2UsesRowOnlyWhenBytesMatch) {
  const auto index = ExpertIndex::Parse(
      "# optane-moe-index-v2\n@pack\t1\ta\ta\n@pack\t2\tb\tb\nt\t3\t2\t4096\t1024\n", "idx.txt",
      NoPacks());
  ASSERT_TRUE(index.ok()) << index.status();
  const auto loc = index->Resolve("t", 3, 1024);
  ASSERT_TRUE(loc.has_value());
  EXPECT_EQ(loc->pack, 1u);
  EXPECT_EQ(loc->offset, 4096u);
  EXPECT_EQ(loc->bytes, 1024u);
  EXPECT_EQ(loc->line, 4);
  EXPECT_FALSE(index->Resolve("t", 3, 1023).has_value());
  EXPECT_FALSE(index->Resolve("t", 3, 2048).has_value());
  EXPECT_FALSE(index->Resolve("t", 2, 1024).has_value());
  EXPECT_FALSE(index->Resolve("u", 3, 1024).has_value());
}

TEST_F(IndexResolveTest, V1ParityCountAndOffset) {
  // Q holds the odd experts of t: expert e at 1000 + (e / 2) * 64, for e < 8.
  const auto index = ExpertIndex::Parse("t\t1000 64 1 8\n", "idx.txt", V1NoPacks());
  ASSERT_TRUE(index.ok()) << index.status();
  auto loc = index->Resolve("t", 5, 64);
  ASSERT_TRUE(loc.has_value());
  EXPECT_EQ(loc->pack, 0u);
  EXPECT_EQ(loc->offset, 1128u);
  EXPECT_EQ(loc->bytes, 64u);
  EXPECT_EQ(loc->line, 1);
  loc = index->Resolve("t", 1, 64);
  ASSERT_TRUE(loc.has_value());
  EXPECT_EQ(loc->offset, 1000u);
  loc = index->Resolve("t", 7, 64);
  ASSERT_TRUE(loc.has_value());
  EXPECT_EQ(loc->offset, 1192u);
  EXPECT_FALSE(index->Resolve("t", 4, 64).has_value());  // parity
  EXPECT_FALSE(index->Resolve("t", 9, 64).has_value());  // count
  EXPECT_FALSE(index->Resolve("t", 5, 65).has_value());  // bytes
  EXPECT_FALSE(index->Resolve("u", 5, 64).has_value());  // no row
}

TEST_F(IndexResolveTest, V1RangeMustLieInsidePack) {
  MakePack("q.pack", 1200);
  const auto index = ReadText("t\t1000 64 1 8\n", IndexOptions{.v1_q_pack = "q.pack"});
  ASSERT_TRUE(index.ok()) << index.status();
  // Expert 5: [1128, 1192) fits in 1200 bytes; expert 7: [1192, 1256) does not.
  ASSERT_TRUE(index->Resolve("t", 5, 64).has_value());
  EXPECT_FALSE(index->Resolve("t", 7, 64).has_value());
  // Without the pack size, the range is not checked.
  const auto unchecked = ExpertIndex::Parse("t\t1000 64 1 8\n", "idx.txt", V1NoPacks());
  ASSERT_TRUE(unchecked.ok()) << unchecked.status();
  EXPECT_TRUE(unchecked->Resolve("t", 7, 64).has_value());
}

TEST_F(IndexResolveTest, V1OffsetOverflowIsNotAHit) {
  const auto index =
      ExpertIndex::Parse("t\t18446744073709551000 1024 0 8\n", "idx.txt", V1NoPacks());
  ASSERT_TRUE(index.ok()) << index.status();
  // 2^64 - Q_BASE = 616: expert 0 starts at Q_BASE but ends past 2^64; expert 2 starts past it.
  EXPECT_FALSE(index->Resolve("t", 0, 1024).has_value());
  EXPECT_FALSE(index->Resolve("t", 2, 1024).has_value());
}

// ---------------------------------------------------------------- writer

using IndexWriterTest = IndexTest;

IndexV2Contents SampleContents() {
  IndexV2Contents c;
  c.comments = {"model: test", "packs written by expertd"};
  c.packs = {{.id = 1, .label = "hot", .path = "hot.pack"},
             {.id = 5, .label = "cold", .path = "cold.pack"}};
  c.rows = {
      {.tensor = "blk.0.ffn_up_exps.weight", .expert = 0, .pack_id = 1, .offset = 0, .bytes = 144},
      {.tensor = "blk.0.ffn_up_exps.weight", .expert = 1, .pack_id = 5, .offset = 0, .bytes = 144},
      {.tensor = "blk.0.ffn_up_exps.weight",
       .expert = 2,
       .pack_id = 1,
       .offset = 144,
       .bytes = 144}};
  return c;
}

TEST_F(IndexWriterTest, FormatIsExact) {
  EXPECT_EQ(FormatIndexV2(SampleContents()),
            "# optane-moe-index-v2\n"
            "# model: test\n"
            "# packs written by expertd\n"
            "@pack\t1\thot\thot.pack\n"
            "@pack\t5\tcold\tcold.pack\n"
            "blk.0.ffn_up_exps.weight\t0\t1\t0\t144\n"
            "blk.0.ffn_up_exps.weight\t1\t5\t0\t144\n"
            "blk.0.ffn_up_exps.weight\t2\t1\t144\t144\n");
}

TEST_F(IndexWriterTest, RoundTrip) {
  const IndexV2Contents c = SampleContents();
  MakePack("hot.pack", 288);
  MakePack("cold.pack", 144);
  ASSERT_TRUE(WriteIndexV2(index_path(), c).ok());
  const auto index = ExpertIndex::Read(index_path(), IndexOptions{});
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->version(), 2);
  ASSERT_EQ(index->packs().size(), c.packs.size());
  for (size_t i = 0; i < c.packs.size(); ++i) {
    EXPECT_EQ(index->packs()[i].id, c.packs[i].id);
    EXPECT_EQ(index->packs()[i].label, c.packs[i].label);
    EXPECT_EQ(index->packs()[i].path, dir_.File(c.packs[i].path));
  }
  ASSERT_EQ(index->rows().size(), c.rows.size());
  for (size_t i = 0; i < c.rows.size(); ++i) {
    const IndexRow& r = index->rows()[i];
    EXPECT_EQ(r.tensor, c.rows[i].tensor);
    EXPECT_EQ(r.expert, c.rows[i].expert);
    EXPECT_EQ(index->packs()[r.pack].id, c.rows[i].pack_id);
    EXPECT_EQ(r.offset, c.rows[i].offset);
    EXPECT_EQ(r.bytes, c.rows[i].bytes);
  }
  // Parse(FormatIndexV2(x)) reproduces x, paths included when the index has no folder.
  const auto parsed = ExpertIndex::Parse(FormatIndexV2(c), "idx.txt", NoPacks());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->packs()[1].path, "cold.pack");
}

TEST_F(IndexWriterTest, RefusesContentsThatDoNotReadBack) {
  IndexV2Contents tab = SampleContents();
  tab.rows[0].tensor = "a\tb";
  EXPECT_TRUE(IsError(WriteIndexV2(index_path(), tab), absl::StatusCode::kInvalidArgument,
                      ErrorKind::kBadRow, {index_path() + ": "}));
  IndexV2Contents hash = SampleContents();
  hash.rows[1].tensor = "#x";
  EXPECT_TRUE(IsError(WriteIndexV2(index_path(), hash), absl::StatusCode::kInvalidArgument,
                      ErrorKind::kBadValue, {index_path() + ": "}));
  IndexV2Contents comment = SampleContents();
  comment.comments.push_back("two\nlines");
  EXPECT_TRUE(IsError(WriteIndexV2(index_path(), comment), absl::StatusCode::kInvalidArgument,
                      ErrorKind::kBadValue, {index_path() + ": "}));
  IndexV2Contents undeclared = SampleContents();
  undeclared.rows[2].pack_id = 9;
  EXPECT_TRUE(IsError(WriteIndexV2(index_path(), undeclared), absl::StatusCode::kInvalidArgument,
                      ErrorKind::kUndeclaredPack, {index_path() + ": ", "idx.txt:8:"}));
  EXPECT_FALSE(std::filesystem::exists(index_path()));
}

}  // namespace
}  // namespace expertd
