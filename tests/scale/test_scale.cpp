// Shard-native runs at a size where it matters: a model whose whole weights
// are more than a rank may hold trains at a layout that splits it, under
// train.max_memory_mb (checked against each rank's peak resident set after
// every step: build, steps and the save before them included), saves, and
// resumes at other layouts on the same losses as the uninterrupted run; the
// 12B recommender's layout at the largest scale this machine runs, every
// rank's peak within 10% of `ptrain plan`. Long tests, run one at a time
// (tests/CMakeLists.txt: RUN_SERIAL).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "support/test_support.h"

namespace fs = std::filesystem;
using ptrain::test::relDiff;
using ptrain::test::runPtrain;
using ptrain::test::TempDir;

namespace {

std::map<int, double> losses(const std::string& runDir) {
  std::map<int, double> out;
  for (const auto& [step, text] : ptrain::test::readTrainingSteps(runDir)) {
    out[step] = nlohmann::json::parse(text)["loss"].get<double>();
  }
  return out;
}

ptrain::test::ProcessResult run(const std::string& runDir, const std::vector<std::string>& model,
                                const std::vector<std::string>& layout, const std::vector<std::string>& extra) {
  std::vector<std::string> args{"run", ptrain::test::sourceDir() + "/configs/quickstart.yaml", "--nproc", "4",
                                "--run-dir", runDir, "launch.nproc=4"};
  for (const auto* part : {&model, &layout, &extra}) args.insert(args.end(), part->begin(), part->end());
  return runPtrain(args, {}, 900);
}

// Four steps at `saved`, a checkpoint after step 2; then steps 3 and 4
// resumed from it at each of `resumed`, every run under `capMb`.
void trainSaveResume(const std::vector<std::string>& model, const std::vector<std::string>& saved,
                     const std::vector<std::vector<std::string>>& resumed, int capMb) {
  TempDir tmp;
  const std::vector<std::string> common = {"train.steps=4", "checkpoint.every=2", "train.eval_every=0",
                                           "data.eval_size=4", "log.progress=none",
                                           "train.max_memory_mb=" + std::to_string(capMb)};
  const std::string full = tmp.path() + "/full";
  auto r = run(full, model, saved, common);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto reference = losses(full);
  ASSERT_EQ(reference.size(), 4u) << r.output;
  for (size_t i = 0; i < resumed.size(); ++i) {
    const std::string dir = tmp.path() + "/resumed" + std::to_string(i);
    fs::create_directories(dir + "/checkpoints");
    fs::copy(full + "/checkpoints/step_2", dir + "/checkpoints/step_2", fs::copy_options::recursive);
    std::vector<std::string> extra = common;
    extra.push_back("--resume");
    extra.push_back("--allow-changes");
    r = run(dir, model, resumed[i], extra);
    ASSERT_EQ(r.exit_code, 0) << "layout " << i << "\n" << r.output;
    const auto after = losses(dir);
    ASSERT_EQ(after.size(), 2u) << r.output;
    for (int step = 3; step <= 4; ++step) {
      EXPECT_LT(relDiff(after.at(step), reference.at(step)), 1e-6) << "layout " << i << " step " << step;
    }
  }
}

}  // namespace

// 403 M parameters (1.6 GB of float32 weights), SGD: at tp 4 each rank holds
// a quarter of the weights and their gradients (measured peak 1.0 GB), and
// the cap is below the whole weights.
PTRAIN_LONG_TEST(Scale, Gpt403MTrainsAtTp4UnderACapBelowItsWeightsAndResumesAtTp2Pp2AndPp4) {
  trainSaveResume({"model.num_layers=8", "model.hidden_size=2048", "model.num_attention_heads=16",
                   "train.global_batch_size=4", "optimizer.name=sgd"},
                  {"parallel.tensor_model_parallel_size=4"},
                  {{"parallel.tensor_model_parallel_size=2", "parallel.pipeline_model_parallel_size=2"},
                   {"parallel.pipeline_model_parallel_size=4"}},
                  1400);
}

// A GPT-MoE whose experts alone (8 layers of 8 experts of 2 x 1024 x 4096:
// 2.15 GB in float32) are more than the cap: at ep 4 each rank builds and
// holds two experts a layer (measured peak 1.76 GB with their gradients);
// resumed at ep 2 x etp 2 (four experts a layer, half of each one's
// features).
PTRAIN_LONG_TEST(Scale, GptMoeTrainsAtEp4UnderACapBelowItsExpertsAndResumesAtEp2Etp2) {
  trainSaveResume({"model.num_layers=8", "model.hidden_size=1024", "model.num_attention_heads=16",
                   "model.num_experts=8", "model.moe_router_topk=2", "train.global_batch_size=8",
                   "optimizer.name=sgd"},
                  {"parallel.expert_model_parallel_size=4"},
                  {{"parallel.expert_model_parallel_size=2", "parallel.expert_tensor_parallel_size=2"}}, 1900);
}

// The 12B recommender's recipe and layout (tp 4 x pp 2 x ep 2 on 8
// processes) at model.scale 0.1, the largest this machine (24 GB) runs:
// 1.2e9 table values (4.8 GB in float32), a quarter on each rank of the first
// stage. Every rank's peak (build, steps, evaluation, save) within 10% of
// `ptrain plan`, under a cap below what building the whole tables on a rank
// would take.
PTRAIN_LONG_TEST(Scale, RecommenderAt12bLayoutAndTheLargestScaleThisMachineRuns) {
  TempDir tmp;
  const std::vector<std::string> recipe = {"run", ptrain::test::sourceDir() + "/configs/recommender/recsys_12b_scaled_cpu.yaml",
                                           "model.scale=0.1", "train.steps=4", "data.eval_size=1024",
                                           "checkpoint.save_final=true", "log.progress=none",
                                           "train.max_memory_mb=4300"};
  std::vector<std::string> plan = recipe;
  plan[0] = "plan";
  plan.insert(plan.end(), {"--device", "host", "--json"});
  auto predicted = runPtrain(plan, {}, 300);
  ASSERT_EQ(predicted.exit_code, 0) << predicted.output;
  const auto prediction = nlohmann::json::parse(predicted.output.substr(predicted.output.find('{')));
  const auto stages = prediction["stage_memory_bytes"];
  ASSERT_EQ(stages.size(), 2u) << predicted.output;
  // The first stage's parameters are a quarter of the tables (tp 4): the
  // whole tables in float32 are more than the cap a rank runs under.
  ASSERT_EQ(prediction["stage"], 0);
  EXPECT_GT(4 * prediction["params_bytes"].get<double>() / (1 << 20), 4300);
  std::vector<std::string> args = recipe;
  args.insert(args.end(), {"--run-dir", tmp.path() + "/run"});
  auto r = runPtrain(args, {}, 900);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<double> peaks;
  std::istringstream metrics(ptrain::test::readFile(tmp.path() + "/run/metrics.jsonl"));
  for (std::string line; std::getline(metrics, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("peak_rss_mb_ranks")) peaks = j["peak_rss_mb_ranks"].get<std::vector<double>>();
  }
  ASSERT_EQ(peaks.size(), 8u);
  // Ranks 0-3 are the first stage (the tables), 4-7 the last.
  for (int rank = 0; rank < 8; ++rank) {
    const double plannedMb = stages[rank < 4 ? 0 : 1].get<double>() / (1 << 20);
    EXPECT_LT(std::abs(plannedMb / peaks[static_cast<size_t>(rank)] - 1), 0.10)
        << "rank " << rank << ": planned " << plannedMb << " MB, peak " << peaks[static_cast<size_t>(rank)] << " MB";
  }
}
