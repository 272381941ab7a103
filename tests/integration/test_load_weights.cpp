// checkpoint.load: a run starts from another run's weights (any layout, the
// optimizer and data fresh), proved against the first run's own evaluation
// of those weights; `ptrain check` refuses a source that is not there.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/test_support.h"

using ptrain::test::runPtrain;
using ptrain::test::TempDir;

namespace {

std::string quickstart() { return ptrain::test::sourceDir() + "/configs/quickstart.yaml"; }

double evalLoss(const std::string& runDir) {
  const std::string line = ptrain::test::readLastEvaluation(runDir);
  if (line.empty()) return NAN;
  return nlohmann::json::parse(line)["eval_loss"].get<double>();
}

double firstLoss(const std::string& runDir) {
  return nlohmann::json::parse(ptrain::test::readTrainingSteps(runDir).at(1))["loss"].get<double>();
}

}  // namespace

TEST(LoadWeights, ARunStartsFromAnotherRunsWeightsAtAnyLayout) {
  TempDir tmp;
  const std::string a = tmp.path() + "/a";
  auto r = runPtrain({"run", quickstart(), "--nproc", "1", "train.steps=20", "train.eval_every=0", "--run-dir", a},
                     {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const double trained = evalLoss(a);
  ASSERT_TRUE(std::isfinite(trained)) << r.output;

  // One step at a learning rate too small to move the weights: the run's
  // evaluation at its end is of A's weights, read at tp 2 from a tp 1 save.
  const std::vector<std::string> still = {"train.steps=1", "optimizer.lr=1e-12", "train.eval_every=0",
                                          "checkpoint.save_final=false"};
  const std::string b = tmp.path() + "/b";
  std::vector<std::string> args = {"run", quickstart(), "--nproc", "2", "parallel.tensor_model_parallel_size=2",
                                   "checkpoint.load=" + a, "--run-dir", b};
  args.insert(args.end(), still.begin(), still.end());
  r = runPtrain(args, {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("weights from " + a + " (step 20); optimizer and data start fresh"), std::string::npos)
      << r.output;
  EXPECT_LT(ptrain::test::relDiff(evalLoss(b), trained), 1e-5) << evalLoss(b) << " vs " << trained;

  // A step folder, one rank: the same first step as at tp 2, and not a fresh model's.
  const std::string c = tmp.path() + "/c";
  args = {"run", quickstart(), "--nproc", "1", "checkpoint.load=" + a + "/checkpoints/step_20", "--run-dir", c};
  args.insert(args.end(), still.begin(), still.end());
  r = runPtrain(args, {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_LT(ptrain::test::relDiff(firstLoss(c), firstLoss(b)), 1e-5) << firstLoss(c) << " vs " << firstLoss(b);
  // Where A ended, not where a fresh model starts.
  const double last = nlohmann::json::parse(ptrain::test::readTrainingSteps(a).at(20))["loss"].get<double>();
  EXPECT_LT(std::abs(firstLoss(c) - last), std::abs(firstLoss(c) - firstLoss(a)))
      << firstLoss(c) << ": A began at " << firstLoss(a) << " and ended at " << last;

  // A source that is not there: refused by check and run alike, in one line.
  for (const char* command : {"check", "run"}) {
    std::vector<std::string> bad = {command, quickstart(), "checkpoint.load=" + tmp.path() + "/nowhere"};
    if (std::string(command) == "run") bad.insert(bad.end(), {"--run-dir", tmp.path() + "/never"});
    r = runPtrain(bad, {}, 60);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("checkpoint.load: " + tmp.path() + "/nowhere: not found"), std::string::npos) << r.output;
  }
  // GRPO has its own key for the actor's start.
  r = runPtrain({"check", ptrain::test::sourceDir() + "/configs/grpo/arith_grpo.yaml", "actor_rollout_ref.model.path=",
                 "checkpoint.load=" + a},
                {}, 60);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("set that instead"), std::string::npos) << r.output;
}

// Weights made elsewhere: `ptrain export --format hf` writes a GPT-2 folder,
// and checkpoint.load of that folder (at tp 2: each rank reads its rows,
// transposed and permuted from GPT-2's layout), or of a bare safetensors
// state dict (what `ptrain checkpoint consolidate` writes), starts from the
// very weights of the step folder itself.
TEST(LoadWeights, HuggingFaceFoldersAndStateDictsStartFromTheSameWeights) {
  TempDir tmp;
  const std::string a = tmp.path() + "/a";
  auto r = runPtrain({"run", quickstart(), "--nproc", "1", "train.steps=10", "train.eval_every=0", "--run-dir", a},
                     {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string hf = tmp.path() + "/hf";
  r = runPtrain({"export", a, "--format", "hf", hf}, {}, 120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(hf + ": hf weights of " + a + "/checkpoints/step_10 (step 10)"), std::string::npos)
      << r.output;
  r = runPtrain({"checkpoint", "consolidate", a + "/checkpoints/step_10", tmp.path() + "/whole"}, {}, 120);
  ASSERT_EQ(r.exit_code, 0) << r.output;

  const std::vector<std::string> still = {"train.steps=1", "optimizer.lr=1e-12", "train.eval_every=0",
                                          "checkpoint.save_final=false"};
  auto firstStep = [&](const std::string& name, const std::string& from, int tp) {
    std::vector<std::string> args = {"run", quickstart(), "--nproc", std::to_string(tp),
                                     "parallel.tensor_model_parallel_size=" + std::to_string(tp),
                                     "checkpoint.load=" + from, "--run-dir", tmp.path() + "/" + name};
    args.insert(args.end(), still.begin(), still.end());
    auto run = runPtrain(args, {}, 300);
    EXPECT_EQ(run.exit_code, 0) << run.output;
    return run.exit_code == 0 ? firstLoss(tmp.path() + "/" + name) : NAN;
  };
  const double fromStep = firstStep("step", a, 1);
  EXPECT_EQ(firstStep("hf", hf, 2), fromStep);
  EXPECT_EQ(firstStep("file", tmp.path() + "/whole/model.safetensors", 1), fromStep);

  // bf16 with float32 masters: the masters start from the loaded weights
  // too, so the steps after the first (which the masters write back) stay
  // where A ended instead of returning to a fresh model's loss.
  {
    std::vector<std::string> args = {"run", quickstart(), "--nproc", "1", "precision.name=bf16",
                                     "checkpoint.load=" + hf, "--run-dir", tmp.path() + "/bf16",
                                     "train.steps=3", "optimizer.lr=1e-12", "train.eval_every=0",
                                     "checkpoint.save_final=false"};
    r = runPtrain(args, {}, 300);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto steps = ptrain::test::readTrainingSteps(tmp.path() + "/bf16");
    const double third = nlohmann::json::parse(steps.at(3))["loss"].get<double>();
    EXPECT_LT(std::abs(third - fromStep), std::abs(third - firstLoss(a)) / 4)
        << third << ": A began at " << firstLoss(a) << ", the loaded weights give " << fromStep;
  }

  // A GPT-2 of another shape is refused by check, naming the key to set.
  r = runPtrain({"check", quickstart(), "model.hidden_size=128", "checkpoint.load=" + hf}, {}, 60);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("checkpoint.load: " + hf + "/config.json: n_embd is 64, this model's model.hidden_size is "
                          "128; set model.hidden_size: 64"),
            std::string::npos)
      << r.output;
  // A trainer without an export refuses the format in one line.
  r = runPtrain({"export", a, "--format", "onnx", tmp.path() + "/onnx"}, {}, 60);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--format onnx: this trainer exports only hf"), std::string::npos) << r.output;
}
