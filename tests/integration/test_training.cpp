// End-to-end training through the ptrain binary: data-parallel runs match the
// single-process run, resume continues bit for bit, bad input is refused.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "support/test_support.h"

namespace fs = std::filesystem;
using ptrain::test::runPtrain;
using ptrain::test::relDiff;
using ptrain::test::TempDir;

namespace {

// A tiny GPT on 1-digit addition: fast enough for 4 processes on 2 cores.
const char* kTinyRecipe = R"(
name: tiny
trainer: {name: llm}
model: {num_layers: 2, hidden_size: 32, num_attention_heads: 2, seq_length: 8}
data: {name: arithmetic, digits: 1, operations: [add], eval_size: 32}
train: {steps: 20, global_batch_size: 16, micro_batch_size: 2, seed: 7, eval_every: 0, log_every: 5}
optimizer: {name: adamw, lr: 0.003, lr_schedule: cosine, warmup_steps: 3, clip_grad: 1.0}
parallel: {grad_bucket_size_mb: 0.01}
checkpoint: {every: 0, keep: 3}
log: {progress: lines}
)";

struct StepRecord {
  double loss = 0;
  std::string loss_text;  // as written, for bitwise comparison
};

// step -> the last training line for that step in metrics.jsonl.
std::map<int, StepRecord> readLosses(const std::string& runDir) {
  std::map<int, StepRecord> out;
  for (const auto& [step, text] : ptrain::test::readTrainingSteps(runDir)) {
    auto j = nlohmann::json::parse(text);
    out[step] = StepRecord{j["loss"].get<double>(), j["loss"].dump()};
  }
  return out;
}

ptrain::test::ProcessResult train(const std::string& recipe, const std::string& runDir, int nproc,
                                  std::vector<std::string> extra = {}, const std::vector<std::string>& env = {}) {
  std::vector<std::string> args{"run", recipe, "--nproc", std::to_string(nproc), "--run-dir", runDir};
  args.insert(args.end(), extra.begin(), extra.end());
  return runPtrain(args, env, 400);
}

}  // namespace

TEST(Training, DataParallelMatchesSingleProcess) {
  TempDir tmp;
  const std::string recipe = tmp.write("tiny.yaml", kTinyRecipe);
  std::map<int, std::map<int, StepRecord>> losses;
  for (int dp : {1, 2, 4}) {
    const std::string dir = tmp.path() + "/dp" + std::to_string(dp);
    auto r = train(recipe, dir, dp);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    losses[dp] = readLosses(dir);
    ASSERT_EQ(losses[dp].size(), 20u) << r.output;
  }
  for (int dp : {2, 4}) {
    EXPECT_LT(relDiff(losses[dp][1].loss, losses[1][1].loss), 1e-5) << "dp=" << dp << " step 1";
    for (int step = 1; step <= 20; ++step) {
      EXPECT_LT(relDiff(losses[dp][step].loss, losses[1][step].loss), 1e-4) << "dp=" << dp << " step " << step;
    }
  }
  // The run actually learns: the loss falls.
  EXPECT_LT(losses[1][20].loss, losses[1][1].loss * 0.8);
}

// ptrain's host kernels and caching allocator against libtorch's ops and
// malloc: the same training curve. With two intra-op threads (the suite runs
// with OMP_NUM_THREADS=1, which the worker would follow), so the kernels
// really split their products.
TEST(Training, HostKernelsAndAllocatorMatchLibtorch) {
  TempDir tmp;
  const std::string recipe = tmp.write("tiny.yaml", kTinyRecipe);
  const std::string mine = tmp.path() + "/ptrain", ref = tmp.path() + "/libtorch";
  auto r = train(recipe, mine, 1, {"cpu.kernels=ptrain", "cpu.allocator=caching"}, {"OMP_NUM_THREADS=2"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = train(recipe, ref, 1, {"cpu.kernels=libtorch", "cpu.allocator=system"}, {"OMP_NUM_THREADS=2"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto a = readLosses(mine), b = readLosses(ref);
  ASSERT_EQ(a.size(), 20u);
  ASSERT_EQ(b.size(), 20u);
  EXPECT_LT(relDiff(a[1].loss, b[1].loss), 1e-5);
  for (int step = 1; step <= 20; ++step) EXPECT_LT(relDiff(a[step].loss, b[step].loss), 1e-4) << "step " << step;
}

TEST(Training, ResumeContinuesBitForBit) {
  TempDir tmp;
  const std::string recipe = tmp.write("tiny.yaml", kTinyRecipe);
  const std::string full = tmp.path() + "/full";
  auto r = train(recipe, full, 2, {"checkpoint.every=10"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto reference = readLosses(full);
  ASSERT_TRUE(fs::exists(full + "/checkpoints/step_10/index.json"));
  ASSERT_TRUE(fs::exists(full + "/checkpoints/step_20/meta.json"));

  // The same run, stopped right after its step-10 checkpoint: keep only that
  // checkpoint and the metrics up to it, then resume.
  const std::string resumed = tmp.path() + "/resumed";
  fs::create_directories(resumed + "/checkpoints");
  fs::copy(full + "/checkpoints/step_10", resumed + "/checkpoints/step_10", fs::copy_options::recursive);
  r = train(recipe, resumed, 2, {"checkpoint.every=10", "--resume", "--allow-changes"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto after = readLosses(resumed);
  ASSERT_EQ(after.size(), 10u) << r.output;
  for (int step = 11; step <= 20; ++step) {
    EXPECT_EQ(after[step].loss_text, reference[step].loss_text) << "step " << step;
  }
}

// configs/llm/gpt_recompute.yaml is the quickstart with full recomputation:
// the same loss curve, bit for bit (dropout on, so the replayed random
// streams matter).
PTRAIN_LONG_TEST(Training, RecomputeRecipeTrainsTheQuickstartsCurve) {
  TempDir tmp;
  const std::string configs = ptrain::test::sourceDir() + "/configs/";
  const std::vector<std::string> shortRun = {"train.steps=30", "train.eval_every=0", "model.dropout=0.1",
                                             "train.log_every=10", "log.progress=lines"};
  auto r = train(configs + "quickstart.yaml", tmp.path() + "/plain", 2, shortRun);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* mode : {"full", "selective"}) {
    std::vector<std::string> args = shortRun;
    args.push_back(std::string("model.recompute=") + mode);
    const std::string dir = tmp.path() + "/" + mode;
    r = train(configs + "llm/gpt_recompute.yaml", dir, 2, args);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    auto plain = readLosses(tmp.path() + "/plain"), again = readLosses(dir);
    ASSERT_EQ(again.size(), 30u);
    for (const auto& [step, rec] : plain) EXPECT_EQ(again.at(step).loss_text, rec.loss_text) << mode << " step " << step;
  }
}

// The first step reports each rank's memory: parameters, gradients, optimizer
// states in the ratios AdamW and the precision imply, and activations that
// full recomputation cuts down to the blocks' inputs.
TEST(Training, FirstStepReportsMemoryByKind) {
  TempDir tmp;
  const std::string recipe = tmp.write("tiny.yaml", kTinyRecipe);
  std::map<std::string, nlohmann::json> first;
  for (const std::string name : {"fp32", "bf16", "recompute"}) {
    std::vector<std::string> extra = {"train.steps=2"};
    if (name == "bf16") extra.push_back("precision.name=bf16");
    if (name == "recompute") extra.push_back("model.recompute=full");
    auto r = train(recipe, tmp.path() + "/" + name, 1, extra);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    first[name] = nlohmann::json::parse(ptrain::test::readTrainingSteps(tmp.path() + "/" + name).at(1));
    ASSERT_TRUE(first[name].contains("mem_activations")) << first[name].dump();
  }
  const double params = first["fp32"]["mem_params"].get<double>();
  EXPECT_GT(params, 0);
  // fp32: gradients as large as the parameters, AdamW's two moments twice that.
  EXPECT_EQ(first["fp32"]["mem_grads"].get<double>(), params);
  EXPECT_EQ(first["fp32"]["mem_optimizer"].get<double>(), 2 * params);
  // bf16: 2-byte parameters, float32 gradients, moments and master weights.
  EXPECT_EQ(first["bf16"]["mem_params"].get<double>(), params / 2);
  EXPECT_EQ(first["bf16"]["mem_grads"].get<double>(), params);
  EXPECT_EQ(first["bf16"]["mem_optimizer"].get<double>(), 3 * params);
  EXPECT_LT(first["recompute"]["mem_activations"].get<double>(), 0.5 * first["fp32"]["mem_activations"].get<double>());
  EXPECT_GT(first["recompute"]["mem_activations"].get<double>(), 0);
}

TEST(Training, ResumeRefusesMissingFolderWithOneLine) {
  TempDir tmp;
  const std::string recipe = tmp.write("tiny.yaml", kTinyRecipe);
  auto r = train(recipe, tmp.path() + "/nope", 1, {"--resume", "--allow-changes"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output, "ptrain: " + tmp.path() + "/nope: run folder not found: nothing to resume\n");
  EXPECT_FALSE(fs::exists(tmp.path() + "/nope"));
}

TEST(Training, ResumeRefusesCheckpointOfAnotherModelAndKeepsIt) {
  TempDir tmp;
  const std::string recipe = tmp.write("tiny.yaml", kTinyRecipe);
  const std::string dir = tmp.path() + "/run";
  auto r = train(recipe, dir, 1, {"train.steps=2", "checkpoint.every=1"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string before = ptrain::test::readFile(dir + "/checkpoints/step_2/model.rank00000.safetensors");
  r = train(recipe, dir, 1, {"train.steps=4", "model.hidden_size=64", "--resume", "--allow-changes"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("the checkpoint is from another model"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("terminate called"), std::string::npos) << r.output;
  EXPECT_EQ(ptrain::test::readFile(dir + "/checkpoints/step_2/model.rank00000.safetensors"), before);
  EXPECT_TRUE(fs::exists(dir + "/checkpoints/step_1/meta.json"));
}

TEST(Training, RefusesToOverwriteAnExistingRun) {
  TempDir tmp;
  const std::string recipe = tmp.write("tiny.yaml", kTinyRecipe);
  const std::string dir = tmp.path() + "/run";
  ASSERT_EQ(train(recipe, dir, 1, {"train.steps=1"}).exit_code, 0);
  auto r = train(recipe, dir, 1, {"train.steps=1"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output, "ptrain: " + dir +
                          " already holds checkpoints: add --resume to continue that run, or choose another --run-dir\n");
}

TEST(Training, UnknownTrainerIsOneLine) {
  TempDir tmp;
  const std::string recipe = tmp.write("tiny.yaml", kTinyRecipe);
  auto r = runPtrain({"run", recipe, "trainer.name=lmm", "--run-dir", tmp.path() + "/x"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("trainer.name: no trainer plugin named 'lmm' (did you mean 'llm'?)"), std::string::npos)
      << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  EXPECT_FALSE(fs::exists(tmp.path() + "/x"));
}

TEST(Training, DatasetSettingOutOfRangeIsOneLine) {
  TempDir tmp;
  const std::string recipe = tmp.write("tiny.yaml", kTinyRecipe);
  auto r = runPtrain({"run", recipe, "data.digits=12", "--run-dir", tmp.path() + "/x"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("data.digits"), std::string::npos) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  EXPECT_FALSE(fs::exists(tmp.path() + "/x"));
}
