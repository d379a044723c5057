// Route traces (JSONL): the grammar, its errors, and the real Mixtral-8x7B traces read as they are.
#include "format/route_trace.h"

#include <gtest/gtest.h>

#include <string>

#include "support/test_support.h"

namespace expertd {
namespace {

using ::expertd::testing::IsError;
using ::expertd::testing::SharedDataDir;
using ::expertd::testing::TempDir;
using ::expertd::testing::WriteFile;

TEST(RouteTraceTest, ParsesAllKeys) {
  const auto records = ParseRouteTrace(
      R"({"token": 12, "layer": 3, "experts": [5, 0, 255], "weights": [0.5, 0.25, 0.25], "problem_id": 4, "extra": "ignored"})",
      "t.jsonl");
  ASSERT_TRUE(records.ok()) << records.status();
  ASSERT_EQ(records->size(), 1u);
  const RouteRecord& r = (*records)[0];
  EXPECT_EQ(r.token, 12);
  EXPECT_EQ(r.layer, 3u);
  EXPECT_EQ(r.experts, (std::vector<uint32_t>{5, 0, 255}));
  EXPECT_EQ(r.weights, (std::vector<float>{0.5f, 0.25f, 0.25f}));
  EXPECT_EQ(r.problem_id, 4);
  EXPECT_EQ(r.line, 1);
}

TEST(RouteTraceTest, OptionalKeysAndAliases) {
  const std::string text =
      "{\"token_idx\": 7, \"layer\": 0, \"experts\": [1]}\n"
      "\n"
      "   \n"
      "{\"token_pos\": 8, \"layer\": 31, \"experts\": [2, 3], \"gating_probs\": [0.75, 0.25]}\r\n"
      "{\"token\": -1, \"layer\": 1, \"experts\": [4], \"problem_id\": 0}";  // no final newline
  const auto records = ParseRouteTrace(text, "t.jsonl");
  ASSERT_TRUE(records.ok()) << records.status();
  ASSERT_EQ(records->size(), 3u);
  EXPECT_EQ((*records)[0].token, 7);
  EXPECT_EQ((*records)[0].problem_id, -1);
  EXPECT_TRUE((*records)[0].weights.empty());
  EXPECT_EQ((*records)[0].line, 1);
  EXPECT_EQ((*records)[1].token, 8);
  EXPECT_EQ((*records)[1].layer, 31u);
  EXPECT_EQ((*records)[1].weights, (std::vector<float>{0.75f, 0.25f}));
  EXPECT_EQ((*records)[1].line, 4);
  EXPECT_EQ((*records)[2].token, -1);
  EXPECT_EQ((*records)[2].problem_id, 0);
  EXPECT_EQ((*records)[2].line, 5);
}

TEST(RouteTraceTest, EmptyTextHasNoRecords) {
  const auto records = ParseRouteTrace("", "t.jsonl");
  ASSERT_TRUE(records.ok()) << records.status();
  EXPECT_TRUE(records->empty());
}

TEST(RouteTraceTest, MalformedLines) {
  const std::string good = R"({"token": 0, "layer": 0, "experts": [1]})";
  struct Case {
    std::string line;
    std::string needle;
  };
  const Case cases[] = {
      {R"({"token": 0, "layer": 0, "experts": [1])", "JSON"},
      {"not json", "JSON"},
      {R"([1, 2])", "object"},
      {R"({"layer": 0, "experts": [1]})", "token"},
      {R"({"token": 0, "experts": [1]})", "layer"},
      {R"({"token": 0, "layer": 0})", "experts"},
      {R"({"token": 0, "layer": 0, "experts": []})", "experts"},
      {R"({"token": 0, "layer": 0, "experts": 1})", "experts"},
      {R"({"token": 1.5, "layer": 0, "experts": [1]})", "token"},
      {R"({"token": "1", "layer": 0, "experts": [1]})", "token"},
      {R"({"token": 0, "layer": -1, "experts": [1]})", "layer"},
      {R"({"token": 0, "layer": 4294967296, "experts": [1]})", "layer"},
      {R"({"token": 0, "layer": 0, "experts": [1, -2]})", "expert"},
      {R"({"token": 0, "layer": 0, "experts": [1.0]})", "expert"},
      {R"({"token": 0, "layer": 0, "experts": [1, 2], "weights": [1.0]})", "weights"},
      {R"({"token": 0, "layer": 0, "experts": [1], "weights": ["a"]})", "weight"},
      {R"({"token": 0, "layer": 0, "experts": [1], "gating_probs": 0.5})", "weights"},
      {R"({"token": 0, "layer": 0, "experts": [1], "problem_id": "p"})", "problem_id"},
      {R"({"token": 18446744073709551615, "layer": 0, "experts": [1]})", "token"},
  };
  for (const Case& c : cases) {
    const auto records = ParseRouteTrace(good + "\n" + good + "\n" + c.line + "\n", "t.jsonl");
    EXPECT_TRUE(IsError(records.status(), absl::StatusCode::kInvalidArgument, ErrorKind::kBadRow,
                        {"t.jsonl:3: ", c.needle}))
        << c.line;
  }
}

TEST(RouteTraceTest, ReadsFile) {
  TempDir dir;
  WriteFile(dir.File("t.jsonl"), "{\"token\": 1, \"layer\": 2, \"experts\": [3]}\n");
  const auto records = ReadRouteTrace(dir.File("t.jsonl"));
  ASSERT_TRUE(records.ok()) << records.status();
  ASSERT_EQ(records->size(), 1u);
  EXPECT_EQ((*records)[0].experts, (std::vector<uint32_t>{3}));
}

TEST(RouteTraceTest, ErrorNamesTheFile) {
  TempDir dir;
  WriteFile(dir.File("t.jsonl"), "{\"token\": 1, \"layer\": 2, \"experts\": [3]}\n{\n");
  EXPECT_TRUE(IsError(ReadRouteTrace(dir.File("t.jsonl")).status(),
                      absl::StatusCode::kInvalidArgument, ErrorKind::kBadRow,
                      {dir.File("t.jsonl") + ":2: "}));
}

TEST(RouteTraceTest, MissingFile) {
  TempDir dir;
  EXPECT_TRUE(IsError(ReadRouteTrace(dir.File("gone.jsonl")).status(), absl::StatusCode::kNotFound,
                      ErrorKind::kMissingFile, {dir.File("gone.jsonl")}));
}

// The real traces (tests/data/traces/mixtral-8x7b, see PROVENANCE.txt there): Mixtral-8x7B,
// 32 layers, 8 experts, top-2. Counts from PROVENANCE.txt; first records read off `head -1`.
class RouteTraceMixtralTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(SharedDataDir().empty()) << "tests/data is missing";
    dir_ = SharedDataDir() + "/traces/mixtral-8x7b/";
  }

  // Every record is a top-2 choice among 8 experts of 32 layers, with both weights.
  static void ExpectMixtralShape(const std::vector<RouteRecord>& records) {
    for (size_t i = 0; i < records.size(); ++i) {
      const RouteRecord& r = records[i];
      ASSERT_EQ(r.line, static_cast<int>(i + 1));
      ASSERT_LT(r.layer, 32u) << "line " << r.line;
      ASSERT_EQ(r.experts.size(), 2u) << "line " << r.line;
      ASSERT_EQ(r.weights.size(), 2u) << "line " << r.line;
      ASSERT_LT(r.experts[0], 8u) << "line " << r.line;
      ASSERT_LT(r.experts[1], 8u) << "line " << r.line;
      ASSERT_NE(r.experts[0], r.experts[1]) << "line " << r.line;
      ASSERT_GE(r.problem_id, 0) << "line " << r.line;
    }
  }

  std::string dir_;
};

TEST_F(RouteTraceMixtralTest, Gsm8k) {
  const auto records = ReadRouteTrace(dir_ + "gsm8k_2_routing.jsonl");
  ASSERT_TRUE(records.ok()) << records.status();
  ASSERT_EQ(records->size(), 7889u);
  const RouteRecord& r = records->front();
  // {"dataset": "gsm8k", "problem_id": 0, "layer": 0, "experts": [7, 0],
  //  "gating_probs": [0.8003801107406616, 0.19961987435817719], "token_idx": 0}
  EXPECT_EQ(r.problem_id, 0);
  EXPECT_EQ(r.layer, 0u);
  EXPECT_EQ(r.token, 0);
  EXPECT_EQ(r.experts, (std::vector<uint32_t>{7, 0}));
  ASSERT_EQ(r.weights.size(), 2u);
  EXPECT_FLOAT_EQ(r.weights[0], 0.8003801107406616f);
  EXPECT_FLOAT_EQ(r.weights[1], 0.19961987435817719f);
  ExpectMixtralShape(*records);
}

TEST_F(RouteTraceMixtralTest, HumanEval) {
  const auto records = ReadRouteTrace(dir_ + "humaneval_2_routing.jsonl");
  ASSERT_TRUE(records.ok()) << records.status();
  ASSERT_EQ(records->size(), 10779u);
  const RouteRecord& r = records->front();
  // {"dataset": "humaneval", "problem_id": 0, "layer": 0, "experts": [6, 5],
  //  "gating_probs": [0.6959583759307861, 0.30404168367385864], "token_idx": 0}
  EXPECT_EQ(r.problem_id, 0);
  EXPECT_EQ(r.layer, 0u);
  EXPECT_EQ(r.token, 0);
  EXPECT_EQ(r.experts, (std::vector<uint32_t>{6, 5}));
  ASSERT_EQ(r.weights.size(), 2u);
  EXPECT_FLOAT_EQ(r.weights[0], 0.6959583759307861f);
  EXPECT_FLOAT_EQ(r.weights[1], 0.30404168367385864f);
  ExpectMixtralShape(*records);
}

TEST_F(RouteTraceMixtralTest, RoutingRaw) {
  const auto records = ReadRouteTrace(dir_ + "routing_raw.jsonl");
  ASSERT_TRUE(records.ok()) << records.status();
  ASSERT_EQ(records->size(), 6777u);
  const RouteRecord& r = records->front();
  // {"dataset": "humaneval", "problem_id": 0, "layer": 0, "token_pos": 0, "experts": [5, 2],
  //  "gating_probs": [0.7783125042915344, 0.22168749570846558]}
  EXPECT_EQ(r.problem_id, 0);
  EXPECT_EQ(r.layer, 0u);
  EXPECT_EQ(r.token, 0);
  EXPECT_EQ(r.experts, (std::vector<uint32_t>{5, 2}));
  ASSERT_EQ(r.weights.size(), 2u);
  EXPECT_FLOAT_EQ(r.weights[0], 0.7783125042915344f);
  EXPECT_FLOAT_EQ(r.weights[1], 0.22168749570846558f);
  ExpectMixtralShape(*records);
}

}  // namespace
}  // namespace expertd
