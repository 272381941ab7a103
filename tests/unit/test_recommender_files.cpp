// The recommender's data from files (trainers/recommender/click_files.h):
// the synthetic clicks exported as Criteo TSV read back as the generator's
// batches bit for bit (plain and gzip), a rank reads only its rows, the
// shuffled order is a seeded per-epoch permutation of blocks, and bad files
// or keys are refused in one line.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "../../trainers/recommender/recommender_trainer.h"
#include "ptrain/core/error.h"
#include "ptrain/recipe/recipe.h"
#include "ptrain/recipe/schema.h"
#include "support/test_support.h"

namespace fs = std::filesystem;
using namespace ptrain;
using recommender::RecommenderTrainer;

namespace {

// Tables scaled to 50 rows, a history of 6; 4 steps of 16 samples.
const char* kRecipe = R"(
name: rec_files
trainer: {name: recommender}
model: {embedding_dim: 4, bottom_mlp: [8], top_mlp: [8], attention_hidden: 4, hidden_size: 8, ffn_hidden_size: 8,
        scale: 0.001, min_table_rows: 50}
data: {name: clicks, history_length: 6, eval_size: 40}
train: {steps: 4, global_batch_size: 16, seed: 3}
)";

std::unique_ptr<RecommenderTrainer> setUp(const std::string& recipePath, const std::vector<std::string>& overrides) {
  auto trainer = std::make_unique<RecommenderTrainer>(PluginContext{});
  Schema schema;
  describeCoreKeys(schema);
  trainer->describeKeys(schema);
  Recipe recipe = Recipe::load(recipePath, overrides);
  recipe.validate(schema);
  trainer->setup(recipe);
  return trainer;
}

std::vector<std::string> filesOverrides(const std::string& train, std::vector<std::string> more = {}) {
  std::vector<std::string> o = {"data.name=criteo", "data.path=" + train,
                                "data.validation_path=" + recommender::validationPathFor(train)};
  o.insert(o.end(), more.begin(), more.end());
  return o;
}

// Every tensor of `files` equals the generator's of the same name.
void expectSameBatch(const Batch& generator, const Batch& files, const std::string& what) {
  EXPECT_EQ(files.tensors.size() + 1, generator.tensors.size()) << what;  // less "probabilities"
  for (const auto& [name, t] : files.tensors) {
    ASSERT_TRUE(generator.tensors.count(name)) << what << ": " << name;
    EXPECT_TRUE(torch::equal(t, generator.at(name))) << what << ": " << name;
  }
}

std::string oneLineError(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    const std::string s = e.what();
    EXPECT_EQ(s.find('\n'), std::string::npos) << s;
    return s;
  }
  ADD_FAILURE() << "no ConfigError";
  return "";
}

}  // namespace

TEST(RecommenderFiles, ExportReadsBackAsTheGeneratorsBatchesBitForBit) {
  test::TempDir tmp;
  const std::string recipe = tmp.write("rec.yaml", kRecipe);
  auto generator = setUp(recipe, {});
  for (const std::string name : {"clicks_train.tsv", "clicks_train.tsv.gz"}) {
    const std::string out = tmp.path() + "/" + name;
    generator->exportData("clicks", out, 0, 0);
    ASSERT_TRUE(fs::exists(out));
    ASSERT_TRUE(fs::exists(recommender::validationPathFor(out)));
    auto files = setUp(recipe, filesOverrides(out, {"data.shuffle=false"}));
    ASSERT_NE(files->files(), nullptr);
    EXPECT_EQ(files->files()->trainRecords(), 4 * 16);
    EXPECT_EQ(files->files()->validationRecords(), 40);
    EXPECT_EQ(files->files()->trainFile().indexInfo().gzip, name.size() > 4 && name.substr(name.size() - 3) == ".gz");
    for (int64_t step = 0; step < 4; ++step) {
      expectSameBatch(generator->globalBatch(step, 16), files->globalBatch(step, 16), name + " step " + std::to_string(step));
      expectSameBatch(generator->batchRows(step, 16, 5, 13), files->batchRows(step, 16, 5, 13),
                      name + " rows 5..13 of step " + std::to_string(step));
    }
    expectSameBatch(generator->dataset().batch(datasets::ClicksSplit::kValidation, 0, 40),
                    files->files()->validationRows(0, 40), name + " validation");
    // A second export to the same place is refused, naming the file.
    const std::string again = oneLineError([&] { generator->exportData("clicks", out, 0, 0); });
    EXPECT_NE(again.find(out + ": exists"), std::string::npos) << again;
  }
  // A recipe that reads files has nothing to export.
  auto files = setUp(recipe, filesOverrides(tmp.path() + "/clicks_train.tsv"));
  EXPECT_NE(oneLineError([&] { files->exportData("clicks", tmp.path() + "/x.tsv", 0, 0); }).find("data.name: criteo"),
            std::string::npos);
}

TEST(RecommenderFiles, ValidationFileIsNamedAfterTheTrainingFile) {
  EXPECT_EQ(recommender::validationPathFor("data/clicks_train.tsv.gz"), "data/clicks_validation.tsv.gz");
  EXPECT_EQ(recommender::validationPathFor("data/clicks.tsv"), "data/clicks.validation.tsv");
  EXPECT_EQ(recommender::validationPathFor("clicks.tsv.gz"), "clicks.validation.tsv.gz");
  EXPECT_EQ(recommender::validationPathFor("/a/train_dir/c.gz"), "/a/train_dir/c.validation.gz");
}

TEST(RecommenderFiles, ARankReadsOnlyItsRows) {
  test::TempDir tmp;
  const std::string recipe = tmp.write("rec.yaml", kRecipe);
  const std::string out = tmp.path() + "/clicks_train.tsv";
  setUp(recipe, {})->exportData("clicks", out, 0, 0);
  for (const char* shuffle : {"data.shuffle=false", "data.shuffle=true"}) {
    auto trainer = setUp(recipe, filesOverrides(out, {shuffle, "data.shuffle_block=8"}));
    const recommender::ClickFiles& f = *trainer->files();
    uint64_t bothRanks = 0;
    for (int64_t rank = 0; rank < 2; ++rank) {
      const_cast<datasets::CriteoDataset&>(f.trainFile()).resetReadStats();
      const int64_t begin = rank * 8, end = begin + 8;
      trainer->batchRows(2, 16, begin, end);
      uint64_t expected = 0;
      for (int64_t r = begin; r < end; ++r) {
        const auto bytes = f.trainFile().recordBytes(f.recordOf(2 * 16 + r), 1);
        expected += bytes.second - bytes.first;
      }
      const datasets::CriteoReadStats stats = f.trainFile().readStats();
      // Exactly the rank's records' bytes (a plain file reads runs with pread).
      EXPECT_EQ(stats.data_bytes_read, expected) << shuffle << " rank " << rank;
      if (std::string(shuffle) == "data.shuffle=false") {
        EXPECT_EQ(stats.reads, 1u);
      }
      bothRanks += stats.data_bytes_read;
    }
    const auto whole = f.trainFile().recordBytes(0, f.trainRecords());
    EXPECT_LT(bothRanks, whole.second - whole.first) << shuffle;
  }
}

TEST(RecommenderFiles, ShuffledOrderIsASeededPermutationOfBlocksPerEpoch) {
  test::TempDir tmp;
  const std::string recipe = tmp.write("rec.yaml", kRecipe);
  const std::string out = tmp.path() + "/clicks_train.tsv";
  setUp(recipe, {})->exportData("clicks", out, 60, 0);  // 60 records: blocks of 8, the last of 4
  const std::vector<std::string> keys = {"data.shuffle_block=8", "data.eval_size=0"};
  std::vector<std::string> withoutValidation = {"data.name=criteo", "data.path=" + out};
  withoutValidation.insert(withoutValidation.end(), keys.begin(), keys.end());
  auto a = setUp(recipe, withoutValidation);
  auto again = setUp(recipe, withoutValidation);
  auto other = withoutValidation;
  other.push_back("train.seed=4");
  auto b = setUp(recipe, other);
  std::vector<int64_t> epoch0, epoch1, seed4;
  for (int64_t i = 0; i < 60; ++i) {
    epoch0.push_back(a->files()->recordOf(i));
    epoch1.push_back(a->files()->recordOf(60 + i));
    seed4.push_back(b->files()->recordOf(i));
    EXPECT_EQ(again->files()->recordOf(i), epoch0.back());
  }
  for (const auto* order : {&epoch0, &epoch1, &seed4}) {
    EXPECT_EQ(std::set<int64_t>(order->begin(), order->end()).size(), 60u);
  }
  EXPECT_NE(epoch0, epoch1);
  EXPECT_NE(epoch0, seed4);
  // Runs of consecutive positions stay within one block of the file.
  int64_t blockChanges = 0;
  for (size_t i = 1; i < epoch0.size(); ++i) blockChanges += epoch0[i] / 8 != epoch0[i - 1] / 8;
  EXPECT_EQ(blockChanges, 7);
  // The batches are the order's records.
  Batch rows = a->batchRows(1, 16, 0, 16);
  Batch inOrder = setUp(recipe, {"data.name=criteo", "data.path=" + out, "data.eval_size=0", "data.shuffle=false"})
                      ->globalBatch(0, 60);
  for (int64_t r = 0; r < 16; ++r) {
    EXPECT_TRUE(torch::equal(rows.at("sparse")[r], inOrder.at("sparse")[epoch0[static_cast<size_t>(16 + r)]]));
  }
}

TEST(RecommenderFiles, BadFilesAndKeysAreRefusedInOneLine) {
  test::TempDir tmp;
  const std::string recipe = tmp.write("rec.yaml", kRecipe);
  const std::string out = tmp.path() + "/clicks_train.tsv";
  setUp(recipe, {})->exportData("clicks", out, 20, 10);
  auto refusal = [&](const std::vector<std::string>& overrides) {
    return oneLineError([&] { setUp(recipe, overrides); });
  };
  std::string e = refusal(filesOverrides(tmp.path() + "/missing.tsv"));
  EXPECT_NE(e.find("data.path: " + tmp.path() + "/missing.tsv: no such file"), std::string::npos) << e;
  e = refusal(filesOverrides(out, {"data.history_length=4"}));
  EXPECT_NE(e.find("carry 6 history columns but data.history_length is 4"), std::string::npos) << e;
  e = refusal(filesOverrides(out, {"data.zipf_exponent=1.3"}));
  EXPECT_NE(e.find("data.zipf_exponent: is read only with data.name: clicks"), std::string::npos) << e;
  e = refusal({"data.path=" + out});
  EXPECT_NE(e.find("data.path: is read only with data.name: criteo"), std::string::npos) << e;
  e = refusal({"data.name=criteo"});
  EXPECT_NE(e.find("data.path: not set"), std::string::npos) << e;
  e = refusal({"data.name=criteo", "data.path=" + out});
  EXPECT_NE(e.find("data.validation_path: not set"), std::string::npos) << e;
  // A line of 39 columns, found by the index scan.
  const std::string bad = tmp.path() + "/bad_train.tsv";
  {
    std::ifstream in(out);
    std::ofstream o(bad);
    std::string line;
    for (int i = 0; std::getline(in, line); ++i) o << (i == 3 ? line.substr(0, line.find('\t')) : line) << "\n";
  }
  fs::copy_file(recommender::validationPathFor(out), recommender::validationPathFor(bad));
  e = refusal(filesOverrides(bad));
  EXPECT_NE(e.find("data.path: " + bad + ":4:"), std::string::npos) << e;
}

TEST(RecommenderFiles, PositionRecordsTheFilesAndRefusesAChangedOne) {
  test::TempDir tmp;
  const std::string recipe = tmp.write("rec.yaml", kRecipe);
  const std::string out = tmp.path() + "/clicks_train.tsv";
  setUp(recipe, {})->exportData("clicks", out, 0, 0);
  auto trainer = setUp(recipe, filesOverrides(out));
  const nlohmann::json saved = trainer->dataPosition(2, 16);
  EXPECT_EQ(saved["source"], "criteo");
  EXPECT_EQ(saved["consumed_samples"].get<int64_t>(), 32);
  EXPECT_EQ(saved["shuffle"], true);
  EXPECT_FALSE(trainer->checkDataPosition(saved, 2, 16).has_value());
  EXPECT_TRUE(trainer->checkDataPosition(saved, 2, 8).has_value());
  auto unshuffled = setUp(recipe, filesOverrides(out, {"data.shuffle=false"}));
  auto why = unshuffled->checkDataPosition(saved, 2, 16);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("shuffle was true and is false"), std::string::npos) << *why;
  fs::last_write_time(out, fs::last_write_time(out) + std::chrono::seconds(5));
  why = trainer->checkDataPosition(saved, 2, 16);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("the data files changed since the checkpoint"), std::string::npos) << *why;
  // The generator's run has no position; resuming it from files is refused.
  auto generator = setUp(recipe, {});
  EXPECT_TRUE(generator->dataPosition(2, 16).is_null());
  EXPECT_TRUE(generator->checkDataPosition(saved, 2, 16).has_value());
  EXPECT_TRUE(trainer->checkDataPosition(nullptr, 2, 16).has_value());
}
