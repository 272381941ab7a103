// The out-of-tree trainer of docs/writing_a_trainer.md: build
// docs/examples/regression_trainer against an install of this tree with
// find_package(ptrain) only, load it through PTRAIN_PLUGIN_PATH, and train
// it on one rank, at dp 2 and at pp 2: every layout trains the one-rank model
// (loss within 1e-5 at step 1 and 1e-4 at every step, eval_loss within 1e-4).
// Its keys are the ones it declares: any other model.* key is refused.
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/test_support.h"

namespace fs = std::filesystem;
using ptrain::test::readFile;
using ptrain::test::relDiff;
using ptrain::test::runProcess;
using ptrain::test::TempDir;

namespace {

// The cmake that configured this build: `cmake --install` must match it.
const std::string kCmake = PTRAIN_CMAKE_COMMAND;
constexpr int kSteps = 20;

std::string exampleDir() { return ptrain::test::sourceDir() + "/docs/examples/regression_trainer"; }

// Training lines (by step) and evaluation lines (by step) of a run folder.
std::map<int, nlohmann::json> trainingSteps(const std::string& runDir) {
  std::map<int, nlohmann::json> out;
  for (const auto& [step, text] : ptrain::test::readTrainingSteps(runDir)) out[step] = nlohmann::json::parse(text);
  return out;
}

std::map<int, double> evalLosses(const std::string& runDir) {
  std::map<int, double> out;
  std::istringstream lines(readFile(runDir + "/metrics.jsonl"));
  for (std::string line; std::getline(lines, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("eval_loss")) out[j["step"].get<int>()] = j["eval_loss"].get<double>();
  }
  return out;
}

// "VERSION PATH" of plugin kind/name in the output of `ptrain plugins`; "" when it is not listed.
std::string listed(const std::string& output, const std::string& kind, const std::string& name) {
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream fields(line);
    std::string k, n, version, path;
    if (fields >> k >> n >> version >> path && k == kind && n == name) return version + " " + path;
  }
  return "";
}

}  // namespace

PTRAIN_LONG_TEST(OutOfTreeTrainer, BuildsAgainstTheInstalledSdkAndTrainsAlikeAtDp2AndPp2) {
  // About 50 s, most of it compiling the example against the install: once
  // per CI run (the Debian suite) is enough.
  TempDir tmp;
  const std::string prefix = fs::path(tmp.path() + "/prefix").lexically_normal().string();
  auto r = runProcess({kCmake, "--install", ptrain::test::binaryDir(), "--prefix", prefix}, {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;

  // The example against the installed package alone.
  const std::string build = tmp.path() + "/build";
  r = runProcess({kCmake, "-S", exampleDir(), "-B", build, "-DCMAKE_PREFIX_PATH=" + prefix,
                  "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON"},
                 {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = runProcess({kCmake, "--build", build, "--parallel", "2"}, {}, 600);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Compiled with the installed SDK headers, none of the tree's.
  const std::string commands = readFile(build + "/compile_commands.json");
  EXPECT_NE(commands.find("regression_trainer.cpp"), std::string::npos) << commands;
  EXPECT_NE(commands.find(prefix + "/include"), std::string::npos) << commands;
  EXPECT_EQ(commands.find(ptrain::test::sourceDir() + "/framework"), std::string::npos) << commands;
  EXPECT_EQ(commands.find(ptrain::test::sourceDir() + "/trainers"), std::string::npos) << commands;

  // The installed ptrain, the example's plugin folder, nothing from the build tree.
  const std::string ptrain = prefix + "/bin/ptrain";
  const std::vector<std::string> env{"PTRAIN_PLUGIN_PATH=" + build + "/plugins", "LD_LIBRARY_PATH=",
                                     "OMP_NUM_THREADS=1"};
  r = runProcess({ptrain, "plugins"}, env);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(listed(r.output, "trainer", "regression"), "0.1.0 " + build + "/plugins/libptrain_trainer_regression.so")
      << r.output;

  // A key the trainer does not declare is refused: one line naming it.
  const std::string recipe = exampleDir() + "/regression.yaml";
  r = runProcess({ptrain, "check", recipe, "model.num_attention_heads=4"}, env);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(ptrain::test::trimNewlines(r.output).find('\n'), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("model.num_attention_heads"), std::string::npos) << r.output;

  // One rank, dp 2, pp 2: 20 steps of the recipe's 64 rows in micro-batches
  // of 8 (4 per rank at dp 2), evaluated at steps 10 and 20.
  const std::vector<std::string> shortRun{"train.steps=" + std::to_string(kSteps), "train.micro_batch_size=8",
                                          "train.eval_every=10", "optimizer.warmup_steps=2", "train.log_every=10"};
  auto train = [&](const std::string& name, const std::string& nproc, const std::string& pp) {
    std::vector<std::string> args{ptrain, "run", recipe, "--nproc", nproc, "--run-dir", tmp.path() + "/" + name,
                                  "parallel.pipeline_model_parallel_size=" + pp};
    args.insert(args.end(), shortRun.begin(), shortRun.end());
    return runProcess(args, env, 300);
  };
  r = train("one_rank", "1", "1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto ref = trainingSteps(tmp.path() + "/one_rank");
  const auto refEval = evalLosses(tmp.path() + "/one_rank");
  ASSERT_EQ(ref.size(), static_cast<size_t>(kSteps)) << r.output;
  ASSERT_EQ(refEval.size(), 2u) << r.output;
  EXPECT_LT(ref.at(kSteps)["loss"].get<double>(), 0.7 * ref.at(1)["loss"].get<double>()) << "the loss decreases";
  EXPECT_LT(refEval.at(20), refEval.at(10)) << "the evaluation loss decreases";

  for (const auto& [name, pp] : std::vector<std::pair<std::string, std::string>>{{"dp2", "1"}, {"pp2", "2"}}) {
    r = train(name, "2", pp);
    ASSERT_EQ(r.exit_code, 0) << name << "\n" << r.output;
    const auto got = trainingSteps(tmp.path() + "/" + name);
    ASSERT_EQ(got.size(), static_cast<size_t>(kSteps)) << name << "\n" << r.output;
    EXPECT_LT(relDiff(got.at(1)["loss"], ref.at(1)["loss"]), 1e-5) << name << " step 1";
    for (int step = 1; step <= kSteps; ++step) {
      EXPECT_LT(relDiff(got.at(step)["loss"], ref.at(step)["loss"]), 1e-4) << name << " step " << step;
    }
    const auto gotEval = evalLosses(tmp.path() + "/" + name);
    ASSERT_EQ(gotEval.size(), 2u) << name;
    for (const auto& [step, loss] : refEval) {
      EXPECT_LT(relDiff(gotEval.at(step), loss), 1e-4) << name << " eval " << step;
    }
  }
}
