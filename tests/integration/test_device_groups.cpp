// Device groups (parallel.groups) end to end through the ptrain binary: one
// job whose groups hold the model in different layouts (tp x pp, dp) and take
// unequal shares of the global batch trains the one-rank model (1e-5 at step
// 1, 1e-4 over 20 steps), with the plain and the distributed optimizer, in
// fp32 and bf16, with a group interleaving its pipeline (vpp) and with the
// offload tier; a checkpoint the groups saved resumes on one rank on the
// same curve, and one rank's checkpoint resumes in the groups; the doctor
// names the slowest group; `ptrain check` refuses groups that cannot run, one
// line each, and accepts the shipped recipes (test_plan.cpp: and the section
// `ptrain plan --cluster` prints).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>

#include <nlohmann/json.hpp>

#include "support/test_support.h"

namespace fs = std::filesystem;
using ptrain::test::relDiff;
using ptrain::test::runPtrain;
using ptrain::test::TempDir;

namespace {

// A tiny GPT: 4 layers (pp 2 takes two each), 4 heads (tp 2 takes two).
const char* kRecipe = R"(
name: tiny-groups
trainer: {name: llm}
model: {num_layers: 4, hidden_size: 32, num_attention_heads: 4, seq_length: 8, dropout: 0}
data: {name: arithmetic, digits: 1, operations: [add], eval_size: 8}
train: {steps: 20, global_batch_size: 24, micro_batch_size: 2, seed: 13, eval_every: 0, log_every: 5}
optimizer: {name: adamw, lr: 0.003, lr_schedule: cosine, warmup_steps: 2, clip_grad: 1.0}
log: {progress: none}
)";

// The 6-rank job: group a tp 2 x pp 2 (4 ranks), group b tp 2 (2 ranks), 2:1.
const char* kSixRanks =
    "parallel.groups=[{name: a, ranks: 4, tensor_model_parallel_size: 2, pipeline_model_parallel_size: 2, share: 2},"
    " {name: b, ranks: 2, tensor_model_parallel_size: 2, share: 1}]";
// The seed's shape scaled down: group a tp 2 x pp 2 on 4 ranks, group b
// tp 1 x pp 2 x dp 2 on 4 ranks with its own micro-batch size.
const char* kEightRanks =
    "parallel.groups=[{name: a, ranks: 4, tensor_model_parallel_size: 2, pipeline_model_parallel_size: 2, share: 1},"
    " {name: b, ranks: 4, pipeline_model_parallel_size: 2, micro_batch_size: 3, share: 1}]";

using Curve = std::map<int, nlohmann::json>;

Curve train(const std::string& recipe, const std::string& runDir, int nproc, std::vector<std::string> extra) {
  const std::string n = std::to_string(nproc);
  std::vector<std::string> args{"run", recipe, "--nproc", n, "--run-dir", runDir, "launch.nproc=" + n};
  args.insert(args.end(), extra.begin(), extra.end());
  auto r = runPtrain(args, {}, 600);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  Curve out;
  for (const auto& [step, text] : ptrain::test::readTrainingSteps(runDir)) out[step] = nlohmann::json::parse(text);
  return out;
}

void expectSameCurve(const Curve& reference, const Curve& run, const std::string& what, int from = 1) {
  ASSERT_FALSE(run.empty()) << what;
  double worstLoss = 0, worstNorm = 0;
  for (const auto& [step, j] : reference) {
    if (step < from) continue;
    ASSERT_TRUE(run.count(step)) << what << ": no step " << step;
    const double tolerance = step == 1 ? 1e-5 : 1e-4;
    const double loss = relDiff(run.at(step)["loss"], j["loss"]);
    const double norm = relDiff(run.at(step)["grad_norm"], j["grad_norm"]);
    EXPECT_LT(loss, tolerance) << what << " step " << step;
    EXPECT_LT(norm, tolerance) << what << " step " << step;
    worstLoss = std::max(worstLoss, loss);
    worstNorm = std::max(worstNorm, norm);
  }
  std::printf("%s: largest relative difference, loss %.2g, grad norm %.2g\n", what.c_str(), worstLoss, worstNorm);
}

PTRAIN_LONG_TEST(DeviceGroups, GroupsOfDifferentLayoutsTrainTheOneRankModel) {
  TempDir tmp;
  const std::string recipe = tmp.write("recipe.yaml", kRecipe);
  const Curve single = train(recipe, tmp.path() + "/single", 1, {});
  ASSERT_EQ(single.size(), 20u);
  expectSameCurve(single, train(recipe, tmp.path() + "/six", 6, {kSixRanks}), "6 ranks (tp2 x pp2 | tp2, 2:1)");
  // The doctor names the group the others waited for.
  auto doctor = runPtrain({"doctor", tmp.path() + "/six"});
  EXPECT_EQ(doctor.exit_code, 0) << doctor.output;
  EXPECT_NE(doctor.output.find("device groups: the slowest is "), std::string::npos) << doctor.output;
  EXPECT_NE(doctor.output.find("shares that would even them: a "), std::string::npos) << doctor.output;
  expectSameCurve(single, train(recipe, tmp.path() + "/eight", 8, {kEightRanks}),
                  "8 ranks (tp2 x pp2 | pp2 x dp2, 1:1)");
  // The shipped recipe runs here, on the quickstart's one-rank curve.
  const std::string quickstart = ptrain::test::sourceDir() + "/configs/quickstart.yaml";
  const std::string hetero = ptrain::test::sourceDir() + "/configs/llm/gpt_hetero.yaml";
  const std::vector<std::string> brief{"train.steps=5", "train.eval_every=0", "checkpoint.save_final=false"};
  expectSameCurve(train(quickstart, tmp.path() + "/quickstart", 1, brief),
                  train(hetero, tmp.path() + "/hetero", 6, brief), "configs/llm/gpt_hetero.yaml");
}

// The distributed optimizer in every group (its buckets all-reduced inside
// the group, summed across the groups, each rank stepping on its range): the
// one-rank curve, like the plain optimizer.
PTRAIN_LONG_TEST(DeviceGroups, TheDistributedOptimizerInEveryGroupTrainsTheOneRankModel) {
  TempDir tmp;
  const std::string recipe = tmp.write("recipe.yaml", kRecipe);
  const Curve single = train(recipe, tmp.path() + "/single", 1, {});
  expectSameCurve(single,
                  train(recipe, tmp.path() + "/eight", 8,
                        {kEightRanks, "optimizer.distributed=true", "parallel.grad_bucket_size_mb=0.001"}),
                  "8 ranks, distributed optimizer");
}

// A GPT-MoE (4 experts, top 2): group a tp 2 x pp 2 with the experts split
// over tp (etp 2), group b experts over ep 2 on 2 data-parallel ranks; the
// auxiliary loss weighted by the job's micro-batch count.
PTRAIN_LONG_TEST(DeviceGroups, GptMoeGroupsTrainTheOneRankModel) {
  TempDir tmp;
  const std::string recipe = tmp.write("recipe.yaml", kRecipe);
  const std::vector<std::string> moe{"model.num_experts=4", "model.moe_router_topk=2", "train.steps=12",
                                     "parallel.sequence_parallel=true"};
  const Curve single = train(recipe, tmp.path() + "/single", 1, moe);
  ASSERT_EQ(single.size(), 12u);
  std::vector<std::string> groups = moe;
  groups.push_back(
      "parallel.groups=[{name: a, ranks: 4, tensor_model_parallel_size: 2, pipeline_model_parallel_size: 2},"
      " {name: b, ranks: 2, expert_model_parallel_size: 2, share: 4}]");
  expectSameCurve(single, train(recipe, tmp.path() + "/moe", 6, groups), "GPT-MoE, 6 ranks (tp2 x pp2 | ep2)");
}

// A group with model chunks (vpp 2) runs the interleaved schedule beside a
// group without pipeline; and the offload tier (parameters and gradients
// resting in memory-mapped files) under the groups: the exchange reads each
// gradient where it rests and writes the sum back there.
PTRAIN_LONG_TEST(DeviceGroups, InterleavedAndOffloadedGroupsTrainTheOneRankModel) {
  TempDir tmp;
  const std::string recipe = tmp.write("recipe.yaml", kRecipe);
  const Curve single = train(recipe, tmp.path() + "/single", 1, {});
  ASSERT_EQ(single.size(), 20u);
  const std::string interleaved =
      "parallel.groups=[{name: a, ranks: 4, tensor_model_parallel_size: 2, pipeline_model_parallel_size: 2,"
      " virtual_pipeline_model_parallel_size: 2, share: 2}, {name: b, ranks: 2, tensor_model_parallel_size: 2, share: 1}]";
  const Curve chunked = train(recipe, tmp.path() + "/interleaved", 6, {interleaved});
  expectSameCurve(single, chunked, "6 ranks (tp2 x pp2 vpp2 | tp2, 2:1)");
  // Group a (rank 0 reports its stages) ran the interleaved schedule: its
  // 16 rows (shares 2:1) in 8 micro-batches over 2 stages x 2 chunks,
  // (p - 1) / (v m) = 1/16 of bubble (1f1b's would be 1/8).
  ASSERT_TRUE(chunked.at(1).contains("pp_bubble_formula")) << chunked.at(1).dump();
  EXPECT_DOUBLE_EQ(chunked.at(1)["pp_bubble_formula"].get<double>(), 1.0 / 16);
  expectSameCurve(single,
                  train(recipe, tmp.path() + "/offloaded", 6,
                        {kSixRanks, "offload.params=true", "offload.grads=true", "offload.optimizer=true"}),
                  "6 ranks (tp2 x pp2 | tp2, 2:1), parameters, gradients and optimizer offloaded");
}

PTRAIN_LONG_TEST(DeviceGroups, Bf16GroupsTrainTheOneRankBf16Model) {
  TempDir tmp;
  const std::string recipe = tmp.write("recipe.yaml", kRecipe);
  const Curve single = train(recipe, tmp.path() + "/single", 1, {"precision.name=bf16", "train.steps=8"});
  ASSERT_EQ(single.size(), 8u);
  // bf16 rounds each layout's products differently: the float32 masters
  // keep the curves within bf16's precision of each other.
  const Curve six = train(recipe, tmp.path() + "/six", 6, {kSixRanks, "precision.name=bf16", "train.steps=8"});
  ASSERT_EQ(six.size(), 8u);
  for (const auto& [step, j] : single) {
    EXPECT_LT(relDiff(six.at(step)["loss"], j["loss"]), 2e-2) << "step " << step;
  }
}

PTRAIN_LONG_TEST(DeviceGroups, ACheckpointOfTheGroupsResumesOnOneRankAndBack) {
  TempDir tmp;
  const std::string recipe = tmp.write("recipe.yaml", kRecipe);
  const Curve single = train(recipe, tmp.path() + "/single", 1, {});
  const std::string dir = tmp.path() + "/groups";
  const Curve groups = train(recipe, dir, 6, {kSixRanks, "checkpoint.every=10"});
  ASSERT_EQ(groups.size(), 20u);
  // Group 0 wrote every tensor once; the other group wrote nothing.
  EXPECT_TRUE(fs::exists(dir + "/checkpoints/step_10/model.rank00000.safetensors"));
  EXPECT_FALSE(fs::exists(dir + "/checkpoints/step_10/model.rank00004.safetensors"));
  // Its step 10 resumed on one rank, the groups gone: steps 11..20 on the
  // uninterrupted one-rank curve.
  const std::string one = tmp.path() + "/one";
  fs::create_directories(one + "/checkpoints");
  fs::copy(dir + "/checkpoints/step_10", one + "/checkpoints/step_10", fs::copy_options::recursive);
  const Curve resumed = train(recipe, one, 1, {"--resume", "--allow-changes"});
  ASSERT_EQ(resumed.size(), 10u);
  expectSameCurve(single, resumed, "resumed on one rank", 11);
  // And back: the one-rank run's step 10 resumed by the groups.
  const Curve saved = train(recipe, tmp.path() + "/saved", 1, {"checkpoint.every=10"});
  const std::string back = tmp.path() + "/back";
  fs::create_directories(back + "/checkpoints");
  fs::copy(tmp.path() + "/saved/checkpoints/step_10", back + "/checkpoints/step_10", fs::copy_options::recursive);
  const Curve regrouped = train(recipe, back, 6, {kSixRanks, "--resume", "--allow-changes"});
  ASSERT_EQ(regrouped.size(), 10u);
  expectSameCurve(single, regrouped, "one rank's checkpoint resumed by the groups", 11);
}

TEST(DeviceGroups, CheckRefusesGroupsThatCannotRun) {
  TempDir tmp;
  const std::string recipe = tmp.write("recipe.yaml", kRecipe);
  struct Case {
    std::string groups;
    std::vector<const char*> lines;  // one line each, in this order
  };
  const std::vector<Case> cases = {
      {"[{ranks: 4, tensor_model_parallel_size: 2, share: 2}, {ranks: 4, share: 1}]",
       {"the device groups have 8 ranks in all, the job 6: run with --nproc 8"}},
      {"[{ranks: 4, tensor_model_parallel_size: 3, share: 2}, {ranks: 2, share: 1}]",
       {"parallel.groups[0] (group0): the group's 4 ranks are not divisible by",
        "parallel.groups[0] (group0): tensor_model_parallel_size=3 does not divide num_attention_heads=4",
        "parallel.groups[0] (group0): tensor_model_parallel_size=3 does not divide ffn_hidden_size=128"}},
      {"[{ranks: 4, tp: 2}, {ranks: 2}]", {"parallel.groups[0].tp: unknown key"}},
      {"[{ranks: 4, share: 0}, {ranks: 2}]", {"parallel.groups[0].share: expected a number > 0"}},
      {"[{ranks: 4, share: 5}, {ranks: 2, share: 2}]", {"does not split by the device groups' shares [5, 2]"}},
      {"[{ranks: 4}, {tensor_model_parallel_size: 2}]", {"parallel.groups[1]: no ranks"}},
      {"[{ranks: 4, pipeline_model_parallel_size: 2, micro_batch_size: 5}, {ranks: 2}]",
       {"parallel.groups[0] (group0): the group's rows of global_batch_size=16 is not divisible by micro_batch_size*dp=10"}},
      {"[4, 2]", {"entry 1 is '4', expected a mapping"}},
      // Groups are named in metrics, `ptrain doctor` and checkpoints: two
      // may not share a name, given or the group<i> one gets.
      {"[{name: a, ranks: 4}, {name: a, ranks: 2}]",
       {"parallel.groups[1].name: 'a' already names parallel.groups[0]; give each device group a name of its own"}},
      {"[{ranks: 4}, {name: group0, ranks: 2}]", {"parallel.groups[1].name: 'group0' already names parallel.groups[0]"}},
  };
  for (const auto& c : cases) {
    auto r = runPtrain({"check", recipe, "--nproc", "6", "launch.nproc=6", "parallel.groups=" + c.groups});
    EXPECT_EQ(r.exit_code, 2) << c.groups << "\n" << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), static_cast<long>(c.lines.size()))
        << c.groups << "\n" << r.output;
    size_t at = 0;
    for (const char* line : c.lines) {
      at = r.output.find(line, at);
      EXPECT_NE(at, std::string::npos) << c.groups << ": no '" << line << "' in\n" << r.output;
    }
  }
  // One refusal (exit 2) that says `message`.
  auto expectRefused = [&](std::vector<std::string> overrides, const std::string& message) {
    std::vector<std::string> args{"check", recipe, "--nproc", "6", "launch.nproc=6"};
    args.insert(args.end(), overrides.begin(), overrides.end());
    auto r = runPtrain(args);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << message << "\n" << r.output;
  };
  // A job-wide size beside the groups is a second answer.
  expectRefused({kSixRanks, "parallel.tensor_model_parallel_size=2"}, "is set with parallel.groups");
  expectRefused({kSixRanks, "parallel.virtual_pipeline_model_parallel_size=2"}, "is set with parallel.groups");
  // A group's chunks against the model's layers, and the job's schedule for
  // the groups without chunks.
  expectRefused({"parallel.groups=[{ranks: 4, pipeline_model_parallel_size: 2, virtual_pipeline_model_parallel_size: 4},"
                 " {ranks: 2}]"},
                "parallel.groups[0] (group0): pipeline_model_parallel_size*virtual_pipeline_model_parallel_size=8 "
                "does not divide num_layers=4: use sizes whose product is 1, 2 or 4\n");
  expectRefused({"parallel.pipeline_schedule=interleaved",
                 "parallel.groups=[{ranks: 4, pipeline_model_parallel_size: 2, virtual_pipeline_model_parallel_size: 2},"
                 " {ranks: 2, pipeline_model_parallel_size: 2}]"},
                "parallel.groups[1] (group1): pipeline_schedule=interleaved needs virtual_pipeline_model_parallel_size");
  // An expert model: each group's expert grid against its ranks and the
  // experts, and its tp against sequence parallelism.
  expectRefused({"model.num_experts=4", "parallel.groups=[{ranks: 4, expert_model_parallel_size: 3}, {ranks: 2}]"},
                "parallel.groups[0] (group0): expert_model_parallel_size=3 does not divide num_experts=4");
  expectRefused({"model.num_experts=4", "parallel.groups=[{ranks: 4, tensor_model_parallel_size: 2}, {ranks: 2}]"},
                "parallel.groups[0] (group0): tensor_model_parallel_size=2 with a MoE model needs sequence parallelism");
  // Memory: the group whose layout needs the most, here the second (a 3.6B
  // GPT whole on each of group b's ranks), against the device named.
  {
    const std::string big = tmp.write("big.yaml", R"(
name: big-groups
trainer: {name: llm}
model: {num_layers: 32, hidden_size: 3072, num_attention_heads: 24, seq_length: 1024, dropout: 0}
data: {name: arithmetic, digits: 1, operations: [add], eval_size: 8}
train: {steps: 20, global_batch_size: 48, micro_batch_size: 1}
)");
    auto r = runPtrain({"check", big, "--nproc", "6", "launch.nproc=6", "--device", "V100-32G",
                        "parallel.groups=[{name: a, ranks: 4, tensor_model_parallel_size: 4, share: 1},"
                        " {name: b, ranks: 2, share: 1}]"});
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("device group b's layout is predicted to need"), std::string::npos) << r.output;
  }
  // The shipped recipes: the one this machine runs, and the A100 + V100 plan at its real size.
  for (const char* shipped : {"/configs/llm/gpt_hetero.yaml", "/configs/llm/gpt_7b_a100_v100.yaml"}) {
    auto r = runPtrain({"check", ptrain::test::sourceDir() + shipped});
    EXPECT_EQ(r.exit_code, 0) << shipped << "\n" << r.output;
  }
  auto ok = runPtrain({"check", recipe, "--nproc", "6", "launch.nproc=6", kSixRanks});
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_NE(ok.output.find("group a: ranks 0-3, tp 2 pp 2 dp 1, 16 rows"), std::string::npos) << ok.output;
  EXPECT_NE(ok.output.find("group b: ranks 4-5, tp 2 pp 1 dp 1, 8 rows"), std::string::npos) << ok.output;
  auto chunked = runPtrain({"check", recipe, "--nproc", "6", "launch.nproc=6",
                            "parallel.groups=[{name: a, ranks: 4, pipeline_model_parallel_size: 2, "
                            "virtual_pipeline_model_parallel_size: 2}, {name: b, ranks: 2}]"});
  EXPECT_EQ(chunked.exit_code, 0) << chunked.output;
  EXPECT_NE(chunked.output.find("group a: ranks 0-3, tp 1 pp 2 vpp 2 (interleaved) dp 2"), std::string::npos)
      << chunked.output;
  // A group of one rank is "rank 4", not "ranks 4-4".
  auto single = runPtrain({"check", recipe, "--nproc", "5", "launch.nproc=5",
                           "parallel.groups=[{name: a, ranks: 4, share: 2}, {name: b, ranks: 1, share: 1}]"});
  EXPECT_EQ(single.exit_code, 0) << single.output;
  EXPECT_NE(single.output.find("group b: rank 4, tp 1 pp 1 dp 1, 8 rows"), std::string::npos) << single.output;
  EXPECT_EQ(single.output.find("4-4"), std::string::npos) << single.output;
}

}  // namespace
