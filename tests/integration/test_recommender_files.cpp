// The recommender trained from Criteo TSV files end to end through the ptrain
// binary: `ptrain data export clicks` writes the synthetic clicks, a run from
// the files (data.shuffle: false) gives the generator run's losses and
// evaluation at one rank and two data-parallel ranks, a resume continues
// exactly and is refused after the file changed, and `ptrain check` refuses
// bad files and keys in one line with exit 2.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/test_support.h"

namespace fs = std::filesystem;
using ptrain::test::runPtrain;
using ptrain::test::TempDir;

namespace {

const char* kGeneratorRecipe = R"(
name: rec_files_e2e
trainer: {name: recommender}
model: {embedding_dim: 4, bottom_mlp: [8], top_mlp: [8], attention_hidden: 4, hidden_size: 8, ffn_hidden_size: 8,
        scale: 0.001, min_table_rows: 50}
data: {name: clicks, history_length: 6, eval_size: 64}
train: {steps: 6, global_batch_size: 16, seed: 3, eval_every: 6, log_every: 1}
optimizer: {name: adamw, lr: 0.003, weight_decay: 0.0, lr_schedule: constant}
checkpoint: {every: 3}
)";

std::map<int, double> lossesOf(const std::string& runDir) {
  std::map<int, double> out;
  for (const auto& [step, text] : ptrain::test::readTrainingSteps(runDir)) {
    out[step] = nlohmann::json::parse(text)["loss"].get<double>();
  }
  return out;
}

// The last metrics line with the recommender's evaluation (eval_auc).
nlohmann::json lastEvaluation(const std::string& runDir) {
  nlohmann::json last;
  std::istringstream in(ptrain::test::readFile(runDir + "/metrics.jsonl"));
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("eval_auc")) last = j;
  }
  return last;
}

// The error line of a refused command (the output's last non-empty line).
std::string lastLine(const std::string& output) {
  const std::string t = ptrain::test::trimNewlines(output);
  const size_t nl = t.rfind('\n');
  return nl == std::string::npos ? t : t.substr(nl + 1);
}

}  // namespace

TEST(RecommenderFilesRun, ExportedClicksTrainAsTheGeneratorAndResumeExactly) {
  TempDir tmp;
  const std::string generator = tmp.write("gen.yaml", kGeneratorRecipe);
  const std::string train = tmp.path() + "/data/clicks_train.tsv.gz";
  auto r = runPtrain({"data", "export", "clicks", train, "--recipe", generator}, {}, 120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("clicks: 96 training samples to " + train + " ("), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("64 validation samples to " + tmp.path() + "/data/clicks_validation.tsv.gz"),
            std::string::npos)
      << r.output;
  r = runPtrain({"data", "export", "clicks", train, "--recipe", generator}, {}, 120);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(lastLine(r.output).find(train + ": exists"), std::string::npos) << r.output;

  const std::vector<std::string> files = {"data.name=criteo", "data.path=" + train,
                                          "data.validation_path=" + tmp.path() + "/data/clicks_validation.tsv.gz",
                                          "data.shuffle=false"};
  auto run = [&](const std::string& dir, const std::string& nproc, bool fromFiles) {
    std::vector<std::string> args = {"run", generator, "--nproc", nproc, "--run-dir", tmp.path() + "/" + dir};
    if (fromFiles) args.insert(args.end(), files.begin(), files.end());
    auto res = runPtrain(args, {"OMP_NUM_THREADS=1"}, 300);
    EXPECT_EQ(res.exit_code, 0) << dir << ": " << res.output;
    return res;
  };
  run("gen1", "1", false);
  const auto reference = lossesOf(tmp.path() + "/gen1");
  ASSERT_EQ(reference.size(), 6u);
  const nlohmann::json referenceEval = lastEvaluation(tmp.path() + "/gen1");
  ASSERT_TRUE(referenceEval.contains("eval_auc")) << referenceEval.dump();

  auto one = run("files1", "1", true);
  EXPECT_NE(one.output.find("no ground-truth AUC or logloss for data from files"), std::string::npos) << one.output;
  EXPECT_EQ(one.output.find("ground truth on"), std::string::npos) << one.output;
  EXPECT_EQ(lossesOf(tmp.path() + "/files1"), reference);
  const nlohmann::json eval = lastEvaluation(tmp.path() + "/files1");
  EXPECT_EQ(eval["eval_auc"], referenceEval["eval_auc"]) << eval.dump();
  EXPECT_EQ(eval["eval_logloss"], referenceEval["eval_logloss"]) << eval.dump();
  EXPECT_FALSE(eval.contains("best_auc")) << eval.dump();

  run("files2", "2", true);
  run("gen2", "2", false);
  const auto two = lossesOf(tmp.path() + "/files2");
  ASSERT_EQ(two.size(), 6u);
  EXPECT_EQ(two, lossesOf(tmp.path() + "/gen2"));
  for (const auto& [step, loss] : two) EXPECT_LT(ptrain::test::relDiff(loss, reference.at(step)), 1e-5) << step;

  // Stopped after step 3 and resumed: steps 4..6 as the uninterrupted run.
  const std::string cut = tmp.path() + "/files1";
  const auto meta = nlohmann::json::parse(ptrain::test::readFile(cut + "/checkpoints/step_6/meta.json"));
  EXPECT_EQ(meta["data"]["source"], "criteo");
  EXPECT_EQ(meta["data"]["consumed_samples"].get<int64_t>(), 96);
  fs::remove_all(cut + "/checkpoints/step_6");
  std::ofstream(cut + "/metrics.jsonl", std::ios::trunc).close();
  r = runPtrain({"run", "--resume", "--run-dir", cut, "--nproc", "1"}, {"OMP_NUM_THREADS=1"}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto resumed = lossesOf(cut);
  ASSERT_EQ(resumed.size(), 3u) << r.output;
  for (const auto& [step, loss] : resumed) EXPECT_EQ(loss, reference.at(step)) << "step " << step;

  // The file changed under the run: its resume is refused, naming why.
  fs::remove_all(cut + "/checkpoints/step_6");
  fs::last_write_time(train, fs::last_write_time(train) + std::chrono::seconds(5));
  r = runPtrain({"run", "--resume", "--run-dir", cut, "--nproc", "1"}, {}, 300);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("the data files changed since the checkpoint"), std::string::npos) << r.output;
}

TEST(RecommenderFilesRun, CheckRefusesBadFilesAndKeysInOneLine) {
  TempDir tmp;
  const std::string generator = tmp.write("gen.yaml", kGeneratorRecipe);
  const std::string train = tmp.path() + "/clicks_train.tsv";
  auto r = runPtrain({"data", "export", "clicks", train, "--recipe", generator, "--train", "20", "--validation", "8"},
                     {}, 120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string validation = "data.validation_path=" + tmp.path() + "/clicks_validation.tsv";
  auto check = [&](std::vector<std::string> overrides, const std::string& expected) {
    std::vector<std::string> args = {"check", generator};
    args.insert(args.end(), overrides.begin(), overrides.end());
    auto res = runPtrain(args, {}, 120);
    EXPECT_EQ(res.exit_code, 2) << res.output;
    EXPECT_NE(lastLine(res.output).find(expected), std::string::npos) << res.output;
  };
  check({"data.name=criteo", "data.path=" + tmp.path() + "/none.tsv", validation}, "none.tsv: no such file");
  check({"data.name=criteo", "data.path=" + train, validation, "data.history_length=3"},
        "carry 6 history columns but data.history_length is 3");
  check({"data.name=criteo", "data.path=" + train, validation, "data.world_seed=5"},
        "data.world_seed: is read only with data.name: clicks");
  check({"data.path=" + train}, "data.path: is read only with data.name: criteo");
  {
    std::ofstream bad(tmp.path() + "/bad.tsv");
    bad << "1\t2\t3\n";
  }
  check({"data.name=criteo", "data.path=" + tmp.path() + "/bad.tsv", validation}, "bad.tsv:1:");
  r = runPtrain({"check", generator, "data.name=criteo", "data.path=" + train, validation}, {}, 120);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  // `ptrain check` built the index the workers will load.
  EXPECT_TRUE(fs::exists(train + ".ptrain-index"));
}
