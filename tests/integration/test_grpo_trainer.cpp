// The llm_grpo trainer end to end through the ptrain binary: a supervised
// run, then GRPO from its checkpoint with the actor at tp 2 and the rollout at
// tp 1 x dp 2 on two ranks. The GRPO run's evaluation before its first step
// is the supervised run's last (the weights came across), its metrics carry
// verl's names, its dumped rollouts hold group advantages the test recomputes
// from the rewards, and the same run with the rollout at the actor's tp
// samples the same tokens; with the reference's parameters offloaded the run
// is the same bit for bit; device groups (a tp 2 group and a tp 1 group)
// sample the same tokens and follow the same curve. `ptrain check` refuses
// verl's known failures, and a device group GRPO cannot run, one line each.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "support/test_support.h"

namespace fs = std::filesystem;
using ptrain::test::runPtrain;
using ptrain::test::TempDir;

namespace {

std::string config(const std::string& name) { return ptrain::test::sourceDir() + "/configs/grpo/" + name; }

// 1-digit addition: a model that learns it in a few dozen steps.
const std::vector<std::string> kTinyData = {"data.digits=1", "data.operations=[add]", "data.eval_size=64"};

std::vector<std::string> grpoArgs(const std::string& runDir, const std::string& sft, std::vector<std::string> extra) {
  std::vector<std::string> args{"run", config("arith_grpo.yaml"), "--run-dir", runDir,
                                "actor_rollout_ref.model.path=" + sft, "train.steps=2", "train.eval_every=0",
                                "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8", "train.global_batch_size=16", "algorithm.dump_rollouts=1", "train.log_every=1",
                                "actor_rollout_ref.actor.kl_loss_coef=0.1"};
  args.insert(args.end(), kTinyData.begin(), kTinyData.end());
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

std::vector<nlohmann::json> jsonLines(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::istringstream in(ptrain::test::readFile(path));
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

PTRAIN_LONG_TEST(GrpoTrainer, StartsFromTheSupervisedRunAndTrainsOnItsOwnRolloutLayout) {
  TempDir tmp;
  const std::string sft = tmp.path() + "/sft";
  std::vector<std::string> sftArgs{"run", config("arith_sft.yaml"), "--run-dir", sft, "--nproc", "1",
                                   "launch.nproc=1", "train.steps=40", "train.eval_every=0", "log.progress=lines"};
  sftArgs.insert(sftArgs.end(), kTinyData.begin(), kTinyData.end());
  auto r = runPtrain(sftArgs, {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json sftEval = nlohmann::json::parse(ptrain::test::readLastEvaluation(sft));

  const std::string grpo = tmp.path() + "/grpo";
  // The engine's loop runs GRPO too: log.count_ops counts its operators as
  // for every trainer.
  r = runPtrain(grpoArgs(grpo, sft, {"log.count_ops=true"}), {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto metrics = jsonLines(grpo + "/metrics.jsonl");
  ASSERT_FALSE(metrics.empty());
  // The first line is the evaluation before any GRPO step: the supervised
  // model's, now at tp 2.
  ASSERT_EQ(metrics.front()["step"].get<int>(), 0);
  EXPECT_EQ(metrics.front()["eval_exact_match"].get<double>(), sftEval["eval_exact_match"].get<double>());
  EXPECT_NEAR(metrics.front()["eval_loss"].get<double>(), sftEval["eval_loss"].get<double>(), 1e-5);

  int trainingLines = 0;
  for (const auto& m : metrics) {
    if (!m.contains("loss")) continue;
    ++trainingLines;
    for (const char* key : {"actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/kl_loss", "actor/entropy",
                            "actor/grad_norm", "critic/score/mean", "critic/score/max", "critic/score/min",
                            "critic/advantages/mean", "response_length/mean", "timing_s/gen", "timing_s/ref",
                            "timing_s/update_actor", "timing_s/reshard", "perf/throughput"}) {
      EXPECT_TRUE(m.contains(key)) << key << " missing from " << m.dump();
    }
    // The loop's own fields, as in every trainer's rows.
    for (const char* key : {"lr", "grad_norm", "tokens_per_s", "step_time_s", "peak_rss_mb"}) {
      EXPECT_TRUE(m.contains(key)) << key << " missing from " << m.dump();
    }
    EXPECT_GT(m.value("aten_ops", 0), 0) << m.dump();
    EXPECT_GT(m["lr"].get<double>(), 0.0) << m.dump();
  }
  EXPECT_EQ(trainingLines, 2);
  // The actor alone, in shards (rank 0 owns at least its first tensor-parallel slices).
  EXPECT_TRUE(fs::exists(grpo + "/checkpoints/step_2/actor.rank00000.safetensors"));
  EXPECT_FALSE(fs::exists(grpo + "/checkpoints/step_2/rollout.rank00000.safetensors"));

  // One step dumped: 4 prompts x 8 samples. Each group's advantages are its
  // rewards standardised (std as torch.std, unbiased), recomputed here.
  const auto rollouts = jsonLines(grpo + "/rollouts.jsonl");
  ASSERT_EQ(rollouts.size(), 32u);
  for (size_t g = 0; g < 4; ++g) {
    double mean = 0, var = 0;
    for (size_t s = 0; s < 8; ++s) mean += rollouts[g * 8 + s]["reward"].get<double>() / 8;
    for (size_t s = 0; s < 8; ++s) var += std::pow(rollouts[g * 8 + s]["reward"].get<double>() - mean, 2) / 7;
    for (size_t s = 0; s < 8; ++s) {
      const auto& row = rollouts[g * 8 + s];
      const double reward = row["reward"].get<double>();
      EXPECT_TRUE(reward == 0 || reward == 1) << row.dump();
      EXPECT_EQ(reward == 1, row["response"].get<std::string>() == row["answer"].get<std::string>() + "<eos>")
          << row.dump();
      EXPECT_NEAR(row["advantage"].get<double>(), (reward - mean) / (std::sqrt(var) + 1e-6), 1e-4) << row.dump();
      const size_t tokens = row["response_tokens"].size();
      EXPECT_EQ(row["old_log_probs"].size(), tokens);
      EXPECT_EQ(row["ref_log_probs"].size(), tokens);
      for (size_t t = 0; t < tokens; ++t) {
        // Before the first update the actor is the reference.
        EXPECT_NEAR(row["old_log_probs"][t].get<double>(), row["ref_log_probs"][t].get<double>(), 1e-5);
        EXPECT_LE(row["old_log_probs"][t].get<double>(), 0.0);
      }
    }
  }

  // The rollout on the actor's layout (tp 2) samples the same tokens, and the
  // run follows the same curve.
  const std::string same = tmp.path() + "/same";
  r = runPtrain(grpoArgs(same, sft, {"actor_rollout_ref.rollout.tensor_model_parallel_size=2"}), {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto sameRollouts = jsonLines(same + "/rollouts.jsonl");
  ASSERT_EQ(sameRollouts.size(), rollouts.size());
  for (size_t i = 0; i < rollouts.size(); ++i) EXPECT_EQ(sameRollouts[i]["response"], rollouts[i]["response"]) << i;
  const auto a = ptrain::test::readTrainingSteps(grpo), b = ptrain::test::readTrainingSteps(same);
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [step, text] : a) {
    const auto x = nlohmann::json::parse(text), y = nlohmann::json::parse(b.at(step));
    EXPECT_EQ(x["critic/score/mean"], y["critic/score/mean"]) << step;
    EXPECT_NEAR(x["actor/pg_loss"].get<double>(), y["actor/pg_loss"].get<double>(), 1e-4) << step;
  }
}

TEST(GrpoTrainer, AnOffloadedReferenceGivesTheSameRun) {
  TempDir tmp;
  // Without --run-dir the supervised run lands in runs/arith_sft/<time>/;
  // model.path may name runs/arith_sft, whose newest run is taken.
  std::vector<std::string> sftArgs{"run", config("arith_sft.yaml"), "--nproc", "1", "launch.nproc=1",
                                   "train.steps=20", "train.eval_every=0"};
  sftArgs.insert(sftArgs.end(), kTinyData.begin(), kTinyData.end());
  ASSERT_EQ(runPtrain(sftArgs, {}, 300, tmp.path()).exit_code, 0);
  const std::string sft = tmp.path() + "/runs/arith_sft";
  auto r = runPtrain(grpoArgs(tmp.path() + "/resident", sft, {}), {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = runPtrain(grpoArgs(tmp.path() + "/offloaded", sft, {"actor_rollout_ref.ref.param_offload=true"}), {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // The reference's parameters come back from the disk tier bit for bit:
  // the same reference log-probabilities, KL losses and updates.
  EXPECT_EQ(ptrain::test::readFile(tmp.path() + "/offloaded/rollouts.jsonl"),
            ptrain::test::readFile(tmp.path() + "/resident/rollouts.jsonl"));
  const auto a = ptrain::test::readTrainingSteps(tmp.path() + "/resident");
  const auto b = ptrain::test::readTrainingSteps(tmp.path() + "/offloaded");
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  for (const auto& [step, text] : a) {
    const auto x = nlohmann::json::parse(text), y = nlohmann::json::parse(b.at(step));
    for (const char* key : {"actor/kl_loss", "actor/pg_loss", "actor/grad_norm", "critic/score/mean"}) {
      EXPECT_EQ(x[key], y[key]) << key << " step " << step;
    }
  }
}

// configs/grpo/arith_grpo.yaml without its job-wide tensor parallelism,
// which device groups refuse beside their own (written into `tmp`).
std::string recipeForGroups(const TempDir& tmp) {
  std::string text = ptrain::test::readFile(config("arith_grpo.yaml"));
  const std::string parallel = "parallel:\n  tensor_model_parallel_size: 2\n";
  const size_t at = text.find(parallel);
  EXPECT_NE(at, std::string::npos) << "arith_grpo.yaml's parallel section changed";
  if (at != std::string::npos) text.erase(at, parallel.size());
  return tmp.write("arith_grpo_groups.yaml", text);
}

// Device groups (parallel.groups) run GRPO's three models in each group's own
// layout: group a tp 2 on 2 ranks, group b on 1, half the samples each. The
// rollout samples the same tokens as the recipe's one layout (tp 2 on 2
// ranks), each row once over the job, and the run follows the same curve.
PTRAIN_LONG_TEST(GrpoTrainer, DeviceGroupsSampleAndTrainAsOneLayout) {
  TempDir tmp;
  const std::string sft = tmp.path() + "/sft";
  std::vector<std::string> sftArgs{"run", config("arith_sft.yaml"), "--run-dir", sft, "--nproc", "1",
                                   "launch.nproc=1", "train.steps=40", "train.eval_every=0"};
  sftArgs.insert(sftArgs.end(), kTinyData.begin(), kTinyData.end());
  ASSERT_EQ(runPtrain(sftArgs, {}, 300).exit_code, 0);
  auto r = runPtrain(grpoArgs(tmp.path() + "/one", sft, {}), {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<std::string> args = grpoArgs(
      tmp.path() + "/groups", sft,
      {"--nproc", "3", "launch.nproc=3",
       "parallel.groups=[{name: a, ranks: 2, tensor_model_parallel_size: 2, share: 1}, {name: b, ranks: 1, share: 1}]"});
  args[1] = recipeForGroups(tmp);
  r = runPtrain(args, {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto one = jsonLines(tmp.path() + "/one/rollouts.jsonl");
  const auto groups = jsonLines(tmp.path() + "/groups/rollouts.jsonl");
  ASSERT_EQ(groups.size(), one.size());
  for (size_t i = 0; i < one.size(); ++i) {
    EXPECT_EQ(groups[i]["response"], one[i]["response"]) << i;
    EXPECT_EQ(groups[i]["reward"], one[i]["reward"]) << i;
    for (size_t t = 0; t < one[i]["old_log_probs"].size(); ++t) {
      EXPECT_NEAR(groups[i]["old_log_probs"][t].get<double>(), one[i]["old_log_probs"][t].get<double>(), 1e-5) << i;
    }
  }
  const auto a = ptrain::test::readTrainingSteps(tmp.path() + "/one");
  const auto b = ptrain::test::readTrainingSteps(tmp.path() + "/groups");
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  for (const auto& [step, text] : a) {
    const auto x = nlohmann::json::parse(text), y = nlohmann::json::parse(b.at(step));
    EXPECT_EQ(x["critic/score/mean"], y["critic/score/mean"]) << step;
    for (const char* key : {"actor/pg_loss", "actor/kl_loss", "actor/entropy"}) {
      EXPECT_NEAR(x[key].get<double>(), y[key].get<double>(), 1e-4) << key << " step " << step;
    }
    EXPECT_NEAR(x["actor/grad_norm"].get<double>(), y["actor/grad_norm"].get<double>(),
                1e-4 * x["actor/grad_norm"].get<double>())
        << step;
    std::printf("step %d: pg_loss %.6g vs %.6g, grad_norm %.6g vs %.6g\n", step, x["actor/pg_loss"].get<double>(),
                y["actor/pg_loss"].get<double>(), x["actor/grad_norm"].get<double>(),
                y["actor/grad_norm"].get<double>());
  }
}

// Each device group's layout against GRPO's own rules, one line naming the group.
TEST(GrpoTrainer, CheckHoldsEachDeviceGroupToTheRolloutAndActorSplits) {
  TempDir tmp;
  const std::string recipe = recipeForGroups(tmp);
  auto check = [&](std::vector<std::string> extra) {
    // Each group takes 256 of a step's 512 samples: micro-batches of 256.
    std::vector<std::string> args{"check", recipe, "actor_rollout_ref.model.path=", "--nproc", "3", "launch.nproc=3",
                                  "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=256"};
    args.insert(args.end(), extra.begin(), extra.end());
    return runPtrain(args, {}, 120);
  };
  const std::string ok = "parallel.groups=[{name: a, ranks: 2, tensor_model_parallel_size: 2, share: 1},"
                         " {name: b, ranks: 1, share: 1}]";
  auto r = check({ok});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = check({"parallel.groups=[{name: a, ranks: 2, pipeline_model_parallel_size: 2, share: 1},"
             " {name: b, ranks: 1, share: 1}]"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("parallel.groups[0] (a): pipeline_model_parallel_size=2: the grpo trainer's models run "
                          "without a pipeline"),
            std::string::npos)
      << r.output;
  r = check({"parallel.groups=[{name: a, ranks: 2, tensor_model_parallel_size: 2, micro_batch_size: 4, share: 1},"
             " {name: b, ranks: 1, share: 1}]"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("parallel.groups[0] (a): micro_batch_size: the grpo trainer's actor takes"),
            std::string::npos)
      << r.output;
  // Shares that give a group no whole rows of the 512 samples.
  r = check({"parallel.groups=[{name: a, ranks: 2, tensor_model_parallel_size: 2, share: 1},"
             " {name: b, ranks: 1, share: 2}]"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("does not split by the device groups' shares"), std::string::npos) << r.output;
  // The rollout's tp against a group's ranks.
  r = check({ok, "actor_rollout_ref.rollout.tensor_model_parallel_size=2"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("parallel.groups[1] (b): actor_rollout_ref.rollout.tensor_model_parallel_size=2 does not "
                          "divide the group's ranks 1: use 1"),
            std::string::npos)
      << r.output;
}

TEST(GrpoTrainer, CheckRefusesVerlsKnownFailuresOneLineEach) {
  TempDir tmp;
  // The recipe starts from its supervised run (runs/arith_sft), which these
  // checks do not make: they start from fresh weights instead.
  auto check = [](std::vector<std::string> extra) {
    std::vector<std::string> args{"check", config("arith_grpo.yaml"), "actor_rollout_ref.model.path="};
    args.insert(args.end(), extra.begin(), extra.end());
    return runPtrain(args, {}, 120);
  };
  auto ok = check({});
  EXPECT_EQ(ok.exit_code, 0) << ok.output;

  // A starting run that is not there, or holds no checkpoint, is refused as
  // the run would refuse it.
  auto missing = check({"actor_rollout_ref.model.path=" + tmp.path() + "/no_such_run"});
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_NE(missing.output.find("actor_rollout_ref.model.path: " + tmp.path() + "/no_such_run: not found"),
            std::string::npos)
      << missing.output;
  auto empty = check({"actor_rollout_ref.model.path=" + tmp.path()});
  EXPECT_EQ(empty.exit_code, 2) << empty.output;
  EXPECT_NE(empty.output.find("holds no checkpoint to start from"), std::string::npos) << empty.output;

  auto r = check({"--nproc", "4", "launch.nproc=4", "actor_rollout_ref.rollout.tensor_model_parallel_size=3"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("actor_rollout_ref.rollout.tensor_model_parallel_size=3 does not divide the world size 4: "
                          "use 1, 2, 4"),
            std::string::npos)
      << r.output;

  r = check({"actor_rollout_ref.actor.ppo_mini_batch_size=128"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("ppo_mini_batch_size=128 is above data.train_batch_size=64"), std::string::npos)
      << r.output;

  r = check({"train.global_batch_size=64"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("train.global_batch_size=64 is not the actor's optimizer step"), std::string::npos)
      << r.output;

  // Sequence parallelism with heads the tensor-parallel size does not divide:
  // the core's layout check says it for the actor.
  r = check({"--nproc", "4", "launch.nproc=4", "parallel.tensor_model_parallel_size=4", "parallel.sequence_parallel=true",
             "model.num_attention_heads=2", "model.hidden_size=64"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("does not divide num_attention_heads=2"), std::string::npos) << r.output;

  r = check({"parallel.pipeline_model_parallel_size=2", "parallel.tensor_model_parallel_size=1"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("parallel.pipeline_model_parallel_size"), std::string::npos) << r.output;
}

}  // namespace
