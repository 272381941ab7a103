// Pipeline parallelism end to end through the ptrain binary: every schedule
// (1F1B at pp 2 and 4, interleaved with vpp 2, GPipe) and tp x pp x dp =
// 2 x 2 x 2 (with and without sequence parallelism) reproduce the single-process loss curve and evaluation; each
// stage reports the micro-batches it kept alive (at most pp - stage for 1F1B,
// m for GPipe), its busy and idle time and the bubble formula; a checkpoint
// saved at pp=2 resumes at pp=1, pp=4 and tp2 x pp2 on the same curve.
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "support/test_support.h"

namespace fs = std::filesystem;
using ptrain::test::runPtrain;
using ptrain::test::relDiff;
using ptrain::test::TempDir;

namespace {

// Tiny: 4 layers, hidden 32, 4 heads, seq 8, 1-digit addition, 4 micro-batches
// of 2 per data-parallel rank at dp=1. Evaluation at steps 10 and 20.
constexpr int kSteps = 20;
const char* kRecipe = R"(
name: tiny-pp
trainer: {name: llm}
model: {num_layers: 4, hidden_size: 32, num_attention_heads: 4, seq_length: 8}
data: {name: arithmetic, digits: 1, operations: [add], eval_size: 16}
train: {steps: 20, global_batch_size: 8, micro_batch_size: 2, seed: 11, eval_every: 10, log_every: 10}
optimizer: {name: adamw, lr: 0.003, lr_schedule: cosine, warmup_steps: 3, clip_grad: 1.0}
parallel: {grad_bucket_size_mb: 0.01}
checkpoint: {every: 0, keep: 3}
log: {progress: lines}
)";

struct Layout {
  int tp = 1, pp = 1, dp = 1, vpp = 1;
  std::string schedule = "1f1b";
  std::string blocks;  // parallel.pipeline_layout, e.g. "[2,0,2]"; empty: the default split
  std::string name() const {
    std::string n = "tp" + std::to_string(tp) + "_pp" + std::to_string(pp) + "_dp" + std::to_string(dp) + "_" +
                    schedule + (vpp > 1 ? "_vpp" + std::to_string(vpp) : "");
    for (char c : blocks)
      if (std::isdigit(static_cast<unsigned char>(c))) n += std::string("_") + c;
    return n;
  }
  int microBatches() const { return 8 / (2 * dp); }
};

ptrain::test::ProcessResult train(const std::string& recipe, const std::string& runDir, const Layout& l,
                                  std::vector<std::string> extra = {}) {
  const std::string nproc = std::to_string(l.tp * l.pp * l.dp);
  std::vector<std::string> args{"run", recipe, "--nproc", nproc, "--run-dir", runDir, "launch.nproc=" + nproc,
                                "parallel.tensor_model_parallel_size=" + std::to_string(l.tp),
                                "parallel.pipeline_model_parallel_size=" + std::to_string(l.pp),
                                "parallel.virtual_pipeline_model_parallel_size=" + std::to_string(l.vpp),
                                "parallel.pipeline_schedule=" + l.schedule};
  if (!l.blocks.empty()) args.push_back("parallel.pipeline_layout=" + l.blocks);
  args.insert(args.end(), extra.begin(), extra.end());
  return runPtrain(args, {}, 300);
}

// Training lines by step, and evaluation lines by step.
std::map<int, nlohmann::json> steps(const std::string& runDir) {
  std::map<int, nlohmann::json> out;
  for (const auto& [step, text] : ptrain::test::readTrainingSteps(runDir)) out[step] = nlohmann::json::parse(text);
  return out;
}

std::map<int, nlohmann::json> evals(const std::string& runDir) {
  std::map<int, nlohmann::json> out;
  std::ifstream in(runDir + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("eval_loss")) out[j["step"].get<int>()] = j;
  }
  return out;
}

void expectSameCurve(const std::map<int, nlohmann::json>& got, const std::map<int, nlohmann::json>& ref,
                     const std::string& what) {
  ASSERT_EQ(got.size(), static_cast<size_t>(kSteps)) << what;
  EXPECT_LT(relDiff(got.at(1)["loss"], ref.at(1)["loss"]), 1e-5) << what << " step 1";
  for (int step = 1; step <= kSteps; ++step) {
    EXPECT_LT(relDiff(got.at(step)["loss"], ref.at(step)["loss"]), 1e-4) << what << " step " << step;
  }
}

void runGrid(const std::vector<Layout>& layouts, const std::vector<std::string>& extra = {}) {
  TempDir tmp;
  const std::string recipe = tmp.write("tiny.yaml", kRecipe);
  auto r = train(recipe, tmp.path() + "/ref", Layout{}, extra);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto ref = steps(tmp.path() + "/ref");
  auto refEval = evals(tmp.path() + "/ref");
  ASSERT_EQ(ref.size(), static_cast<size_t>(kSteps)) << r.output;
  ASSERT_EQ(refEval.size(), 2u) << r.output;
  EXPECT_LT(ref.at(kSteps)["loss"].get<double>(), ref.at(1)["loss"].get<double>() * 0.8) << "the reference learns";
  EXPECT_FALSE(ref.at(1).contains("pp_bubble")) << "no pipeline plugin at pp=1";

  for (const Layout& l : layouts) {
    const std::string dir = tmp.path() + "/" + l.name();
    r = train(recipe, dir, l, extra);
    ASSERT_EQ(r.exit_code, 0) << l.name() << "\n" << r.output;
    auto got = steps(dir);
    expectSameCurve(got, ref, l.name());
    // Evaluation runs through the pipeline: the same loss and accuracy.
    auto gotEval = evals(dir);
    ASSERT_EQ(gotEval.size(), 2u) << l.name();
    for (const auto& [step, line] : refEval) {
      EXPECT_LT(relDiff(gotEval.at(step)["eval_loss"], line["eval_loss"]), 1e-4) << l.name() << " eval " << step;
      EXPECT_EQ(gotEval.at(step)["eval_exact_match"], line["eval_exact_match"]) << l.name() << " eval " << step;
    }

    // Per-stage figures, every step.
    const int m = l.microBatches();
    const double formula = (l.pp - 1.0) / (l.vpp * m);
    for (const auto& [step, line] : got) {
      ASSERT_TRUE(line.contains("pp_bubble")) << l.name() << " step " << step;
      EXPECT_DOUBLE_EQ(line["pp_bubble_formula"].get<double>(), formula) << l.name();
      for (int s = 0; s < l.pp; ++s) {
        const std::string stage = "pp_stage" + std::to_string(s) + "_";
        const int inflight = line[stage + "inflight_max"].get<int>();
        if (l.schedule == "gpipe") {
          EXPECT_EQ(inflight, m) << l.name() << " stage " << s;
        } else if (l.schedule == "1f1b") {
          EXPECT_EQ(inflight, std::min(l.pp - s, m)) << l.name() << " stage " << s;
          EXPECT_LE(inflight, l.pp) << l.name() << " stage " << s;
        }
        EXPECT_GT(line[stage + "busy_s"].get<double>(), 0) << l.name();
        EXPECT_GE(line[stage + "idle_s"].get<double>(), 0) << l.name();
        EXPECT_GT(line[stage + "peak_rss_mb"].get<double>(), 0) << l.name();
      }
    }
  }
}

}  // namespace

PTRAIN_LONG_TEST(PipelineParallel, SchedulesMatchOneRank) {
  runGrid({{1, 2, 1, 1, "1f1b"}, {1, 4, 1, 1, "1f1b"}, {1, 2, 1, 2, "interleaved"}, {1, 2, 1, 1, "gpipe"}});
}

// An untied LM head lives on the last stage only; a tied one is a copy whose
// gradient is summed with the embedding's (the test above).
TEST(PipelineParallel, UntiedHeadMatchesOneRank) { runGrid({{1, 2, 1, 1, "1f1b"}}, {"model.tie_embeddings=false"}); }

PTRAIN_LONG_TEST(PipelineParallel, TensorPipelineAndDataParallelTogetherMatchOneRank) {
  runGrid({{2, 2, 2, 1, "1f1b"}, {1, 2, 2, 2, "interleaved"}, {2, 2, 1, 2, "interleaved"}});
}

// Explicit layouts: uneven stages, and a middle stage with no block at all
// (it only passes activations and gradients on).
PTRAIN_LONG_TEST(PipelineParallel, UnevenAndEmptyStagesMatchOneRank) {
  runGrid({{1, 3, 1, 1, "1f1b", "[1,2,1]"}, {1, 3, 1, 1, "1f1b", "[2,0,2]"}});
}

// Sequence parallelism inside each stage: activations cross stages as
// sequence shards.
PTRAIN_LONG_TEST(PipelineParallel, SequenceParallelStagesMatchOneRank) {
  runGrid({{2, 2, 2, 1, "1f1b"}}, {"parallel.sequence_parallel=true"});
}

// A run saved at pp=2 resumes at pp=1, pp=4 and tp2 x pp2 and continues the
// uninterrupted pp=2 curve: checkpoints hold the whole model.
PTRAIN_LONG_TEST(PipelineParallel, CheckpointResumesAtAnotherPipelineSize) {
  TempDir tmp;
  const std::string recipe = tmp.write("tiny.yaml", kRecipe);
  const std::string full = tmp.path() + "/pp2";
  auto r = train(recipe, full, Layout{1, 2}, {"checkpoint.every=10"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto reference = steps(full);
  ASSERT_EQ(reference.size(), static_cast<size_t>(kSteps));
  ASSERT_TRUE(fs::exists(full + "/checkpoints/step_10/index.json"));
  // The saved model is whole: every block, the embedding and the head.
  std::ifstream meta(full + "/checkpoints/step_10/meta.json");
  auto shapes = nlohmann::json::parse(meta)["parameters"];
  EXPECT_TRUE(shapes.contains("embed.tokens.weight"));
  EXPECT_TRUE(shapes.contains("blocks.0.attn.qkv.weight"));
  EXPECT_TRUE(shapes.contains("blocks.3.mlp.fc2.weight"));
  EXPECT_TRUE(shapes.contains("head.ln_f.weight"));

  for (const Layout& l : {Layout{1, 1}, Layout{1, 4}, Layout{2, 2}}) {
    const std::string dir = tmp.path() + "/resume_" + l.name();
    fs::create_directories(dir + "/checkpoints");
    fs::copy(full + "/checkpoints/step_10", dir + "/checkpoints/step_10", fs::copy_options::recursive);
    r = train(recipe, dir, l, {"checkpoint.every=10", "--resume", "--allow-changes"});
    ASSERT_EQ(r.exit_code, 0) << l.name() << "\n" << r.output;
    auto after = steps(dir);
    ASSERT_EQ(after.size(), 10u) << l.name() << "\n" << r.output;
    for (int step = 11; step <= kSteps; ++step) {
      EXPECT_LT(relDiff(after.at(step)["loss"], reference.at(step)["loss"]), 1e-5) << l.name() << " step " << step;
    }
  }
}

TEST(PipelineParallel, LayoutThatDoesNotSplitIsOneLine) {
  TempDir tmp;
  const std::string recipe = tmp.write("tiny.yaml", kRecipe);
  // 4 layers do not split into 3 stages.
  auto r = runPtrain({"run", recipe, "--nproc", "3", "launch.nproc=3", "--run-dir", tmp.path() + "/bad",
                      "parallel.pipeline_model_parallel_size=3"},
                     {}, 60);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("pipeline_model_parallel_size=3 does not divide num_layers=4: use 1, 2 or 4, or give "
                          "parallel.pipeline_layout"),
            std::string::npos)
      << r.output;
  // Interleaving runs micro-batches in groups of pp: 3 of them do not split over 2 stages.
  r = runPtrain({"check", recipe, "--nproc", "2", "parallel.pipeline_model_parallel_size=2",
                 "parallel.virtual_pipeline_model_parallel_size=2", "parallel.pipeline_schedule=interleaved",
                 "train.global_batch_size=6"},
                {}, 60);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("the interleaved schedule needs the micro-batches per step (3 = global_batch_size / "
                          "(micro_batch_size*dp)) to be a multiple of pipeline_model_parallel_size=2"),
            std::string::npos)
      << r.output;
}
