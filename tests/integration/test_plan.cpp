// `ptrain plan` end to end: the quickstart fits this machine; a large GPT on
// a V100-16G does not, and the plan lists the flowchart's fixes with exit
// code 2; cluster files and presets it cannot use are refused in one line.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "support/test_support.h"

using ptrain::test::runPtrain;
using ptrain::test::TempDir;

namespace {

std::string configs() { return ptrain::test::sourceDir() + "/configs/"; }

TEST(Plan, QuickstartFitsThisMachine) {
  auto r = runPtrain({"plan", configs() + "quickstart.yaml"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const char* text : {"layout: world=2 tp=1 pp=1 dp=2", "device: host", "parameters", "optimizer states",
                           "activations", ": fits", "tokens/s"}) {
    EXPECT_NE(r.output.find(text), std::string::npos) << text << "\n" << r.output;
  }
}

TEST(Plan, ALayoutThatDoesNotFitGetsTheFlowchartsFixes) {
  auto r = runPtrain({"plan", configs() + "quickstart.yaml", "--device", "V100-16G", "--nproc", "1",
                      "model.num_layers=32", "model.hidden_size=4096", "model.num_attention_heads=32",
                      "model.seq_length=1024", "train.global_batch_size=8", "train.micro_batch_size=8"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("does NOT fit"), std::string::npos) << r.output;
  const size_t offload = r.output.find("offload.params=true"), micro = r.output.find("train.micro_batch_size=4");
  ASSERT_NE(offload, std::string::npos) << r.output;
  ASSERT_NE(micro, std::string::npos) << r.output;
  EXPECT_LT(offload, micro) << r.output;
}

TEST(Plan, SearchListsTheBestLayoutsBesideTheRecipes) {
  auto r = runPtrain({"plan", configs() + "quickstart.yaml", "--device", "A100-80G", "--nproc", "8", "--search",
                      "model.num_layers=32", "model.hidden_size=4096", "model.num_attention_heads=32",
                      "model.seq_length=2048", "train.global_batch_size=64", "precision.name=bf16"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("best layouts of 8 x A100-80G"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("   1 "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("the recipe's layout (tp 1, pp 1, dp 8, micro-batch 8)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("does not fit"), std::string::npos) << r.output;
}

TEST(Plan, AClusterOfTwoGenerationsGetsALayoutPerGroupAndABatchSplitBySpeed) {
  const std::string cluster = configs() + "clusters/a100_v100.yaml";
  auto r = runPtrain({"plan", configs() + "quickstart.yaml", "--cluster", cluster, "model.num_layers=8",
                      "model.hidden_size=1024", "model.num_attention_heads=16", "model.seq_length=512",
                      "train.global_batch_size=64", "precision.name=fp16"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const char* text : {"cluster: 4 x A100-80G + 4 x V100-32G", "even", "by speed",
                           "predicted gain of the split by speed over the even split"}) {
    EXPECT_NE(r.output.find(text), std::string::npos) << text << "\n" << r.output;
  }
  // The faster group takes more rows.
  const size_t bySpeed = r.output.find("by speed");
  ASSERT_NE(bySpeed, std::string::npos);
  const auto rowsAfter = [&](const std::string& group) {
    const size_t at = r.output.find(group, bySpeed);
    return at == std::string::npos ? -1 : std::stoi(r.output.substr(at + group.size()));
  };
  EXPECT_GT(rowsAfter("4 x A100-80G"), rowsAfter("4 x V100-32G")) << r.output;
  // The recipe section that runs the split, each group in its own layout:
  // `ptrain check` accepts it as printed.
  const size_t section = r.output.find("\nparallel:\n  groups:\n");
  ASSERT_NE(section, std::string::npos) << r.output;
  ptrain::test::TempDir tmp;
  const std::string recipe = tmp.write("groups.yaml", "defaults: [" + configs() + "quickstart.yaml]\n" +
                                                          r.output.substr(section + 1));
  auto accepted = runPtrain({"check", recipe, "--nproc", "8", "launch.nproc=8", "device=cuda", "model.num_layers=8",
                             "model.hidden_size=1024", "model.num_attention_heads=16", "model.seq_length=512",
                             "train.global_batch_size=64", "precision.name=fp16"});
  EXPECT_EQ(accepted.exit_code, 0) << r.output.substr(section) << "\n" << accepted.output;
  EXPECT_NE(accepted.output.find("group A100-80G: ranks 0-3"), std::string::npos) << accepted.output;
  // `ptrain check` sizes one device kind and says where to go instead.
  auto check = runPtrain({"check", configs() + "quickstart.yaml", "--cluster", cluster});
  EXPECT_EQ(check.exit_code, 2) << check.output;
  EXPECT_NE(check.output.find("2 groups of devices"), std::string::npos) << check.output;
}

TEST(Plan, CheckRefusesALayoutPredictedNotToFitItsDevice) {
  const std::vector<std::string> big = {"--nproc", "1", "model.num_layers=32", "model.hidden_size=4096",
                                        "model.num_attention_heads=32", "model.seq_length=1024",
                                        "train.global_batch_size=8"};
  std::vector<std::string> args = {"check", configs() + "quickstart.yaml", "--device", "V100-16G"};
  args.insert(args.end(), big.begin(), big.end());
  auto r = runPtrain(args);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("per rank, V100-16G has 16.00 GiB: start with offload.params=true"), std::string::npos)
      << r.output;
  // One line.
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  r = runPtrain({"check", configs() + "quickstart.yaml", "--device", "A100-80G"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST(Plan, AutoLayoutIsChosenOnceAtLaunchAndRefusedInAWorkerOfAnotherLauncher) {
  const std::string recipe = configs() + "llm/gpt_auto.yaml";
  auto check = runPtrain({"check", recipe, "--nproc", "2"});
  EXPECT_EQ(check.exit_code, 0) << check.output;
  EXPECT_NE(check.output.find("parallel: auto chose tp "), std::string::npos) << check.output;
  EXPECT_NE(check.output.find("on 2 x host"), std::string::npos) << check.output;
  EXPECT_NE(check.output.find(": OK"), std::string::npos) << check.output;

  TempDir tmp;
  auto run = runPtrain({"run", recipe, "--nproc", "2", "--run-dir", tmp.path() + "/run", "train.steps=4",
                        "train.eval_every=0", "log.progress=lines"},
                       {}, 300);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("parallel: auto chose"), std::string::npos) << run.output;
  EXPECT_EQ(ptrain::test::readTrainingSteps(tmp.path() + "/run").size(), 4u) << run.output;

  // A worker that no ptrain launcher resolved the layout for.
  auto worker = runPtrain({"run", recipe, "--run-dir", tmp.path() + "/worker"},
                          {"PTRAIN_WORKER=1", "RANK=0", "WORLD_SIZE=1", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=1",
                           "MASTER_ADDR=127.0.0.1", "MASTER_PORT=29999"},
                          60);
  EXPECT_EQ(worker.exit_code, 2) << worker.output;
  EXPECT_NE(worker.output.find("parallel: auto is chosen by `ptrain run` before it starts the workers"),
            std::string::npos)
      << worker.output;
}

TEST(Plan, DeviceTuningPageIsWhatPlanTablePrints) {
  auto r = runPtrain({"plan", "--table"}, {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(ptrain::test::sourceDir() + "/docs/device_tuning.md");
  std::stringstream page;
  page << in.rdbuf();
  EXPECT_EQ(page.str(), r.output) << "docs/device_tuning.md is out of date: regenerate it with "
                                     "`build/bin/ptrain plan --table > docs/device_tuning.md`";
  for (const char* text : {"## A100-80G", "## V100-16G", "| 175B | 512 |", "seed rule", "Megatron-LM"}) {
    EXPECT_NE(r.output.find(text), std::string::npos) << text;
  }
}

TEST(Plan, ClusterFilesAndPresetsItCannotUseAreRefusedInOneLine) {
  TempDir tmp;
  const std::string two = tmp.write("two.yaml", "groups:\n  - {device: A100-80G, count: 4}\n  - {device: V100-32G}\n");
  auto r = runPtrain({"plan", configs() + "quickstart.yaml", "--cluster", two});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(two + ":3:5: count: expected the group's number of devices"), std::string::npos) << r.output;

  const std::string unknown = tmp.write("unknown.yaml", "groups:\n  - {device: A200, count: 8}\n");
  r = runPtrain({"plan", configs() + "quickstart.yaml", "--cluster", unknown});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("device: 'A200' is not a preset; use one of A100-40G"), std::string::npos) << r.output;

  const std::string one = tmp.write("one.yaml", "groups:\n  - {device: H100-80G, count: 2}\n");
  r = runPtrain({"plan", configs() + "quickstart.yaml", "--cluster", one});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("device: H100-80G, 80.0 GiB"), std::string::npos) << r.output;
}

}  // namespace
