// The detection trainer from files through the ptrain binary: `ptrain data
// export mosaic` writes the recipe's mosaics as a COCO folder, a run from it
// (data.name: coco, data.shuffle: false) gives the generator run's losses at
// 1 and 2 data-parallel ranks, a resume continues exactly, and bad folders
// and keys are refused in one line with exit code 2.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/test_support.h"

namespace fs = std::filesystem;
using ptrain::test::runPtrain;
using ptrain::test::TempDir;

namespace {

const char* kCommon = R"(trainer: {name: detection}
model: {num_layers: 1, hidden_size: 16, ffn_hidden_size: 16, stem_channels: 8}
train: {steps: 4, global_batch_size: 8, seed: 7, eval_every: 4, log_every: 1}
optimizer: {name: adamw, lr: 0.003}
checkpoint: {every: 2}
log: {progress: lines}
)";

std::string mosaicRecipe(const TempDir& tmp) {
  return tmp.write("mosaic.yaml", std::string("name: det_mosaic\n") + kCommon +
                                      "data: {name: mosaic, canvas: 64, max_items: 3, min_scale: 0.75, "
                                      "max_scale: 1.25, eval_size: 8}\n");
}

std::string filesRecipe(const TempDir& tmp, const std::string& folder) {
  return tmp.write("files.yaml", std::string("name: det_files\n") + kCommon + "data: {name: coco, canvas: 64, path: " +
                                     folder + ", shuffle: false, max_boxes: 3, eval_size: 8}\n");
}

std::map<int, double> lossesOf(const std::string& runDir) {
  std::map<int, double> out;
  for (const auto& [step, text] : ptrain::test::readTrainingSteps(runDir)) {
    out[step] = nlohmann::json::parse(text)["loss"].get<double>();
  }
  return out;
}

void expectOneLineRefusal(const ptrain::test::ProcessResult& r, const std::string& text) {
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(text), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("terminate"), std::string::npos) << r.output;
}

}  // namespace

TEST(DetectionFilesRun, ExportedFolderTrainsAsTheGeneratorAndResumesExactly) {
  TempDir tmp;
  const std::string mosaic = mosaicRecipe(tmp);
  const std::string folder = tmp.path() + "/mosaic_coco";
  auto r = runPtrain({"data", "export", "mosaic", folder, "--recipe", mosaic}, {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("mosaic: wrote 32 training and 8 validation canvases"), std::string::npos) << r.output;
  const std::string files = filesRecipe(tmp, folder);

  for (const std::string nproc : {"1", "2"}) {
    const std::string gen = tmp.path() + "/gen" + nproc, coco = tmp.path() + "/coco" + nproc;
    r = runPtrain({"run", mosaic, "--nproc", nproc, "--run-dir", gen}, {"OMP_NUM_THREADS=1"}, 300);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    r = runPtrain({"run", files, "--nproc", nproc, "--run-dir", coco}, {"OMP_NUM_THREADS=1"}, 300);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto want = lossesOf(gen), got = lossesOf(coco);
    ASSERT_EQ(want.size(), 4u) << nproc;
    ASSERT_EQ(got.size(), 4u) << nproc;
    for (const auto& [step, loss] : want) EXPECT_EQ(got.at(step), loss) << nproc << " ranks, step " << step;
    EXPECT_TRUE(fs::exists(coco + "/coco_gt.json"));
  }

  // Stopped after step 2 and resumed: steps 3 and 4 as the uninterrupted run.
  const std::string whole = tmp.path() + "/coco1";
  const std::string cut = tmp.path() + "/cut";
  fs::create_directories(cut + "/checkpoints");
  fs::copy(whole + "/checkpoints/step_2", cut + "/checkpoints/step_2", fs::copy_options::recursive);
  fs::copy(whole + "/recipe.yaml", cut + "/recipe.yaml");
  r = runPtrain({"run", files, "--resume", "--run-dir", cut, "--nproc", "1", "--allow-changes"}, {"OMP_NUM_THREADS=1"},
                300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto want = lossesOf(whole), resumed = lossesOf(cut);
  for (int step = 3; step <= 4; ++step) {
    ASSERT_EQ(resumed.count(step), 1u) << "step " << step << "\n" << r.output;
    EXPECT_EQ(resumed.at(step), want.at(step)) << "step " << step;
  }
  const auto meta = nlohmann::json::parse(ptrain::test::readFile(whole + "/checkpoints/step_2/meta.json"));
  EXPECT_EQ(meta["data"]["source"], "coco");
  EXPECT_EQ(meta["data"]["consumed_samples"].get<int64_t>(), 16);

  // The annotations changed under the run: its resume is refused.
  fs::remove_all(cut + "/checkpoints/step_4");
  const std::string json = folder + "/annotations/instances_train.json";
  { std::ofstream(json, std::ios::app) << "\n"; }
  r = runPtrain({"run", files, "--resume", "--run-dir", cut, "--nproc", "1", "--allow-changes"}, {}, 300);
  expectOneLineRefusal(r, "meta.json: the annotation files changed since the checkpoint");
}

TEST(DetectionFilesRun, BadFoldersAndKeysAreRefusedInOneLine) {
  TempDir tmp;
  const std::string mosaic = mosaicRecipe(tmp);
  const std::string folder = tmp.path() + "/coco";
  auto r = runPtrain({"data", "export", "mosaic", folder, "--recipe", mosaic, "--train", "4", "--validation", "2"},
                     {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("mosaic: wrote 4 training and 2 validation canvases"), std::string::npos) << r.output;
  const std::string files = filesRecipe(tmp, folder);
  r = runPtrain({"check", files}, {}, 60);
  EXPECT_EQ(r.exit_code, 0) << r.output;

  // An existing non-empty folder is not overwritten.
  r = runPtrain({"data", "export", "mosaic", folder, "--recipe", mosaic}, {}, 60);
  expectOneLineRefusal(r, folder + " exists and is not an empty folder");
  // A missing folder.
  r = runPtrain({"check", files, "data.path=" + tmp.path() + "/nowhere"}, {}, 60);
  expectOneLineRefusal(r, "data.path: " + tmp.path() + "/nowhere is not a folder");
  // Keys of the other source.
  r = runPtrain({"check", files, "data.max_items=4"}, {}, 60);
  expectOneLineRefusal(r, "data.max_items: is read only with data.name: mosaic");
  r = runPtrain({"check", mosaic, "data.path=" + folder}, {}, 60);
  expectOneLineRefusal(r, "data.path: is read only with data.name: coco");
  // A missing image file.
  fs::rename(folder + "/images/mosaic_train_000002.png", tmp.path() + "/moved.png");
  r = runPtrain({"check", files}, {}, 60);
  expectOneLineRefusal(r, "mosaic_train_000002.png");
  fs::rename(tmp.path() + "/moved.png", folder + "/images/mosaic_train_000002.png");
  // Malformed JSON.
  const std::string json = folder + "/annotations/instances_validation.json";
  { std::ofstream(json, std::ios::trunc) << "{\"images\": [\n"; }
  r = runPtrain({"check", files}, {}, 60);
  expectOneLineRefusal(r, "data.path: ");
  EXPECT_NE(r.output.find("instances_validation.json"), std::string::npos) << r.output;
}
