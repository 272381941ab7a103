// COCO box detection metrics, computed as pycocotools' COCOeval (iouType
// "bbox") computes them, so that numbers reported during training can be put
// next to published ones without running Python. Everything that changes the
// result is reproduced: the IoU and recall thresholds as numpy's linspace
// rounds them, stable (mergesort) score ordering with ties kept in input
// order, ignored ground truths (crowd or outside the area range) and the
// detections they absorb, the greedy matching per IoU threshold, and the
// 101-point interpolated precision. The 12 numbers have agreed with
// COCOeval.summarize() to the last bit on x86-64 in every case tried
// (test_coco_eval.cpp checks them against pycocotools where it is installed).
//
// Pure C++17: no libtorch, so that data tools and tests can use it alone.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ptrain::detection {

// An axis-aligned box in pixels as COCO stores it: top-left corner and size
// (not corners), with no +1 on the size (x + width is the right edge).
struct Box {
  double x = 0, y = 0, width = 0, height = 0;
};

struct GroundTruth {
  int64_t image_id = 0;
  int64_t category_id = 0;
  Box bbox;
  // COCO's annotation area (the segmentation mask's area for COCO itself,
  // often a little smaller than the box's). It alone decides the small /
  // medium / large range of a ground truth, as in pycocotools.
  double area = 0;
  // A crowd region: never counted as an object to find; detections falling
  // on it (IoU over the detection's own area) are neither right nor wrong.
  bool iscrowd = false;
};

struct Detection {
  int64_t image_id = 0;
  int64_t category_id = 0;
  Box bbox;  // its area (width * height) decides its area range
  double score = 0;
};

// COCOeval.summarize()'s 12 numbers for boxes, each in [0, 1], or -1 where
// nothing could be measured (no ground truth in that area range in any
// category). AP averages the precision over IoU 0.50:0.05:0.95, the 101
// recall points and the categories that have ground truth; AR averages the
// best recall over the IoU thresholds and categories.
struct CocoMetrics {
  double ap = -1;         // AP @[IoU=0.50:0.95 | area=all    | maxDets=100]
  double ap50 = -1;       // AP @[IoU=0.50      | area=all    | maxDets=100]
  double ap75 = -1;       // AP @[IoU=0.75      | area=all    | maxDets=100]
  double ap_small = -1;   // AP @[IoU=0.50:0.95 | area=small  | maxDets=100], area < 32^2
  double ap_medium = -1;  // AP @[IoU=0.50:0.95 | area=medium | maxDets=100], 32^2 to 96^2
  double ap_large = -1;   // AP @[IoU=0.50:0.95 | area=large  | maxDets=100], area > 96^2
  double ar1 = -1;        // AR @[IoU=0.50:0.95 | area=all    | maxDets=1]
  double ar10 = -1;       // AR @[IoU=0.50:0.95 | area=all    | maxDets=10]
  double ar100 = -1;      // AR @[IoU=0.50:0.95 | area=all    | maxDets=100]
  double ar_small = -1;   // AR @[IoU=0.50:0.95 | area=small  | maxDets=100]
  double ar_medium = -1;  // AR @[IoU=0.50:0.95 | area=medium | maxDets=100]
  double ar_large = -1;   // AR @[IoU=0.50:0.95 | area=large  | maxDets=100]

  // AP @[IoU=0.50:0.95 | area=all | maxDets=100] of each category seen in the
  // ground truth or the detections; -1 for a category without ground truth
  // (it is left out of `ap`, as COCOeval leaves it out).
  std::map<int64_t, double> ap_per_category;

  // The 12 numbers in COCOeval.stats order.
  std::array<double, 12> stats() const;
};

// Evaluates `detections` against `groundTruth` over every image and category
// that appears in either. Detections on an image without ground truth of
// their category are false positives; detections of a category without any
// ground truth change nothing (as in pycocotools, where such images must be
// listed in the ground truth file). Per image and category only the 100
// highest-scoring detections count.
CocoMetrics evaluateCoco(const std::vector<GroundTruth>& groundTruth, const std::vector<Detection>& detections);

// The 12 lines COCOeval.summarize() prints, for logs.
std::string formatCocoSummary(const CocoMetrics& metrics);

// COCO JSON, readable by pycocotools' COCO() and COCO.loadRes(). Errors
// (unreadable file, missing field) throw std::runtime_error naming the file.
//
// Ground truth as an instances file: "images" (each image id of the ground
// truth, plus `extraImageIds`: images that only detections refer to, which
// pycocotools requires to be listed), "annotations" (ids 1..N in order) and
// "categories" (each category id of the ground truth).
void writeCocoGroundTruth(const std::string& path, const std::vector<GroundTruth>& groundTruth,
                          const std::vector<int64_t>& extraImageIds = {});
// Reads the "annotations" of an instances file; "area" defaults to the box's
// and "iscrowd" to 0 where an annotation lacks them.
std::vector<GroundTruth> readCocoGroundTruth(const std::string& path);

// Detections as a results file: a list of {image_id, category_id, bbox, score}.
void writeCocoDetections(const std::string& path, const std::vector<Detection>& detections);
std::vector<Detection> readCocoDetections(const std::string& path);

}  // namespace ptrain::detection
