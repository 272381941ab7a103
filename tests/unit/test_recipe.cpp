// Recipe loading, merging, overrides, validation messages and the round trip.
// Every expected message is written out by hand: file:line:col, key path,
// what is wrong and how to fix it.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../../trainers/llm/llm_trainer.h"
#include "ptrain/recipe/key_specs.h"
#include "ptrain/recipe/recipe.h"
#include "ptrain/recipe/schema.h"
#include "support/test_support.h"

namespace ptrain {
namespace {

using test::TempDir;

// The core's keys and the groups a GPT-shaped trainer declares (shape,
// experts, recomputation, fusion), as the llm trainer does.
Schema coreSchema() {
  Schema s;
  describeCoreKeys(s);
  keys::addTransformerShape(s);
  keys::addMoe(s);
  keys::addRecompute(s, /*selective=*/true);
  keys::addFusion(s);
  return s;
}

// The message of the ConfigError `f` throws; fails the test when it throws none.
template <typename F>
std::string errorOf(F&& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no ConfigError thrown";
  return "";
}

std::vector<std::string> problemsOf(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  Recipe r = Recipe::fromString(yaml, "r.yaml", overrides);
  return r.validateAll(coreSchema());
}

const char* kMinimal =
    "trainer: {name: llm}\n"
    "train:\n"
    "  steps: 10\n"
    "  global_batch_size: 8\n";

TEST(RecipeLoad, TypedValuesAndDefaults) {
  TempDir dir;
  std::string path = dir.write("small.yaml",
                               "trainer: {name: llm}\n"
                               "model:\n"
                               "  num_layers: 2\n"
                               "  dropout: 0.25\n"
                               "train: {steps: 600, global_batch_size: 64}\n"
                               "optimizer: {lr: 3e-3}\n"
                               "plugins: {paths: [a, b]}\n"
                               "parallel: {pipeline_layout: [1, 1]}\n");
  Recipe r = Recipe::load(path);
  // model.dropout is the llm trainer's key.
  Schema schema = coreSchema();
  llm::LlmTrainer(PluginContext{}).describeKeys(schema);
  r.validate(schema);
  EXPECT_EQ(r.path(), path);
  EXPECT_EQ(r.name(), "small");
  EXPECT_EQ(r.getInt("model.num_layers"), 2);
  EXPECT_DOUBLE_EQ(r.getFloat("model.dropout"), 0.25);
  EXPECT_DOUBLE_EQ(r.getFloat("optimizer.lr"), 0.003);
  EXPECT_EQ(r.getInt("train.steps"), 600);
  EXPECT_EQ(r.getStringList("plugins.paths"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(r.getIntList("parallel.pipeline_layout"), (std::vector<int64_t>{1, 1}));
  // Defaults from the schema.
  EXPECT_EQ(r.getString("communication.backend"), "auto");
  EXPECT_DOUBLE_EQ(r.getFloat("communication.timeout_s"), 300.0);
  EXPECT_EQ(r.getString("precision.name"), "fp32");
  EXPECT_EQ(r.getString("optimizer.name"), "adamw");
  EXPECT_EQ(r.getString("parallel.pipeline_schedule"), "1f1b");
  EXPECT_DOUBLE_EQ(r.getFloat("parallel.grad_bucket_size_mb"), 4.0);
  EXPECT_TRUE(r.getBool("parallel.overlap_grad_reduce"));
  EXPECT_FALSE(r.getBool("parallel.sequence_parallel"));
  EXPECT_EQ(r.getInt("parallel.tensor_model_parallel_size"), 1);
  EXPECT_EQ(r.getString("log.progress"), "auto");
  EXPECT_EQ(r.getInt("train.seed"), 1234);
  // A key with no default and no value.
  EXPECT_FALSE(r.has("train.micro_batch_size"));
  EXPECT_TRUE(r.has("model"));
  EXPECT_TRUE(r.isExplicit("train.steps"));
  EXPECT_FALSE(r.isExplicit("optimizer.name"));
  EXPECT_TRUE(r.isExplicit("optimizer"));  // lr was written
  EXPECT_EQ(r.location("model.dropout").str(), path + ":4:3");
  EXPECT_EQ(r.location("optimizer.name").str(), "<default>");
  EXPECT_EQ(r.keysUnder("plugins"), (std::vector<std::string>{"plugins.paths"}));
  EXPECT_EQ(r.keysUnder("model"),
            (std::vector<std::string>{"model.dropout", "model.ffn_hidden_size", "model.init_std",
                                      "model.make_vocab_size_divisible_by", "model.moe_aux_loss_coeff",
                                      "model.moe_layer_freq", "model.moe_pad_expert_input_to_capacity",
                                      "model.moe_router_pre_softmax", "model.moe_router_score_function",
                                      "model.moe_router_topk", "model.moe_z_loss_coeff", "model.num_experts",
                                      "model.num_layers", "model.recompute", "model.recompute_num_layers",
                                      "model.tie_embeddings", "model.vocab_size"}));
}

TEST(RecipeLoad, NameKeyWinsOverFileName) {
  Recipe r = Recipe::fromString(std::string(kMinimal) + "name: my-run\n", "x.yaml");
  EXPECT_EQ(r.name(), "my-run");
  Recipe unnamed = Recipe::fromString(kMinimal, "configs/quick.yaml");
  EXPECT_EQ(unnamed.name(), "quick");
}

// A caller that passes on what the recipe itself said about a key (a
// getString that found nothing) does not get the key's location twice.
TEST(RecipeLoad, FailSaysWhereOnce) {
  Recipe r = Recipe::fromString(kMinimal, "r.yaml");
  const std::string prefix = r.location("train.steps").str() + ": train.steps: ";
  for (const std::string& message : {std::string("must be 5"), prefix + "must be 5"}) {
    try {
      r.fail("train.steps", message);
      FAIL() << "no error";
    } catch (const ConfigError& e) {
      EXPECT_EQ(std::string(e.what()), prefix + "must be 5");
    }
  }
}

TEST(RecipeLoad, DottedKeysNest) {
  Recipe r = Recipe::fromString("trainer.name: llm\ntrain.steps: 3\ntrain:\n  global_batch_size: 4\n", "r.yaml");
  r.validate(coreSchema());
  EXPECT_EQ(r.getString("trainer.name"), "llm");
  EXPECT_EQ(r.getInt("train.steps"), 3);
  EXPECT_EQ(r.getInt("train.global_batch_size"), 4);
}

TEST(RecipeErrors, MissingFile) {
  EXPECT_EQ(errorOf([] { Recipe::load("/nonexistent/dir/recipe.yaml"); }),
            "recipe not found: /nonexistent/dir/recipe.yaml");
}

TEST(RecipeErrors, YamlSyntaxErrorHasFileLineColumn) {
  TempDir dir;
  // The second ':' on line 2 (column 11) makes an illegal map value.
  std::string path = dir.write("bad.yaml", "train:\n  steps: 5: 6\n");
  EXPECT_EQ(errorOf([&] { Recipe::load(path); }),
            path + ":2:11: YAML syntax error: illegal map value; check the indentation, colons, quotes and "
                   "brackets there");
}

TEST(RecipeErrors, TopLevelMustBeAMapping) {
  EXPECT_EQ(errorOf([] { Recipe::fromString("- a\n- b\n", "r.yaml"); }),
            "r.yaml:1:1: expected a mapping of sections at the top level, got a list; start with keys such as "
            "'train:'");
}

TEST(RecipeErrors, DuplicateKey) {
  EXPECT_EQ(errorOf([] { Recipe::fromString("train:\n  steps: 1\n  steps: 2\n", "r.yaml"); }),
            "r.yaml:3:3: train.steps: duplicate key (first written at r.yaml:2:3); remove one of them");
}

TEST(RecipeErrors, UnknownKeySuggestsNearest) {
  auto p = problemsOf(
      "trainer: {name: llm}\n"
      "train:\n"
      "  step: 5\n"
      "  global_batch_size: 8\n");
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0], "r.yaml:3:3: train.step: unknown key; did you mean 'train.steps'?");
  EXPECT_EQ(p[1], "r.yaml:2:1: train.steps: missing required key; add 'steps: <int>' under 'train:'");
}

TEST(RecipeErrors, UnknownKeySuggestions) {
  // Swapped letters in the section, the right name in the wrong section, a
  // forgotten word (Megatron's tensor_model_parallel_size).
  auto p = problemsOf(std::string(kMinimal) +
                      "trian:\n"
                      "  seed: 3\n"
                      "optimizer:\n"
                      "  lr: 0.1\n"
                      "  lr_scheduler: cosine\n"
                      "parallel: {tensor_parallel_size: 2}\n"
                      "log: {lr: 1}\n");
  ASSERT_EQ(p.size(), 4u);
  EXPECT_EQ(p[0], "r.yaml:6:3: trian.seed: unknown key; did you mean 'train.seed'?");
  EXPECT_EQ(p[1], "r.yaml:9:3: optimizer.lr_scheduler: unknown key; did you mean 'optimizer.lr_schedule'?");
  EXPECT_EQ(p[2],
            "r.yaml:10:12: parallel.tensor_parallel_size: unknown key; did you mean "
            "'parallel.tensor_model_parallel_size'?");
  EXPECT_EQ(p[3], "r.yaml:11:7: log.lr: unknown key; did you mean 'optimizer.lr'?");
}

TEST(RecipeErrors, UnknownKeyWithoutSuggestion) {
  auto p = problemsOf(std::string(kMinimal) +
                      "model:\n"
                      "  frobnicate: 1\n"
                      "zzz:\n"
                      "  a: 1\n"
                      "  b: 2\n"
                      "qqqq: 1\n");
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[0], "r.yaml:6:3: model.frobnicate: unknown key; remove it (`ptrain keys` lists the keys of 'model')");
  // One line for a whole unknown section.
  EXPECT_EQ(p[1], "r.yaml:7:1: zzz: unknown section; remove it (`ptrain keys` lists the known keys)");
  EXPECT_EQ(p[2], "r.yaml:10:1: qqqq: unknown key; remove it (`ptrain keys` lists the known keys)");
}

TEST(RecipeErrors, WrongTypes) {
  auto p = problemsOf(
      "trainer: {name: llm}\n"
      "train:\n"
      "  steps: abc\n"
      "  global_batch_size: 8.5\n"
      "optimizer:\n"
      "  lr: fast\n"
      "parallel:\n"
      "  sequence_parallel: maybe\n"
      "  pipeline_layout: 3\n"
      "plugins: {paths: [a, [b]]}\n"
      "model:\n"
      "  num_layers: {a: 1}\n"
      "checkpoint: 5\n"
      "data: {name: [x]}\n");
  ASSERT_EQ(p.size(), 9u);
  EXPECT_EQ(p[0], "r.yaml:3:10: train.steps: expected an integer, got 'abc'; write a whole number such as 1");
  EXPECT_EQ(p[1],
            "r.yaml:4:22: train.global_batch_size: expected an integer, got '8.5'; write a whole number such as 1");
  EXPECT_EQ(p[2], "r.yaml:6:7: optimizer.lr: expected a number, got 'fast'; write a number such as 0.001");
  EXPECT_EQ(p[3], "r.yaml:8:22: parallel.sequence_parallel: expected true or false, got 'maybe'; write true or false");
  EXPECT_EQ(p[4], "r.yaml:9:20: parallel.pipeline_layout: expected a list of integers, got '3'; write [3]");
  EXPECT_EQ(p[5],
            "r.yaml:10:22: plugins.paths: element 1: expected a string, got a list; write a single value");
  EXPECT_EQ(p[6],
            "r.yaml:12:15: model.num_layers: expected an integer, got a mapping; write a value >= 1 instead of the "
            "keys below it");
  EXPECT_EQ(p[7],
            "r.yaml:13:13: checkpoint: expected a section of keys, got '5'; write its keys below it (`ptrain keys` "
            "lists them)");
  EXPECT_EQ(p[8], "r.yaml:14:14: data.name: expected a string, got a list; write a single value");
}

TEST(RecipeErrors, ListElementPointsAtTheElement) {
  auto p = problemsOf(std::string(kMinimal) + "parallel: {pipeline_layout: [1, x]}\n");
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0],
            "r.yaml:5:33: parallel.pipeline_layout: element 1: expected an integer, got 'x'; write a whole number "
            "such as 0");
}

TEST(RecipeErrors, OutOfRangeNamesTheRange) {
  auto p = problemsOf(
      "trainer: {name: llm}\n"
      "train: {steps: 0, global_batch_size: 8}\n"
      "optimizer: {lr: 0, beta1: 1, weight_decay: -0.5}\n"
      "parallel: {pipeline_layout: [2, -1]}\n");
  ASSERT_EQ(p.size(), 5u);
  EXPECT_EQ(p[0], "r.yaml:2:16: train.steps: 0 is out of range; use a value >= 1");
  EXPECT_EQ(p[1], "r.yaml:3:17: optimizer.lr: 0 is out of range; use a value > 0");
  EXPECT_EQ(p[2], "r.yaml:3:27: optimizer.beta1: 1 is out of range; use a value in [0, 1)");
  EXPECT_EQ(p[3], "r.yaml:3:44: optimizer.weight_decay: -0.5 is out of range; use a value >= 0");
  EXPECT_EQ(p[4], "r.yaml:4:33: parallel.pipeline_layout: element 1: -1 is out of range; use a value >= 0");
}

TEST(RecipeErrors, NotOneOfTheChoices) {
  auto p = problemsOf(std::string(kMinimal) +
                      "optimizer: {name: adam, lr_schedule: step}\n"
                      "log: {progress: fancy}\n");
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[0], "r.yaml:5:19: optimizer.name: 'adam' is not one of adamw, sgd; did you mean 'adamw'?");
  EXPECT_EQ(p[1],
            "r.yaml:5:38: optimizer.lr_schedule: 'step' is not one of constant, linear, cosine; use one of them");
  EXPECT_EQ(p[2], "r.yaml:6:17: log.progress: 'fancy' is not one of auto, bar, lines, none; use one of them");
}

TEST(RecipeErrors, MissingRequiredKeys) {
  auto p = problemsOf("model: {num_layers: 2}\n");
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[0], "r.yaml:1:1: trainer.name: missing required key; add 'name: <string>' under 'trainer:'");
  EXPECT_EQ(p[1], "r.yaml:1:1: train.steps: missing required key; add 'steps: <int>' under 'train:'");
  EXPECT_EQ(p[2],
            "r.yaml:1:1: train.global_batch_size: missing required key; add 'global_batch_size: <int>' under "
            "'train:'");
}

TEST(RecipeErrors, ValidateThrowsTheFirstAndCountsTheRest) {
  Recipe one = Recipe::fromString("trainer: {name: llm}\ntrain: {steps: 1, global_batch_size: x}\n", "r.yaml");
  EXPECT_EQ(errorOf([&] { one.validate(coreSchema()); }),
            "r.yaml:2:38: train.global_batch_size: expected an integer, got 'x'; write a whole number such as 1");
  Recipe three = Recipe::fromString("train: {steps: 1}\n", "r.yaml");
  EXPECT_EQ(errorOf([&] { three.validate(coreSchema()); }),
            "r.yaml:1:1: trainer.name: missing required key; add 'name: <string>' under 'trainer:' (and 1 more "
            "problem: `ptrain check` lists all)");
}

// Keys that are planned but not built: a value that would not run is refused
// where it was written; what runs today, and the schema default, pass.
TEST(RecipeErrors, ReservedKeysRefuseWhatIsNotBuilt) {
  EXPECT_EQ(problemsOf(std::string(kMinimal) + "  eval_batches: 4\n"),
            std::vector<std::string>{"r.yaml:5:17: train.eval_batches: 4 is not implemented yet (the trainer sizes "
                                     "evaluation, e.g. the llm trainer's data.eval_size); remove it"});
  EXPECT_EQ(problemsOf(kMinimal, {"fusion.masked_softmax=yes", "train.eval_batches=8"}),
            (std::vector<std::string>{
                "<command line>: train.eval_batches: 8 is not implemented yet (the trainer sizes evaluation, e.g. the "
                "llm trainer's data.eval_size); remove it"}));
  // Through validate(): the first problem, as for any other mistake.
  Recipe r = Recipe::fromString(kMinimal, "r.yaml", {"train.eval_batches=2"});
  EXPECT_EQ(errorOf([&] { r.validate(coreSchema()); }),
            "<command line>: train.eval_batches: 2 is not implemented yet (the trainer sizes evaluation, e.g. the "
            "llm trainer's data.eval_size); remove it");
  // A wrong type is reported as such, not as a reserved value.
  EXPECT_EQ(problemsOf(kMinimal, {"train.eval_batches=many"}),
            std::vector<std::string>{
                "<command line>: train.eval_batches: expected an integer, got 'many'; write a whole number such as 8"});
  EXPECT_EQ(problemsOf(kMinimal, {"offload.params=maybe"}),
            std::vector<std::string>{
                "<command line>: offload.params: expected true or false, got 'maybe'; write true or false"});
  EXPECT_EQ(problemsOf(kMinimal, {"device=tpu"}),
            std::vector<std::string>{"<command line>: device.type: 'tpu' is not one of auto, cpu, cuda; did you mean 'cpu'?"});

  // The values that run today pass, however they are spelt.
  EXPECT_EQ(problemsOf(kMinimal, {"offload.params=false", "offload.optimizer=no", "precision.name=fp32",
                                  "fusion.bias_gelu=off", "device=cpu"}),
            std::vector<std::string>{});
  // Defaults never trigger it, train.eval_batches' 8 included, and the
  // resolved recipe leaves that default out so that it loads back.
  Recipe plain = Recipe::fromString(kMinimal, "r.yaml");
  plain.validate(coreSchema());
  EXPECT_EQ(plain.getInt("train.eval_batches"), 8);
  EXPECT_FALSE(plain.isExplicit("train.eval_batches"));
  EXPECT_EQ(plain.getString("device.type"), "auto");
  EXPECT_EQ(plain.toYaml().find("eval_batches"), std::string::npos) << plain.toYaml();
  Recipe again = Recipe::fromString(plain.toYaml(), "resolved.yaml");
  EXPECT_EQ(again.validateAll(coreSchema()), std::vector<std::string>{});
  EXPECT_EQ(again.getInt("train.eval_batches"), 8);
  // A value the recipe set is kept.
  Recipe set = Recipe::fromString(kMinimal, "r.yaml", {"offload.params=false"});
  set.validate(coreSchema());
  EXPECT_NE(set.toYaml().find("params: false"), std::string::npos) << set.toYaml();
  // The written form leaves every default out, so a default that applies to
  // no layout of this recipe (fp16's loss scale under fp32) is not written
  // back as if set; it keeps the values that were written.
  const std::string written = set.toYaml(Recipe::Values::kWritten);
  EXPECT_EQ(written.find("loss_scale"), std::string::npos) << written;
  EXPECT_EQ(written.find("device"), std::string::npos) << written;
  EXPECT_NE(written.find("params: false"), std::string::npos) << written;
  Recipe reloaded = Recipe::fromString(written, "written.yaml");
  EXPECT_EQ(reloaded.validateAll(coreSchema()), std::vector<std::string>{});
  EXPECT_FALSE(reloaded.isExplicit("precision.loss_scale"));
  EXPECT_EQ(reloaded.toYaml(), set.toYaml());
}

TEST(RecipeOverrides, ApplyAfterTheFileAsYaml) {
  Recipe r = Recipe::fromString(kMinimal, "r.yaml",
                                {"train.steps=20", "parallel.pipeline_layout=[1,2]", "optimizer.lr=3e-3",
                                 "name=quoted run", "model={num_layers: 4, hidden_size: 64}",
                                 "train.micro_batch_size=2"});
  r.validate(coreSchema());
  EXPECT_EQ(r.getInt("train.steps"), 20);
  EXPECT_EQ(r.getIntList("parallel.pipeline_layout"), (std::vector<int64_t>{1, 2}));
  EXPECT_DOUBLE_EQ(r.getFloat("optimizer.lr"), 0.003);
  EXPECT_EQ(r.name(), "quoted run");
  EXPECT_EQ(r.getInt("model.num_layers"), 4);
  EXPECT_EQ(r.getInt("model.hidden_size"), 64);
  EXPECT_EQ(r.location("train.steps").str(), "<command line>");
  EXPECT_EQ(r.location("train.global_batch_size").str(), "r.yaml:4:3");
}

TEST(RecipeOverrides, EmptyValueRemovesTheKey) {
  Recipe r = Recipe::fromString(std::string(kMinimal) + "optimizer: {lr: 0.5}\ntrain.micro_batch_size: 2\n", "r.yaml",
                                {"optimizer.lr=", "train.micro_batch_size=null"});
  r.validate(coreSchema());
  EXPECT_DOUBLE_EQ(r.getFloat("optimizer.lr"), 0.001);  // back to the default
  EXPECT_FALSE(r.has("train.micro_batch_size"));
}

TEST(RecipeOverrides, BadValueNamesTheCommandLine) {
  auto p = problemsOf(kMinimal, {"train.steps=abc"});
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0], "<command line>: train.steps: expected an integer, got 'abc'; write a whole number such as 1");
  auto q = problemsOf(kMinimal, {"train.stesp=3"});
  ASSERT_EQ(q.size(), 1u);
  EXPECT_EQ(q[0], "<command line>: train.stesp: unknown key; did you mean 'train.steps'?");
}

TEST(RecipeOverrides, MalformedOverridesNameTheArgument) {
  EXPECT_EQ(errorOf([] { Recipe::fromString(kMinimal, "r.yaml", {"foo"}); }),
            "<command line>: override 'foo': expected key=value; write it as a.b.c=value, e.g. train.steps=100");
  EXPECT_EQ(errorOf([] { Recipe::fromString(kMinimal, "r.yaml", {"=3"}); }),
            "<command line>: override '=3': the key before '=' is missing; write it as a.b.c=value, e.g. "
            "train.steps=100");
  EXPECT_EQ(errorOf([] { Recipe::fromString(kMinimal, "r.yaml", {".a=1"}); }),
            "<command line>: override '.a=1': '.a' is not a key path; use names joined by single dots, e.g. "
            "train.steps=100");
  EXPECT_EQ(errorOf([] { Recipe::fromString(kMinimal, "r.yaml", {"a..b=1"}); }),
            "<command line>: override 'a..b=1': 'a..b' is not a key path; use names joined by single dots, e.g. "
            "train.steps=100");
  EXPECT_EQ(errorOf([] { Recipe::fromString(kMinimal, "r.yaml", {"train.steps=[1,"}); }),
            "<command line>: override 'train.steps=[1,': the value is not valid YAML (end of sequence flow not "
            "found); fix it, or quote it to pass it as a string");
}

TEST(RecipeDefaults, ChainLaterWinsRecipeLastOverridesAfter) {
  TempDir dir;
  dir.write("base.yaml",
            "trainer: {name: llm}\n"
            "train: {steps: 1, global_batch_size: 8, seed: 1}\n"
            "optimizer: {lr: 0.1, name: sgd}\n"
            "parallel: {pipeline_layout: [1, 1, 1]}\n");
  dir.write("more.yaml",
            "defaults: [base.yaml]\n"
            "train: {steps: 2}\n"
            "optimizer: {lr: 0.2}\n");
  dir.write("other.yaml",
            "train: {steps: 3, eval_every: 7}\n"
            "parallel: {pipeline_layout: [4]}\n");
  std::string top = dir.write("sub/top.yaml",
                              "defaults: [../more.yaml, ../other.yaml]\n"
                              "optimizer:\n"
                              "  lr: 0.3\n");
  Recipe r = Recipe::load(top, {"train.seed=9"});
  r.validate(coreSchema());
  EXPECT_EQ(r.getInt("train.steps"), 3);          // other.yaml comes after more.yaml
  EXPECT_EQ(r.getInt("train.eval_every"), 7);
  EXPECT_EQ(r.getInt("train.global_batch_size"), 8);  // only in base.yaml
  EXPECT_DOUBLE_EQ(r.getFloat("optimizer.lr"), 0.3);  // the recipe itself wins
  EXPECT_EQ(r.getString("optimizer.name"), "sgd");   // sections merge key by key
  EXPECT_EQ(r.getInt("train.seed"), 9);              // overrides come last
  EXPECT_EQ(r.getIntList("parallel.pipeline_layout"), (std::vector<int64_t>{4}));  // lists replace
  EXPECT_EQ(r.name(), "top");
  // Values from a base file say where they were written.
  EXPECT_EQ(r.location("train.global_batch_size").str(), dir.path() + "/base.yaml:2:19");
  EXPECT_EQ(r.location("train.steps").str(), dir.path() + "/other.yaml:1:9");
  EXPECT_EQ(r.location("optimizer.lr").str(), top + ":3:3");
}

TEST(RecipeDefaults, ErrorsInABaseNameTheBaseFile) {
  TempDir dir;
  dir.write("base.yaml", "trainer: {name: llm}\ntrain: {steps: 1, global_batch_size: 8, sed: 3}\n");
  std::string top = dir.write("top.yaml", "defaults: [base.yaml]\n");
  Recipe r = Recipe::load(top);
  auto p = r.validateAll(coreSchema());
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0], dir.path() + "/base.yaml:2:41: train.sed: unknown key; did you mean 'train.seed'?");
}

TEST(RecipeDefaults, MissingBase) {
  TempDir dir;
  std::string top = dir.write("top.yaml", "trainer: {name: llm}\ndefaults:\n  - base.yaml\n");
  EXPECT_EQ(errorOf([&] { Recipe::load(top); }),
            top + ":3:5: defaults: recipe not found: " + dir.path() +
                "/base.yaml; paths are relative to the file that names them");
}

TEST(RecipeDefaults, CycleIsDetected) {
  TempDir dir;
  std::string a = dir.write("a.yaml", "defaults: [b.yaml]\n");
  std::string b = dir.write("b.yaml", "defaults: [c.yaml]\n");
  std::string c = dir.write("c.yaml", "defaults: [a.yaml]\n");
  EXPECT_EQ(errorOf([&] { Recipe::load(a); }),
            c + ":1:12: defaults: cycle " + a + " -> " + b + " -> " + c + " -> " + a +
                "; remove one of these defaults");
  std::string self = dir.write("self.yaml", "defaults: [self.yaml]\n");
  EXPECT_EQ(errorOf([&] { Recipe::load(self); }),
            self + ":1:12: defaults: cycle " + self + " -> " + self + "; remove one of these defaults");
}

TEST(RecipeDefaults, SharedBaseIsNotACycle) {
  TempDir dir;
  dir.write("common.yaml", "trainer: {name: llm}\ntrain: {steps: 1, global_batch_size: 8}\n");
  dir.write("left.yaml", "defaults: [common.yaml]\n");
  dir.write("right.yaml", "defaults: [common.yaml]\n");
  std::string top = dir.write("top.yaml", "defaults: [left.yaml, right.yaml]\n");
  Recipe r = Recipe::load(top);
  EXPECT_TRUE(r.validateAll(coreSchema()).empty());
}

TEST(RecipeDefaults, FromStringResolvesAgainstBaseDir) {
  TempDir dir;
  dir.write("base.yaml", "trainer: {name: llm}\ntrain: {steps: 5, global_batch_size: 8}\n");
  Recipe r = Recipe::fromString("defaults: base.yaml\ntrain: {steps: 6}\n", "<string>", {}, dir.path());
  r.validate(coreSchema());
  EXPECT_EQ(r.getInt("train.steps"), 6);
  EXPECT_EQ(r.getInt("train.global_batch_size"), 8);
}

TEST(RecipeRoundTrip, ToYamlLoadsBackToTheSameRecipe) {
  TempDir dir;
  dir.write("base.yaml", "trainer: {name: llm}\noptimizer: {lr: 3e-3, lr_schedule: cosine}\n");
  std::string path = dir.write("r.yaml",
                               "defaults: [base.yaml]\n"
                               "name: \"123\"\n"
                               "data: {name: 'yes'}\n"
                               "model: {num_layers: 2, hidden_size: 128}\n"
                               "train: {steps: 600, global_batch_size: 64}\n"
                               "plugins: {paths: [\"a b\", 'true']}\n");
  Recipe first = Recipe::load(path, {"parallel.pipeline_layout=[2]"});
  first.validate(coreSchema());
  std::string text = first.toYaml();
  std::string again = dir.write("resolved.yaml", text);
  Recipe second = Recipe::load(again);
  second.validate(coreSchema());
  EXPECT_EQ(second.toYaml(), text);
  EXPECT_EQ(second.keysUnder(""), first.keysUnder(""));
  // Every value came back explicit and equal, strings that look like other types included.
  EXPECT_EQ(second.name(), "123");
  EXPECT_EQ(second.getString("data.name"), "yes");
  EXPECT_EQ(second.getStringList("plugins.paths"), (std::vector<std::string>{"a b", "true"}));
  EXPECT_DOUBLE_EQ(second.getFloat("optimizer.lr"), 0.003);
  EXPECT_EQ(second.getString("optimizer.lr_schedule"), "cosine");
  EXPECT_EQ(second.getIntList("parallel.pipeline_layout"), (std::vector<int64_t>{2}));
  EXPECT_EQ(second.getString("communication.backend"), "auto");
  EXPECT_TRUE(second.isExplicit("communication.backend"));
  EXPECT_EQ(second.getInt("train.steps"), 600);
  // Sections come in the schema's order, the defaults key is resolved away.
  EXPECT_EQ(text.find("defaults"), std::string::npos);
  EXPECT_LT(text.find("launch:"), text.find("trainer:"));
  EXPECT_LT(text.find("trainer:"), text.find("train:"));
  EXPECT_LT(text.find("train:"), text.find("optimizer:"));
  EXPECT_LT(text.find("optimizer:"), text.find("log:"));
}

TEST(RecipeGetters, ErrorsSayWhatIsMissing) {
  Recipe r = Recipe::fromString(kMinimal, "r.yaml");
  r.validate(coreSchema());
  EXPECT_EQ(errorOf([&] { r.getInt("train.micro_batch_size"); }),
            "r.yaml:2:1: train.micro_batch_size: not set; add it to the recipe or pass train.micro_batch_size=<value>");
  EXPECT_EQ(errorOf([&] { r.getString("train"); }),
            "r.yaml:2:1: train: is a section, not a value; read the keys below it");
  EXPECT_EQ(errorOf([&] { r.getIntList("train.steps"); }),
            "r.yaml:3:10: train.steps: expected a list of integers, got '10'; fix the value");
  EXPECT_EQ(errorOf([&] { r.fail("train.steps", "too many for this test"); }),
            "r.yaml:3:3: train.steps: too many for this test");
}

TEST(RecipeSet, ActsLikeAnOverride) {
  Recipe r = Recipe::fromString(kMinimal, "r.yaml");
  r.validate(coreSchema());
  r.set("train.micro_batch_size", "4");
  r.set("parallel.pipeline_layout", "[3, 5]");
  EXPECT_EQ(r.getInt("train.micro_batch_size"), 4);
  EXPECT_EQ(r.getIntList("parallel.pipeline_layout"), (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(r.location("train.micro_batch_size").str(), "<set>");
  r.set("train.steps", "many");
  EXPECT_EQ(errorOf([&] { r.validate(coreSchema()); }),
            "<set>: train.steps: expected an integer, got 'many'; write a whole number such as 1");
  EXPECT_EQ(errorOf([&] { r.set("bad key", "1"); }),
            "<set>: override 'bad key=1': 'bad key' is not a key path; use names joined by single dots, e.g. "
            "train.steps=100");
}

TEST(RecipeCopy, CopiesAreIndependent) {
  Recipe a = Recipe::fromString(kMinimal, "r.yaml");
  Recipe b = a;
  b.set("train.steps", "99");
  EXPECT_EQ(a.getInt("train.steps"), 10);
  EXPECT_EQ(b.getInt("train.steps"), 99);
  a = b;
  a.set("train.steps", "5");
  EXPECT_EQ(b.getInt("train.steps"), 99);
  EXPECT_EQ(a.getInt("train.steps"), 5);
}

}  // namespace
}  // namespace ptrain

namespace ptrain {
namespace {

// A list of mappings (parallel.groups): each entry and key with where it was
// written, in the order written; the schema refuses other shapes at the entry.
TEST(RecipeMapList, EntriesKeepTheirKeysInOrderWithTheirPlaces) {
  Recipe r = Recipe::fromString(std::string(kMinimal) +
                                    "parallel:\n"
                                    "  groups:\n"
                                    "    - {name: a, ranks: 4, tensor_model_parallel_size: 2}\n"
                                    "    - ranks: 2\n"
                                    "      share: 0.5\n",
                                "g.yaml");
  r.validate(coreSchema());
  const auto groups = r.getMapList("parallel.groups");
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].at.str(), "g.yaml:7:7");
  ASSERT_EQ(groups[0].fields.size(), 3u);
  EXPECT_EQ(groups[0].fields[0].key, "name");
  EXPECT_EQ(groups[0].fields[0].value, "a");
  EXPECT_EQ(groups[0].fields[2].key, "tensor_model_parallel_size");
  EXPECT_EQ(groups[0].fields[2].at.str(), "g.yaml:7:27");
  ASSERT_EQ(groups[1].fields.size(), 2u);
  EXPECT_EQ(groups[1].fields[1].key, "share");
  EXPECT_EQ(groups[1].fields[1].value, "0.5");
  EXPECT_EQ(groups[1].fields[1].at.str(), "g.yaml:9:7");
  // From the command line too.
  Recipe o = Recipe::fromString(kMinimal, "g.yaml", {"parallel.groups=[{ranks: 1}, {ranks: 3}]"});
  o.validate(coreSchema());
  EXPECT_EQ(o.getMapList("parallel.groups")[1].fields[0].value, "3");
}

TEST(RecipeMapList, OtherShapesAreRefusedAtTheEntry) {
  const auto scalar = problemsOf(std::string(kMinimal) + "parallel: {groups: 4}\n");
  ASSERT_EQ(scalar.size(), 1u);
  EXPECT_NE(scalar[0].find("parallel.groups: expected a list of mappings, got"), std::string::npos) << scalar[0];
  const auto nested = problemsOf(std::string(kMinimal) + "parallel:\n  groups:\n    - {ranks: 4}\n    - {ranks: [2]}\n");
  ASSERT_EQ(nested.size(), 1u);
  EXPECT_NE(nested[0].find("r.yaml:8:7: parallel.groups: entry 2 is"), std::string::npos) << nested[0];
  EXPECT_NE(nested[0].find("expected a mapping of single values"), std::string::npos) << nested[0];
}

}  // namespace
}  // namespace ptrain
