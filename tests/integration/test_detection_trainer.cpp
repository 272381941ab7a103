// The detection trainer end to end through the ptrain binary: a short CenterNet
// run on small mosaics, data-parallel and tensor-parallel, exits cleanly,
// learns (the loss falls), reports COCO metrics in [0, 1] and writes its
// detections and ground truth as COCO JSON.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/test_support.h"

namespace fs = std::filesystem;
using ptrain::test::runPtrain;
using ptrain::test::TempDir;

namespace {

// 64x64 canvases with up to 3 small items and a 1-block detector: 20 steps
// and an evaluation take seconds on 2 cores.
const char* kTinyRecipe = R"(
name: detection_tiny
trainer: {name: detection}
model: {num_layers: 1, hidden_size: 16, ffn_hidden_size: 16, stem_channels: 8}
data: {name: mosaic, canvas: 64, max_items: 3, min_scale: 0.75, max_scale: 1.25, eval_size: 32}
train: {steps: 20, global_batch_size: 16, seed: 7, eval_every: 20, log_every: 5}
optimizer: {name: adamw, lr: 0.003, lr_schedule: cosine, warmup_steps: 3}
checkpoint: {every: 0}
log: {progress: lines}
)";

// The last line of metrics.jsonl that carries eval_map.
nlohmann::json lastEvaluation(const std::string& runDir) {
  nlohmann::json last;
  std::istringstream in(ptrain::test::readFile(runDir + "/metrics.jsonl"));
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("eval_map")) last = j;
  }
  return last;
}

void expectTrainsAndEvaluates(const std::string& runDir, const ptrain::test::ProcessResult& r) {
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::map<int, double> losses;
  for (const auto& [step, text] : ptrain::test::readTrainingSteps(runDir)) {
    losses[step] = nlohmann::json::parse(text)["loss"].get<double>();
  }
  ASSERT_EQ(losses.size(), 20u) << r.output;
  EXPECT_LT(losses[20], losses[1] * 0.8) << "step 1: " << losses[1] << ", step 20: " << losses[20];

  const nlohmann::json eval = lastEvaluation(runDir);
  ASSERT_FALSE(eval.is_null()) << r.output;
  EXPECT_EQ(eval["step"].get<int>(), 20);
  for (const char* name : {"eval_map", "eval_map50", "eval_map75", "eval_ar100"}) {
    ASSERT_TRUE(eval.contains(name)) << name << " missing in " << eval.dump();
    EXPECT_GE(eval[name].get<double>(), 0.0) << name;
    EXPECT_LE(eval[name].get<double>(), 1.0) << name;
  }
  EXPECT_TRUE(eval.contains("eval_loss"));

  // COCO JSON beside the metrics: the ground truth of the 32 canvases and a
  // results list whose entries refer to them.
  const auto gt = nlohmann::json::parse(ptrain::test::readFile(runDir + "/coco_gt.json"));
  EXPECT_EQ(gt["images"].size(), 32u);
  EXPECT_FALSE(gt["annotations"].empty());
  const auto dets = nlohmann::json::parse(ptrain::test::readFile(runDir + "/detections.json"));
  ASSERT_TRUE(dets.is_array());
  for (const auto& d : dets) {
    EXPECT_GE(d["image_id"].get<int64_t>(), 0);
    EXPECT_LT(d["image_id"].get<int64_t>(), 32);
    EXPECT_GE(d["category_id"].get<int64_t>(), 1);
    EXPECT_LE(d["category_id"].get<int64_t>(), 10);
    EXPECT_EQ(d["bbox"].size(), 4u);
  }
}

}  // namespace

TEST(DetectionTrainer, DataParallelRunLearnsAndReportsCocoMetrics) {
  TempDir tmp;
  const std::string recipe = tmp.write("tiny.yaml", kTinyRecipe);
  const std::string dir = tmp.path() + "/dp2";
  auto r = runPtrain({"run", recipe, "--nproc", "2", "--run-dir", dir}, {"OMP_NUM_THREADS=1"}, 300);
  expectTrainsAndEvaluates(dir, r);
  // The run summary's throughput counts canvases.
  EXPECT_NE(r.output.find("images/s"), std::string::npos) << r.output;
}

TEST(DetectionTrainer, TensorParallelRunLearnsAndReportsCocoMetrics) {
  TempDir tmp;
  const std::string recipe = tmp.write("tiny.yaml", kTinyRecipe);
  const std::string dir = tmp.path() + "/tp2";
  auto r = runPtrain({"run", recipe, "--nproc", "2", "--run-dir", dir, "parallel.tensor_model_parallel_size=2"},
                     {"OMP_NUM_THREADS=1"}, 300);
  expectTrainsAndEvaluates(dir, r);
}

namespace {

// Two dilated blocks whose inner channels (16: four groups of 4) split over
// tp 2; every step logged for the comparisons below.
const char* kExactRecipe = R"(
name: detection_exact
trainer: {name: detection}
model: {num_layers: 2, hidden_size: 16, ffn_hidden_size: 16, stem_channels: 8, block_dilations: [1, 2]}
data: {name: mosaic, canvas: 64, max_items: 3, min_scale: 0.75, max_scale: 1.25, eval_size: 8}
train: {steps: 20, global_batch_size: 16, seed: 11, eval_every: 0, log_every: 1}
optimizer: {name: adamw, lr: 0.003, lr_schedule: cosine, warmup_steps: 3}
checkpoint: {every: 10}
log: {progress: lines}
)";

std::map<int, double> lossesOf(const std::string& runDir) {
  std::map<int, double> out;
  for (const auto& [step, text] : ptrain::test::readTrainingSteps(runDir)) {
    out[step] = nlohmann::json::parse(text)["loss"].get<double>();
  }
  return out;
}

double relDiff(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-12); }

}  // namespace

// The whole trainer (group norm, dilated channel-parallel convolutions, the
// focal and L1 losses over the global batch) trains the one-rank model at
// tp 2 x dp 2, at pp 2, and in two device groups (tp 2 | one rank): 1e-5 at
// step 1, 1e-4 over 20 steps.
PTRAIN_LONG_TEST(DetectionTrainer, ParallelLayoutsTrainTheOneRankModel) {
  TempDir tmp;
  const std::string recipe = tmp.write("exact.yaml", kExactRecipe);
  auto run = [&](const std::string& name, const std::string& nproc, std::vector<std::string> extra) {
    std::vector<std::string> args{"run", recipe, "--nproc", nproc, "--run-dir", tmp.path() + "/" + name,
                                  "checkpoint.every=0"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto r = runPtrain(args, {"OMP_NUM_THREADS=1"}, 300);
    EXPECT_EQ(r.exit_code, 0) << name << ": " << r.output;
    return lossesOf(tmp.path() + "/" + name);
  };
  const auto one = run("one", "1", {});
  ASSERT_EQ(one.size(), 20u);
  const std::map<std::string, std::map<int, double>> layouts{
      {"tp2_dp2", run("tp2_dp2", "4", {"parallel.tensor_model_parallel_size=2"})},
      {"pp2", run("pp2", "2", {"parallel.pipeline_model_parallel_size=2", "train.micro_batch_size=4"})},
      // Device groups: tp 2 on two ranks beside one rank, half the batch each.
      {"groups", run("groups", "3",
                     {"parallel.groups=[{name: a, ranks: 2, tensor_model_parallel_size: 2, share: 1},"
                      " {name: b, ranks: 1, share: 1}]"})},
  };
  for (const auto& [name, losses] : layouts) {
    ASSERT_EQ(losses.size(), one.size()) << name;
    EXPECT_LT(relDiff(losses.at(1), one.at(1)), 1e-5) << name << " step 1";
    for (const auto& [step, loss] : one) EXPECT_LT(relDiff(losses.at(step), loss), 1e-4) << name << " step " << step;
  }
}

// A checkpoint written at tp 2 resumes at tp 1 (the engine gathers the
// channel-split tensors whole) and continues the tp 2 run's losses.
TEST(DetectionTrainer, CheckpointResumesAtAnotherTensorParallelSize) {
  TempDir tmp;
  const std::string recipe = tmp.write("exact.yaml", kExactRecipe);
  const std::string tp2 = tmp.path() + "/tp2";
  auto r = runPtrain({"run", recipe, "--nproc", "2", "--run-dir", tp2, "parallel.tensor_model_parallel_size=2"},
                     {"OMP_NUM_THREADS=1"}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string resumed = tmp.path() + "/resumed";
  fs::create_directories(resumed + "/checkpoints");
  fs::copy(tp2 + "/checkpoints/step_10", resumed + "/checkpoints/step_10", fs::copy_options::recursive);
  r = runPtrain({"run", recipe, "--nproc", "1", "--run-dir", resumed, "--resume", "--allow-changes"}, {"OMP_NUM_THREADS=1"}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto want = lossesOf(tp2), got = lossesOf(resumed);
  for (int step = 11; step <= 20; ++step) {
    ASSERT_EQ(got.count(step), 1u) << "step " << step << "\n" << r.output;
    EXPECT_LT(relDiff(got.at(step), want.at(step)), 1e-4) << "step " << step;
  }
}

TEST(DetectionTrainer, RefusesAnotherDataset) {
  TempDir tmp;
  const std::string recipe = tmp.write("tiny.yaml", kTinyRecipe);
  auto r = runPtrain({"run", recipe, "--nproc", "1", "--run-dir", tmp.path() + "/bad", "data.name=arithmetic"}, {}, 120);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("data.name"), std::string::npos) << r.output;
}
