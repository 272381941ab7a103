// pycocotools' COCOeval for boxes, step for step: evaluate() per image and
// category (evaluateImageCategory), accumulate() per category, area range and
// detection limit (accumulateCurve), summarize() (summarizeMean). Floating
// point is computed in the same order as numpy and maskApi.c, so that a
// detection whose IoU sits exactly on a threshold is decided the same way.
#include "coco_eval.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <limits>
#include <numeric>
#include <set>
#include <stdexcept>
#include <utility>

#include <nlohmann/json.hpp>

namespace ptrain::detection {
namespace {

// COCOeval's Params.setDetParams().
constexpr int kIouThresholdCount = 10;  // 0.50:0.05:0.95
constexpr int kRecallPointCount = 101;  // 0:0.01:1
constexpr std::array<int, 3> kMaxDetections = {1, 10, 100};
constexpr int kAllDetections = 2;  // index of maxDets 100, the limit every AP uses

struct AreaRange {
  double min, max;  // both inclusive: an area of exactly 32^2 is small and medium
};
// 1e5 ** 2 as pycocotools writes the unbounded end.
constexpr std::array<AreaRange, 4> kAreaRanges = {{{0, 1e10}, {0, 32 * 32}, {32 * 32, 96 * 96}, {96 * 96, 1e10}}};
constexpr std::array<const char*, 4> kAreaNames = {"all", "small", "medium", "large"};
enum AreaIndex { kAreaAll = 0, kAreaSmall = 1, kAreaMedium = 2, kAreaLarge = 3 };

bool outsideRange(double area, const AreaRange& range) { return area < range.min || area > range.max; }

// a * b rounded to a double before it is added to anything. A compiler may
// otherwise fuse a * b + c into one FMA (GCC does by default on aarch64 or
// with -march supporting FMA), which rounds once, unlike numpy and
// pycocotools' C code as built for x86-64; the volatile store forbids that.
double roundedProduct(double a, double b) {
  volatile double product = a * b;
  return product;
}

// np.linspace(start, stop, count): i * step + start, the last one exactly stop.
// Its rounding matters: summarize() finds IoU 0.75 by equality in this list.
std::vector<double> numpyLinspace(double start, double stop, int count) {
  const double step = (stop - start) / (count - 1);
  std::vector<double> values(count);
  for (int i = 0; i < count; ++i) values[i] = roundedProduct(i, step) + start;
  values[count - 1] = stop;
  return values;
}

const std::vector<double>& iouThresholds() {
  static const std::vector<double> thresholds = numpyLinspace(0.5, 0.95, kIouThresholdCount);
  return thresholds;
}

const std::vector<double>& recallPoints() {
  static const std::vector<double> points = numpyLinspace(0.0, 1.0, kRecallPointCount);
  return points;
}

// maskApi.c bbIou: no +1 on sizes; boxes that only touch have IoU 0. For a
// crowd region the union is the detection's own area, so a detection lying
// inside a crowd has IoU 1 with it however large the crowd is.
double boxIou(const Box& detection, const Box& truth, bool crowd) {
  const double truthArea = roundedProduct(truth.width, truth.height);
  const double detectionArea = roundedProduct(detection.width, detection.height);
  const double overlapWidth = std::min(detection.width + detection.x, truth.width + truth.x) -
                              std::max(detection.x, truth.x);
  if (overlapWidth <= 0) return 0;
  const double overlapHeight = std::min(detection.height + detection.y, truth.height + truth.y) -
                               std::max(detection.y, truth.y);
  if (overlapHeight <= 0) return 0;
  const double overlap = roundedProduct(overlapWidth, overlapHeight);
  const double unionArea = crowd ? detectionArea : detectionArea + truthArea - overlap;
  return overlap / unionArea;
}

// numpy's pairwise summation of doubles (np.add.reduce over a contiguous
// array), so that the means of summarize() round as np.mean rounds them.
double numpySum(const double* values, size_t count) {
  constexpr size_t kBlock = 128;
  if (count < 8) {
    double sum = 0;
    for (size_t i = 0; i < count; ++i) sum += values[i];
    return sum;
  }
  if (count <= kBlock) {
    double partial[8];
    for (size_t j = 0; j < 8; ++j) partial[j] = values[j];
    size_t i = 8;
    for (; i < count - count % 8; i += 8) {
      for (size_t j = 0; j < 8; ++j) partial[j] += values[i + j];
    }
    double sum = ((partial[0] + partial[1]) + (partial[2] + partial[3])) +
                 ((partial[4] + partial[5]) + (partial[6] + partial[7]));
    for (; i < count; ++i) sum += values[i];
    return sum;
  }
  size_t half = count / 2;
  half -= half % 8;
  return numpySum(values, half) + numpySum(values + half, count - half);
}

// np.mean(s[s > -1]), or -1 when nothing was measured.
double meanOfMeasured(const std::vector<double>& values) {
  std::vector<double> measured;
  for (double v : values) {
    if (v > -1) measured.push_back(v);
  }
  if (measured.empty()) return -1;
  return numpySum(measured.data(), measured.size()) / static_cast<double>(measured.size());
}

// The indices 0..count-1 in the order np.argsort(keys, kind='mergesort')
// gives for `less`: stable, so ties keep their input order.
template <typename Less>
std::vector<size_t> stableOrder(size_t count, Less less) {
  std::vector<size_t> order(count);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), less);
  return order;
}

// The ground truth and detections of one image and category, in input order.
struct ImageCategory {
  std::vector<const GroundTruth*> truths;
  std::vector<const Detection*> detections;
};

// evaluateImg()'s result for one area range: per IoU threshold and kept
// detection (highest score first), whether it matched and whether it is
// ignored (matched to an ignored ground truth, or unmatched and outside the
// range).
struct ImageEvaluation {
  std::vector<double> scores;
  std::vector<std::vector<char>> matched;  // [threshold][detection]
  std::vector<std::vector<char>> ignored;  // [threshold][detection]
  int64_t countedTruths = 0;               // ground truths neither crowd nor outside the range
};

ImageEvaluation evaluateImageCategory(const std::vector<const GroundTruth*>& truths,
                                      const std::vector<const Detection*>& detections,
                                      const std::vector<std::vector<double>>& ious, const AreaRange& range) {
  const std::vector<double>& thresholds = iouThresholds();
  const size_t truthCount = truths.size();
  const size_t detectionCount = detections.size();

  std::vector<char> truthIgnored(truthCount);
  for (size_t g = 0; g < truthCount; ++g) {
    truthIgnored[g] = truths[g]->iscrowd || outsideRange(truths[g]->area, range);
  }
  // Ignored ground truths last, so that a detection prefers any counted one.
  const std::vector<size_t> truthOrder =
      stableOrder(truthCount, [&](size_t a, size_t b) { return truthIgnored[a] < truthIgnored[b]; });

  ImageEvaluation result;
  result.scores.reserve(detectionCount);
  for (const Detection* d : detections) result.scores.push_back(d->score);
  result.matched.assign(thresholds.size(), std::vector<char>(detectionCount, 0));
  result.ignored.assign(thresholds.size(), std::vector<char>(detectionCount, 0));
  for (char ignored : truthIgnored) result.countedTruths += ignored ? 0 : 1;

  for (size_t t = 0; t < thresholds.size(); ++t) {
    std::vector<char> truthTaken(truthCount, 0);  // by position in truthOrder
    for (size_t d = 0; d < detectionCount; ++d) {
      double bestIou = std::min(thresholds[t], 1 - 1e-10);
      int best = -1;
      for (size_t k = 0; k < truthCount; ++k) {
        const size_t g = truthOrder[k];
        // A crowd region can absorb any number of detections.
        if (truthTaken[k] && !truths[g]->iscrowd) continue;
        // Once a counted ground truth is matched, ignored ones (all after it) cannot take over.
        if (best > -1 && !truthIgnored[truthOrder[best]] && truthIgnored[g]) break;
        // Not `<=`: among equal IoUs the later ground truth wins, as in pycocotools.
        if (ious[d][g] < bestIou) continue;
        bestIou = ious[d][g];
        best = static_cast<int>(k);
      }
      if (best == -1) continue;
      result.ignored[t][d] = truthIgnored[truthOrder[best]];
      result.matched[t][d] = 1;
      truthTaken[best] = 1;
    }
    for (size_t d = 0; d < detectionCount; ++d) {
      const Box& box = detections[d]->bbox;
      const bool outside = outsideRange(box.width * box.height, range);
      if (!result.matched[t][d] && outside) result.ignored[t][d] = 1;
    }
  }
  return result;
}

// accumulate() for one category, area range and detection limit: the
// precision at each recall point (interpolated: the best precision at that
// recall or beyond) and the final recall, per IoU threshold. Returns false
// (leaving the outputs at -1) when no ground truth counts.
bool accumulateCurve(const std::vector<ImageEvaluation>& images, int maxDetections,
                     std::vector<std::vector<double>>& precisionAtRecall, std::vector<double>& finalRecall) {
  int64_t countedTruths = 0;
  for (const ImageEvaluation& image : images) countedTruths += image.countedTruths;
  if (countedTruths == 0) return false;

  // Every image's best `maxDetections`, then all of them by score; ties keep
  // image order (ascending image id) and then their order in the image.
  struct Entry {
    double score;
    const ImageEvaluation* image;
    size_t index;
  };
  std::vector<Entry> entries;
  for (const ImageEvaluation& image : images) {
    const size_t kept = std::min(image.scores.size(), static_cast<size_t>(maxDetections));
    for (size_t d = 0; d < kept; ++d) entries.push_back({image.scores[d], &image, d});
  }
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.score > b.score; });

  const std::vector<double>& points = recallPoints();
  const size_t count = entries.size();
  for (size_t t = 0; t < kIouThresholdCount; ++t) {
    std::vector<double> recall(count), precision(count);
    int64_t truePositives = 0, falsePositives = 0;
    for (size_t i = 0; i < count; ++i) {
      const Entry& e = entries[i];
      if (!e.image->ignored[t][e.index]) {
        if (e.image->matched[t][e.index]) {
          ++truePositives;
        } else {
          ++falsePositives;
        }
      }
      const double tp = static_cast<double>(truePositives), fp = static_cast<double>(falsePositives);
      recall[i] = tp / static_cast<double>(countedTruths);
      // np.spacing(1) keeps 0 / 0 (only ignored detections so far) at 0.
      precision[i] = tp / (fp + tp + 2.220446049250313e-16);
    }
    finalRecall[t] = count > 0 ? recall.back() : 0;

    for (size_t i = count; i-- > 1;) {
      if (precision[i] > precision[i - 1]) precision[i - 1] = precision[i];
    }
    std::vector<double>& sampled = precisionAtRecall[t];
    sampled.assign(kRecallPointCount, 0);
    for (size_t r = 0; r < points.size(); ++r) {
      // np.searchsorted(recall, point, side='left'); recall points never reached keep 0.
      const size_t at = std::lower_bound(recall.begin(), recall.end(), points[r]) - recall.begin();
      if (at >= count) break;
      sampled[r] = precision[at];
    }
  }
  return true;
}

}  // namespace

std::array<double, 12> CocoMetrics::stats() const {
  return {ap, ap50, ap75, ap_small, ap_medium, ap_large, ar1, ar10, ar100, ar_small, ar_medium, ar_large};
}

CocoMetrics evaluateCoco(const std::vector<GroundTruth>& groundTruth, const std::vector<Detection>& detections) {
  // Keyed by (category, image) so that one category's images come together,
  // in ascending image id as COCOeval walks them.
  std::map<std::pair<int64_t, int64_t>, ImageCategory> cells;
  std::set<int64_t> categorySet;
  for (const GroundTruth& g : groundTruth) {
    cells[{g.category_id, g.image_id}].truths.push_back(&g);
    categorySet.insert(g.category_id);
  }
  for (const Detection& d : detections) {
    cells[{d.category_id, d.image_id}].detections.push_back(&d);
    categorySet.insert(d.category_id);
  }
  const std::vector<int64_t> categories(categorySet.begin(), categorySet.end());

  // precision[t][r][k][a][m] and recall[t][k][a][m] of accumulate(), -1 where not measured.
  const size_t T = kIouThresholdCount, R = kRecallPointCount, K = categories.size();
  const size_t A = kAreaRanges.size(), M = kMaxDetections.size();
  std::vector<double> precision(T * R * K * A * M, -1), recall(T * K * A * M, -1);
  auto precisionAt = [&](size_t t, size_t r, size_t k, size_t a, size_t m) -> double& {
    return precision[(((t * R + r) * K + k) * A + a) * M + m];
  };
  auto recallAt = [&](size_t t, size_t k, size_t a, size_t m) -> double& {
    return recall[((t * K + k) * A + a) * M + m];
  };

  for (size_t k = 0; k < K; ++k) {
    std::vector<std::vector<ImageEvaluation>> evaluations(A);  // [area][image]
    const auto first = cells.lower_bound({categories[k], std::numeric_limits<int64_t>::min()});
    for (auto it = first; it != cells.end() && it->first.first == categories[k]; ++it) {
      const ImageCategory& cell = it->second;
      // Highest score first (stable), at most the largest detection limit.
      const std::vector<size_t> order = stableOrder(cell.detections.size(), [&](size_t a, size_t b) {
        return cell.detections[a]->score > cell.detections[b]->score;
      });
      std::vector<const Detection*> kept;
      for (size_t i = 0; i < order.size() && i < static_cast<size_t>(kMaxDetections.back()); ++i) {
        kept.push_back(cell.detections[order[i]]);
      }
      std::vector<std::vector<double>> ious(kept.size(), std::vector<double>(cell.truths.size()));
      for (size_t d = 0; d < kept.size(); ++d) {
        for (size_t g = 0; g < cell.truths.size(); ++g) {
          ious[d][g] = boxIou(kept[d]->bbox, cell.truths[g]->bbox, cell.truths[g]->iscrowd);
        }
      }
      for (size_t a = 0; a < A; ++a) {
        evaluations[a].push_back(evaluateImageCategory(cell.truths, kept, ious, kAreaRanges[a]));
      }
    }
    for (size_t a = 0; a < A; ++a) {
      for (size_t m = 0; m < M; ++m) {
        std::vector<std::vector<double>> curve(T);
        std::vector<double> finalRecall(T);
        if (!accumulateCurve(evaluations[a], kMaxDetections[m], curve, finalRecall)) continue;
        for (size_t t = 0; t < T; ++t) {
          recallAt(t, k, a, m) = finalRecall[t];
          for (size_t r = 0; r < R; ++r) precisionAt(t, r, k, a, m) = curve[t][r];
        }
      }
    }
  }

  // summarize(): means in numpy's element order (threshold, recall point, category).
  // An IoU threshold is found by equality, as `np.where(iouThr == p.iouThrs)`.
  auto thresholdsEqualTo = [&](double value) {
    std::vector<size_t> found;
    for (size_t t = 0; t < T; ++t) {
      if (iouThresholds()[t] == value) found.push_back(t);
    }
    return found;
  };
  std::vector<size_t> allThresholds(T);
  std::iota(allThresholds.begin(), allThresholds.end(), 0);
  auto averagePrecision = [&](const std::vector<size_t>& thresholds, size_t a, size_t m) {
    std::vector<double> values;
    for (size_t t : thresholds) {
      for (size_t r = 0; r < R; ++r) {
        for (size_t k = 0; k < K; ++k) values.push_back(precisionAt(t, r, k, a, m));
      }
    }
    return meanOfMeasured(values);
  };
  auto averageRecall = [&](size_t a, size_t m) {
    std::vector<double> values;
    for (size_t t = 0; t < T; ++t) {
      for (size_t k = 0; k < K; ++k) values.push_back(recallAt(t, k, a, m));
    }
    return meanOfMeasured(values);
  };

  CocoMetrics metrics;
  metrics.ap = averagePrecision(allThresholds, kAreaAll, kAllDetections);
  metrics.ap50 = averagePrecision(thresholdsEqualTo(0.5), kAreaAll, kAllDetections);
  metrics.ap75 = averagePrecision(thresholdsEqualTo(0.75), kAreaAll, kAllDetections);
  metrics.ap_small = averagePrecision(allThresholds, kAreaSmall, kAllDetections);
  metrics.ap_medium = averagePrecision(allThresholds, kAreaMedium, kAllDetections);
  metrics.ap_large = averagePrecision(allThresholds, kAreaLarge, kAllDetections);
  metrics.ar1 = averageRecall(kAreaAll, 0);
  metrics.ar10 = averageRecall(kAreaAll, 1);
  metrics.ar100 = averageRecall(kAreaAll, kAllDetections);
  metrics.ar_small = averageRecall(kAreaSmall, kAllDetections);
  metrics.ar_medium = averageRecall(kAreaMedium, kAllDetections);
  metrics.ar_large = averageRecall(kAreaLarge, kAllDetections);
  for (size_t k = 0; k < K; ++k) {
    std::vector<double> values;
    for (size_t t = 0; t < T; ++t) {
      for (size_t r = 0; r < R; ++r) values.push_back(precisionAt(t, r, k, kAreaAll, kAllDetections));
    }
    metrics.ap_per_category[categories[k]] = meanOfMeasured(values);
  }
  return metrics;
}

std::string formatCocoSummary(const CocoMetrics& metrics) {
  struct Line {
    bool precision;
    const char* iou;
    int area;
    int maxDetections;
  };
  // In CocoMetrics::stats() order.
  static const Line kLines[12] = {
      {true, "0.50:0.95", kAreaAll, 100},     {true, "0.50", kAreaAll, 100},
      {true, "0.75", kAreaAll, 100},          {true, "0.50:0.95", kAreaSmall, 100},
      {true, "0.50:0.95", kAreaMedium, 100},  {true, "0.50:0.95", kAreaLarge, 100},
      {false, "0.50:0.95", kAreaAll, 1},      {false, "0.50:0.95", kAreaAll, 10},
      {false, "0.50:0.95", kAreaAll, 100},    {false, "0.50:0.95", kAreaSmall, 100},
      {false, "0.50:0.95", kAreaMedium, 100}, {false, "0.50:0.95", kAreaLarge, 100}};
  const std::array<double, 12> values = metrics.stats();
  std::string text;
  char line[160];
  for (size_t i = 0; i < values.size(); ++i) {
    const Line& l = kLines[i];
    std::snprintf(line, sizeof(line), " %-18s %s @[ IoU=%-9s | area=%6s | maxDets=%3d ] = %0.3f\n",
                  l.precision ? "Average Precision" : "Average Recall", l.precision ? "(AP)" : "(AR)", l.iou,
                  kAreaNames[l.area], l.maxDetections, values[i]);
    text += line;
  }
  return text;
}

namespace {

nlohmann::json boxToJson(const Box& box) { return nlohmann::json::array({box.x, box.y, box.width, box.height}); }

Box boxFromJson(const nlohmann::json& value) {
  if (!value.is_array() || value.size() != 4) throw std::runtime_error("bbox is not [x, y, width, height]");
  return {value[0].get<double>(), value[1].get<double>(), value[2].get<double>(), value[3].get<double>()};
}

void writeJson(const std::string& path, const nlohmann::json& document) {
  std::ofstream out(path);
  if (!out) throw std::runtime_error("cannot write " + path);
  out << document.dump();
  if (!out) throw std::runtime_error("cannot write " + path);
}

nlohmann::json readJson(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(path + ": " + e.what());
  }
}

}  // namespace

void writeCocoGroundTruth(const std::string& path, const std::vector<GroundTruth>& groundTruth,
                          const std::vector<int64_t>& extraImageIds) {
  std::set<int64_t> imageIds(extraImageIds.begin(), extraImageIds.end()), categoryIds;
  nlohmann::json annotations = nlohmann::json::array();
  int64_t id = 0;
  for (const GroundTruth& g : groundTruth) {
    imageIds.insert(g.image_id);
    categoryIds.insert(g.category_id);
    // Ids from 1: COCOeval takes a match id of 0 for "unmatched".
    annotations.push_back({{"id", ++id},
                           {"image_id", g.image_id},
                           {"category_id", g.category_id},
                           {"bbox", boxToJson(g.bbox)},
                           {"area", g.area},
                           {"iscrowd", g.iscrowd ? 1 : 0}});
  }
  nlohmann::json images = nlohmann::json::array(), categories = nlohmann::json::array();
  for (int64_t imageId : imageIds) images.push_back({{"id", imageId}});
  for (int64_t categoryId : categoryIds) {
    categories.push_back({{"id", categoryId}, {"name", std::to_string(categoryId)}});
  }
  writeJson(path, {{"images", images}, {"annotations", annotations}, {"categories", categories}});
}

std::vector<GroundTruth> readCocoGroundTruth(const std::string& path) {
  const nlohmann::json document = readJson(path);
  std::vector<GroundTruth> result;
  try {
    for (const nlohmann::json& a : document.at("annotations")) {
      GroundTruth g;
      g.image_id = a.at("image_id").get<int64_t>();
      g.category_id = a.at("category_id").get<int64_t>();
      g.bbox = boxFromJson(a.at("bbox"));
      g.area = a.contains("area") ? a["area"].get<double>() : g.bbox.width * g.bbox.height;
      if (a.contains("iscrowd")) {
        const nlohmann::json& crowd = a["iscrowd"];
        g.iscrowd = crowd.is_boolean() ? crowd.get<bool>() : crowd.get<int64_t>() != 0;
      }
      result.push_back(g);
    }
  } catch (const std::exception& e) {
    throw std::runtime_error(path + ": " + e.what());
  }
  return result;
}

void writeCocoDetections(const std::string& path, const std::vector<Detection>& detections) {
  nlohmann::json results = nlohmann::json::array();
  for (const Detection& d : detections) {
    results.push_back({{"image_id", d.image_id},
                       {"category_id", d.category_id},
                       {"bbox", boxToJson(d.bbox)},
                       {"score", d.score}});
  }
  writeJson(path, results);
}

std::vector<Detection> readCocoDetections(const std::string& path) {
  const nlohmann::json document = readJson(path);
  std::vector<Detection> result;
  try {
    if (!document.is_array()) throw std::runtime_error("a results file is a list of detections");
    for (const nlohmann::json& r : document) {
      Detection d;
      d.image_id = r.at("image_id").get<int64_t>();
      d.category_id = r.at("category_id").get<int64_t>();
      d.bbox = boxFromJson(r.at("bbox"));
      d.score = r.at("score").get<double>();
      result.push_back(d);
    }
  } catch (const std::exception& e) {
    throw std::runtime_error(path + ": " + e.what());
  }
  return result;
}

}  // namespace ptrain::detection
