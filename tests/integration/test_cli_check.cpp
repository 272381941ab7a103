// `ptrain check` and `ptrain keys` as real processes: exit codes, one line per
// problem, no stack traces, and docs/recipes.md kept equal to `ptrain keys --markdown`.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "support/test_support.h"

namespace ptrain {
namespace {

using test::runPtrain;
using test::TempDir;

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) out.push_back(line);
  return out;
}

// What a crash or an uncaught exception would leave behind.
void expectNoCrashTrace(const std::string& output) {
  for (const char* marker : {"terminate called", "what():", "Aborted", "Segmentation", "internal error", "#0 ",
                             "Stack trace", "Exception raised"}) {
    EXPECT_EQ(output.find(marker), std::string::npos) << marker << " in:\n" << output;
  }
}

// Runs `ptrain check` and expects exit 2 with exactly these lines.
void expectProblems(const std::vector<std::string>& args, const std::vector<std::string>& expected) {
  std::vector<std::string> full = {"check"};
  full.insert(full.end(), args.begin(), args.end());
  test::ProcessResult r = runPtrain(full, {}, 60);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(lines(r.output), expected);
  expectNoCrashTrace(r.output);
}

const char* kValid =
    "trainer: {name: llm}\n"
    "launch: {nproc: 2}\n"
    "model: {num_layers: 4, hidden_size: 64, num_attention_heads: 4, seq_length: 16}\n"
    "train: {steps: 10, global_batch_size: 16}\n";

TEST(CliCheck, ValidRecipeExitsZeroWithASummary) {
  TempDir dir;
  std::string path = dir.write("ok.yaml", kValid);
  test::ProcessResult r = runPtrain({"check", path}, {}, 60);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  auto out = lines(r.output);
  ASSERT_EQ(out.size(), 4u) << r.output;
  EXPECT_EQ(out[0], path + ": OK");
  EXPECT_EQ(out[1], "layout: world=2 tp=1 pp=1 dp=2 cp=1 ep=1 etp=1 edp=2");
  EXPECT_EQ(out[2], "batch: global=16 micro=8 (global/dp) micro-batches per step=1");
  EXPECT_EQ(out[3], "trainer: llm");
  expectNoCrashTrace(r.output);
}

TEST(CliCheck, NprocAndOverridesChangeTheLayout) {
  TempDir dir;
  std::string path = dir.write("ok.yaml", kValid);
  // 8 ranks, tp=2, pp=2 -> dp=2; micro 4 -> 16 / (4*2) = 2 micro-batches.
  test::ProcessResult r =
      runPtrain({"check", path, "--nproc", "8", "parallel.tensor_model_parallel_size=2",
                 "parallel.pipeline_model_parallel_size=2", "train.micro_batch_size=4"},
                {}, 60);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  auto out = lines(r.output);
  ASSERT_GE(out.size(), 3u) << r.output;
  // pp=2 with 2 micro-batches is fine: no warning, so the summary comes first.
  EXPECT_EQ(out[0], path + ": OK");
  EXPECT_EQ(out[1], "layout: world=8 tp=2 pp=2 dp=2 cp=1 ep=1 etp=1 edp=4");
  EXPECT_EQ(out[2], "batch: global=16 micro=4 micro-batches per step=2");
}

TEST(CliCheck, QuickstartRecipeIsValid) {
  test::ProcessResult r = runPtrain({"check", test::sourceDir() + "/configs/quickstart.yaml"}, {}, 60);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  auto out = lines(r.output);
  ASSERT_GE(out.size(), 3u) << r.output;
  EXPECT_EQ(out[1], "layout: world=2 tp=1 pp=1 dp=2 cp=1 ep=1 etp=1 edp=2");
  EXPECT_EQ(out[2], "batch: global=64 micro=32 (global/dp) micro-batches per step=1");
}

TEST(CliCheck, ExampleRecipeExtendsTheQuickstart) {
  test::ProcessResult r = runPtrain({"check", test::sourceDir() + "/configs/llm/gpt_tp2_pp2_dp2.yaml"}, {}, 60);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  auto out = lines(r.output);
  ASSERT_GE(out.size(), 3u) << r.output;
  // 8 ranks / (tp 2 * pp 2) = dp 2; 64 / (8 * 2) = 4 micro-batches.
  EXPECT_EQ(out[1], "layout: world=8 tp=2 pp=2 dp=2 cp=1 ep=1 etp=1 edp=4");
  EXPECT_EQ(out[2], "batch: global=64 micro=8 micro-batches per step=4");
  ASSERT_GE(out.size(), 5u) << r.output;
  EXPECT_EQ(out[4], "pipeline: 1f1b, blocks per stage [1, 1], bubble (pp-1)/m = 0.25, at most 2 micro-batches "
                    "alive per stage");
}

TEST(CliCheck, WarningsGoToStderrAndStillPass) {
  TempDir dir;
  std::string path = dir.write("ok.yaml", kValid);
  test::ProcessResult r = runPtrain({"check", path, "parallel.sequence_parallel=true"}, {}, 60);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("ptrain: warning: <command line>: sequence_parallel has no effect with "
                          "tensor_model_parallel_size=1; it is ignored\n"),
            std::string::npos)
      << r.output;
}

TEST(CliCheck, SchemaProblemsOneLineEach) {
  TempDir dir;
  std::string path = dir.write("bad.yaml",
                               "trainer: {name: llm}\n"
                               "train:\n"
                               "  step: 10\n"
                               "  global_batch_size: abc\n"
                               "optimizer: {name: adam, lr: 0}\n");
  expectProblems({path},
                 {"ptrain: " + path + ":3:3: train.step: unknown key; did you mean 'train.steps'?",
                  "ptrain: " + path +
                      ":4:22: train.global_batch_size: expected an integer, got 'abc'; write a whole number such as 1",
                  "ptrain: " + path + ":5:19: optimizer.name: 'adam' is not one of adamw, sgd; did you mean 'adamw'?",
                  "ptrain: " + path + ":5:29: optimizer.lr: 0 is out of range; use a value > 0",
                  "ptrain: " + path + ":2:1: train.steps: missing required key; add 'steps: <int>' under 'train:'"});
}

TEST(CliCheck, TrainerKeysAreUnknownWithoutTheTrainer) {
  TempDir dir;
  std::string path = dir.write("bad.yaml", std::string(kValid) + "data: {name: arithmetic, frobnicate: 3}\n");
  expectProblems({path}, {"ptrain: " + path +
                          ":5:26: data.frobnicate: unknown key; remove it (`ptrain keys` lists the keys of 'data')"});
}

TEST(CliCheck, LayoutProblemsOneLineEach) {
  TempDir dir;
  std::string path = dir.write("ok.yaml", kValid);
  expectProblems({path, "--nproc", "3", "parallel.tensor_model_parallel_size=3"},
                 {"ptrain: <command line>: tensor_model_parallel_size=3 does not divide num_attention_heads=4: use 1, "
                  "2 or 4",
                  "ptrain: <command line>: tensor_model_parallel_size=3 does not divide ffn_hidden_size=256 "
                  "(4*hidden_size): use 1, 2, 4, 8, 16, 32, 64, 128 or 256"});
  std::string pp = dir.write("pp.yaml", std::string(kValid) + "parallel:\n  pipeline_model_parallel_size: 3\n");
  expectProblems({pp, "--nproc", "6"},
                 {"ptrain: " + pp +
                  ":6:3: pipeline_model_parallel_size=3 does not divide num_layers=4: use 1, 2 or 4, or give "
                  "parallel.pipeline_layout"});
  // The world size comes from launch.nproc (2) when --nproc is not given.
  std::string tp = dir.write("tp.yaml", std::string(kValid) + "parallel:\n  tensor_model_parallel_size: 4\n");
  expectProblems({tp},
                 {"ptrain: " + tp +
                  ":6:3: world size 2 is not divisible by "
                  "tensor_model_parallel_size*pipeline_model_parallel_size*context_parallel_size=4: use --nproc 4, or "
                  "sizes whose product divides 2 (1 or 2)"});
}

// A key that is planned but not built refuses a value that would not run,
// from the file or the command line; its default and what runs today pass.
TEST(CliCheck, ReservedKeysRefuseWhatIsNotBuilt) {
  TempDir dir;
  std::string path = dir.write("reserved.yaml", std::string(kValid) + "fusion: {layernorm: true}\n");
  expectProblems({path, "train.eval_batches=4"},
                 {"ptrain: <command line>: train.eval_batches: 4 is not implemented yet (the trainer sizes "
                  "evaluation, e.g. the llm trainer's data.eval_size); remove it"});
  std::string ok = dir.write("ok.yaml", kValid);
  test::ProcessResult r = runPtrain(
      {"check", ok, "offload.params=false", "precision.name=fp32", "device=cpu", "fusion.layernorm=true"},
      {}, 60);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(lines(r.output).at(0), ok + ": OK") << r.output;
}

// The device section: `device: cpu` is short for device.type; TF32 is
// refused where nothing would read it (the cpu), from the file or the
// command line; `run` refuses it as `check` does.
TEST(CliCheck, DeviceSectionAndTf32) {
  TempDir dir;
  std::string shorthand = dir.write("short.yaml", std::string(kValid) + "device: cpu\n");
  test::ProcessResult r = runPtrain({"check", shorthand}, {}, 60);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::string section = dir.write("section.yaml", std::string(kValid) + "device: {type: cpu, tf32: true}\n");
  expectProblems({section}, {"ptrain: " + section +
                             ":5:21: device.tf32: true, but device.type is cpu; TF32 is a format of CUDA tensor cores: "
                             "remove device.tf32 or set device: cuda"});
  expectProblems({shorthand, "device.tf32=true"},
                 {"ptrain: <command line>: device.tf32: true, but device.type is cpu; TF32 is a format of CUDA tensor "
                  "cores: remove device.tf32 or set device: cuda"});
  r = runPtrain({"run", shorthand, "device.tf32=true", "--run-dir", dir.path() + "/run"}, {}, 60);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("device.tf32: true, but device.type is cpu"), std::string::npos) << r.output;
}

// Loss-scale settings that cannot work, and precision names no plugin has:
// exit 2, one line each, pointing at the key.
TEST(CliCheck, PrecisionSettingsThatCannotWorkOneLineEach) {
  TempDir dir;
  std::string fp16 = dir.write("fp16.yaml", std::string(kValid) +
                                                "precision: {name: fp16, initial_loss_scale: 1024, min_loss_scale: 4096}\n");
  expectProblems({fp16}, {"ptrain: " + fp16 +
                          ":5:51: precision.min_loss_scale: 4096 is above precision.initial_loss_scale=1024; the "
                          "dynamic scale starts at the initial one and never goes below the minimum: lower "
                          "min_loss_scale or raise initial_loss_scale"});
  std::string ok = dir.write("ok.yaml", kValid);
  expectProblems({ok, "precision.name=fp16", "precision.loss_scale_window=0", "precision.loss_scale=-1"},
                 {"ptrain: <command line>: precision.loss_scale_window: 0 is out of range; use a value >= 1",
                  "ptrain: <command line>: precision.loss_scale: -1 is out of range; use a value >= 0"});
  expectProblems({ok, "precision.name=bf16", "precision.hysteresis=4", "precision.fp16_lm_cross_entropy=true"},
                 {"ptrain: <command line>: precision.hysteresis: applies to plugin precision/fp16 only, and "
                  "precision.name is bf16; remove it or set precision.name: fp16",
                  "ptrain: <command line>: precision.fp16_lm_cross_entropy: applies to plugin precision/fp16 only, "
                  "and precision.name is bf16; remove it or set precision.name: fp16"});
  test::ProcessResult r = runPtrain({"check", ok, "precision.name=fp61"}, {}, 60);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  ASSERT_EQ(lines(r.output).size(), 1u) << r.output;
  EXPECT_EQ(r.output.rfind("ptrain: <command line>: precision.name: no precision plugin named 'fp61' (did you mean "
                           "'fp16'?); available: ", 0), 0u) << r.output;
  for (const char* known : {"fp32", "bf16", "fp16"}) EXPECT_NE(r.output.find(known), std::string::npos) << r.output;
  expectNoCrashTrace(r.output);
  // Every built-in precision with its own keys passes.
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{"precision.name=bf16"},
        std::vector<std::string>{"precision.name=fp16", "precision.loss_scale=128", "precision.fp16_lm_cross_entropy=true"}}) {
    std::vector<std::string> args{"check", ok};
    args.insert(args.end(), extra.begin(), extra.end());
    r = runPtrain(args, {}, 60);
    EXPECT_EQ(r.exit_code, 0) << r.output;
  }
}

// A plugin declares its own keys: checked and listed (under its name) where
// a recipe uses the plugin, refused with the plugin's name where it does not.
// precision/fp16 is built in; parallel/echo (a fixture executing cp) stands
// for a third party's plugin found on PTRAIN_PLUGIN_PATH.
TEST(CliKeys, APluginsKeysAreCheckedWhereItIsUsedAndRefusedElsewhere) {
  test::ProcessResult r = runPtrain({"keys"}, {}, 60);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const size_t fp16 = r.output.find("keys of plugin precision/fp16:");
  ASSERT_NE(fp16, std::string::npos) << r.output;
  EXPECT_GT(r.output.find("precision.loss_scale ", fp16), fp16) << r.output;
  EXPECT_NE(r.output.find("keys of plugin offload/tiered:"), std::string::npos) << r.output;
  // Not among the core's keys, before the plugins' own lines.
  EXPECT_GT(r.output.find("precision.loss_scale "), fp16) << r.output;

  const std::string echo = "PTRAIN_PLUGIN_PATH=" + std::string(PTRAIN_FIXTURE_DIR) + "/parallel_echo";
  r = runPtrain({"keys"}, {echo}, 60);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const size_t echoKeys = r.output.find("keys of plugin parallel/echo:");
  ASSERT_NE(echoKeys, std::string::npos) << r.output;
  EXPECT_GT(r.output.find("parallel.echo_rounds", echoKeys), echoKeys) << r.output;

  TempDir dir;
  const std::string ok = dir.write("ok.yaml", kValid);
  // The layout does not use cp: the key is refused, naming its plugin.
  r = runPtrain({"check", ok, "parallel.echo_rounds=2"}, {echo}, 60);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(lines(r.output),
            std::vector<std::string>{"ptrain: <command line>: parallel.echo_rounds: applies to plugin parallel/echo "
                                     "only, which executes cp, and this layout does not use it; remove it, or set "
                                     "that size above 1"});
  // Without the plugin installed it is an unknown key.
  r = runPtrain({"check", ok, "parallel.echo_rounds=2"}, {}, 60);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("parallel.echo_rounds: unknown key"), std::string::npos) << r.output;
  // Where the layout uses cp, the plugin's key is checked against its own range.
  r = runPtrain({"check", ok, "parallel.context_parallel_size=2", "parallel.echo_rounds=0"}, {echo}, 60);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(lines(r.output), std::vector<std::string>{"ptrain: <command line>: parallel.echo_rounds: 0 is out of "
                                                      "range; use a value >= 1"});
  expectNoCrashTrace(r.output);
}

// A layout dimension above 1 runs only if a parallel plugin executes it;
// `check` and `run` refuse one that no installed plugin does.
TEST(CliCheck, SizesNoPluginExecutesAreRefused) {
  TempDir dir;
  std::string cp = dir.write("cp.yaml", std::string(kValid) + "parallel:\n  context_parallel_size: 2\n");
  const std::string line = cp + ":6:3: context_parallel_size=2: no installed parallel plugin executes cp; set it to 1";
  expectProblems({cp}, {"ptrain: " + line});
  test::ProcessResult r = runPtrain({"run", cp, "trainer.name=llm", "--run-dir", dir.path() + "/run"}, {}, 60);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(line), std::string::npos) << r.output;
  expectNoCrashTrace(r.output);
  // The expert plugin is built in: a MoE layout over 2 ranks passes.
  std::string ok = dir.write("ok.yaml", kValid);
  r = runPtrain({"check", ok, "--nproc", "2", "model.num_experts=4", "parallel.expert_model_parallel_size=2"}, {}, 60);
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST(CliCheck, LoadErrorsOneLine) {
  TempDir dir;
  std::string missing = dir.path() + "/none.yaml";
  expectProblems({missing}, {"ptrain: recipe not found: " + missing});
  std::string syntax = dir.write("syntax.yaml", "train:\n  steps: 5: 6\n");
  expectProblems({syntax}, {"ptrain: " + syntax +
                            ":2:11: YAML syntax error: illegal map value; check the indentation, colons, quotes and "
                            "brackets there"});
  std::string ok = dir.write("ok.yaml", kValid);
  expectProblems({ok, "foo"}, {"ptrain: <command line>: override 'foo': expected key=value; write it as "
                               "a.b.c=value, e.g. train.steps=100"});
  std::string a = dir.write("a.yaml", "defaults: [b.yaml]\n");
  std::string b = dir.write("b.yaml", "defaults: [a.yaml]\n");
  expectProblems({a}, {"ptrain: " + b + ":1:12: defaults: cycle " + a + " -> " + b + " -> " + a +
                       "; remove one of these defaults"});
}

TEST(CliKeys, ListsEveryCoreKey) {
  test::ProcessResult r = runPtrain({"keys"}, {}, 60);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const char* key : {"train.steps", "parallel.tensor_model_parallel_size", "optimizer.lr_schedule",
                          "communication.timeout_s", "log.progress"}) {
    EXPECT_NE(r.output.find(std::string("\n") + key + " "), std::string::npos) << key;
  }
  // A reserved key that accepts no value is refused when set, never listed.
  EXPECT_EQ(r.output.find("train.eval_batches"), std::string::npos) << r.output;
}

TEST(CliKeys, ListsATrainersOwnKeysOnRequest) {
  test::ProcessResult r = runPtrain({"keys", "--trainer", "llm"}, {}, 60);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const auto own = r.output.find("keys of trainer llm:");
  ASSERT_NE(own, std::string::npos) << r.output;
  for (const char* key : {"data.operations", "data.digits", "model.make_vocab_size_divisible_by", "data.eval_size"}) {
    EXPECT_NE(r.output.find(std::string("\n") + key + " ", own), std::string::npos) << key;
  }
  // Without --trainer only the core keys.
  r = runPtrain({"keys"}, {}, 60);
  EXPECT_EQ(r.output.find("data.digits"), std::string::npos);
  // An unknown trainer is one line, exit 2.
  r = runPtrain({"keys", "--trainer", "lm"}, {}, 60);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("did you mean 'llm'"), std::string::npos) << r.output;
}

// docs/recipes.md carries the key table between markers; it must equal what
// `ptrain keys --markdown` prints, so the documentation cannot drift.
TEST(CliKeys, DocsTableMatchesKeysMarkdown) {
  // Blank lines around the markers keep the markdown readable: both sides are trimmed.
  const std::string table = test::markedSection(test::sourceDir() + "/docs/recipes.md", "keys");
  ASSERT_FALSE(table.empty());
  test::ProcessResult r = runPtrain({"keys", "--markdown"}, {}, 60);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(table, test::trimNewlines(r.output))
      << "docs/recipes.md is out of date: replace the table between the markers with the output of "
         "`ptrain keys --markdown`";
}

// A model whose tensor-parallel layer allocates its weight whole (a fixture
// trainer) cannot build a rank's slice: refused at tp 2 in one line, before
// anything runs; at tp 1 it is fine.
TEST(CliCheck, AModelThatCannotBuildASliceIsRefusedForThatLayout) {
  TempDir tmp;
  const std::string recipe = tmp.write("r.yaml", std::string("trainer: {name: whole_layer}\n"
                                                             "plugins: {paths: [") +
                                                     PTRAIN_FIXTURE_DIR + "/whole_layer]}\n"
                                                     "parallel:\n  tensor_model_parallel_size: 2\n"
                                                     "train: {steps: 1, global_batch_size: 2}\n");
  expectProblems({recipe, "--nproc", "2"},
                 {"ptrain: " + recipe + ":4:3: parallel.tensor_model_parallel_size: the model cannot build a slice of "
                  "parameter 'layer.weight': its layer allocates it whole, so every rank would hold all of it (build "
                  "it from ptrain::nn layers, or register it with nn::splittableParameter)"});
  test::ProcessResult r = runPtrain({"check", recipe, "--nproc", "1", "parallel.tensor_model_parallel_size=1"}, {}, 60);
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

}  // namespace
}  // namespace ptrain
