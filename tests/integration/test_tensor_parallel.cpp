// Tensor parallelism end to end through the ptrain binary: tp x dp layouts,
// with and without sequence parallelism, reproduce the single-process loss
// curve; the communicated bytes match the analytic count; a checkpoint saved
// at tp=2 resumes at tp=1 and tp=4 on the same curve; bad layouts are refused
// in one line.
//
// Layouts run (every tp in {1,2,4}, every dp in {1,2}, SP on and off):
//   tp1 dp1 (reference), tp2 dp1, tp4 dp1, tp2 dp2, tp4 dp2 (SP on and off
//   each); tp1 dp2 is Training.DataParallelMatchesSingleProcess.
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

// Tiny: 2 layers, hidden 32, 4 heads, seq 8, 1-digit addition, 4 micro-batches
// of 2 on one data-parallel rank. The vocabulary (16) is padded to 128.
constexpr int kLayers = 2, kHidden = 32, kSeq = 8, kGlobalBatch = 8, kMicro = 2, kSteps = 20;
const char* kRecipe = R"(
name: tiny-tp
trainer: {name: llm}
model: {num_layers: 2, hidden_size: 32, num_attention_heads: 4, seq_length: 8}
data: {name: arithmetic, digits: 1, operations: [add], eval_size: 8}
train: {steps: 20, global_batch_size: 8, micro_batch_size: 2, seed: 11, eval_every: 0, log_every: 10}
optimizer: {name: adamw, lr: 0.003, lr_schedule: cosine, warmup_steps: 3, clip_grad: 1.0}
parallel: {grad_bucket_size_mb: 0.01}
checkpoint: {every: 0, keep: 3}
log: {progress: lines}
)";

struct StepLine {
  double loss = 0;
  double tp_comm_bytes = -1;  // -1: not reported
};

std::map<int, StepLine> readSteps(const std::string& runDir) {
  std::map<int, StepLine> out;
  for (const auto& [step, text] : ptrain::test::readTrainingSteps(runDir)) {
    auto j = nlohmann::json::parse(text);
    StepLine line;
    line.loss = j["loss"].get<double>();
    if (j.contains("tp_comm_bytes")) line.tp_comm_bytes = j["tp_comm_bytes"].get<double>();
    out[step] = line;
  }
  return out;
}

struct Layout {
  int tp = 1, dp = 1;
  bool sp = false;
  std::string name() const {
    return "tp" + std::to_string(tp) + "_dp" + std::to_string(dp) + (sp ? "_sp" : "");
  }
};

ptrain::test::ProcessResult train(const std::string& recipe, const std::string& runDir, const Layout& l,
                                  std::vector<std::string> extra = {}) {
  const std::string nproc = std::to_string(l.tp * l.dp);
  // launch.nproc as well as --nproc: `ptrain run` checks the layout against
  // launch.nproc before it reads --nproc.
  std::vector<std::string> args{"run", recipe, "--nproc", nproc, "--run-dir", runDir, "launch.nproc=" + nproc,
                                "parallel.tensor_model_parallel_size=" + std::to_string(l.tp),
                                std::string("parallel.sequence_parallel=") + (l.sp ? "true" : "false")};
  args.insert(args.end(), extra.begin(), extra.end());
  return runPtrain(args, {}, 300);
}

// Bytes the tensor plugin moves per step (fp32), counting an all-reduce by
// its tensor, an all-gather by its output and a reduce-scatter by its input
// (docs/tensor_parallel.md). Per micro-batch of b rows, with a = b*s*h:
//   without SP: (4L + 2) a + 3 b s  (2 + 2 all-reduces per layer; the
//               embedding's forward and the LM head input's backward
//               all-reduce; max, target logit and sum-exp of the loss)
//   with SP:    (8L + 4) a + 3 b s  (per layer 4 all-gathers + 4 reduce-
//               scatters; embedding all-reduce and scatter's backward
//               all-gather; gather before the LM head and its backward)
//               plus, once per step, the partial gradients: 2 LayerNorms
//               per layer and the final one (2h each) and 2 row-parallel
//               biases per layer (h each) = (6L + 2) h.
double expectedTpBytes(const Layout& l) {
  const double microBatches = static_cast<double>(kGlobalBatch) / (kMicro * l.dp);
  const double a = static_cast<double>(kMicro) * kSeq * kHidden;
  const double perMicro = (l.sp ? 8.0 * kLayers + 4 : 4.0 * kLayers + 2) * a + 3.0 * kMicro * kSeq;
  const double once = l.sp ? (6.0 * kLayers + 2) * kHidden : 0.0;
  return 4.0 * (microBatches * perMicro + once);
}

void expectSameCurve(const std::map<int, StepLine>& got, const std::map<int, StepLine>& ref,
                     const std::string& what) {
  ASSERT_EQ(got.size(), static_cast<size_t>(kSteps)) << what;
  EXPECT_LT(relDiff(got.at(1).loss, ref.at(1).loss), 1e-5) << what << " step 1";
  for (int step = 1; step <= kSteps; ++step) {
    EXPECT_LT(relDiff(got.at(step).loss, ref.at(step).loss), 1e-4) << what << " step " << step;
  }
}

void runGrid(const std::vector<Layout>& layouts) {
  TempDir tmp;
  const std::string recipe = tmp.write("tiny.yaml", kRecipe);
  auto r = train(recipe, tmp.path() + "/ref", Layout{});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto ref = readSteps(tmp.path() + "/ref");
  ASSERT_EQ(ref.size(), static_cast<size_t>(kSteps)) << r.output;
  EXPECT_LT(ref.at(kSteps).loss, ref.at(1).loss * 0.8) << "the reference run learns";
  EXPECT_EQ(ref.at(1).tp_comm_bytes, -1) << "no tensor plugin at tp=1";

  for (const Layout& l : layouts) {
    const std::string dir = tmp.path() + "/" + l.name();
    r = train(recipe, dir, l);
    ASSERT_EQ(r.exit_code, 0) << l.name() << "\n" << r.output;
    auto got = readSteps(dir);
    expectSameCurve(got, ref, l.name());
    for (const auto& [step, line] : got) {
      EXPECT_EQ(line.tp_comm_bytes, expectedTpBytes(l)) << l.name() << " step " << step;
    }
  }
}

}  // namespace

PTRAIN_LONG_TEST(TensorParallel, LayoutsWithoutSequenceParallelMatchOneRank) {
  runGrid({{2, 1, false}, {4, 1, false}, {2, 2, false}, {4, 2, false}});
}

PTRAIN_LONG_TEST(TensorParallel, LayoutsWithSequenceParallelMatchOneRank) {
  runGrid({{2, 1, true}, {4, 1, true}, {2, 2, true}, {4, 2, true}});
}

// A run saved at tp=2 resumes at tp=1 and at tp=4 (and with sequence
// parallelism switched on) and continues the uninterrupted tp=2 curve.
PTRAIN_LONG_TEST(TensorParallel, CheckpointReshardsAcrossTensorParallelSizes) {
  TempDir tmp;
  const std::string recipe = tmp.write("tiny.yaml", kRecipe);
  const std::string full = tmp.path() + "/tp2";
  auto r = train(recipe, full, Layout{2, 1, false}, {"checkpoint.every=10"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto reference = readSteps(full);
  ASSERT_EQ(reference.size(), static_cast<size_t>(kSteps));
  ASSERT_TRUE(fs::exists(full + "/checkpoints/step_10/index.json"));

  for (const Layout& l : {Layout{1, 1, false}, Layout{4, 1, false}, Layout{4, 1, true}}) {
    const std::string dir = tmp.path() + "/resume_" + l.name();
    fs::create_directories(dir + "/checkpoints");
    fs::copy(full + "/checkpoints/step_10", dir + "/checkpoints/step_10", fs::copy_options::recursive);
    r = train(recipe, dir, l, {"checkpoint.every=10", "--resume", "--allow-changes"});
    ASSERT_EQ(r.exit_code, 0) << l.name() << "\n" << r.output;
    auto after = readSteps(dir);
    ASSERT_EQ(after.size(), 10u) << l.name() << "\n" << r.output;
    for (int step = 11; step <= kSteps; ++step) {
      EXPECT_LT(relDiff(after.at(step).loss, reference.at(step).loss), 1e-5) << l.name() << " step " << step;
    }
  }
}

TEST(TensorParallel, LayoutThatDoesNotSplitTheModelIsOneLine) {
  TempDir tmp;
  const std::string recipe = tmp.write("tiny.yaml", kRecipe);
  // 4 heads do not split over 3 ranks.
  auto r = runPtrain({"check", recipe, "--nproc", "3", "parallel.tensor_model_parallel_size=3"}, {}, 60);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("tensor_model_parallel_size=3 does not divide num_attention_heads=4: use 1, 2 or 4"),
            std::string::npos)
      << r.output;
  // Sequence parallelism needs the sequence to split: 8 positions over 4 ranks
  // do, 9 do not.
  r = runPtrain({"check", recipe, "--nproc", "4", "parallel.tensor_model_parallel_size=4",
                 "parallel.sequence_parallel=true", "model.seq_length=9"},
                {}, 60);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("sequence_parallel needs seq_length=9 divisible by tensor_model_parallel_size=4"),
            std::string::npos)
      << r.output;
}
