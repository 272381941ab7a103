// Sharded checkpoints end to end through the ptrain binary: every rank writes
// what it owns; a checkpoint saved at one layout resumes at another (tensor,
// pipeline, data parallelism, the distributed optimizer on or off) and in
// another precision, continuing the uninterrupted curve; a checkpoint written
// before sharding (tests/fixtures/checkpoints/legacy_gpt) still resumes; a
// damaged file or a renamed step folder is refused in one line;
// `ptrain checkpoint consolidate` writes whole tensors that an independent
// safetensors reader loads and that a run resumes from; start-up, save and
// load are in metrics.jsonl and the summary.
#include <gtest/gtest.h>

#include <algorithm>
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

// A tiny GPT: 4 layers (so pp 4 has a block per stage), hidden 32, 4 heads.
const char* kRecipe = R"(
name: tiny-sharded
trainer: {name: llm}
model: {num_layers: 4, hidden_size: 32, num_attention_heads: 4, seq_length: 8}
data: {name: arithmetic, digits: 1, operations: [add], eval_size: 8}
train: {steps: 12, global_batch_size: 8, micro_batch_size: 2, seed: 13, eval_every: 0, log_every: 4}
optimizer: {name: adamw, lr: 0.003, lr_schedule: cosine, warmup_steps: 2, clip_grad: 1.0}
parallel: {grad_bucket_size_mb: 0.001}
checkpoint: {every: 6, keep: 3}
log: {progress: none}
)";

struct Layout {
  int tp = 1, pp = 1, dp = 1;
  bool distributedOptimizer = false;
  std::string name() const {
    return "tp" + std::to_string(tp) + "_pp" + std::to_string(pp) + "_dp" + std::to_string(dp) +
           (distributedOptimizer ? "_dist" : "");
  }
  int world() const { return tp * pp * dp; }
};

ptrain::test::ProcessResult train(const std::string& recipe, const std::string& runDir, const Layout& l,
                                  std::vector<std::string> extra = {}) {
  const std::string n = std::to_string(l.world());
  std::vector<std::string> args{"run", recipe, "--nproc", n, "--run-dir", runDir, "launch.nproc=" + n,
                                "parallel.tensor_model_parallel_size=" + std::to_string(l.tp),
                                "parallel.pipeline_model_parallel_size=" + std::to_string(l.pp),
                                std::string("optimizer.distributed=") + (l.distributedOptimizer ? "true" : "false")};
  args.insert(args.end(), extra.begin(), extra.end());
  return runPtrain(args, {}, 300);
}

std::map<int, double> losses(const std::string& runDir) {
  std::map<int, double> out;
  for (const auto& [step, text] : ptrain::test::readTrainingSteps(runDir)) {
    out[step] = nlohmann::json::parse(text)["loss"].get<double>();
  }
  return out;
}

std::vector<nlohmann::json> metricRows(const std::string& runDir, const std::string& key) {
  std::vector<nlohmann::json> rows;
  std::istringstream in(ptrain::test::readFile(runDir + "/metrics.jsonl"));
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.contains(key)) rows.push_back(j);
  }
  return rows;
}

// A fresh run folder holding only `from`'s checkpoint `step`.
std::string copyCheckpoint(const std::string& from, int step, const std::string& to) {
  fs::create_directories(to + "/checkpoints");
  const std::string name = "/checkpoints/step_" + std::to_string(step);
  fs::copy(from + name, to + name, fs::copy_options::recursive);
  return to;
}

// Saved at one layout, resumed at others: each continues the uninterrupted
// curve (1e-5 relative; the layouts sum in other orders).
void expectResumesAcross(const Layout& saved, const std::vector<Layout>& resumed) {
  TempDir tmp;
  const std::string recipe = tmp.write("tiny.yaml", kRecipe);
  const std::string full = tmp.path() + "/" + saved.name();
  auto r = train(recipe, full, saved);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto reference = losses(full);
  ASSERT_EQ(reference.size(), 12u) << r.output;
  // One file per rank that owns anything, and the index.
  ASSERT_TRUE(fs::exists(full + "/checkpoints/step_6/index.json"));
  ASSERT_TRUE(fs::exists(full + "/checkpoints/step_6/model.rank00000.safetensors"));
  ASSERT_FALSE(fs::exists(full + "/checkpoints/step_6/model.safetensors"));
  for (const Layout& l : resumed) {
    const std::string dir = copyCheckpoint(full, 6, tmp.path() + "/resume_" + l.name());
    r = train(recipe, dir, l, {"--resume", "--allow-changes"});
    ASSERT_EQ(r.exit_code, 0) << saved.name() << " -> " << l.name() << "\n" << r.output;
    const auto after = losses(dir);
    ASSERT_EQ(after.size(), 6u) << l.name() << "\n" << r.output;
    for (int step = 7; step <= 12; ++step) {
      EXPECT_LT(relDiff(after.at(step), reference.at(step)), 1e-5)
          << saved.name() << " -> " << l.name() << " step " << step;
    }
  }
}

}  // namespace

PTRAIN_LONG_TEST(ShardedCheckpoints, SavedAtTp2Pp2ResumesAtOtherLayouts) {
  expectResumesAcross({2, 2, 1, false}, {{1, 1, 1, false}, {1, 4, 1, false}, {4, 1, 1, false}, {1, 1, 2, true}});
}

PTRAIN_LONG_TEST(ShardedCheckpoints, DistributedOptimizerRangesResumeAtOtherLayouts) {
  // Its flat ranges of every parameter, read back as whole blocks, and as
  // other ranges.
  expectResumesAcross({1, 1, 4, true}, {{2, 1, 1, false}, {1, 1, 2, true}, {2, 1, 2, true}});
}

TEST(ShardedCheckpoints, ResumesOneRankRunAtTensorParallel2) {
  expectResumesAcross({1, 1, 1, false}, {{2, 1, 1, false}});
}

// fp32 <-> bf16 (float32 master weights): the same model continues, within
// what bf16 rounding moves the loss.
TEST(ShardedCheckpoints, ResumesIntoAnotherPrecision) {
  TempDir tmp;
  const std::string recipe = tmp.write("tiny.yaml", kRecipe);
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{{"fp32", "bf16"}, {"bf16", "fp32"}}) {
    const std::string full = tmp.path() + "/" + from;
    auto r = train(recipe, full, {1, 1, 1}, {"precision.name=" + from});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto reference = losses(full);
    const std::string dir = copyCheckpoint(full, 6, tmp.path() + "/" + from + "_to_" + to);
    r = train(recipe, dir, {1, 1, 1}, {"precision.name=" + to, "--resume", "--allow-changes"});
    ASSERT_EQ(r.exit_code, 0) << from << " -> " << to << "\n" << r.output;
    const auto after = losses(dir);
    ASSERT_EQ(after.size(), 6u) << r.output;
    EXPECT_LT(relDiff(after.at(7), reference.at(7)), 2e-2) << from << " -> " << to;
  }
}

// A checkpoint written by ptrain before sharded checkpoints (whole tensors,
// 2 data-parallel ranks, tests/fixtures/checkpoints/legacy_gpt) resumes, at
// its own layout and at tp 2, on the curve of the run that wrote it.
TEST(ShardedCheckpoints, ACheckpointOfAnEarlierVersionStillResumes) {
  TempDir tmp;
  const std::string fixture = ptrain::test::sourceDir() + "/tests/fixtures/checkpoints/legacy_gpt";
  const auto written = nlohmann::json::parse(ptrain::test::readFile(fixture + "/losses.json"))["losses"];
  for (const auto& [name, extra] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"dp2", {"--nproc", "2"}}, {"tp2", {"--nproc", "2", "parallel.tensor_model_parallel_size=2"}}}) {
    const std::string dir = tmp.path() + "/" + name;
    fs::create_directories(dir + "/checkpoints");
    fs::copy(fixture + "/step_3", dir + "/checkpoints/step_3", fs::copy_options::recursive);
    std::vector<std::string> args{"run", fixture + "/recipe.yaml", "--run-dir", dir, "--resume", "--allow-changes"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto r = runPtrain(args, {}, 120);
    ASSERT_EQ(r.exit_code, 0) << name << "\n" << r.output;
    const auto after = losses(dir);
    for (int step = 4; step <= 6; ++step) {
      EXPECT_LT(relDiff(after.at(step), written[std::to_string(step)].get<double>()), 1e-5) << name << " step " << step;
    }
    // It saves sharded from then on.
    EXPECT_TRUE(fs::exists(dir + "/checkpoints/step_6/index.json")) << name;
  }
}

TEST(ShardedCheckpoints, ConsolidatedFilesLoadAnywhereAndResume) {
  TempDir tmp;
  const std::string recipe = tmp.write("tiny.yaml", kRecipe);
  const std::string full = tmp.path() + "/tp2_pp2";
  auto r = train(recipe, full, {2, 2, 1});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto reference = losses(full);
  const std::string out = tmp.path() + "/whole";
  r = runPtrain({"checkpoint", "consolidate", full + "/checkpoints/step_6", out}, {}, 60);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("2 safetensors files"), std::string::npos) << r.output;
  // An independent reader (no ptrain code; Debian's python3-torch, which
  // tools/install-deps.sh installs) loads every tensor whole.
  auto py = ptrain::test::runProcess(
      {"/usr/bin/python3", ptrain::test::sourceDir() + "/tests/tools/read_safetensors.py", out + "/model.safetensors"},
      {}, 120);
  ASSERT_EQ(py.exit_code, 0) << py.output;
  EXPECT_NE(py.output.find("tensor\tembed.tokens.weight\tF32\t128,32\t"), std::string::npos) << py.output;
  // A run resumes from the whole tensors, at one rank, on the same curve.
  const std::string dir = tmp.path() + "/from_whole";
  fs::create_directories(dir + "/checkpoints");
  fs::copy(out, dir + "/checkpoints/step_6", fs::copy_options::recursive);
  r = train(recipe, dir, {1, 1, 1}, {"--resume", "--allow-changes"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto after = losses(dir);
  for (int step = 7; step <= 12; ++step) EXPECT_LT(relDiff(after.at(step), reference.at(step)), 1e-5) << step;
  // Not a checkpoint: one line, exit 2.
  r = runPtrain({"checkpoint", "consolidate", tmp.path(), tmp.path() + "/x"}, {}, 60);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
}

TEST(ShardedCheckpoints, ADamagedFileOrARenamedStepIsOneLineAndExit2) {
  TempDir tmp;
  const std::string recipe = tmp.write("tiny.yaml", kRecipe);
  const std::string full = tmp.path() + "/run";
  auto r = train(recipe, full, {2, 1, 1}, {"train.steps=6"});
  ASSERT_EQ(r.exit_code, 0) << r.output;

  // One flipped byte in rank 1's file.
  const std::string damaged = copyCheckpoint(full, 6, tmp.path() + "/damaged");
  const std::string file = damaged + "/checkpoints/step_6/model.rank00001.safetensors";
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(file) - 17));
    f.put('\x7f');
  }
  r = train(recipe, damaged, {2, 1, 1}, {"train.steps=8", "--resume", "--allow-changes"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(file + ": bytes ["), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("do not match their checksum"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("terminate called"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(file));  // nothing saved is touched

  // A step folder renamed by hand.
  const std::string renamed = tmp.path() + "/renamed";
  fs::create_directories(renamed + "/checkpoints");
  fs::copy(full + "/checkpoints/step_6", renamed + "/checkpoints/step_9", fs::copy_options::recursive);
  r = train(recipe, renamed, {2, 1, 1}, {"train.steps=10", "--resume", "--allow-changes"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("meta.json: says step 6, but its folder is step_9"), std::string::npos) << r.output;
}

TEST(ShardedCheckpoints, StartupSaveAndLoadAreMeasured) {
  TempDir tmp;
  const std::string recipe = tmp.write("tiny.yaml", kRecipe);
  const std::string dir = tmp.path() + "/run";
  auto r = train(recipe, dir, {2, 1, 1}, {"log.progress=lines"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto startup = metricRows(dir, "startup_s");
  ASSERT_EQ(startup.size(), 1u);
  EXPECT_GT(startup[0]["startup_s"].get<double>(), 0);
  const auto saves = metricRows(dir, "checkpoint_save_s");
  ASSERT_EQ(saves.size(), 2u);  // steps 6 and 12
  for (const auto& row : saves) {
    ASSERT_EQ(row["checkpoint_save_s"].size(), 2u);  // one per rank
    EXPECT_GT(row["checkpoint_save_bytes"][0].get<double>(), 0) << row.dump();
    EXPECT_GT(row["checkpoint_save_bytes"][1].get<double>(), 0) << row.dump();
  }
  EXPECT_NE(r.output.find("start-up"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("checkpoints saved"), std::string::npos) << r.output;

  const std::string resumed = copyCheckpoint(dir, 6, tmp.path() + "/resumed");
  r = train(recipe, resumed, {2, 1, 1}, {"--resume", "--allow-changes"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto loads = metricRows(resumed, "checkpoint_load_s");
  ASSERT_EQ(loads.size(), 1u);
  EXPECT_EQ(loads[0]["step"], 6);
  EXPECT_GT(loads[0]["checkpoint_load_bytes"][1].get<double>(), 0) << loads[0].dump();
  EXPECT_NE(r.output.find("checkpoint loaded"), std::string::npos) << r.output;
}
