// Uneven data-parallel shares (parallel.data_parallel_shares), end to end
// through the ptrain binary: two ranks taking 3/4 and 1/4 of every global
// batch train the same curve as one rank taking all of it (within 1e-5, the
// reordering of float sums), with tp and pp too; `ptrain check` refuses
// shares that cannot run, one line each.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include <nlohmann/json.hpp>

#include "support/test_support.h"

using ptrain::test::relDiff;
using ptrain::test::runPtrain;
using ptrain::test::TempDir;

namespace {

std::string quickstart() { return ptrain::test::sourceDir() + "/configs/quickstart.yaml"; }

std::map<int, nlohmann::json> train(const std::string& runDir, int nproc, std::vector<std::string> extra) {
  std::vector<std::string> args{"run",           quickstart(),          "--nproc",           std::to_string(nproc),
                                "--run-dir",     runDir,                "launch.nproc=" + std::to_string(nproc),
                                "train.steps=12", "train.eval_every=0", "train.log_every=4",
                                // Dropout masks depend on how rows fall on ranks.
                                "model.dropout=0", "log.progress=lines", "train.micro_batch_size=8"};
  args.insert(args.end(), extra.begin(), extra.end());
  auto r = runPtrain(args, {}, 400);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::map<int, nlohmann::json> out;
  for (const auto& [step, text] : ptrain::test::readTrainingSteps(runDir)) out[step] = nlohmann::json::parse(text);
  return out;
}

// `rank0Micro`: the micro-batches rank 0 took, its share (the curve shows
// that the ranks together took every row once).
void expectSameCurve(const std::map<int, nlohmann::json>& reference, const std::map<int, nlohmann::json>& run,
                     int rank0Micro) {
  ASSERT_EQ(run.size(), reference.size());
  EXPECT_EQ(run.begin()->second["micro_batches"].get<int>(), rank0Micro);
  for (const auto& [step, j] : reference) {
    EXPECT_LT(relDiff(run.at(step)["loss"], j["loss"]), 1e-5) << "step " << step;
    EXPECT_LT(relDiff(run.at(step)["grad_norm"], j["grad_norm"]), 1e-5) << "step " << step;
  }
}

PTRAIN_LONG_TEST(DataShares, UnevenSharesTrainTheSingleRankCurve) {
  TempDir tmp;
  const auto single = train(tmp.path() + "/single", 1, {});
  ASSERT_EQ(single.size(), 12u);
  // 48 and 16 of the 64 rows: six micro-batches on rank 0, two on rank 1.
  expectSameCurve(single, train(tmp.path() + "/shares", 2, {"parallel.data_parallel_shares=[3,1]"}), 6);
  // The same through tensor and pipeline parallelism: dp=2 of tp2 (and of pp2).
  expectSameCurve(single, train(tmp.path() + "/tp", 4,
                                {"parallel.data_parallel_shares=[0.25,0.75]", "parallel.tensor_model_parallel_size=2"}),
                  2);
  expectSameCurve(single, train(tmp.path() + "/pp", 4,
                                {"parallel.data_parallel_shares=[5,3]", "parallel.pipeline_model_parallel_size=2"}),
                  5);
}

TEST(DataShares, CheckRefusesSharesThatCannotRun) {
  struct Case {
    std::vector<std::string> overrides;
    const char* message;
  };
  const std::vector<Case> cases = {
      {{"parallel.data_parallel_shares=[1,1,2]"}, "data_parallel_shares has 3 entries but the data-parallel size is dp=2"},
      {{"parallel.data_parallel_shares=[1,0]"}, "data_parallel_shares: element 1: 0 is out of range; use a value > 0"},
      {{"parallel.data_parallel_shares=[2,1]"}, "does not split by data_parallel_shares [2, 1] into whole micro-batches "
                                                "of 8 rows on every rank: use shares [40, 24]"},
      {{"parallel.data_parallel_shares=[3,1]", "train.micro_batch_size=null"}, "needs train.micro_batch_size"},
  };
  for (const auto& c : cases) {
    std::vector<std::string> args{"check", quickstart(), "--nproc", "2", "train.micro_batch_size=8"};
    args.insert(args.end(), c.overrides.begin(), c.overrides.end());
    auto r = runPtrain(args);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  }
  auto ok = runPtrain({"check", quickstart(), "--nproc", "2", "train.micro_batch_size=8",
                       "parallel.data_parallel_shares=[3,1]"});
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_NE(ok.output.find("rows per rank [48, 16]"), std::string::npos) << ok.output;
}

}  // namespace
