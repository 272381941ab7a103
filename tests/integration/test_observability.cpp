// What a run shows of itself, through the ptrain binary: metrics.jsonl rows
// with their kind and time, lr, grad norm, MFU, throughput and memory on every
// training row and on the progress line, phase timers that add up to the step
// time (and name the phase a layout adds: pipeline waits under pp, gradient
// reductions under dp), TensorBoard event files that TensorBoard's own reader
// reads back with every value of metrics.jsonl (across a resume), and a
// profiler trace of a window of steps that parses as Chrome trace JSON.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "support/test_support.h"

namespace fs = std::filesystem;
using nlohmann::json;
using ptrain::test::runPtrain;
using ptrain::test::TempDir;

namespace {

std::string quickstart() { return ptrain::test::sourceDir() + "/configs/quickstart.yaml"; }

std::vector<json> rowsOf(const std::string& runDir) {
  std::vector<json> out;
  std::istringstream in(ptrain::test::readFile(runDir + "/metrics.jsonl"));
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(json::parse(line));
  return out;
}

std::vector<json> rowsOfKind(const std::vector<json>& rows, const std::string& kind) {
  std::vector<json> out;
  for (const auto& r : rows)
    if (r.value("kind", "") == kind) out.push_back(r);
  return out;
}

const char* kPhases[] = {"data",  "forward_backward", "grad_reduce", "pipeline_wait", "optimizer",
                         "rollout", "eval",           "checkpoint",  "other"};

double phaseSum(const json& row) {
  double sum = 0;
  for (const char* p : kPhases) sum += row.at(std::string("time_") + p + "_s").get<double>();
  return sum;
}

std::vector<std::string> quickRun(const std::string& runDir, std::vector<std::string> extra) {
  std::vector<std::string> args{"run", quickstart(), "--run-dir", runDir, "train.global_batch_size=8",
                                "train.log_every=1", "log.progress=lines", "optimizer.warmup_steps=0"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

TEST(Observability, RowsCarryKindTimeFiguresAndPhasesThatAddUpToTheStep) {
  TempDir tmp;
  const std::string run = tmp.path() + "/run";
  const double before = static_cast<double>(std::time(nullptr));
  auto r = runPtrain(quickRun(run, {"--nproc", "1", "launch.nproc=1", "train.steps=6", "train.eval_every=3",
                                    "checkpoint.every=3"}),
                     {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const double after = static_cast<double>(std::time(nullptr)) + 1;
  const auto rows = rowsOf(run);
  std::set<std::string> kinds;
  for (const auto& row : rows) {
    ASSERT_TRUE(row.contains("kind") && row.contains("time")) << row.dump();
    kinds.insert(row["kind"].get<std::string>());
    EXPECT_GE(row["time"].get<double>(), before - 1) << row.dump();
    EXPECT_LE(row["time"].get<double>(), after) << row.dump();
  }
  EXPECT_EQ(kinds, (std::set<std::string>{"train", "eval", "startup", "checkpoint", "summary"}));

  const auto train = rowsOfKind(rows, "train");
  ASSERT_EQ(train.size(), 6u);
  const double peakFlops = rowsOfKind(rows, "startup").at(0).at("peak_flops").get<double>();
  EXPECT_GT(peakFlops, 1e8);  // this host's float32 products: GFLOP/s at least
  double flopsPerToken = 0;
  for (const auto& row : train) {
    const int step = row["step"].get<int>();
    SCOPED_TRACE("step " + std::to_string(step));
    for (const char* field : {"loss", "lr", "grad_norm", "mfu", "tokens_per_s", "mem_mb", "peak_rss_mb", "step_time_s"})
      ASSERT_TRUE(row.contains(field)) << field << " missing: " << row.dump();
    EXPECT_GT(row["lr"].get<double>(), 0);
    EXPECT_GT(row["grad_norm"].get<double>(), 0);
    EXPECT_GT(row["mem_mb"].get<double>(), 10);
    EXPECT_GE(row["peak_rss_mb"].get<double>(), row["mem_mb"].get<double>() * 0.99);
    const double mfu = row["mfu"].get<double>();
    EXPECT_GT(mfu, 0);
    EXPECT_LT(mfu, 1.5);
    // MFU is model FLOPs over time and peak: per token the same every step.
    const double perToken = mfu * peakFlops / row["tokens_per_s"].get<double>();
    if (flopsPerToken == 0) flopsPerToken = perToken;
    EXPECT_NEAR(perToken / flopsPerToken, 1.0, 1e-6);

    const double stepTime = row["step_time_s"].get<double>();
    EXPECT_NEAR(phaseSum(row), stepTime, 0.05 * stepTime) << row.dump();
    EXPECT_GT(row["time_data_s"].get<double>(), 0);
    EXPECT_GT(row["time_forward_backward_s"].get<double>(), 0);
    EXPECT_GT(row["time_optimizer_s"].get<double>(), 0);
    // Evaluation and checkpoints at steps 3 and 6 only, and in no other phase.
    const bool due = step % 3 == 0;
    EXPECT_EQ(row["time_eval_s"].get<double>() > 0, due);
    EXPECT_EQ(row["time_checkpoint_s"].get<double>() > 0, due);
    EXPECT_EQ(row["time_pipeline_wait_s"].get<double>(), 0);
  }
  // A step of a few hundred kFLOP per token: 6 x parameters, roughly.
  EXPECT_GT(flopsPerToken, 1e4);

  const auto summary = rowsOfKind(rows, "summary").at(0);
  double stepsTime = 0;
  for (const auto& row : train) stepsTime += row["step_time_s"].get<double>();
  EXPECT_NEAR(summary.at("step_time_s").get<double>(), stepsTime, 1e-6 * stepsTime);
  EXPECT_NEAR(phaseSum(summary), stepsTime, 0.05 * stepsTime);
  // The phases name where the time went: what is left for the loop itself is
  // small (over the run: one step of a few milliseconds can lose its core to
  // another process at any point, "other" included).
  EXPECT_LT(summary.at("time_other_s").get<double>(), 0.2 * stepsTime) << summary.dump();

  // The progress line and the summary carry the same figures.
  EXPECT_NE(r.output.find("step 6/6  loss "), std::string::npos) << r.output;
  for (const char* shown : {"  lr ", "  gnorm ", "  mfu ", " tok/s", "  mem ", "MiB"})
    EXPECT_NE(r.output.find(shown), std::string::npos) << shown << " not on the progress line:\n" << r.output;
  EXPECT_NE(r.output.find("step time"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("forward_backward"), std::string::npos) << r.output;
}

TEST(Observability, PhasesNameWhatEachLayoutAdds) {
  TempDir tmp;
  const std::string dp = tmp.path() + "/dp", pp = tmp.path() + "/pp";
  auto r = runPtrain(quickRun(dp, {"train.steps=3"}), {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const auto& row : rowsOfKind(rowsOf(dp), "train")) {
    EXPECT_GT(row["time_grad_reduce_s"].get<double>(), 0) << row.dump();
    EXPECT_EQ(row["time_pipeline_wait_s"].get<double>(), 0) << row.dump();
  }
  r = runPtrain(quickRun(pp, {"train.steps=3", "parallel.pipeline_model_parallel_size=2", "train.micro_batch_size=2"}),
                {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const auto& row : rowsOfKind(rowsOf(pp), "train")) {
    EXPECT_GT(row["time_pipeline_wait_s"].get<double>(), 0) << row.dump();
    const double stepTime = row["step_time_s"].get<double>();
    EXPECT_NEAR(phaseSum(row), stepTime, 0.05 * stepTime) << row.dump();
  }
}

TEST(Observability, TensorBoardReadsBackEveryValueAcrossAResume) {
  const std::string python = ptrain::test::pythonImporting("tensorboard");
  if (python.empty()) GTEST_SKIP() << ptrain::test::pythonLacks({"tensorboard"});
  TempDir tmp;
  const std::string run = tmp.path() + "/run";
  auto r = runPtrain(quickRun(run, {"--nproc", "1", "launch.nproc=1", "train.steps=4", "train.eval_every=2",
                                    "checkpoint.every=2", "log.tensorboard=true"}),
                     {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = runPtrain(quickRun(run, {"--nproc", "1", "launch.nproc=1", "train.steps=6", "train.eval_every=2",
                               "checkpoint.every=2", "log.tensorboard=true", "--resume", "--allow-changes"}),
                {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;

  const std::string script = ptrain::test::sourceDir() + "/tests/tools/read_tensorboard.py";
  auto read = ptrain::test::runProcess({python, script, run + "/tensorboard"}, {}, 120);
  ASSERT_EQ(read.exit_code, 0) << read.output;
  const json board = json::parse(read.output.substr(read.output.find('{')));
  const json& scalars = board.at("scalars");

  // Every number of every row is a point of "<kind>/<field>" at its step.
  int checked = 0;
  std::set<int> lossSteps;
  for (const auto& row : rowsOf(run)) {
    const std::string kind = row["kind"];
    const int step = row["step"].get<int>();
    for (const auto& [field, value] : row.items()) {
      if (field == "step" || field == "time" || field == "kind") continue;
      std::vector<std::pair<std::string, double>> points;
      if (value.is_number()) points.emplace_back(kind + "/" + field, value.get<double>());
      if (value.is_array())
        for (size_t i = 0; i < value.size(); ++i)
          points.emplace_back(kind + "/" + field + "/rank" + std::to_string(i), value[i].get<double>());
      for (const auto& [tag, expected] : points) {
        ASSERT_TRUE(scalars.contains(tag)) << tag << " is not in TensorBoard's scalars";
        bool found = false;
        for (const auto& point : scalars[tag]) {
          found = found || (point[0].get<int>() == step &&
                            point[1].get<double>() == static_cast<double>(static_cast<float>(expected)));
        }
        EXPECT_TRUE(found) << tag << " at step " << step << ": " << expected << " not read back";
        ++checked;
      }
    }
    if (kind == "train") lossSteps.insert(step);
  }
  EXPECT_GT(checked, 100);
  EXPECT_EQ(lossSteps, (std::set<int>{1, 2, 3, 4, 5, 6}));  // one curve across the resume
  std::set<int> boardSteps;
  for (const auto& point : scalars.at("train/loss")) boardSteps.insert(point[0].get<int>());
  EXPECT_EQ(boardSteps, lossSteps);

  // The resolved recipe, once.
  const json& texts = board.at("texts");
  ASSERT_TRUE(texts.contains("recipe")) << read.output;
  ASSERT_EQ(texts["recipe"].size(), 1u);
  const std::string recipe = texts["recipe"][0][1];
  EXPECT_NE(recipe.find("name: quickstart"), std::string::npos) << recipe;
  EXPECT_NE(recipe.find("tensorboard: true"), std::string::npos) << recipe;
}

// The names of the complete ("X") events of a Chrome trace: a JSON array of
// events (libtorch's legacy profiler) or {"traceEvents": [...]} (Kineto).
std::multiset<std::string> traceRanges(const std::string& path) {
  const json trace = json::parse(ptrain::test::readFile(path));
  const json& events = trace.is_array() ? trace : trace.at("traceEvents");
  std::multiset<std::string> names;
  for (const auto& e : events) {
    if (e.value("ph", "") != "X") continue;
    EXPECT_TRUE(e.contains("ts") && e.contains("dur")) << e.dump();
    names.insert(e.value("name", ""));
  }
  return names;
}

TEST(Observability, ProfileStepsWriteAChromeTracePerRankWithPtrainsRanges) {
  TempDir tmp;
  const std::string run = tmp.path() + "/run";
  auto r = runPtrain(quickRun(run, {"train.steps=4", "log.profile_steps=[2, 3]"}), {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (int rank : {0, 1}) {
    const std::string path = run + "/traces/rank" + std::to_string(rank) + ".json";
    ASSERT_TRUE(fs::exists(path)) << path << "\n" << r.output;
    const auto names = traceRanges(path);
    // Two steps: each phase range twice.
    for (const char* phase : {"ptrain::data", "ptrain::forward_backward", "ptrain::grad_reduce", "ptrain::optimizer"})
      EXPECT_EQ(names.count(phase), 2u) << phase << " in " << path;
    EXPECT_EQ(names.count("ptrain::other"), 2u) << path;
    bool collective = false;
    size_t operators = 0;
    for (const auto& n : names) {
      collective = collective || n.rfind("ptrain::allreduce", 0) == 0;
      operators += n.rfind("aten::", 0) == 0 ? 1 : 0;
    }
    EXPECT_TRUE(collective) << "no collective's range in " << path;
    // The operators of two steps: hundreds (the products are ptrain's host
    // kernels, not ATen operators, on the cpu).
    EXPECT_GT(operators, 100u) << path;
  }

  // A window outside the run: one line, exit code 2, before any step.
  r = runPtrain({"check", quickstart(), "train.steps=4", "log.profile_steps=[3, 9]"}, {}, 120);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("log.profile_steps: [3, 9] is not a window of this run's steps: expected 1 <= A <= B <= "
                          "train.steps (4)"),
            std::string::npos)
      << r.output;
}

}  // namespace
