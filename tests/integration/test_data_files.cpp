// Training from a user's files: `ptrain data prepare` makes a Megatron
// indexed data set from text Debian ships (its license texts), the llm
// trainer reads it (data.name: megatron) at any layout with the one-rank
// losses, a resume continues the same sample order exactly, and damaged or
// changed files are refused in one line.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/test_support.h"

namespace fs = std::filesystem;
using ptrain::test::runPtrain;
using ptrain::test::TempDir;

namespace {

const std::vector<std::string> kCorpus = {"/usr/share/common-licenses/GPL-3", "/usr/share/common-licenses/GPL-2",
                                          "/usr/share/common-licenses/LGPL-2.1",
                                          "/usr/share/common-licenses/Apache-2.0"};

std::string recipe(const TempDir& tmp, const std::string& prefix) {
  return tmp.write("files.yaml", R"(name: gpt_files
trainer:
  name: llm
model:
  num_layers: 2
  hidden_size: 32
  num_attention_heads: 4
  seq_length: 32
data:
  name: megatron
  path: [)" + prefix + R"(]
  split: "949,50,1"
  eval_size: 32
train:
  steps: 12
  global_batch_size: 8
  eval_every: 0
  seed: 7
optimizer:
  name: adamw
  lr: 3e-3
checkpoint:
  every: 6
)");
}

std::vector<double> losses(const std::string& runDir) {
  std::vector<double> out;
  for (const auto& [step, line] : ptrain::test::readTrainingSteps(runDir)) {
    out.push_back(nlohmann::json::parse(line)["loss"].get<double>());
  }
  return out;
}

}  // namespace

TEST(DataFiles, PreparedTextTrainsAtAnyLayoutAndResumesExactly) {
  TempDir tmp;
  const std::string prefix = tmp.path() + "/data/licenses";
  std::vector<std::string> args = {"data", "prepare"};
  args.insert(args.end(), kCorpus.begin(), kCorpus.end());
  args.insert(args.end(), {"--output", prefix, "--vocab-size", "500"});
  auto r = runPtrain(args, {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(prefix + ".bin/.idx: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" tokens, vocabulary 500 ("), std::string::npos) << r.output;
  for (const char* ext : {".bin", ".idx", ".json", ".model", ".vocab"}) EXPECT_TRUE(fs::exists(prefix + ext)) << ext;
  // SentencePiece's own log stays quiet (its "Running command" line included).
  EXPECT_EQ(r.output.find("Running command"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("trainer_interface.cc"), std::string::npos) << r.output;

  const std::string file = recipe(tmp, prefix);
  const std::string one = tmp.path() + "/one";
  r = runPtrain({"run", file, "--nproc", "1", "--run-dir", one}, {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<double> reference = losses(one);
  ASSERT_EQ(reference.size(), 12u);
  // The vocabulary came from the data set's metadata: a fresh model's loss is ln(500).
  EXPECT_NEAR(reference.front(), std::log(500.0), 0.3);
  EXPECT_LT(reference.back(), reference.front() - 0.5);

  // Two data-parallel ranks, and tensor parallelism: the same rows, the same losses.
  for (const std::vector<std::string>& layout :
       {std::vector<std::string>{"--nproc", "2"},
        std::vector<std::string>{"--nproc", "2", "parallel.tensor_model_parallel_size=2"}}) {
    const std::string dir = tmp.path() + "/l" + std::to_string(layout.size());
    std::vector<std::string> a = {"run", file, "--run-dir", dir};
    a.insert(a.end(), layout.begin(), layout.end());
    r = runPtrain(a, {}, 300);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::vector<double> got = losses(dir);
    ASSERT_EQ(got.size(), reference.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_LT(ptrain::test::relDiff(got[i], reference[i]), 1e-4) << i;
  }

  // Stopped at step 6 and resumed: steps 7..12 as the uninterrupted run.
  const std::string cut = tmp.path() + "/cut";
  r = runPtrain({"run", file, "--nproc", "1", "train.steps=12", "--run-dir", cut}, {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  fs::remove_all(cut + "/checkpoints/step_12");
  std::ofstream(cut + "/metrics.jsonl", std::ios::trunc).close();
  r = runPtrain({"run", "--resume", "--run-dir", cut, "--nproc", "1"}, {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<double> resumed = losses(cut);
  ASSERT_EQ(resumed.size(), 6u) << r.output;
  for (size_t i = 0; i < resumed.size(); ++i) EXPECT_EQ(resumed[i], reference[6 + i]) << "step " << 7 + i;
  const auto meta = nlohmann::json::parse(ptrain::test::readFile(cut + "/checkpoints/step_12/meta.json"));
  EXPECT_EQ(meta["data"]["consumed_samples"].get<int64_t>(), 12 * 8);
  EXPECT_EQ(meta["data"]["source"], "megatron");

  // The files changed under the run: its resume is refused, naming why.
  fs::remove_all(cut + "/checkpoints/step_12");
  {
    std::ofstream bin(prefix + ".bin", std::ios::binary | std::ios::in | std::ios::out);
    bin.seekp(0);
    bin.put('\x05');
  }
  fs::last_write_time(prefix + ".bin", fs::last_write_time(prefix + ".bin") + std::chrono::seconds(5));
  r = runPtrain({"run", "--resume", "--run-dir", cut, "--nproc", "1"}, {}, 300);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("meta.json: the data files changed since the checkpoint"), std::string::npos) << r.output;
}

TEST(DataFiles, DamagedFilesAndBadInputsAreOneLine) {
  TempDir tmp;
  const std::string prefix = tmp.path() + "/d";
  auto r = runPtrain({"data", "prepare", kCorpus[0], "--output", prefix, "--vocab-size", "300"}, {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string file = recipe(tmp, prefix);
  // A truncated index: check names the file and the byte.
  fs::resize_file(prefix + ".idx", fs::file_size(prefix + ".idx") - 5);
  r = runPtrain({"check", file}, {}, 60);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("data.path: " + prefix + ".idx: byte "), std::string::npos) << r.output;
  // A vocabulary too small for the data set's ids.
  r = runPtrain({"data", "prepare", kCorpus[0], "--output", prefix, "--vocab-size", "300"}, {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = runPtrain({"check", file, "model.vocab_size=100"}, {}, 60);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("model.vocab_size: 100 is smaller than the data set's vocabulary (300)"), std::string::npos)
      << r.output;
  // Keys of the other source are refused, not ignored.
  r = runPtrain({"check", file, "data.digits=3"}, {}, 60);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("data.digits: is read only with data.name: arithmetic"), std::string::npos) << r.output;
  // A JSONL line that is not an object: file and line.
  const std::string jsonl = tmp.write("docs.jsonl", "{\"text\": \"one document\"}\n{\"text\": 3}\n");
  r = runPtrain({"data", "prepare", jsonl, "--output", tmp.path() + "/j", "--vocab-size", "20"}, {}, 60);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(jsonl + ":2: no string field \"text\""), std::string::npos) << r.output;
  // A line in Latin-1, not UTF-8: the byte, its column and its offset in the file.
  const std::string latin1 = tmp.write("latin1.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"caf\xe9\"}\n");
  r = runPtrain({"data", "prepare", latin1, "--output", tmp.path() + "/l", "--vocab-size", "20"}, {}, 60);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("ptrain: " + latin1 + ":2:14: not UTF-8 (byte 0xE9 at offset 28 of the file)"),
            std::string::npos)
      << r.output;
}
