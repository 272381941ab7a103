// The memory levers end to end through the ptrain binary:
// configs/llm/gpt_offload.yaml trains the quickstart's loss curve bit for bit
// and leaves no file behind; the distributed optimizer trains the
// quickstart's curve within 1e-6, and its checkpoints resume at other data-
// parallel sizes with and without it; `ptrain check` and `ptrain run` say in
// one line what cannot work or gains nothing.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include <nlohmann/json.hpp>

#include "support/test_support.h"

namespace fs = std::filesystem;
using ptrain::test::relDiff;
using ptrain::test::runPtrain;
using ptrain::test::TempDir;

namespace {

std::map<int, nlohmann::json> steps(const std::string& runDir) {
  std::map<int, nlohmann::json> out;
  for (const auto& [step, text] : ptrain::test::readTrainingSteps(runDir)) out[step] = nlohmann::json::parse(text);
  return out;
}

ptrain::test::ProcessResult train(const std::string& recipe, const std::string& runDir, int nproc,
                                  std::vector<std::string> extra = {}) {
  std::vector<std::string> args{"run", recipe, "--nproc", std::to_string(nproc), "--run-dir", runDir,
                                "launch.nproc=" + std::to_string(nproc)};
  args.insert(args.end(), extra.begin(), extra.end());
  return runPtrain(args, {}, 400);
}

const std::vector<std::string> kShortRun = {"train.steps=20", "train.eval_every=0", "model.dropout=0.1",
                                            "train.log_every=5", "log.progress=lines"};

std::string configs() { return ptrain::test::sourceDir() + "/configs/"; }

TEST(MemoryLevers, OffloadRecipeTrainsTheQuickstartsCurveBitForBit) {
  TempDir tmp;
  auto r = train(configs() + "quickstart.yaml", tmp.path() + "/plain", 2, kShortRun);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string dir = tmp.path() + "/offload";
  r = train(configs() + "llm/gpt_offload.yaml", dir, 2, kShortRun);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto plain = steps(tmp.path() + "/plain"), offloaded = steps(dir);
  ASSERT_EQ(offloaded.size(), 20u);
  for (const auto& [step, j] : plain) EXPECT_EQ(offloaded.at(step)["loss"].dump(), j["loss"].dump()) << "step " << step;
  EXPECT_GT(offloaded.at(20)["offload_in_bytes"].get<double>(), 0);
  // The tier's files are unlinked as soon as they are mapped, and their
  // folder goes when the run ends: nothing is left.
  EXPECT_FALSE(fs::exists(dir + "/offload"));
}

PTRAIN_LONG_TEST(MemoryLevers, DistributedOptimizerTrainsTheQuickstartsCurveAndResumesAtAnyDp) {
  TempDir tmp;
  // Without dropout: its masks depend on how the batch is split over ranks.
  std::vector<std::string> run = kShortRun;
  run[2] = "model.dropout=0";
  std::vector<std::string> withCheckpoints = run;
  withCheckpoints.push_back("checkpoint.every=10");
  auto r = train(configs() + "quickstart.yaml", tmp.path() + "/plain", 2, run);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string first = tmp.path() + "/sharded";
  r = train(configs() + "llm/gpt_distributed_optimizer.yaml", first, 2, withCheckpoints);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto plain = steps(tmp.path() + "/plain"), sharded = steps(first);
  ASSERT_EQ(sharded.size(), 20u);
  for (const auto& [step, j] : plain) {
    EXPECT_LT(relDiff(sharded.at(step)["loss"], j["loss"]), 1e-6) << "step " << step;
  }
  // One all-reduce's bytes: a reduce-scatter and an all-gather of fp32.
  EXPECT_GT(sharded.at(20)["dp_comm_bytes"].get<double>(), 0);

  struct Resume {
    int nproc;
    bool distributed;
  };
  for (const Resume& at : {Resume{1, false}, Resume{2, false}, Resume{4, true}}) {
    const std::string name = "dp" + std::to_string(at.nproc) + (at.distributed ? "_sharded" : "_plain");
    const std::string dir = tmp.path() + "/" + name;
    fs::create_directories(dir + "/checkpoints");
    fs::copy(first + "/checkpoints/step_10", dir + "/checkpoints/step_10", fs::copy_options::recursive);
    std::vector<std::string> args = withCheckpoints;
    args.push_back("--resume");
    args.push_back("--allow-changes");
    args.push_back(std::string("optimizer.distributed=") + (at.distributed ? "true" : "false"));
    r = train(configs() + "llm/gpt_distributed_optimizer.yaml", dir, at.nproc, args);
    ASSERT_EQ(r.exit_code, 0) << name << "\n" << r.output;
    auto after = steps(dir);
    ASSERT_EQ(after.size(), 10u) << r.output;
    for (int step = 11; step <= 20; ++step) {
      EXPECT_LT(relDiff(after.at(step)["loss"], sharded.at(step)["loss"]), 1e-5) << name << " step " << step;
    }
  }
}

TEST(MemoryLevers, ChecksSayWhatCannotWorkInOneLine) {
  TempDir tmp;
  // Nothing to shard over at dp=1: a warning, and the run may go on.
  auto r = runPtrain({"check", configs() + "llm/gpt_distributed_optimizer.yaml", "--nproc", "1"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("warning: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("optimizer.distributed=true shards the optimizer"), std::string::npos) << r.output;

  // A run folder the disk tier cannot write: refused before anything starts.
  const std::string file = tmp.write("not-a-folder", "x");
  r = runPtrain({"run", configs() + "llm/gpt_offload.yaml", "--run-dir", file + "/run", "train.steps=2"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("gpt_offload.yaml:12:3: offload's disk tier writes its files under the run folder"),
            std::string::npos)
      << r.output;

  // Offload and the distributed optimizer together.
  r = runPtrain({"check", configs() + "llm/gpt_offload.yaml", "optimizer.distributed=true"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("use one of the two"), std::string::npos) << r.output;
}

}  // namespace
