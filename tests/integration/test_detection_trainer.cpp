// The detection trainer end to end through the ptrain binary: a short CenterNet
// run on small mosaics, data-parallel and tensor-parallel, exits cleanly,
// learns (the loss falls), reports COCO metrics in [0, 1] and writes its
// detections and ground truth as COCO JSON.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <sstream>
#include <string>

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
}

TEST(DetectionTrainer, TensorParallelRunLearnsAndReportsCocoMetrics) {
  TempDir tmp;
  const std::string recipe = tmp.write("tiny.yaml", kTinyRecipe);
  const std::string dir = tmp.path() + "/tp2";
  auto r = runPtrain({"run", recipe, "--nproc", "2", "--run-dir", dir, "parallel.tensor_model_parallel_size=2"},
                     {"OMP_NUM_THREADS=1"}, 300);
  expectTrainsAndEvaluates(dir, r);
}

TEST(DetectionTrainer, RefusesAnotherDataset) {
  TempDir tmp;
  const std::string recipe = tmp.write("tiny.yaml", kTinyRecipe);
  auto r = runPtrain({"run", recipe, "--nproc", "1", "--run-dir", tmp.path() + "/bad", "data.name=arithmetic"}, {}, 120);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("data.name"), std::string::npos) << r.output;
}
