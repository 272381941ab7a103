// Expert parallelism end to end through the ptrain binary: the two MoE
// recipes (gpt_moe_ep2 to the quickstart's accuracy, gpt_moe_tp2_ep2 on 4
// ranks); a GPT-MoE at ep=2
// (evaluating, so decoding keeps the ranks in step) saves a checkpoint that
// holds every expert in full, and resumes at ep=1, ep=4 and ep=2 x etp=2 on
// the same loss curve; `ptrain check` names each MoE setting that cannot work on one line.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "support/test_support.h"

namespace fs = std::filesystem;
using ptrain::test::relDiff;
using ptrain::test::runPtrain;
using ptrain::test::TempDir;

namespace {

constexpr int kSteps = 20;
const char* kRecipe = R"(
name: tiny-moe
trainer: {name: llm}
model: {num_layers: 2, hidden_size: 32, num_attention_heads: 4, seq_length: 8, num_experts: 4, moe_router_topk: 2,
        moe_aux_loss_coeff: 0.01}
data: {name: arithmetic, digits: 1, operations: [add], eval_size: 13}
train: {steps: 20, global_batch_size: 8, micro_batch_size: 2, seed: 11, eval_every: 10, log_every: 10}
optimizer: {name: adamw, lr: 0.003, lr_schedule: cosine, warmup_steps: 3, clip_grad: 1.0}
checkpoint: {every: 10, keep: 3}
log: {progress: lines}
)";

ptrain::test::ProcessResult train(const std::string& recipe, const std::string& runDir, int ep, int nproc,
                                  std::vector<std::string> extra = {}) {
  std::vector<std::string> args{"run", recipe, "--nproc", std::to_string(nproc), "--run-dir", runDir,
                                "launch.nproc=" + std::to_string(nproc),
                                "parallel.expert_model_parallel_size=" + std::to_string(ep)};
  args.insert(args.end(), extra.begin(), extra.end());
  return runPtrain(args, {}, 300);
}

std::map<int, nlohmann::json> steps(const std::string& runDir) {
  std::map<int, nlohmann::json> out;
  for (const auto& [step, text] : ptrain::test::readTrainingSteps(runDir)) out[step] = nlohmann::json::parse(text);
  return out;
}

PTRAIN_LONG_TEST(ExpertParallel, CheckpointHoldsEveryExpertAndResumesAtAnotherExpertSize) {
  TempDir tmp;
  const std::string recipe = tmp.write("tiny.yaml", kRecipe);
  const std::string first = tmp.path() + "/ep2";
  // 13 evaluation problems over 2 ranks: shards of 6 and 7, decoded for
  // different numbers of steps, which expert parallelism must keep in step.
  auto r = train(recipe, first, 2, 2);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto reference = steps(first);
  ASSERT_EQ(reference.size(), static_cast<size_t>(kSteps));
  EXPECT_GT(reference.at(20)["moe_aux_loss"].get<double>(), 0.0);
  EXPECT_GT(reference.at(20)["moe_a2a_bytes"].get<double>(), 0.0);
  EXPECT_GE(reference.at(20)["moe_tokens_max"].get<double>(), reference.at(20)["moe_tokens_min"].get<double>());

  std::ifstream meta(first + "/checkpoints/step_10/meta.json");
  auto shapes = nlohmann::json::parse(meta)["parameters"];
  ASSERT_TRUE(shapes.contains("blocks.0.moe.experts.fc1.weight")) << shapes.dump();
  EXPECT_EQ(shapes["blocks.0.moe.experts.fc1.weight"], nlohmann::json::parse("[4, 128, 32]"))
      << shapes["blocks.0.moe.experts.fc1.weight"].dump();

  struct Resume {
    int ep, etp, nproc;
  };
  for (const Resume& at : {Resume{1, 1, 1}, Resume{4, 1, 4}, Resume{2, 2, 4}}) {
    const std::string name = "ep" + std::to_string(at.ep) + "_etp" + std::to_string(at.etp);
    const std::string dir = tmp.path() + "/resume_" + name;
    fs::create_directories(dir + "/checkpoints");
    fs::copy(first + "/checkpoints/step_10", dir + "/checkpoints/step_10", fs::copy_options::recursive);
    r = train(recipe, dir, at.ep, at.nproc,
              {"--resume", "--allow-changes", "parallel.expert_tensor_parallel_size=" + std::to_string(at.etp)});
    ASSERT_EQ(r.exit_code, 0) << name << "\n" << r.output;
    auto after = steps(dir);
    ASSERT_EQ(after.size(), 10u) << r.output;
    for (int step = 11; step <= kSteps; ++step) {
      EXPECT_LT(relDiff(after.at(step)["loss"], reference.at(step)["loss"]), 1e-4) << name << " step " << step;
    }
    // Saved from this layout: every expert, every feature.
    std::ifstream saved(dir + "/checkpoints/step_20/meta.json");
    auto savedShapes = nlohmann::json::parse(saved)["parameters"];
    EXPECT_EQ(savedShapes["blocks.1.moe.experts.fc2.weight"], nlohmann::json::parse("[4, 32, 128]")) << name;
  }
}

nlohmann::json lastEval(const std::string& runDir) {
  const std::string line = ptrain::test::readLastEvaluation(runDir);
  return line.empty() ? nlohmann::json::object() : nlohmann::json::parse(line);
}

PTRAIN_LONG_TEST(ExpertParallelConfigs, GptMoeEp2ReachesTheQuickstartAccuracy) {
  TempDir tmp;
  const std::string dir = tmp.path() + "/run";
  auto r = runPtrain({"run", ptrain::test::sourceDir() + "/configs/llm/gpt_moe_ep2.yaml", "--run-dir", dir,
                      "log.progress=lines", "train.log_every=500"},
                     {}, 900);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  nlohmann::json eval = lastEval(dir);
  EXPECT_EQ(eval["step"].get<int>(), 4000) << r.output;
  EXPECT_GE(eval["eval_exact_match"].get<double>(), 0.9) << r.output;
}

TEST(ExpertParallelConfigs, GptMoeTp2Ep2RunsOnFourRanks) {
  TempDir tmp;
  const std::string dir = tmp.path() + "/run";
  auto r = runPtrain({"run", ptrain::test::sourceDir() + "/configs/llm/gpt_moe_tp2_ep2.yaml", "--run-dir", dir,
                      "log.progress=lines", "train.steps=40", "train.eval_every=40", "data.eval_size=30"},
                     {}, 600);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto steps = ptrain::test::readTrainingSteps(dir);
  ASSERT_EQ(steps.size(), 40u);
  auto first = nlohmann::json::parse(steps.at(1)), last = nlohmann::json::parse(steps.at(40));
  EXPECT_LT(last["loss"].get<double>(), first["loss"].get<double>());
  EXPECT_GT(last["moe_a2a_bytes"].get<double>(), 0.0);
  EXPECT_TRUE(lastEval(dir).contains("eval_exact_match")) << r.output;
}

TEST(ExpertParallel, CheckNamesEachMoeSettingThatCannotWork) {
  TempDir tmp;
  const std::string recipe = tmp.write("tiny.yaml", kRecipe);
  auto r = runPtrain({"check", recipe, "--nproc", "4", "parallel.expert_model_parallel_size=3",
                      "model.moe_router_topk=5", "model.moe_pad_expert_input_to_capacity=true",
                      "parallel.tensor_model_parallel_size=2"},
                     {}, 60);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  for (const char* line :
       {"expert_model_parallel_size=3 does not divide num_experts=4: use 1, 2 or 4",
        "moe_router_topk=5 exceeds num_experts=4: use at most 4",
        "routing is dropless (no moe_expert_capacity_factor); set model.moe_expert_capacity_factor or remove it",
        "with a MoE model needs sequence parallelism"}) {
    EXPECT_NE(r.output.find(line), std::string::npos) << line << "\n" << r.output;
  }
  // MoE keys on a dense model.
  r = runPtrain({"check", recipe, "model.num_experts=0"}, {}, 60);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("moe_router_topk applies to MoE models only, and model.num_experts is 0"), std::string::npos)
      << r.output;
}

}  // namespace
