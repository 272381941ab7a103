// Training in bf16 and fp16 through the ptrain binary: the configs reach the
// fp32 accuracy, the fp16 loss scale is in metrics.jsonl and the progress
// line, and a resumed fp16 run continues with the scale it stopped at.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "support/test_support.h"

namespace fs = std::filesystem;
using ptrain::test::runPtrain;
using ptrain::test::TempDir;

namespace {

nlohmann::json lastEval(const std::string& runDir) {
  const std::string line = ptrain::test::readLastEvaluation(runDir);
  return line.empty() ? nlohmann::json::object() : nlohmann::json::parse(line);
}

ptrain::test::ProcessResult run(const std::vector<std::string>& args) { return runPtrain(args, {}, 900); }

class PrecisionConfig : public ::testing::TestWithParam<std::string> {};

// The quickstart in bf16 and in fp16 (with the default 2^32 initial scale,
// so the first steps overflow and are skipped) reaches what it reaches in
// fp32: exact match >= 0.9.
PTRAIN_LONG_TEST_P(PrecisionConfig, ReachesTheFp32Accuracy) {
  const std::string precision = GetParam();
  TempDir tmp;
  const std::string dir = tmp.path() + "/run";
  auto r = run({"run", ptrain::test::sourceDir() + "/configs/llm/gpt_" + precision + ".yaml", "--run-dir", dir,
                "log.progress=lines", "train.log_every=500"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  nlohmann::json eval = lastEval(dir);
  ASSERT_TRUE(eval.contains("eval_exact_match")) << r.output;
  EXPECT_EQ(eval["step"].get<int>(), 3000);
  EXPECT_GE(eval["eval_exact_match"].get<double>(), 0.9) << r.output;
  auto steps = ptrain::test::readTrainingSteps(dir);
  ASSERT_EQ(steps.size(), 3000u);
  if (precision == "fp16") {
    // Skipped steps at the start while the scale comes down from 2^32.
    auto first = nlohmann::json::parse(steps.at(1));
    EXPECT_EQ(first["loss_scale"].get<double>(), 4294967296.0);
    EXPECT_EQ(first["skipped"].get<bool>(), true);
    auto last = nlohmann::json::parse(steps.at(3000));
    EXPECT_GT(last["skipped_steps"].get<double>(), 2.0);
    EXPECT_LT(last["loss_scale"].get<double>(), 65536.0 * 4);
    EXPECT_NE(r.output.find("  scale "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("  skipped "), std::string::npos) << r.output;
  } else {
    EXPECT_FALSE(nlohmann::json::parse(steps.at(1)).contains("loss_scale"));
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, PrecisionConfig, ::testing::Values("bf16", "fp16"),
                         [](const auto& info) { return info.param; });

const char* kTinyFp16 = R"(
name: tiny_fp16
trainer: {name: llm}
model: {num_layers: 2, hidden_size: 32, num_attention_heads: 2, seq_length: 8}
data: {name: arithmetic, digits: 1, operations: [add], eval_size: 32}
train: {steps: 12, global_batch_size: 16, micro_batch_size: 4, seed: 7, eval_every: 0, log_every: 1}
optimizer: {name: adamw, lr: 0.003}
precision: {name: fp16, initial_loss_scale: 1024, loss_scale_window: 4}
checkpoint: {every: 6}
log: {progress: lines}
)";

// The scaler's state is in the checkpoint: the scale grows every 4 clean
// steps, and the run resumed at step 6 sees the same scales and losses as
// the run that went through.
TEST(PrecisionTraining, ResumedFp16RunKeepsItsLossScale) {
  TempDir tmp;
  const std::string recipe = tmp.write("tiny.yaml", kTinyFp16);
  const std::string full = tmp.path() + "/full";
  auto r = run({"run", recipe, "--nproc", "2", "--run-dir", full});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto reference = ptrain::test::readTrainingSteps(full);
  ASSERT_EQ(reference.size(), 12u);
  EXPECT_EQ(nlohmann::json::parse(reference.at(1))["loss_scale"].get<double>(), 1024.0);
  EXPECT_EQ(nlohmann::json::parse(reference.at(12))["loss_scale"].get<double>(), 4096.0);

  const std::string resumed = tmp.path() + "/resumed";
  fs::create_directories(resumed + "/checkpoints");
  fs::copy(full + "/checkpoints/step_6", resumed + "/checkpoints/step_6", fs::copy_options::recursive);
  r = run({"run", recipe, "--nproc", "2", "--run-dir", resumed, "--resume", "--allow-changes"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto after = ptrain::test::readTrainingSteps(resumed);
  ASSERT_EQ(after.size(), 6u) << r.output;
  for (int step = 7; step <= 12; ++step) {
    auto a = nlohmann::json::parse(after.at(step));
    auto b = nlohmann::json::parse(reference.at(step));
    EXPECT_EQ(a["loss"].dump(), b["loss"].dump()) << "step " << step;
    EXPECT_EQ(a["loss_scale"], b["loss_scale"]) << "step " << step;
    EXPECT_EQ(a["skipped_steps"], b["skipped_steps"]) << "step " << step;
  }
}

}  // namespace
