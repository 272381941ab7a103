// The COCO box evaluator (trainers/detection/coco_eval.h) on small cases
// whose metrics are worked out by hand below, and on a seeded random case
// against pycocotools itself where a Python with pycocotools is available
// (PTRAIN_PYTHON, default python3).
//
// Reminders for the hand computations: at each IoU threshold the
// detections of a category, highest score first, give recall = TP / (counted
// ground truths) and precision = TP / (TP + FP) after each one; precision is
// made non-increasing from the right (each value becomes the best precision
// at that recall or beyond); then at each of the 101 recall points
// 0, 0.01, ..., 1 the precision of the first detection whose recall reaches
// the point is taken, 0 past the last recall reached. AP is the mean of those
// 101 values over the 10 IoU thresholds 0.50, 0.55, ..., 0.95 (and the
// categories with ground truth).
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "coco_eval.h"

namespace {

using ptrain::detection::Box;
using ptrain::detection::CocoMetrics;
using ptrain::detection::Detection;
using ptrain::detection::evaluateCoco;
using ptrain::detection::GroundTruth;

constexpr double kTolerance = 1e-12;

// A ground truth whose area is its box's, as for a box-only dataset.
GroundTruth truth(int64_t image, int64_t category, Box box, bool crowd = false) {
  GroundTruth g;
  g.image_id = image;
  g.category_id = category;
  g.bbox = box;
  g.area = box.width * box.height;
  g.iscrowd = crowd;
  return g;
}

Detection detection(int64_t image, int64_t category, Box box, double score) {
  Detection d;
  d.image_id = image;
  d.category_id = category;
  d.bbox = box;
  d.score = score;
  return d;
}

void expectAll(const std::array<double, 12>& actual, const std::array<double, 12>& expected) {
  static const char* kNames[12] = {"ap",  "ap50",  "ap75",     "ap_small",  "ap_medium", "ap_large",
                                   "ar1", "ar10",  "ar100",    "ar_small",  "ar_medium", "ar_large"};
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_NEAR(actual[i], expected[i], kTolerance) << kNames[i];
  }
}

TEST(CocoEval, PerfectDetectionsScoreOneWhereMeasured) {
  // One ground truth per image and category, each found exactly (IoU 1 passes
  // every threshold): precision and recall are 1 everywhere. Category 2 has
  // no small or medium object and category 1 no large one; those entries are
  // -1 and left out of the means, so every number is 1.
  const std::vector<GroundTruth> truths = {
      truth(1, 1, {5, 5, 10, 10}),     // area 100: small
      truth(1, 2, {50, 50, 100, 100}),  // area 10000: large
      truth(2, 1, {0, 0, 50, 50}),      // area 2500: medium
  };
  std::vector<Detection> detections;
  for (const GroundTruth& g : truths) detections.push_back(detection(g.image_id, g.category_id, g.bbox, 0.9));
  const CocoMetrics metrics = evaluateCoco(truths, detections);
  expectAll(metrics.stats(), {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1});
  EXPECT_EQ(metrics.ap_per_category.size(), 2u);
  EXPECT_NEAR(metrics.ap_per_category.at(1), 1, kTolerance);
  EXPECT_NEAR(metrics.ap_per_category.at(2), 1, kTolerance);
}

TEST(CocoEval, TwoTruthsThreeDetectionsByHand) {
  // Ground truths A = [0,0,10,10] and B = [20,0,10,10], areas 100 (small).
  //   d1 (0.9) = [1,0,10,10]:   overlap 9*10 = 90, union 100+100-90 = 110, IoU 9/11 = 0.818 with A
  //   d2 (0.8) = [50,50,10,10]: touches nothing, IoU 0
  //   d3 (0.7) = [22,0,10,10]:  overlap 8*10 = 80, union 120, IoU 2/3 = 0.667 with B
  // (no IoU sits on a threshold; with a +1 on sizes they would differ).
  //
  // IoU 0.50 (also 0.55, 0.60, 0.65): d1 TP, d2 FP, d3 TP.
  //   recall 1/2, 1/2, 1; precision 1, 1/2, 2/3 -> non-increasing: 1, 2/3, 2/3.
  //   Points 0..0.50 (51 of them) are first reached by d1: precision 1.
  //   Points 0.51..1 (50) are first reached by d3: 2/3.
  //   AP = (51 * 1 + 50 * 2/3) / 101 = 253/303 = 0.83498.
  // IoU 0.75 (also 0.70, 0.80): d1 TP, d2 FP, d3 FP (2/3 < 0.7).
  //   recall 1/2, 1/2, 1/2; precision 1, 1/2, 1/3, already non-increasing.
  //   Points 0..0.50: 1; points above 0.50 are never reached: 0.
  //   AP = 51/101 = 0.50495.
  // IoU 0.85, 0.90, 0.95: no TP, precision 0 everywhere: AP 0.
  // AP@[.5:.95] = (4 * 253/303 + 3 * 51/101 + 3 * 0) / 10 = (1012 + 459) / 3030 = 1471/3030.
  // AR@100: recall 1 at 4 thresholds, 1/2 at 3, 0 at 3 -> 5.5/10 = 0.55.
  // AR@1 keeps only d1: recall 1/2 at the 7 thresholds up to 0.80 -> 3.5/10 = 0.35.
  // All objects and detections are small: small = all; medium and large have
  // no ground truth: -1.
  const std::vector<GroundTruth> truths = {truth(1, 1, {0, 0, 10, 10}), truth(1, 1, {20, 0, 10, 10})};
  const std::vector<Detection> detections = {
      detection(1, 1, {1, 0, 10, 10}, 0.9),
      detection(1, 1, {50, 50, 10, 10}, 0.8),
      detection(1, 1, {22, 0, 10, 10}, 0.7),
  };
  const double ap = 1471.0 / 3030.0;
  expectAll(evaluateCoco(truths, detections).stats(),
            {ap, 253.0 / 303.0, 51.0 / 101.0, ap, -1, -1, 0.35, 0.55, 0.55, 0.55, -1, -1});
}

TEST(CocoEval, CrowdTruthAbsorbsDetections) {
  // A = [0,0,10,10] (area 100) and a crowd region C = [100,100,50,50].
  // d1 (0.95) and d2 (0.9) lie inside C: against a crowd the union is the
  // detection's own area, so IoU = 100/100 = 1, and a crowd can take any
  // number of detections. Matched to an ignored (crowd) ground truth they are
  // ignored: neither TP nor FP. d3 (0.8) finds A.
  //   Counted truths: 1 (the crowd never counts). Recall 0, 0, 1; precision
  //   0, 0 (0/0 taken as 0), 1 -> non-increasing 1, 1, 1: AP 1, AR 1.
  // AR@1 keeps only d1, which C absorbs: recall 0.
  // C's area 2500 is medium, but being crowd it never counts: medium has no
  // ground truth (-1), nor has large.
  const std::vector<GroundTruth> truths = {truth(1, 1, {0, 0, 10, 10}), truth(1, 1, {100, 100, 50, 50}, true)};
  const std::vector<Detection> detections = {
      detection(1, 1, {110, 110, 10, 10}, 0.95),
      detection(1, 1, {120, 120, 10, 10}, 0.9),
      detection(1, 1, {0, 0, 10, 10}, 0.8),
  };
  expectAll(evaluateCoco(truths, detections).stats(), {1, 1, 1, 1, -1, -1, 0, 1, 1, 1, -1, -1});

  // The same region not marked crowd: d1 and d2 overlap it by 100 of a
  // union 2500 (IoU 0.04) and are false positives before d3.
  //   Counted truths 2. Recall 0, 0, 1/2; precision 0, 0, 1/3 -> 1/3, 1/3, 1/3.
  //   Points 0..0.50: 1/3, above: 0. AP = 51/101 * 1/3 = 17/101 at every threshold.
  std::vector<GroundTruth> notCrowd = truths;
  notCrowd[1].iscrowd = false;
  const CocoMetrics metrics = evaluateCoco(notCrowd, detections);
  EXPECT_NEAR(metrics.ap, 17.0 / 101.0, kTolerance);
  EXPECT_NEAR(metrics.ar100, 0.5, kTolerance);
  // Medium now has C, which nothing finds; d1 and d2 (area 100) fall outside
  // medium unmatched and are ignored, d3 is matched to A, ignored there: AP 0.
  EXPECT_NEAR(metrics.ap_medium, 0, kTolerance);
}

TEST(CocoEval, AreaRangesUseTheTruthAreaAndIgnoreWhatFallsOutside) {
  // S = [0,0,20,20] (area 400, small) is found by d2 (0.9); L = [100,100,200,200]
  // (area 40000, large) is missed; d1 (0.95) = [400,400,50,50] (area 2500,
  // medium) finds nothing.
  // all:    2 counted truths; d1 FP, d2 TP: recall 0, 1/2; precision 0, 1/2 -> 1/2, 1/2.
  //         Points 0..0.50: 1/2, above: 0 -> AP 51/101 * 1/2 = 51/202 at every threshold; AR 1/2.
  // small:  L is outside, ignored; d1 is unmatched and outside small, ignored;
  //         d2 TP: AP 1, AR 1.
  // medium: no counted truth: -1.
  // large:  S is outside, ignored; d2 matches it and is ignored with it; d1 is
  //         unmatched and outside large, ignored. 1 counted truth (L), no TP: AP 0, AR 0.
  // AR@1 (all) keeps only d1, a FP: recall 0.
  const std::vector<GroundTruth> truths = {truth(1, 1, {0, 0, 20, 20}), truth(1, 1, {100, 100, 200, 200})};
  const std::vector<Detection> detections = {
      detection(1, 1, {400, 400, 50, 50}, 0.95),
      detection(1, 1, {0, 0, 20, 20}, 0.9),
  };
  const double ap = 51.0 / 202.0;
  expectAll(evaluateCoco(truths, detections).stats(), {ap, ap, ap, 1, -1, 0, 0, 0.5, 0.5, 1, -1, 0});
}

TEST(CocoEval, AreaIsTheAnnotationAreaNotTheBox) {
  // A 40x40 box (1600, medium) whose annotation area is 900 (a mask smaller
  // than its box) counts as small; exactly 32^2 = 1024 is both small and
  // medium (both ends of a range are included).
  GroundTruth masked = truth(1, 1, {0, 0, 40, 40});
  masked.area = 900;
  const std::vector<Detection> found = {detection(1, 1, {0, 0, 40, 40}, 0.9)};
  CocoMetrics metrics = evaluateCoco({masked}, found);
  EXPECT_NEAR(metrics.ap_small, 1, kTolerance);
  EXPECT_EQ(metrics.ap_medium, -1);

  const std::vector<GroundTruth> boundary = {truth(1, 1, {0, 0, 32, 32})};
  metrics = evaluateCoco(boundary, {detection(1, 1, {0, 0, 32, 32}, 0.9)});
  EXPECT_NEAR(metrics.ap_small, 1, kTolerance);
  EXPECT_NEAR(metrics.ap_medium, 1, kTolerance);
  EXPECT_EQ(metrics.ap_large, -1);
}

TEST(CocoEval, MaxDetectionsKeepTheHighestScores) {
  // 12 separate objects, each found exactly, listed lowest score first.
  // AR@1 keeps the best detection per image: 1 of 12 found; AR@10: 10 of 12;
  // AR@100: all. AP (100 detections) is 1: every detection is a TP.
  std::vector<GroundTruth> truths;
  std::vector<Detection> detections;
  for (int i = 0; i < 12; ++i) {
    const Box box{20.0 * i, 0, 10, 10};
    truths.push_back(truth(1, 1, box));
    detections.push_back(detection(1, 1, box, 0.1 + 0.05 * i));
  }
  const CocoMetrics metrics = evaluateCoco(truths, detections);
  EXPECT_NEAR(metrics.ar1, 1.0 / 12.0, kTolerance);
  EXPECT_NEAR(metrics.ar10, 10.0 / 12.0, kTolerance);
  EXPECT_NEAR(metrics.ar100, 1, kTolerance);
  EXPECT_NEAR(metrics.ap, 1, kTolerance);

  // Beyond 100 detections per image the lowest scores are dropped before
  // matching: 100 misses scored above the hit push it out, AP 0 and AR 0.
  std::vector<Detection> crowded = {detection(1, 1, {0, 0, 10, 10}, 0.5)};
  for (int i = 0; i < 100; ++i) crowded.push_back(detection(1, 1, {500, 500, 10, 10}, 0.9));
  const CocoMetrics dropped = evaluateCoco({truth(1, 1, {0, 0, 10, 10})}, crowded);
  EXPECT_NEAR(dropped.ap, 0, kTolerance);
  EXPECT_NEAR(dropped.ar100, 0, kTolerance);
}

TEST(CocoEval, CategoryWithoutTruthIsLeftOutOfTheMean) {
  // Category 1 is found exactly (AP 1). Category 2 has only a detection: no
  // ground truth, so -1, and the mean is over category 1 alone: 1, not 1/2.
  const std::vector<GroundTruth> truths = {truth(1, 1, {0, 0, 10, 10})};
  const std::vector<Detection> detections = {
      detection(1, 1, {0, 0, 10, 10}, 0.9),
      detection(1, 2, {0, 0, 10, 10}, 0.95),
  };
  const CocoMetrics metrics = evaluateCoco(truths, detections);
  EXPECT_NEAR(metrics.ap, 1, kTolerance);
  EXPECT_NEAR(metrics.ar100, 1, kTolerance);
  EXPECT_NEAR(metrics.ap_per_category.at(1), 1, kTolerance);
  EXPECT_EQ(metrics.ap_per_category.at(2), -1);

  // Nothing to measure at all: every number is -1.
  expectAll(evaluateCoco({}, detections).stats(), {-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1});
}

TEST(CocoEval, DuplicateDetectionsAreFalsePositives) {
  // A = [0,0,10,10], B = [20,0,10,10]; d1 (0.9) finds A, d2 (0.8) is the same
  // box again, d3 (0.7) finds B. A is taken by d1, so d2 (not crowd) is a FP,
  // at every threshold (all IoUs are 1 or 0):
  //   recall 1/2, 1/2, 1; precision 1, 1/2, 2/3 -> 1, 2/3, 2/3.
  //   AP = (51 * 1 + 50 * 2/3) / 101 = 253/303 (1 without the duplicate); AR 1.
  const std::vector<GroundTruth> truths = {truth(1, 1, {0, 0, 10, 10}), truth(1, 1, {20, 0, 10, 10})};
  const std::vector<Detection> detections = {
      detection(1, 1, {0, 0, 10, 10}, 0.9),
      detection(1, 1, {0, 0, 10, 10}, 0.8),
      detection(1, 1, {20, 0, 10, 10}, 0.7),
  };
  const CocoMetrics metrics = evaluateCoco(truths, detections);
  EXPECT_NEAR(metrics.ap, 253.0 / 303.0, kTolerance);
  EXPECT_NEAR(metrics.ar100, 1, kTolerance);
  // A detection on an image without ground truth of its category is a FP
  // too. Scored 0.99, it comes first: FP, d1 TP, d2 FP, d3 TP:
  //   recall 0, 1/2, 1/2, 1; precision 0, 1/2, 1/3, 1/2 -> 1/2, 1/2, 1/2, 1/2.
  //   Every recall point is reached (point 0 by the stray itself): AP 1/2.
  std::vector<Detection> withStray = detections;
  withStray.push_back(detection(7, 1, {0, 0, 10, 10}, 0.99));
  EXPECT_NEAR(evaluateCoco(truths, withStray).ap, 0.5, kTolerance);
}

// A folder under the system's temporary directory, removed with everything
// in it when the test ends.
class TemporaryFolder {
 public:
  TemporaryFolder() {
    const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
    path_ = std::filesystem::temp_directory_path() /
            ("ptrain_coco_eval_" + std::to_string(getpid()) + "_" + std::to_string(now));
    std::filesystem::create_directories(path_);
  }
  ~TemporaryFolder() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TemporaryFolder(const TemporaryFolder&) = delete;
  TemporaryFolder& operator=(const TemporaryFolder&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

TEST(CocoEval, JsonRoundTripKeepsEveryField) {
  TemporaryFolder folder;
  GroundTruth crowd = truth(3, 2, {1.25, 2.5, 30.125, 40.0625}, true);
  crowd.area = 777.7;
  const std::vector<GroundTruth> truths = {truth(1, 1, {0.1, 0.2, 10.3, 20.7}), crowd};
  const std::vector<Detection> detections = {detection(1, 1, {0.3, 0.1, 9.9, 21.1}, 0.123456789012345),
                                             detection(5, 2, {100, 200, 3, 4}, 1e-7)};
  ptrain::detection::writeCocoGroundTruth(folder.file("gt.json"), truths, {5});
  ptrain::detection::writeCocoDetections(folder.file("dt.json"), detections);
  const std::vector<GroundTruth> truthsBack = ptrain::detection::readCocoGroundTruth(folder.file("gt.json"));
  const std::vector<Detection> detectionsBack = ptrain::detection::readCocoDetections(folder.file("dt.json"));
  ASSERT_EQ(truthsBack.size(), truths.size());
  for (size_t i = 0; i < truths.size(); ++i) {
    EXPECT_EQ(truthsBack[i].image_id, truths[i].image_id);
    EXPECT_EQ(truthsBack[i].category_id, truths[i].category_id);
    EXPECT_EQ(truthsBack[i].bbox.x, truths[i].bbox.x);
    EXPECT_EQ(truthsBack[i].bbox.y, truths[i].bbox.y);
    EXPECT_EQ(truthsBack[i].bbox.width, truths[i].bbox.width);
    EXPECT_EQ(truthsBack[i].bbox.height, truths[i].bbox.height);
    EXPECT_EQ(truthsBack[i].area, truths[i].area);
    EXPECT_EQ(truthsBack[i].iscrowd, truths[i].iscrowd);
  }
  ASSERT_EQ(detectionsBack.size(), detections.size());
  for (size_t i = 0; i < detections.size(); ++i) {
    EXPECT_EQ(detectionsBack[i].image_id, detections[i].image_id);
    EXPECT_EQ(detectionsBack[i].category_id, detections[i].category_id);
    EXPECT_EQ(detectionsBack[i].bbox.x, detections[i].bbox.x);
    EXPECT_EQ(detectionsBack[i].bbox.width, detections[i].bbox.width);
    EXPECT_EQ(detectionsBack[i].score, detections[i].score);
  }
  EXPECT_THROW(ptrain::detection::readCocoGroundTruth(folder.file("missing.json")), std::runtime_error);
  EXPECT_THROW(ptrain::detection::readCocoGroundTruth(folder.file("dt.json")), std::runtime_error);
}

TEST(CocoEval, SummaryPrintsLikePycocotools) {
  CocoMetrics metrics;
  metrics.ap = 0.5;
  const std::string summary = ptrain::detection::formatCocoSummary(metrics);
  EXPECT_EQ(summary.substr(0, summary.find('\n')),
            " Average Precision  (AP) @[ IoU=0.50:0.95 | area=   all | maxDets=100 ] = 0.500");
  EXPECT_NE(summary.find(" Average Recall     (AR) @[ IoU=0.50:0.95 | area= large | maxDets=100 ] = -1.000"),
            std::string::npos);
}

// Seeded, with std::mt19937_64 (its output is fixed by the standard; the
// standard distributions are not, so they are not used).
class SeededRandom {
 public:
  explicit SeededRandom(uint64_t seed) : engine_(seed) {}
  double uniform(double low, double high) {
    return low + (high - low) * (static_cast<double>(engine_() >> 11) * 0x1.0p-53);
  }
  bool chance(double p) { return uniform(0, 1) < p; }
  int below(int n) { return static_cast<int>(engine_() % static_cast<uint64_t>(n)); }

 private:
  std::mt19937_64 engine_;
};

// About 20 images, 3 categories, objects of every area range (some with an
// area exactly on a range boundary), crowd regions, jittered and duplicate
// detections, scores with ties, false positives, an image with only
// detections, a category with only detections, and more than 100 detections
// on one image and category.
void makeRandomCase(std::vector<GroundTruth>& truths, std::vector<Detection>& detections) {
  SeededRandom random(20240611);
  auto score = [&]() {
    // Half the scores on a 0.05 grid, so that ties are common.
    return random.chance(0.5) ? std::round(random.uniform(0, 1) * 20) / 20 : random.uniform(0, 1);
  };
  auto jitter = [&](const Box& b) {
    return Box{b.x + b.width * random.uniform(-0.1, 0.1), b.y + b.height * random.uniform(-0.1, 0.1),
               b.width * random.uniform(0.85, 1.15), b.height * random.uniform(0.85, 1.15)};
  };
  for (int64_t image = 1; image <= 20; ++image) {
    for (int64_t category = 1; category <= 3; ++category) {
      const int objects = random.below(5);
      for (int i = 0; i < objects; ++i) {
        const double width = std::exp(random.uniform(std::log(4.0), std::log(250.0)));
        const double height = width * random.uniform(0.5, 2.0);
        GroundTruth g = truth(image, category, {random.uniform(0, 600), random.uniform(0, 400), width, height});
        g.area = width * height * random.uniform(0.55, 1.0);
        if (random.chance(0.05)) g.area = random.chance(0.5) ? 32 * 32 : 96 * 96;
        g.iscrowd = random.chance(0.08);
        truths.push_back(g);
        const int hits = g.iscrowd ? random.below(3) : (random.chance(0.85) ? 1 : 0) + (random.chance(0.15) ? 1 : 0);
        for (int h = 0; h < hits; ++h) detections.push_back(detection(image, category, jitter(g.bbox), score()));
      }
      const int misses = random.below(3);
      for (int i = 0; i < misses; ++i) {
        const double size = std::exp(random.uniform(std::log(4.0), std::log(200.0)));
        detections.push_back(detection(image, category,
                                       {random.uniform(0, 600), random.uniform(0, 400), size, size * 0.8}, score()));
      }
    }
  }
  for (int i = 0; i < 110; ++i) {
    detections.push_back(detection(5, 2, {random.uniform(0, 600), random.uniform(0, 400), 30, 30}, score() * 0.5));
  }
  for (int i = 0; i < 3; ++i) detections.push_back(detection(21, 1, {10.0 * i, 0, 50, 50}, score()));
  detections.push_back(detection(3, 4, {0, 0, 50, 50}, 0.9));
}

std::filesystem::path sourceDirectory() {
#ifdef PTRAIN_SOURCE_DIR
  return PTRAIN_SOURCE_DIR;
#else
  return std::filesystem::absolute(__FILE__).parent_path().parent_path().parent_path();
#endif
}

std::string quoted(const std::string& text) { return "'" + text + "'"; }

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(CocoEval, MatchesPycocotoolsOnARandomCase) {
  // PTRAIN_PYTHON; else the tree's PyPI environment (tools/install-deps.sh
  // --pypi puts pycocotools there), else python3.
  const char* configured = std::getenv("PTRAIN_PYTHON");
  const std::filesystem::path venvPython = sourceDirectory() / ".venv-torch" / "bin" / "python";
  const std::string python = configured != nullptr && *configured != '\0' ? std::string(configured)
                             : std::filesystem::exists(venvPython)        ? venvPython.string()
                                                                         : std::string("python3");
  if (std::system((python + " -c 'import pycocotools' >/dev/null 2>&1").c_str()) != 0) {
    GTEST_SKIP() << "pycocotools cannot be imported by " << python
                 << " (set PTRAIN_PYTHON to a Python that has it to compare against it)";
  }
  std::vector<GroundTruth> truths;
  std::vector<Detection> detections;
  makeRandomCase(truths, detections);

  TemporaryFolder folder;
  const std::string truthPath = folder.file("gt.json"), detectionPath = folder.file("dt.json");
  // Image 21 has only detections; pycocotools requires it listed.
  ptrain::detection::writeCocoGroundTruth(truthPath, truths, {21});
  ptrain::detection::writeCocoDetections(detectionPath, detections);
  const std::string script = (sourceDirectory() / "tools" / "coco_eval_reference.py").string();
  ASSERT_TRUE(std::filesystem::exists(script)) << script << " not found (built outside the source tree?)";
  const std::string command = python + " " + quoted(script) + " " + quoted(truthPath) + " " +
                              quoted(detectionPath) + " >" + quoted(folder.file("out.txt")) + " 2>" +
                              quoted(folder.file("err.txt"));
  ASSERT_EQ(std::system(command.c_str()), 0) << command << "\n" << readFile(folder.file("err.txt"));

  std::istringstream reference(readFile(folder.file("out.txt")));
  std::array<double, 12> expected{};
  for (double& value : expected) ASSERT_TRUE(reference >> value) << "short output from " << script;
  std::map<int64_t, double> expectedPerCategory;
  std::string word;
  int64_t category = 0;
  double ap = 0;
  while (reference >> word >> category >> ap) expectedPerCategory[category] = ap;

  // Evaluated from the files, as pycocotools was.
  const CocoMetrics metrics = evaluateCoco(ptrain::detection::readCocoGroundTruth(truthPath),
                                           ptrain::detection::readCocoDetections(detectionPath));
  const std::array<double, 12> actual = metrics.stats();
  double maxDifference = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_NEAR(actual[i], expected[i], 1e-9) << "stat " << i;
    EXPECT_GT(expected[i], 0) << "stat " << i << ": the random case should measure every number";
    maxDifference = std::max(maxDifference, std::abs(actual[i] - expected[i]));
  }
  ASSERT_EQ(expectedPerCategory.size(), 3u);
  for (const auto& [id, value] : expectedPerCategory) {
    EXPECT_NEAR(metrics.ap_per_category.at(id), value, 1e-9) << "category " << id;
    maxDifference = std::max(maxDifference, std::abs(metrics.ap_per_category.at(id) - value));
  }
  EXPECT_EQ(metrics.ap_per_category.at(4), -1);
  RecordProperty("max_abs_difference", std::to_string(maxDifference));
  std::printf("%zu ground truths, %zu detections; max |C++ - pycocotools| = %.3g\n%s", truths.size(),
              detections.size(), maxDifference, ptrain::detection::formatCocoSummary(metrics).c_str());
}

}  // namespace
