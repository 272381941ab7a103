// A picture of the detector at work: validation canvases side by side with
// their true boxes and the detections, as a PNG the docs can show.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "coco_eval.h"
#include "ptrain/datasets/mosaic.h"

namespace ptrain::detection {

// Colours of the picture (8-bit RGB).
struct Rgb {
  uint8_t r = 0, g = 0, b = 0;
};
inline constexpr Rgb kTrueBoxColour{40, 200, 60};     // green: ground truth
inline constexpr Rgb kRightDetectionColour{40, 110, 255};  // blue: IoU >= 0.5 with a true box of its class
inline constexpr Rgb kWrongDetectionColour{240, 40, 40};   // red: any other detection

// An 8-bit RGB image, rows top to bottom.
struct RgbImage {
  int64_t width = 0, height = 0;
  std::vector<uint8_t> pixels;  // width * height * 3

  RgbImage(int64_t width, int64_t height, Rgb fill);
  void set(int64_t x, int64_t y, Rgb colour);
  // The outline of a box (pixels, may reach past the image: clipped),
  // `thickness` pixels wide inward.
  void outline(double x, double y, double w, double h, Rgb colour, int thickness);
};

// Writes `image` as a PNG (8-bit RGB, zlib-compressed rows). Throws
// ConfigError when `path` cannot be written.
void writePng(const std::string& path, const RgbImage& image);

// Validation canvases 0..count-1 (their grey pixels, scaled `zoom` times) in
// a grid `columns` wide, a 4-pixel margin between them: every true box in
// green, every detection scoring at least `min_score` in blue when it
// overlaps a true box of its class at IoU >= 0.5, else red. `truth` and
// `found` are the evaluation's ground truth and detections (COCO ids).
RgbImage predictionPicture(const datasets::MosaicOptions& data, int64_t count, int64_t columns, int64_t zoom,
                           const std::vector<GroundTruth>& truth, const std::vector<Detection>& found,
                           double min_score);

}  // namespace ptrain::detection
