#include <gtest/gtest.h>

#include "sim/check.hpp"
#include "sim/strategy.hpp"
#include "test_helpers.hpp"

namespace trainplan {
namespace {

Strategy base() {
  Strategy s;
  s.dp = 4;
  s.tp = 2;
  s.pp = 2;
  s.micro_batch = 2;
  s.global_batch = 64;
  s.seq_len = 2048;
  return s;
}

TEST(Strategy, DerivedSizes) {
  Strategy s = base();
  EXPECT_EQ(s.gpus(), 16);
  EXPECT_EQ(s.micro_batches(), 8);  // 64 / (4 * 2)
}

TEST(Strategy, ValidLayoutPasses) { EXPECT_FALSE(validate(base(), testing::gpt(24, 2048, 16))); }

TEST(Strategy, EachRuleNamesItsFlag) {
  const ModelSpec m = testing::gpt(24, 2048, 16);
  struct Case {
    void (*edit)(Strategy&);
    const char* starts;
  };
  const Case cases[] = {
      {[](Strategy& s) { s.tp = 3; }, "--tp 3: must divide the model's heads (16)"},
      {[](Strategy& s) { s.global_batch = 65; }, "--global-batch 65: must be divisible by dp x micro-batch"},
      {[](Strategy& s) { s.zero = 4; }, "--zero 4"},
      {[](Strategy& s) { s.vp = 2; }, "--vp 2: must be 1 unless --schedule interleaved"},
      {[](Strategy& s) { s.cp = 3; }, "--cp 3: 2 x cp must divide the sequence length"},
      {[](Strategy& s) { s.tp = 1; s.sequence_parallel = true; }, "--sequence-parallel on: needs --tp > 1"},
      {[](Strategy& s) { s.pp = 32; }, "--pp 32: pp x vp (32) must not exceed the model's layers (24)"},
      {[](Strategy& s) { s.schedule = ScheduleKind::interleaved; s.vp = 1; }, "--vp 1: must be >= 2"},
      {[](Strategy& s) { s.schedule = ScheduleKind::interleaved; s.vp = 2; s.global_batch = 8 * 3; s.micro_batch = 2; },
       "--global-batch 24: interleaving needs micro-batches per replica (3) divisible by pp (2)"},
  };
  for (const auto& c : cases) {
    Strategy s = base();
    c.edit(s);
    auto err = validate(s, m);
    ASSERT_TRUE(err.has_value()) << c.starts;
    EXPECT_EQ(err->rfind(c.starts, 0), 0u) << *err;
  }
}

TEST(Strategy, KvHeadsMustBeDivisibleByTp) {
  ModelSpec m = testing::gpt(24, 4096, 32);
  m.kv_heads = 4;
  Strategy s = base();
  s.tp = 8;
  s.dp = 1;
  s.global_batch = 16;
  auto err = validate(s, m);
  ASSERT_TRUE(err);
  EXPECT_NE(err->find("kv_heads (4)"), std::string::npos);
}

TEST(Strategy, JsonRoundTrip) {
  Strategy s = base();
  s.recompute = Recompute::selective;
  s.schedule = ScheduleKind::gpipe;
  s.dtype = Dtype::fp16;
  s.attention = Attention::standard;
  s.order = {Dim::tp, Dim::dp, Dim::cp, Dim::pp};
  Strategy back = strategy_from_json(to_json(s), "plan.json");
  EXPECT_EQ(to_json(back), to_json(s));
}

TEST(Strategy, JsonRejectsBadRankOrder) {
  auto j = to_json(base());
  j["rank_order"] = {"tp", "tp", "dp", "pp"};
  try {
    strategy_from_json(j, "plan.json");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("plan.json: strategy.rank_order"), std::string::npos) << e.what();
  }
}

TEST(Strategy, JsonRejectsUnknownKey) {
  auto j = to_json(base());
  j["pipeline"] = 3;
  EXPECT_THROW(strategy_from_json(j, "plan.json"), InputError);
}

TEST(Strategy, Describe) {
  Strategy s = base();
  s.sequence_parallel = true;
  EXPECT_EQ(describe(s), "dp4 tp2 pp2 zero0 mb2 none 1f1b sp");
}

}  // namespace
}  // namespace trainplan
