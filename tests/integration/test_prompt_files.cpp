// A user's own problems (data.name: prompts, JSONL of prompt and answer):
// the llm trainer learns them as it learns the built-in arithmetic (the very
// same losses and exact match when the file holds the generator's problems in
// its order), the GRPO trainer samples and rewards them, and a malformed line
// is one line naming file and line.
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ptrain/datasets/arithmetic.h"
#include "support/test_support.h"

using ptrain::test::runPtrain;
using ptrain::test::TempDir;

namespace {

constexpr int kSteps = 15, kBatch = 16, kEval = 64;

std::string jsonl(const std::vector<std::pair<std::string, std::string>>& items) {
  std::string out;
  for (const auto& [p, a] : items) out += nlohmann::json{{"prompt", p}, {"answer", a}}.dump() + "\n";
  return out;
}

std::vector<double> losses(const std::string& runDir) {
  std::vector<double> out;
  for (const auto& [step, line] : ptrain::test::readTrainingSteps(runDir)) {
    out.push_back(nlohmann::json::parse(line)["loss"].get<double>());
  }
  return out;
}

const char* kModel = R"(trainer:
  name: llm
model:
  num_layers: 2
  hidden_size: 32
  num_attention_heads: 4
train:
  steps: 15
  global_batch_size: 16
  eval_every: 0
  seed: 5
optimizer:
  name: adamw
  lr: 3e-3
)";

}  // namespace

TEST(PromptFiles, TheGeneratorsProblemsAsAFileTrainTheSameModel) {
  TempDir tmp;
  ptrain::datasets::ArithmeticOptions o;
  o.operations = {ptrain::datasets::ArithmeticOp::kAdd};
  o.digits = 2;
  o.seed = 5;
  o.eval_size = kEval;
  o.seq_length = ptrain::datasets::ArithmeticDataset::minSeqLength(o.operations, o.digits);
  ptrain::datasets::ArithmeticDataset generator(o);
  std::vector<std::pair<std::string, std::string>> train, validation;
  for (int s = 0; s < kSteps; ++s) {
    for (int i = 0; i < kBatch; ++i) {
      const auto p = generator.trainProblem(s, i);
      train.emplace_back(p.prompt(), p.answer());
    }
  }
  for (const auto& p : generator.evalProblems()) validation.emplace_back(p.prompt(), p.answer());
  const std::string trainFile = tmp.write("train.jsonl", jsonl(train));
  const std::string validFile = tmp.write("valid.jsonl", jsonl(validation));

  const std::string arithmetic = tmp.write("a.yaml", std::string("name: a\n") + kModel +
                                                         "data:\n  name: arithmetic\n  operations: [add]\n  digits: 2\n"
                                                         "  eval_size: 64\n");
  const std::string files =
      tmp.write("p.yaml", std::string("name: p\n") + kModel + "model.seq_length: " + std::to_string(o.seq_length) +
                              "\ndata:\n  name: prompts\n  path: [" + trainFile + "]\n  validation_path: " + validFile +
                              "\n  shuffle: false\n");
  auto r = runPtrain({"run", arithmetic, "--nproc", "1", "--run-dir", tmp.path() + "/a"}, {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = runPtrain({"run", files, "--nproc", "2", "--run-dir", tmp.path() + "/p"}, {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto a = losses(tmp.path() + "/a"), p = losses(tmp.path() + "/p");
  ASSERT_EQ(a.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(p.size(), a.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_LT(ptrain::test::relDiff(p[i], a[i]), 1e-5) << "step " << i + 1;
  const auto ea = nlohmann::json::parse(ptrain::test::readLastEvaluation(tmp.path() + "/a"));
  const auto ep = nlohmann::json::parse(ptrain::test::readLastEvaluation(tmp.path() + "/p"));
  EXPECT_EQ(ea["eval_exact_match"], ep["eval_exact_match"]);
  EXPECT_LT(ptrain::test::relDiff(ea["eval_loss"].get<double>(), ep["eval_loss"].get<double>()), 1e-5);
}

TEST(PromptFiles, GrpoRewardsTheFilesAnswersAndBadLinesAreOneLine) {
  TempDir tmp;
  std::vector<std::pair<std::string, std::string>> items;
  for (int a = 10; a < 40; ++a) items.emplace_back(std::to_string(a) + "*3=", std::to_string(a * 3));
  const std::string file = tmp.write("math.jsonl", jsonl(items));
  const std::string recipe = tmp.write("g.yaml", R"(name: g
trainer:
  name: llm_grpo
model:
  num_layers: 1
  hidden_size: 32
  num_attention_heads: 4
data:
  name: prompts
  path: [)" + file + R"(]
  validation_path: )" + file + R"(
  train_batch_size: 4
actor_rollout_ref:
  actor:
    ppo_mini_batch_size: 4
  rollout:
    n: 2
algorithm:
  dump_rollouts: 2
train:
  steps: 2
  global_batch_size: 8
  eval_every: 0
optimizer:
  name: adamw
  lr: 1e-3
)");
  auto r = runPtrain({"run", recipe, "--nproc", "1", "--run-dir", tmp.path() + "/g"}, {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::set<std::string> prompts, answers;
  for (const auto& [p, a] : items) {
    prompts.insert(p);
    answers.insert(a);
  }
  std::ifstream dump(tmp.path() + "/g/rollouts.jsonl");
  std::string line;
  int lines = 0;
  while (std::getline(dump, line)) {
    const auto j = nlohmann::json::parse(line);
    EXPECT_TRUE(prompts.count(j["prompt"].get<std::string>())) << line;
    EXPECT_TRUE(answers.count(j["answer"].get<std::string>())) << line;
    ++lines;
  }
  EXPECT_EQ(lines, 2 * 4 * 2);

  const std::string bad = tmp.write("bad.jsonl", jsonl({{"1+1=", "2"}, {"two+two=", "4"}}));
  r = runPtrain({"check", recipe, "data.path=[" + bad + "]"}, {}, 60);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(bad + ":2: prompt holds 't', which the GPT's arithmetic vocabulary lacks"), std::string::npos)
      << r.output;

  // Without data.validation_path there is no evaluation (docs/data.md), not an error.
  std::string withoutValidation = ptrain::test::readFile(recipe);
  const std::string validationLine = "  validation_path: " + file + "\n";
  ASSERT_NE(withoutValidation.find(validationLine), std::string::npos);
  withoutValidation.erase(withoutValidation.find(validationLine), validationLine.size());
  const std::string noEval = tmp.write("no_eval.yaml", withoutValidation);
  r = runPtrain({"check", noEval}, {}, 60);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("validation_path"), std::string::npos) << r.output;

  // A prompt of 100003 characters makes a model.seq_length of 100004 that no
  // host holds: the refusal names the line that set it and the key that bounds it.
  const std::string longFile =
      tmp.write("long.jsonl", "{\"prompt\": \"1+1=\", \"answer\": \"2\"}\n{\"prompt\": \"" +
                                  std::string(100000, '1') + "+1=\", \"answer\": \"2\"}\n");
  r = runPtrain({"check", recipe, "data.path=[" + longFile + "]"}, {}, 120);
  EXPECT_EQ(r.exit_code, 3) << r.output.substr(0, 2000);
  EXPECT_NE(r.output.find("is predicted to need"), std::string::npos) << r.output.substr(0, 2000);
  EXPECT_NE(r.output.find("; model.seq_length 100004 comes from the longest problem, " + longFile +
                          ":2 (100005 tokens with its EOS): set model.seq_length to bound it"),
            std::string::npos)
      << r.output.substr(0, 2000);

  // A byte that is not UTF-8 is named as that, with its line, column and
  // offset in the file (line 1 is 33 bytes and its newline).
  const std::string latin1 = tmp.write("latin1.jsonl", "{\"prompt\": \"1+1=\", \"answer\": \"2\"}\n"
                                                       "{\"prompt\": \"2+2\xff=\", \"answer\": \"4\"}\n");
  r = runPtrain({"check", recipe, "data.path=[" + latin1 + "]"}, {}, 60);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("data.path: " + latin1 + ":2:16: not UTF-8 (byte 0xFF at offset 49 of the file); save it as "
                          "UTF-8 text"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("not a JSON object"), std::string::npos) << r.output;
}
