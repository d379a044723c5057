#include "engine/predictor.h"

#include <gtest/gtest.h>

namespace expertd {
namespace {

PredictorOptions Options() {
  PredictorOptions o;
  o.layers = {1, 2, 3, 5};  // MoE blocks in sweep order (4 is dense)
  o.lookahead = 2;
  o.max_experts = 3;
  o.history_tokens = 2;
  return o;
}

TEST(Predictor, HistoryPredictsTheLayerAheadFromRecentRoutes) {
  auto p = MakePredictor("history", Options());
  ASSERT_TRUE(p.ok()) << p.status();
  const std::vector<uint32_t> r1 = {7, 1}, r2 = {4, 1}, r3 = {9, 8};
  // Token 0: nothing is known about layer 3 yet.
  EXPECT_TRUE((*p)->Step(1, r1).empty());
  // Two ahead of layer 3 is layer 1 of the next token (3 -> 5 -> 1), which routed r1.
  const std::vector<Prediction> wrap = (*p)->Step(3, r1);
  ASSERT_EQ(wrap.size(), 1u);
  EXPECT_EQ(wrap[0].layer, 1u);
  EXPECT_EQ(wrap[0].experts, r1);
  // After layer 3 routed r1 and then r2, layer 1 asks for layer 3 (two ahead).
  (*p)->Step(3, r2);
  const std::vector<Prediction> got = (*p)->Step(1, r3);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].layer, 3u);
  // Most recent route first, union without repeats, capped at max_experts.
  EXPECT_EQ(got[0].experts, (std::vector<uint32_t>{4, 1, 7}));
}

TEST(Predictor, HistoryWrapsToTheNextTokensSweep) {
  auto p = MakePredictor("history", Options());
  ASSERT_TRUE(p.ok());
  const std::vector<uint32_t> r = {2, 6};
  (*p)->Step(2, r);
  const auto got = (*p)->Step(5, r);  // two ahead of 5 is 2 (next token)
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].layer, 2u);
  EXPECT_EQ(got[0].experts, r);
}

TEST(Predictor, HistoryForgetsOldTokens) {
  auto p = MakePredictor("history", Options());
  ASSERT_TRUE(p.ok());
  const std::vector<uint32_t> old = {11}, mid = {12}, now = {13};
  (*p)->Step(3, old);
  (*p)->Step(3, mid);
  (*p)->Step(3, now);  // history_tokens = 2: `old` is gone
  const auto got = (*p)->Step(1, now);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].experts, (std::vector<uint32_t>{13, 12}));
}

TEST(Predictor, NoneAndHintsPredictNothing) {
  for (const char* name : {"none", "hints"}) {
    auto p = MakePredictor(name, Options());
    ASSERT_TRUE(p.ok());
    EXPECT_EQ((*p)->name(), name);
    const std::vector<uint32_t> r = {1};
    for (uint32_t l : {1, 2, 3, 5, 1, 2}) EXPECT_TRUE((*p)->Step(l, r).empty());
  }
}

TEST(Predictor, UnknownNameListsTheValidOnes) {
  auto p = MakePredictor("oracle", Options());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(p.status().message()).find("history, none, hints"), std::string::npos);
}

}  // namespace
}  // namespace expertd
