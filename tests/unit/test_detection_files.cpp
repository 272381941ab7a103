// The detection trainer's data from a COCO folder (data.name: coco,
// trainers/detection/coco_source.h): the mosaics exported as files give the
// generator's batches bit for bit, a data-parallel rank opens only its own
// images, and the shuffled order is a seeded permutation per epoch.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "ptrain/recipe/recipe.h"
#include "ptrain/recipe/schema.h"
#include "support/test_support.h"
#include "../../trainers/detection/detection_trainer.h"

namespace fs = std::filesystem;
using ptrain::PluginContext;
using ptrain::Recipe;
using ptrain::Schema;
using ptrain::detection::DetectionTrainer;
using ptrain::test::TempDir;

namespace {

constexpr int64_t kGlobal = 8;

// 64x64 canvases with up to 3 items; `data` is the recipe's data section.
void setUp(DetectionTrainer& trainer, const std::string& data, const std::vector<std::string>& overrides = {}) {
  Schema schema;
  ptrain::describeCoreKeys(schema);
  trainer.describeKeys(schema);
  Recipe recipe = Recipe::fromString(
      "trainer: {name: detection}\n"
      "model: {num_layers: 1, hidden_size: 16, ffn_hidden_size: 16, stem_channels: 8}\n"
      "data: " + data + "\n"
      "train: {steps: 3, global_batch_size: 8, seed: 7}\n",
      "<test>", overrides);
  recipe.validate(schema);
  trainer.setup(recipe);
}

const char* kMosaicData = "{name: mosaic, canvas: 64, max_items: 3, min_scale: 0.75, max_scale: 1.25, eval_size: 8}";

std::string cocoData(const std::string& path, bool shuffle) {
  return "{name: coco, canvas: 64, path: " + path + ", max_boxes: 3, eval_size: 8, shuffle: " +
         (shuffle ? "true" : "false") + "}";
}

void expectSameBatch(const ptrain::Batch& want, const ptrain::Batch& got, const std::string& what) {
  ASSERT_EQ(want.tensors.size(), got.tensors.size()) << what;
  for (const auto& [name, tensor] : want.tensors) {
    ASSERT_TRUE(got.tensors.count(name)) << what << ": " << name;
    EXPECT_EQ(tensor.scalar_type(), got.at(name).scalar_type()) << what << ": " << name;
    EXPECT_TRUE(torch::equal(tensor, got.at(name))) << what << ": " << name << " differs";
  }
}

// The mosaics of the recipe above exported once per test program: 24
// training canvases (3 steps of 8) and 8 validation canvases.
const std::string& exported() {
  static TempDir tmp;
  static const std::string out = [] {
    DetectionTrainer generator{PluginContext{}};
    setUp(generator, kMosaicData);
    const std::string path = tmp.path() + "/coco";
    generator.exportData("mosaic", path, 0, 0);
    return path;
  }();
  return out;
}

}  // namespace

TEST(DetectionFiles, ExportedMosaicsGiveTheGeneratorsBatchesBitForBit) {
  const std::string folder = exported();
  EXPECT_TRUE(fs::exists(folder + "/annotations/instances_train.json"));
  EXPECT_TRUE(fs::exists(folder + "/annotations/instances_validation.json"));
  EXPECT_TRUE(fs::exists(folder + "/images/mosaic_train_000023.png"));
  EXPECT_TRUE(fs::exists(folder + "/images/mosaic_validation_000007.png"));
  EXPECT_FALSE(fs::exists(folder + "/images/mosaic_train_000024.png"));

  DetectionTrainer generator{PluginContext{}};
  setUp(generator, kMosaicData);
  DetectionTrainer files{PluginContext{}};
  setUp(files, cocoData(folder, false));
  ASSERT_NE(files.cocoSource(), nullptr);
  EXPECT_EQ(files.cocoSource()->trainSize(), 24);
  EXPECT_EQ(files.cocoSource()->validationSize(), 8);
  for (int64_t step = 0; step < 3; ++step) {
    expectSameBatch(generator.globalBatch(step, kGlobal), files.globalBatch(step, kGlobal),
                    "step " + std::to_string(step));
    expectSameBatch(generator.batchRows(step, kGlobal, 3, 7), files.batchRows(step, kGlobal, 3, 7),
                    "rows 3..7 of step " + std::to_string(step));
  }
  // Past the 24 images the order starts again (epoch 1, file order).
  expectSameBatch(files.globalBatch(0, kGlobal), files.globalBatch(3, kGlobal), "epoch 1");
}

TEST(DetectionFiles, RankOpensOnlyItsOwnImages) {
  DetectionTrainer files{PluginContext{}};
  setUp(files, cocoData(exported(), true));
  const auto* source = files.cocoSource();
  ASSERT_EQ(source->trainImagesOpened(), 0);  // setup stats the files, reads none
  files.batchRows(1, kGlobal, 2, 5);
  EXPECT_EQ(source->trainImagesOpened(), 3);
  EXPECT_EQ(source->validationImagesOpened(), 0);
  files.batchRows(2, kGlobal, 4, 8);
  EXPECT_EQ(source->trainImagesOpened(), 7);
}

TEST(DetectionFiles, ShuffleIsASeededPermutationPerEpoch) {
  auto order = [](uint64_t seed, int64_t epoch) {
    DetectionTrainer files{PluginContext{}};
    setUp(files, cocoData(exported(), true), {"train.seed=" + std::to_string(seed)});
    std::vector<int64_t> out;
    for (int64_t i = 0; i < 24; ++i) out.push_back(files.cocoSource()->trainIndex(epoch * 24 + i));
    return out;
  };
  const std::vector<int64_t> e0 = order(7, 0), e1 = order(7, 1);
  std::vector<int64_t> identity(24);
  std::iota(identity.begin(), identity.end(), int64_t{0});
  for (const auto& e : {e0, e1}) {
    std::vector<int64_t> sorted = e;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, identity);  // every image once per epoch
  }
  EXPECT_NE(e0, identity);
  EXPECT_NE(e0, e1);
  EXPECT_EQ(order(7, 1), e1);  // a pure function of (seed, epoch)
  EXPECT_NE(order(8, 0), e0);
}

TEST(DetectionFiles, DataPositionRecordsTheFilesAndRefusesChanges) {
  TempDir tmp;
  const std::string copy = tmp.path() + "/coco";
  fs::copy(exported(), copy, fs::copy_options::recursive);
  DetectionTrainer files{PluginContext{}};
  setUp(files, cocoData(copy, true));
  const nlohmann::json saved = files.dataPosition(2, kGlobal);
  EXPECT_EQ(saved["source"], "coco");
  EXPECT_EQ(saved["consumed_samples"].get<int64_t>(), 16);
  EXPECT_EQ(saved["shuffle"].get<bool>(), true);
  EXPECT_FALSE(files.checkDataPosition(saved, 2, kGlobal).has_value());

  DetectionTrainer unshuffled{PluginContext{}};
  setUp(unshuffled, cocoData(copy, false));
  auto why = unshuffled.checkDataPosition(saved, 2, kGlobal);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("data.shuffle was true and is false"), std::string::npos) << *why;

  DetectionTrainer generator{PluginContext{}};
  setUp(generator, kMosaicData);
  EXPECT_TRUE(generator.dataPosition(2, kGlobal).is_null());
  EXPECT_TRUE(generator.checkDataPosition(saved, 2, kGlobal).has_value());

  const std::string json = copy + "/annotations/instances_train.json";
  { std::ofstream(json, std::ios::app) << "\n"; }
  DetectionTrainer changed{PluginContext{}};
  setUp(changed, cocoData(copy, true));
  why = changed.checkDataPosition(saved, 2, kGlobal);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("the annotation files changed since the checkpoint"), std::string::npos) << *why;
}

TEST(DetectionFiles, ExportRefusesAFolderThatIsNotEmpty) {
  DetectionTrainer generator{PluginContext{}};
  setUp(generator, kMosaicData);
  try {
    generator.exportData("mosaic", exported(), 1, 1);
    FAIL() << "exported into a non-empty folder";
  } catch (const ptrain::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("exists and is not an empty folder"), std::string::npos) << e.what();
  }
  EXPECT_THROW(generator.exportData("clicks", exported() + "_other", 1, 1), ptrain::ConfigError);
}
