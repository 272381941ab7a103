// checkLayout / layoutWarnings / planLayout: one test per rule, each message
// written out by hand with both numbers and the values that would fit. Most
// go through a recipe (engine/recipe_layout.h); the last ones build a
// LayoutRequest by hand, as a caller without a recipe would.
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "ptrain/engine/parallel_plugins.h"
#include "ptrain/engine/recipe_layout.h"
#include "ptrain/plugin/registry.h"
#include "ptrain/recipe/recipe.h"
#include "ptrain/recipe/key_specs.h"
#include "ptrain/recipe/schema.h"
#include "support/test_support.h"

namespace ptrain {
namespace {

// num_layers 8, hidden 128, 4 heads (ffn 4*128 = 512), seq 16, global batch 48.
const char* kBase =
    "trainer: {name: llm}\n"
    "model: {num_layers: 8, hidden_size: 128, num_attention_heads: 4, seq_length: 16}\n"
    "train: {steps: 1, global_batch_size: 48}\n";

Recipe recipe(const std::vector<std::string>& overrides, const std::string& extra = "") {
  Recipe r = Recipe::fromString(std::string(kBase) + extra, "r.yaml", overrides);
  Schema s;
  describeCoreKeys(s);
  // The shape keys a GPT-shaped trainer declares (the llm trainer's).
  keys::addTransformerShape(s);
  keys::addMoe(s);
  r.validate(s);
  return r;
}

std::vector<std::string> check(const std::vector<std::string>& overrides, int world, const std::string& extra = "") {
  return checkLayout(recipe(overrides, extra), world);
}

using Lines = std::vector<std::string>;

TEST(LayoutValidation, FittingLayoutsPass) {
  EXPECT_EQ(check({}, 1), Lines{});
  EXPECT_EQ(check({}, 48), Lines{});
  EXPECT_EQ(check({"parallel.tensor_model_parallel_size=2", "parallel.pipeline_model_parallel_size=2"}, 8), Lines{});
  EXPECT_EQ(check({"parallel.context_parallel_size=2", "parallel.tensor_model_parallel_size=4",
                   "parallel.sequence_parallel=true"},
                  8),
            Lines{});
  EXPECT_EQ(check({"model.num_experts=8", "parallel.expert_model_parallel_size=4",
                   "parallel.expert_tensor_parallel_size=2", "parallel.tensor_model_parallel_size=2",
                   "parallel.pipeline_model_parallel_size=2"},
                  16),
            Lines{});
  // An uneven split is fine when pipeline_layout says so.
  EXPECT_EQ(check({"parallel.pipeline_model_parallel_size=3", "parallel.pipeline_layout=[2,3,3]"}, 3), Lines{});
  EXPECT_EQ(check({"parallel.pipeline_model_parallel_size=2", "parallel.virtual_pipeline_model_parallel_size=2",
                   "parallel.pipeline_schedule=interleaved", "train.micro_batch_size=8"},
                  2),
            Lines{});
}

TEST(LayoutValidation, WorldNotDivisibleByTensorPipelineContext) {
  const std::string extra =
      "parallel:\n"
      "  tensor_model_parallel_size: 4\n";
  EXPECT_EQ(check({}, 6, extra),
            Lines{"r.yaml:5:3: world size 6 is not divisible by "
                  "tensor_model_parallel_size*pipeline_model_parallel_size*context_parallel_size=4: use --nproc 4 or "
                  "8, or sizes whose product divides 6 (1, 2, 3 or 6)"});
  EXPECT_EQ(check({}, 3, extra),
            Lines{"r.yaml:5:3: world size 3 is not divisible by "
                  "tensor_model_parallel_size*pipeline_model_parallel_size*context_parallel_size=4: use --nproc 4, "
                  "or sizes whose product divides 3 (1 or 3)"});
  // The product counts all three sizes; the key blamed is the one written.
  EXPECT_EQ(check({"parallel.pipeline_model_parallel_size=2", "parallel.context_parallel_size=2"}, 6),
            Lines{"<command line>: world size 6 is not divisible by "
                  "tensor_model_parallel_size*pipeline_model_parallel_size*context_parallel_size=4: use --nproc 4 or "
                  "8, or sizes whose product divides 6 (1, 2, 3 or 6)"});
}

TEST(LayoutValidation, PipelineMustDivideLayers) {
  const std::string extra =
      "parallel:\n"
      "  pipeline_model_parallel_size: 3\n";
  EXPECT_EQ(check({}, 3, extra),
            Lines{"r.yaml:5:3: pipeline_model_parallel_size=3 does not divide num_layers=8: use 1, 2, 4 or 8, or "
                  "give parallel.pipeline_layout"});
}

TEST(LayoutValidation, VirtualPipelineMultipliesTheStages) {
  EXPECT_EQ(check({"parallel.pipeline_model_parallel_size=2", "parallel.virtual_pipeline_model_parallel_size=3",
                   "parallel.pipeline_schedule=interleaved", "train.micro_batch_size=8"},
                  2),
            Lines{"<command line>: pipeline_model_parallel_size*virtual_pipeline_model_parallel_size=6 does not "
                  "divide num_layers=8: use sizes whose product is 1, 2, 4 or 8, or give parallel.pipeline_layout"});
}

TEST(LayoutValidation, PipelineLayoutEntriesAndSum) {
  EXPECT_EQ(check({"parallel.pipeline_model_parallel_size=2", "parallel.pipeline_layout=[3,4]"}, 2),
            Lines{"<command line>: pipeline_layout sums to 7 but num_layers=8: make the entries add up to 8"});
  EXPECT_EQ(check({"parallel.pipeline_model_parallel_size=2", "parallel.pipeline_layout=[8]"}, 2),
            Lines{"<command line>: pipeline_layout has 1 entry but pipeline_model_parallel_size=2: give 2 entries, "
                  "one per stage"});
  EXPECT_EQ(check({"parallel.pipeline_model_parallel_size=2", "parallel.virtual_pipeline_model_parallel_size=2",
                   "parallel.pipeline_schedule=interleaved", "parallel.pipeline_layout=[2,2,4]", "train.micro_batch_size=8"},
                  2),
            Lines{"<command line>: pipeline_layout has 3 entries but "
                  "pipeline_model_parallel_size*virtual_pipeline_model_parallel_size=4: give 4 entries, one per "
                  "stage"});
  // Located at the key in the file.
  EXPECT_EQ(check({}, 1, "parallel: {pipeline_layout: [4, 4]}\n"),
            Lines{"r.yaml:4:12: pipeline_layout has 2 entries but pipeline_model_parallel_size=1: give 1 entry, one "
                  "per stage"});
}

TEST(LayoutValidation, ScheduleMustMatchVirtualPipeline) {
  EXPECT_EQ(check({"parallel.pipeline_model_parallel_size=2", "parallel.virtual_pipeline_model_parallel_size=2"}, 2),
            Lines{"<command line>: virtual_pipeline_model_parallel_size=2 needs pipeline_schedule=interleaved, not "
                  "1f1b: set pipeline_schedule to interleaved, or virtual_pipeline_model_parallel_size to 1"});
  EXPECT_EQ(check({"parallel.pipeline_model_parallel_size=2", "parallel.pipeline_schedule=interleaved"}, 2),
            Lines{"<command line>: pipeline_schedule=interleaved needs virtual_pipeline_model_parallel_size > 1: "
                  "set it to 2 or more, or use pipeline_schedule 1f1b"});
  EXPECT_EQ(check({"parallel.virtual_pipeline_model_parallel_size=2", "parallel.pipeline_schedule=interleaved"}, 1),
            Lines{"<command line>: virtual_pipeline_model_parallel_size=2 needs pipeline_model_parallel_size > 1: "
                  "set pipeline_model_parallel_size to 2 or more, or virtual_pipeline_model_parallel_size to 1"});
}

TEST(LayoutValidation, InterleavedNeedsMicroBatchesInGroupsOfPipelineSize) {
  const std::vector<std::string> interleaved{"parallel.pipeline_model_parallel_size=2",
                                             "parallel.virtual_pipeline_model_parallel_size=2",
                                             "parallel.pipeline_schedule=interleaved"};
  auto with = [&](const std::string& extra) {
    auto o = interleaved;
    o.push_back(extra);
    return o;
  };
  // 48 / 8 = 6 micro-batches: a multiple of 2.
  EXPECT_EQ(check(with("train.micro_batch_size=8"), 2), Lines{});
  // 48 / 16 = 3 micro-batches.
  EXPECT_EQ(check(with("train.micro_batch_size=16"), 2),
            Lines{"<command line>: the interleaved schedule needs the micro-batches per step (3 = global_batch_size / "
                  "(micro_batch_size*dp)) to be a multiple of pipeline_model_parallel_size=2: use global_batch_size "
                  "32 or 64, or pipeline_schedule 1f1b"});
  // 1F1B has no such rule.
  EXPECT_EQ(check({"parallel.pipeline_model_parallel_size=2", "train.micro_batch_size=16"}, 2), Lines{});
}

TEST(LayoutValidation, TensorParallelMustDivideHeadsAndFfn) {
  // One line per failure: 4 heads and 4*128 = 512 both fail tp=3.
  EXPECT_EQ(check({"parallel.tensor_model_parallel_size=3"}, 3),
            (Lines{"<command line>: tensor_model_parallel_size=3 does not divide num_attention_heads=4: use 1, 2 or 4",
                   "<command line>: tensor_model_parallel_size=3 does not divide ffn_hidden_size=512 (4*hidden_size): "
                   "use 1, 2, 4, 8, 16, 32, 64, 128, 256 or 512"}));
  EXPECT_EQ(check({"parallel.tensor_model_parallel_size=2", "model.ffn_hidden_size=301"}, 2),
            Lines{"<command line>: tensor_model_parallel_size=2 does not divide ffn_hidden_size=301: use 1, 7, 43 or "
                  "301"});
}

TEST(LayoutValidation, HeadsMustDivideHidden) {
  EXPECT_EQ(check({"model.num_attention_heads=6"}, 1),
            Lines{"<command line>: num_attention_heads=6 does not divide hidden_size=128: use 1, 2, 4, 8, 16, 32, 64 "
                  "or 128"});
}

TEST(LayoutValidation, ExpertsSplitAcrossExpertParallel) {
  EXPECT_EQ(check({"model.num_experts=6", "parallel.expert_model_parallel_size=4"}, 4),
            Lines{"<command line>: expert_model_parallel_size=4 does not divide num_experts=6: use 1, 2, 3 or 6"});
  EXPECT_EQ(check({"parallel.expert_model_parallel_size=2"}, 2),
            Lines{"<command line>: expert_model_parallel_size=2 needs a MoE model, but num_experts=0: set "
                  "model.num_experts to a multiple of 2, or expert_model_parallel_size to 1"});
  EXPECT_EQ(check({"model.num_experts=2", "model.moe_router_topk=4"}, 1),
            Lines{"<command line>: moe_router_topk=4 exceeds num_experts=2: use at most 2"});
}

TEST(LayoutValidation, ExpertGridMustDivideTheWorld) {
  const std::string extra =
      "parallel:\n"
      "  expert_model_parallel_size: 4\n"
      "  expert_tensor_parallel_size: 2\n";
  // tp*pp*cp = 1 fits 4 ranks, the expert grid 2*4*1 = 8 does not.
  EXPECT_EQ(check({"model.num_experts=8"}, 4, extra),
            Lines{"r.yaml:6:3: world size 4 is not divisible by "
                  "expert_tensor_parallel_size*expert_model_parallel_size*pipeline_model_parallel_size=8: use --nproc "
                  "8, or sizes whose product divides 4 (1, 2 or 4)"});
}

TEST(LayoutValidation, GlobalBatchSplitsIntoMicroBatchesAndDataParallel) {
  // dp = 2: 48 is not a multiple of 5*2.
  EXPECT_EQ(check({"train.micro_batch_size=5"}, 2),
            Lines{"r.yaml:3:19: global_batch_size=48 is not divisible by micro_batch_size*dp=10 (micro_batch_size=5, "
                  "dp=2): use global_batch_size 40 or 50, or micro_batch_size 1, 2, 3, 4, 6, 8, 12 or 24"});
  // Not even dp divides it: only the global batch can change.
  EXPECT_EQ(check({"train.micro_batch_size=2"}, 5),
            Lines{"r.yaml:3:19: global_batch_size=48 is not divisible by micro_batch_size*dp=10 (micro_batch_size=2, "
                  "dp=5): use global_batch_size 40 or 50"});
}

TEST(LayoutValidation, UnsetMicroBatchDefaultsToGlobalOverDp) {
  EXPECT_EQ(check({"train.global_batch_size=10"}, 4),
            Lines{"<command line>: global_batch_size=10 is not divisible by data-parallel size dp=4, so "
                  "micro_batch_size (not set) cannot default to global_batch_size/dp: use global_batch_size 8 or 12"});
  EXPECT_EQ(check({"train.global_batch_size=2"}, 4),
            Lines{"<command line>: global_batch_size=2 is not divisible by data-parallel size dp=4, so "
                  "micro_batch_size (not set) cannot default to global_batch_size/dp: use global_batch_size 4"});
  LayoutPlan plan = planLayout(recipe({"parallel.tensor_model_parallel_size=2"}), 8);
  EXPECT_EQ(plan.dp, 4);
  EXPECT_TRUE(plan.micro_batch_size_derived);
  EXPECT_EQ(plan.micro_batch_size, 12);  // 48 / 4
  EXPECT_EQ(plan.micro_batches, 1);
}

TEST(LayoutValidation, ContextAndSequenceParallelSplitTheSequence) {
  EXPECT_EQ(check({"parallel.context_parallel_size=3"}, 3),
            Lines{"<command line>: context_parallel_size=3 does not divide seq_length=16: use seq_length 15 or 18, or "
                  "context_parallel_size 1, 2, 4, 8 or 16"});
  EXPECT_EQ(check({"parallel.tensor_model_parallel_size=4", "parallel.sequence_parallel=true", "model.seq_length=10"},
                  4),
            Lines{"<command line>: sequence_parallel needs seq_length=10 divisible by tensor_model_parallel_size=4: "
                  "use seq_length 8 or 12, or set sequence_parallel to false"});
  EXPECT_EQ(check({"parallel.tensor_model_parallel_size=2", "parallel.context_parallel_size=2",
                   "parallel.sequence_parallel=true", "model.seq_length=10"},
                  4),
            Lines{"<command line>: sequence_parallel needs seq_length=10 divisible by "
                  "tensor_model_parallel_size*context_parallel_size=4: use seq_length 8 or 12, or set "
                  "sequence_parallel to false"});
}

TEST(LayoutValidation, UnsetModelKeysAreNotChecked) {
  Recipe r = Recipe::fromString("trainer: {name: det}\ntrain: {steps: 1, global_batch_size: 6}\n", "r.yaml",
                                {"parallel.pipeline_model_parallel_size=3", "parallel.tensor_model_parallel_size=2"});
  Schema s;
  describeCoreKeys(s);
  r.validate(s);
  EXPECT_EQ(checkLayout(r, 6), Lines{});
}

TEST(LayoutValidation, WorldSizeMustBePositive) {
  EXPECT_EQ(check({}, 0), Lines{"r.yaml:1:1: world size 0 is not valid: use --nproc 1 or more"});
}

TEST(LayoutValidation, Warnings) {
  EXPECT_EQ(layoutWarnings(recipe({}), 4), Lines{});
  EXPECT_EQ(layoutWarnings(recipe({"parallel.sequence_parallel=true"}), 2),
            Lines{"<command line>: sequence_parallel has no effect with tensor_model_parallel_size=1; it is ignored"});
  EXPECT_EQ(layoutWarnings(recipe({"parallel.expert_tensor_parallel_size=2"}), 2),
            Lines{"<command line>: expert_tensor_parallel_size=2 has no effect on a dense model (num_experts=0); it "
                  "is ignored"});
  // pp=4, dp=1, micro = 48: one micro-batch for four stages.
  EXPECT_EQ(layoutWarnings(recipe({"parallel.pipeline_model_parallel_size=4"}), 4),
            Lines{"r.yaml:3:19: only 1 micro-batch per step for pipeline_model_parallel_size=4, so the pipeline cannot "
                  "fill: stages sit idle 75% of each step (bubble (pp-1)/m = 3 of the compute time); make "
                  "global_batch_size / (micro_batch_size*dp) at least 4"});
  EXPECT_EQ(layoutWarnings(recipe({"parallel.pipeline_model_parallel_size=4", "train.micro_batch_size=12"}), 4),
            Lines{});
}

TEST(LayoutValidation, PlanForAMoeLayout) {
  Recipe r = recipe({"model.num_experts=8", "parallel.expert_model_parallel_size=4",
                     "parallel.expert_tensor_parallel_size=2", "parallel.tensor_model_parallel_size=2",
                     "parallel.pipeline_model_parallel_size=2", "train.micro_batch_size=3"});
  LayoutPlan plan = planLayout(r, 16);
  EXPECT_EQ(plan.sizes.world, 16);
  EXPECT_EQ(plan.sizes.tp, 2);
  EXPECT_EQ(plan.sizes.pp, 2);
  EXPECT_EQ(plan.sizes.cp, 1);
  EXPECT_EQ(plan.sizes.ep, 4);
  EXPECT_EQ(plan.sizes.etp, 2);
  EXPECT_EQ(plan.dp, 4);   // 16 / (2*2*1)
  EXPECT_EQ(plan.edp, 1);  // 16 / (2*4*2)
  EXPECT_FALSE(plan.micro_batch_size_derived);
  EXPECT_EQ(plan.micro_batch_size, 3);
  EXPECT_EQ(plan.micro_batches, 4);  // 48 / (3*4)
  // A dense model ignores the expert sizes.
  LayoutPlan dense = planLayout(recipe({"parallel.expert_tensor_parallel_size=2"}), 4);
  EXPECT_EQ(dense.sizes.etp, 1);
  EXPECT_EQ(dense.edp, 4);
}

TEST(LayoutValidation, PlanThrowsTheFirstProblem) {
  try {
    planLayout(recipe({"parallel.tensor_model_parallel_size=3"}), 3);
    FAIL() << "no ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(),
                 "<command line>: tensor_model_parallel_size=3 does not divide num_attention_heads=4: use 1, 2 or 4");
  }
}

// The layout module reads sizes, not a recipe: a request built by hand.
TEST(LayoutRequest, ChecksSizesWithoutARecipe) {
  LayoutRequest q;
  q.world = 6;
  q.tp = 4;
  q.num_layers = 8;
  q.num_attention_heads = 4;
  q.hidden_size = 128;
  q.global_batch_size = 48;
  // No `where`: messages carry no location.
  EXPECT_EQ(checkLayout(q),
            Lines{"world size 6 is not divisible by "
                  "tensor_model_parallel_size*pipeline_model_parallel_size*context_parallel_size=4: use --nproc 4 or "
                  "8, or sizes whose product divides 6 (1, 2, 3 or 6)"});
  // The key the user wrote is blamed first; the others at their section.
  q.where = [](const std::string& key) {
    return std::string(key == "parallel.tensor_model_parallel_size" ? "t.yaml:3:5" : "t.yaml:1:1");
  };
  q.written = {"parallel.tensor_model_parallel_size"};
  q.world = 8;
  q.hidden_size = 30;
  q.ffn_hidden_size = 30;
  EXPECT_EQ(checkLayout(q),
            (Lines{"t.yaml:1:1: num_attention_heads=4 does not divide hidden_size=30: use 1, 2, 3, 5, 6, 10, 15 or 30",
                   "t.yaml:3:5: tensor_model_parallel_size=4 does not divide ffn_hidden_size=30: use 1, 2, 3, 5, 6, "
                   "10, 15 or 30"}));
  // Unset model sizes are not checked.
  LayoutRequest bare;
  bare.world = 6;
  bare.tp = 2;
  bare.pp = 3;
  bare.global_batch_size = 6;
  EXPECT_EQ(checkLayout(bare), Lines{});
  LayoutPlan plan = planLayout(bare);
  EXPECT_EQ(plan.sizes.tp, 2);
  EXPECT_EQ(plan.sizes.pp, 3);
  EXPECT_EQ(plan.dp, 1);
  EXPECT_EQ(plan.micro_batch_size, 6);
  EXPECT_EQ(layoutWarnings(bare),
            Lines{"only 1 micro-batch per step for pipeline_model_parallel_size=3, so the pipeline cannot fill: "
                  "stages sit idle 67% of each step (bubble (pp-1)/m = 2 of the compute time); make "
                  "global_batch_size / (micro_batch_size*dp) at least 3"});
}

TEST(LayoutRequest, FromARecipe) {
  LayoutRequest q = layoutRequestFromRecipe(
      recipe({"parallel.tensor_model_parallel_size=2", "train.micro_batch_size=4"}, "parallel: {pipeline_layout: [8]}\n"),
      4);
  EXPECT_EQ(q.world, 4);
  EXPECT_EQ(q.tp, 2);
  EXPECT_EQ(q.pp, 1);
  EXPECT_EQ(q.pipeline_schedule, "1f1b");
  EXPECT_EQ(q.pipeline_layout, std::optional<std::vector<int64_t>>(std::vector<int64_t>{8}));
  EXPECT_EQ(q.num_layers, std::optional<int64_t>(8));
  EXPECT_EQ(q.ffn_hidden_size, std::optional<int64_t>(0));  // the default
  EXPECT_EQ(q.num_experts, std::optional<int64_t>(0));
  EXPECT_EQ(q.global_batch_size, 48);
  EXPECT_EQ(q.micro_batch_size, std::optional<int64_t>(4));
  EXPECT_EQ(q.written.count("parallel.tensor_model_parallel_size"), 1u);
  EXPECT_EQ(q.written.count("parallel.pipeline_layout"), 1u);
  EXPECT_EQ(q.written.count("parallel.pipeline_model_parallel_size"), 0u);
  // The request outlives the recipe it was read from.
  ASSERT_TRUE(q.where);
  EXPECT_EQ(q.where("parallel.tensor_model_parallel_size"), "<command line>");
  EXPECT_EQ(q.where("parallel.pipeline_layout"), "r.yaml:4:12");
  EXPECT_EQ(q.where("parallel.pipeline_model_parallel_size"), "r.yaml:4:1");  // a default: its section
  EXPECT_EQ(q.where("launch.nproc"), "r.yaml:1:1");                          // no section written: the file

  Recipe bare = Recipe::fromString("trainer: {name: det}\ntrain: {steps: 1, global_batch_size: 6}\n", "r.yaml");
  Schema s;
  describeCoreKeys(s);
  bare.validate(s);
  LayoutRequest unset = layoutRequestFromRecipe(bare, 1);
  EXPECT_FALSE(unset.num_layers.has_value());
  EXPECT_FALSE(unset.seq_length.has_value());
  EXPECT_FALSE(unset.micro_batch_size.has_value());
  EXPECT_FALSE(unset.pipeline_layout.has_value());
}

TEST(LayoutRequest, LayoutFromRecipeFollowsMegatronsExpertTensorDefault) {
  ParallelLayout dense = layoutFromRecipe(recipe({"parallel.tensor_model_parallel_size=2"}), 4);
  EXPECT_EQ(dense.tp(), 2);
  EXPECT_EQ(dense.dp(), 2);
  EXPECT_EQ(dense.etp(), 2);  // not written: the dense tensor-parallel size
  ParallelLayout moe = layoutFromRecipe(
      recipe({"model.num_experts=4", "parallel.tensor_model_parallel_size=2", "parallel.expert_tensor_parallel_size=1",
              "parallel.expert_model_parallel_size=4"}),
      4);
  EXPECT_EQ(moe.etp(), 1);
  EXPECT_EQ(moe.ep(), 4);
  EXPECT_EQ(moe.edp(), 1);
}

TEST(ParallelPlugins, NamesTheDimensionsOfEverySizeAboveOneInOrderOfApplication) {
  LayoutSizes s;
  s.world = 32;
  EXPECT_EQ(layoutDimensionsUsed(s), Lines{"dp"});
  s.vpp = 2;  // chunks of the pipeline's stages: nothing of its own
  EXPECT_EQ(layoutDimensionsUsed(s), Lines{"dp"});
  s.pp = 2;
  s.cp = 2;
  EXPECT_EQ(layoutDimensionsUsed(s), (Lines{"cp", "pp", "dp"}));
  s.tp = 2;
  s.ep = 2;
  EXPECT_EQ(layoutDimensionsUsed(s), (Lines{"tp", "cp", "ep", "pp", "dp"}));
  LayoutSizes etp;
  etp.world = 2;
  etp.etp = 2;
  EXPECT_EQ(layoutDimensionsUsed(etp), (Lines{"etp", "dp"}));
  // A model with experts has the ep plugin at any ep: it places them.
  EXPECT_EQ(layoutDimensionsUsed(LayoutSizes{}, /*experts=*/true), (Lines{"ep", "dp"}));
}

// The engine names no plugin: each dimension goes to the first installed
// plugin that declares it, so one found earlier on the search path (a
// third party's) replaces a built-in one, and a plugin executing two
// dimensions (expert: ep, etp) is applied once.
TEST(ParallelPlugins, PicksThePluginThatDeclaresEachDimension) {
  PluginRegistry installed(PluginRegistry::defaultSearchPath());
  LayoutSizes s;
  s.world = 16;
  s.tp = 2;
  s.pp = 2;
  s.ep = 2;
  s.etp = 2;
  ParallelPluginPick pick = pickParallelPlugins(s, /*experts=*/true, installed);
  EXPECT_EQ(pick.plugins, (Lines{"tensor", "expert", "pipeline", "data"}));
  EXPECT_EQ(pick.missing, Lines{});
  s.cp = 2;
  EXPECT_EQ(pickParallelPlugins(s, true, installed).missing, Lines{"cp"});

  // parallel/echo (a fixture) declares cp; found first, it executes it.
  std::vector<std::string> paths = PluginRegistry::defaultSearchPath();
  paths.insert(paths.begin(), std::string(PTRAIN_FIXTURE_DIR) + "/parallel_echo");
  PluginRegistry withEcho(paths);
  pick = pickParallelPlugins(s, true, withEcho);
  EXPECT_EQ(pick.plugins, (Lines{"tensor", "echo", "expert", "pipeline", "data"}));
  EXPECT_EQ(pick.missing, Lines{});
}

// A size above 1 that no installed plugin executes would repeat the same work
// on every rank of it: refused at its key.
TEST(ParallelPlugins, RefusesASizeNoInstalledPluginExecutes) {
  PluginRegistry installed(PluginRegistry::defaultSearchPath());
  auto missing = [&](const std::vector<std::string>& overrides, int world, const std::string& extra = "") {
    return checkParallelPlugins(layoutRequestFromRecipe(recipe(overrides, extra), world), installed);
  };
  // The tree builds parallel/tensor, expert, pipeline and data.
  EXPECT_EQ(missing({"parallel.tensor_model_parallel_size=2", "parallel.pipeline_model_parallel_size=2"}, 4), Lines{});
  EXPECT_EQ(missing({}, 2, "parallel:\n  context_parallel_size: 2\n"),
            Lines{"r.yaml:5:3: context_parallel_size=2: no installed parallel plugin executes cp; set it to 1"});
  EXPECT_EQ(missing({"model.num_experts=4", "parallel.expert_model_parallel_size=2"}, 4), Lines{});
  // A dense model has no expert grid: etp > 1 is ignored there (a warning),
  // ep > 1 refused by checkLayout.
  EXPECT_EQ(missing({"parallel.expert_tensor_parallel_size=2"}, 2), Lines{});

  // Nothing installed: every plugin is missing, parallel/data included.
  test::TempDir empty;
  PluginRegistry none({empty.path()});
  EXPECT_EQ(checkParallelPlugins(layoutRequestFromRecipe(recipe({"parallel.tensor_model_parallel_size=2"}), 2), none),
            (Lines{"<command line>: tensor_model_parallel_size=2: no installed parallel plugin executes tp; set it to 1",
                   "r.yaml:1:1: no installed parallel plugin executes dp, which reduces the gradients across ranks "
                   "(every run needs it: parallel/data is built in); add its folder to plugins.paths or "
                   "PTRAIN_PLUGIN_PATH"}));
}

}  // namespace
}  // namespace ptrain

namespace ptrain {
namespace {

TEST(DataParallelRows, SharesGiveWholeRowsOrNothing) {
  EXPECT_EQ(dataParallelRows(64, 2, {}), (std::vector<int64_t>{32, 32}));
  EXPECT_EQ(dataParallelRows(64, 2, {3, 1}), (std::vector<int64_t>{48, 16}));
  // Decimal weights are whole up to rounding; rows as shares are themselves.
  EXPECT_EQ(dataParallelRows(10, 2, {0.6, 0.4}), (std::vector<int64_t>{6, 4}));
  EXPECT_EQ(dataParallelRows(24, 3, {12, 8, 4}), (std::vector<int64_t>{12, 8, 4}));
  EXPECT_FALSE(dataParallelRows(64, 2, {2, 1}).has_value());  // 42.67 rows
  EXPECT_FALSE(dataParallelRows(64, 3, {}).has_value());
  EXPECT_FALSE(dataParallelRows(64, 2, {1, 1, 2}).has_value());
  EXPECT_FALSE(dataParallelRows(64, 2, {1, 0}).has_value());
}

TEST(DataParallelRows, PlanTakesTheFewestMicroBatches) {
  LayoutRequest q;
  q.world = 2;
  q.global_batch_size = 64;
  q.micro_batch_size = 8;
  q.data_parallel_shares = {3, 1};
  const LayoutPlan plan = planLayout(q);
  EXPECT_EQ(plan.data_rows, (std::vector<int64_t>{48, 16}));
  EXPECT_EQ(plan.micro_batches, 2);
  // Experts exchange tokens every micro-batch: uneven counts are refused.
  q.num_experts = 4;
  q.ep = 2;
  const auto problems = checkLayout(q);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("cannot be uneven with expert_model_parallel_size=2"), std::string::npos) << problems[0];
}

}  // namespace
}  // namespace ptrain
