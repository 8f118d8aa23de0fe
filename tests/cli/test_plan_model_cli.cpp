// `--plan FILE` runs the model the plan carries ("model_spec", the model-file format): a plan
// written by predict or search from a Hugging Face config, a config folder or a model file keeps
// working after that file is gone or moved, and gives the figures the original file gave. A
// --model flag still overrides the carried model; a plan written before plans carried one (only
// "model", a name) still loads the model by that name. The software profile a search or a
// simulation costed the plan with travels with it the same way (by name).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "cli_fixture.hpp"
#include "sim/model_spec.hpp"

namespace trainplan::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kHf = fs::path(TRAINPLAN_TEST_DATA_DIR) / "hf";
const std::string kLayout = " --cluster dgx-h100 --gpus 8 --tp 2 --pp 2 --global-batch 16 --seq 1024";

class PlanModelCli : public CliTest {
 protected:
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // Copies a Hugging Face config folder of the test data to dir_/<name>/config.json.
  std::string copy_config_folder(const std::string& from, const std::string& name) const {
    fs::create_directories(dir_ / name);
    fs::copy_file(kHf / from / "config.json", dir_ / name / "config.json");
    return path(name);
  }

  // The figures of two predictions agree: layout, memory, time, throughput and the model.
  void expect_same_plan(const json& a, const json& b) const {
    for (const char* k : {"strategy", "memory", "time", "throughput", "model", "model_spec", "feasible"}) {
      EXPECT_EQ(a.at(k), b.at(k)) << k;
    }
  }

  // `predict --plan PLAN --json OUT` must take the plan (exit 0 or 3: an infeasible plan is an answer).
  json predict_plan(const std::string& plan, const std::string& out, const std::string& extra = "") const {
    const Result r = run("predict --plan " + plan + extra + " --json " + out);
    EXPECT_TRUE(r.code == 0 || r.code == 3) << r.err;
    EXPECT_EQ(r.err, "");  // no note: the sequence length is the plan's
    return fs::exists(out) ? read(out) : json();
  }
};

// predict --model config.json --json p.json, then the config is deleted: --plan p.json still runs,
// with the very figures of the config.
TEST_F(PlanModelCli, PredictionFromAConfigFileRunsAfterTheFileIsDeleted) {
  const std::string folder = copy_config_folder("qwen2-0.5b", "qwen");
  const std::string config = folder + "/config.json";
  const Result r = run("predict --model " + config + kLayout + " --json " + path("p.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  const json p = read(path("p.json"));
  ASSERT_TRUE(p.contains("model_spec"));
  EXPECT_EQ(p["model_spec"]["name"], p["model"]);
  fs::remove_all(folder);
  expect_same_plan(predict_plan(path("p.json"), path("again.json")), p);
}

// search --model config.json --json s.json, then the config is deleted: --plan s.json runs the best
// entry with the searched model, as --plan s.json --model config.json did while the file was there.
TEST_F(PlanModelCli, SearchFromAConfigFileRunsAfterTheFileIsDeleted) {
  const std::string folder = copy_config_folder("qwen2-0.5b", "qwen");
  const std::string config = folder + "/config.json";
  const Result s = run("search --model " + config +
                       " --cluster dgx-h100 --gpus 8 --global-batch 16 --seq 1024 --top 1 --threads 1 --json " + path("s.json"));
  ASSERT_EQ(s.code, 0) << s.err;
  const json search = read(path("s.json"));
  ASSERT_TRUE(search.contains("model_spec"));
  EXPECT_EQ(search["model_spec"]["name"], search["model"]);
  const json with_file = predict_plan(path("s.json"), path("ref.json"), " --model " + config);
  fs::remove_all(folder);
  const json without = predict_plan(path("s.json"), path("p.json"));
  expect_same_plan(without, with_file);
  EXPECT_EQ(without["strategy"], search["top"][0]["strategy"]);
}

// A Hugging Face folder (--model DIR), searched and predicted, then deleted.
TEST_F(PlanModelCli, ConfigFolderPlansRunAfterTheFolderIsDeleted) {
  const std::string folder = copy_config_folder("mistral-7b", "my-mistral");
  ASSERT_EQ(run("predict --model " + folder + kLayout + " --json " + path("p.json")).code, 0);
  ASSERT_EQ(run("search --model " + folder + " --cluster dgx-h100 --gpus 8 --global-batch 16 --seq 1024 --top 1 "
                "--threads 1 --json " + path("s.json")).code, 0);
  const json ref = predict_plan(path("s.json"), path("ref.json"));
  fs::remove_all(folder);
  const json p = read(path("p.json"));
  EXPECT_EQ(p["model"], "my-mistral");  // named after its folder
  expect_same_plan(predict_plan(path("p.json"), path("again.json")), p);
  expect_same_plan(predict_plan(path("s.json"), path("s_again.json")), ref);
}

// A trainplan model file that moved after the plan was written.
TEST_F(PlanModelCli, ModelFilePlanRunsAfterTheFileMoved) {
  json m = to_json(load_model("gpt2", TRAINPLAN_SOURCE_DIR));
  m["name"] = "my-gpt";
  m["layers"] = 6;
  std::ofstream(path("my-gpt.json")) << m.dump(2);
  ASSERT_EQ(run("predict --model " + path("my-gpt.json") + kLayout + " --json " + path("p.json")).code, 0);
  fs::rename(path("my-gpt.json"), path("moved.json"));
  const json p = read(path("p.json"));
  EXPECT_EQ(p["model_spec"], m);
  expect_same_plan(predict_plan(path("p.json"), path("again.json")), p);
}

// From a built-in name: the plan carries the built-in model as its file defines it.
TEST_F(PlanModelCli, BuiltInModelIsCarriedAsItsFileDefinesIt) {
  ASSERT_EQ(run("predict --model gpt2" + kLayout + " --json " + path("p.json")).code, 0);
  ASSERT_EQ(run("search --model gpt2 --cluster dgx-h100 --gpus 8 --global-batch 16 --top 1 --threads 1 --json " +
                path("s.json")).code, 0);
  const json builtin = to_json(load_model("gpt2", TRAINPLAN_SOURCE_DIR));
  const json p = read(path("p.json"));
  EXPECT_EQ(p["model_spec"], builtin);
  EXPECT_EQ(read(path("s.json"))["model_spec"], builtin);
  expect_same_plan(predict_plan(path("p.json"), path("again.json")), p);
  // simulate's prediction carries it too.
  ASSERT_EQ(run("simulate --plan " + path("p.json") + " --json " + path("sim.json")).code, 0);
  EXPECT_EQ(read(path("sim.json"))["model_spec"], builtin);
}

// A folder that happens to carry a built-in's name runs the model it held, not the built-in one.
TEST_F(PlanModelCli, ANameThatIsAlsoABuiltInRunsTheCarriedModel) {
  const std::string folder = copy_config_folder("pythia-160m", "gpt2");
  ASSERT_EQ(run("predict --model " + folder + kLayout + " --json " + path("p.json")).code, 0);
  fs::remove_all(folder);
  const json p = read(path("p.json"));
  ASSERT_EQ(p["model"], "gpt2");
  ASSERT_NE(p["model_spec"], to_json(load_model("gpt2", TRAINPLAN_SOURCE_DIR)));  // the case this test is about
  expect_same_plan(predict_plan(path("p.json"), path("again.json")), p);
}

// --model overrides the model the plan carries, as it overrides its name.
TEST_F(PlanModelCli, ModelFlagOverridesTheCarriedModel) {
  ASSERT_EQ(run("predict --model gpt2" + kLayout + " --json " + path("p.json")).code, 0);
  const json q = predict_plan(path("p.json"), path("q.json"), " --model gpt2-medium");
  EXPECT_EQ(q["model"], "gpt2-medium");
  EXPECT_EQ(q["model_spec"], to_json(load_model("gpt2-medium", TRAINPLAN_SOURCE_DIR)));
}

// A plan written before plans carried the model: its name is loaded, as before.
TEST_F(PlanModelCli, PlanWithoutModelSpecLoadsTheModelByName) {
  ASSERT_EQ(run("predict --model gpt2" + kLayout + " --json " + path("p.json")).code, 0);
  json old = read(path("p.json"));
  old.erase("model_spec");
  std::ofstream(path("old.json")) << old.dump(2);
  const json q = predict_plan(path("old.json"), path("q.json"));
  EXPECT_EQ(q["model_spec"], read(path("p.json"))["model_spec"]);
  // And a name that no longer loads is the plan's fault, named so.
  old["model"] = "gone-model";
  std::ofstream(path("gone.json")) << old.dump(2);
  const Result r = run("predict --plan " + path("gone.json"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("its model 'gone-model' does not load"), std::string::npos) << r.err;
}

// The carried model is read as strictly as a model file, and must be the plan's "model".
TEST_F(PlanModelCli, CarriedModelIsCheckedAsAModelFile) {
  ASSERT_EQ(run("predict --model gpt2" + kLayout + " --json " + path("p.json")).code, 0);
  const json good = read(path("p.json"));
  auto refused = [&](const json& doc) {
    std::ofstream(path("bad.json")) << doc.dump(2);
    const Result r = run("predict --plan " + path("bad.json"));
    EXPECT_EQ(r.code, 2);
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    return r.err;
  };
  json bad = good;
  bad["model_spec"]["layers"] = 0;
  EXPECT_NE(refused(bad).find("bad.json: model_spec: layers = 0, must be in [1, 100000]"), std::string::npos);
  bad = good;
  bad["model_spec"]["surplus"] = 1;
  EXPECT_NE(refused(bad).find("model_spec: surplus is not a known key"), std::string::npos);
  bad = good;
  bad["model_spec"]["dropout"] = nullptr;
  EXPECT_NE(refused(bad).find("model_spec: dropout = null, must be a number, not null"), std::string::npos);
  bad = good;
  bad["model"] = "gpt2-medium";
  EXPECT_NE(refused(bad).find("model = \"gpt2-medium\", must be model_spec.name (\"gpt2\")"), std::string::npos);
  bad = good;
  bad["model_spec"] = "gpt2";
  EXPECT_NE(refused(bad).find("model_spec = \"gpt2\", must be a JSON object"), std::string::npos);
}

// search and simulate name the software profile they costed with, and --plan costs with it.
TEST_F(PlanModelCli, SearchAndSimulateCarryTheirSoftwareToThePlan) {
  // (llama-1b has no dropout, which pytorch-eager would leave out with a note.)
  ASSERT_EQ(run("search --model llama-1b --cluster dgx-h100 --gpus 8 --global-batch 16 --seq 1024 --top 1 --threads 1 "
                "--software pytorch-eager --json " + path("s.json")).code, 0);
  EXPECT_EQ(read(path("s.json"))["software"], "pytorch-eager");
  EXPECT_EQ(predict_plan(path("s.json"), path("p.json"))["software"], "pytorch-eager");
  ASSERT_EQ(run("simulate --model llama-1b" + kLayout + " --software pytorch-eager --json " + path("sim.json")).code, 0);
  EXPECT_EQ(read(path("sim.json"))["software"], "pytorch-eager");
  EXPECT_EQ(predict_plan(path("sim.json"), path("q.json"))["software"], "pytorch-eager");
}

}  // namespace
}  // namespace trainplan::testing
