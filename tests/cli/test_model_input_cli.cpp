// The CLI's --model input as a newcomer gives it: a Hugging Face model folder (its config.json),
// and a config without --seq, where the command states the training length it assumed and why,
// in one line on stderr (the rule: set_hf_training_seq_len in sim/model_spec.hpp).
#include <gtest/gtest.h>

#include <string>

#include "cli_fixture.hpp"

namespace trainplan::testing {
namespace {

const std::string kHf = std::string(TRAINPLAN_TEST_DATA_DIR) + "/hf/";
const std::string kPlan = " --cluster dgx-h100 --gpus 8 --tp 8 --global-batch 8";

class ModelInputCli : public CliTest {};

TEST_F(ModelInputCli, FolderReadsItsConfigJson) {
  const auto folder = dir_ / "folder.json", file = dir_ / "file.json";
  const Result a = run("predict --model " + kHf + "llama3-8b" + kPlan + " --json " + folder.string());
  const Result b = run("predict --model " + kHf + "llama3-8b/config.json" + kPlan + " --json " + file.string());
  ASSERT_EQ(a.code, 0) << a.err;
  ASSERT_EQ(b.code, 0) << b.err;
  EXPECT_EQ(read(folder), read(file));
  EXPECT_EQ(read(folder)["model"], "llama3-8b");  // named after the folder
  EXPECT_EQ(a.out, b.out);
}

TEST_F(ModelInputCli, FolderWithoutConfigJsonIsOneLine) {
  const Result r = run("predict --model " + kHf + kPlan);
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "trainplan predict: --model " + kHf +
                       ": is a directory without a config.json (a Hugging Face model folder holds one; "
                       "or name a model file)\n");
}

// Llama 3 configs give max_position_embeddings 8192 (3.1: 131072); the family was pre-trained on
// 8192-token sequences, which the command uses and says.
TEST_F(ModelInputCli, Llama3ConfigWithoutSeqUsesAndStates8192) {
  const auto json = dir_ / "p.json";
  const Result r = run("predict --model " + kHf + "llama3-8b" + kPlan + " --json " + json.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "trainplan predict: note: sequence length 8192: the Llama 3 family's pre-training length (the "
                   "config states no training length, and its max_position_embeddings is the longest sequence, "
                   "not the trained one); --seq sets it\n");
  EXPECT_EQ(read(json)["strategy"]["seq_len"], 8192);
}

// Mistral 7B's config allows 32768 positions; without --seq the command uses the stated 4096.
TEST_F(ModelInputCli, OtherConfigWithoutSeqUsesAndStates4096) {
  const auto json = dir_ / "p.json";
  const Result r = run("predict --model " + kHf + "mistral-7b" + kPlan + " --json " + json.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "trainplan predict: note: sequence length 4096: trainplan's default for a config that states no "
                   "training length (its max_position_embeddings is the longest sequence, not the trained one); "
                   "--seq sets it\n");
  EXPECT_EQ(read(json)["strategy"]["seq_len"], 4096);
}

// --seq given: that length, and nothing to say. A trainplan model file states its own seq_len.
TEST_F(ModelInputCli, SeqOrModelFileNeedsNoNote) {
  const auto json = dir_ / "p.json";
  const Result r = run("predict --model " + kHf + "mistral-7b" + kPlan + " --seq 2048 --json " + json.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(read(json)["strategy"]["seq_len"], 2048);
  const Result zoo = run("predict --model llama3-8b" + kPlan);
  EXPECT_EQ(zoo.code, 0) << zoo.err;
  EXPECT_EQ(zoo.err, "");
}

// search states it the same way; GPT-2's 1024 learned positions cap the 4096 default.
TEST_F(ModelInputCli, SearchStatesTheLengthCappedByPositions) {
  const auto json = dir_ / "s.json";
  const Result r = run("search --model " + kHf + "gpt2 --cluster dgx-h100 --gpus 8 --global-batch 64 --json " +
                       json.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "trainplan search: note: sequence length 1024: the config's n_positions, the longest sequence its "
                   "positions allow (below the 4096 trainplan assumes for a config that states no training length); "
                   "--seq sets it\n");
  EXPECT_EQ(read(json)["top"][0]["strategy"]["seq_len"], 1024);
}

}  // namespace
}  // namespace trainplan::testing
