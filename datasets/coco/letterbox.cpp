// The letterbox of coco_dataset.h: resize by bilinear interpolation with the
// mosaic generator's arithmetic (mosaicScaleItem), place at the top-left
// corner, snap boxes outwards to whole pixels.
#include "ptrain/datasets/coco_dataset.h"

#include <algorithm>
#include <cmath>

namespace ptrain::datasets {
namespace {

// Absorbs decimal noise in box corners (a JSON's 12.000000001) so it does not
// grow a box by a whole pixel.
constexpr double kSnapTolerance = 1e-6;

// The two source indices and the weight of the second for every output
// position along one axis: half-pixel centres, negative coordinates clamped
// to 0 and the last index repeated, as libtorch's bilinear interpolate does
// with align_corners=false and an output size (ratio in / out).
struct AxisTaps {
  std::vector<int64_t> lo, hi;
  std::vector<float> frac;
};

AxisTaps axisTaps(int64_t in, int64_t out) {
  AxisTaps taps;
  taps.lo.resize(static_cast<size_t>(out));
  taps.hi.resize(static_cast<size_t>(out));
  taps.frac.resize(static_cast<size_t>(out));
  const double ratio = static_cast<double>(in) / static_cast<double>(out);
  for (int64_t o = 0; o < out; ++o) {
    const double c = std::max(0.0, (static_cast<double>(o) + 0.5) * ratio - 0.5);
    const int64_t i = std::min<int64_t>(static_cast<int64_t>(c), in - 1);
    taps.lo[static_cast<size_t>(o)] = i;
    taps.hi[static_cast<size_t>(o)] = std::min<int64_t>(i + 1, in - 1);
    taps.frac[static_cast<size_t>(o)] = static_cast<float>(c - static_cast<double>(i));
  }
  return taps;
}

// Rounded half up and capped: interpolating 255 with 255 in float can land
// a hair above 255.
inline uint8_t toByte(float value) {
  return static_cast<uint8_t>(std::min(255.0f, std::floor(value + 0.5f)));
}

}  // namespace

Letterbox letterbox(const Image& image, const std::vector<CocoBox>& boxes, int64_t canvas) {
  PTRAIN_CHECK(canvas >= 1, "letterbox: canvas side ", canvas, " is below 1");
  PTRAIN_CHECK(image.width > 0 && image.height > 0 && (image.channels == 1 || image.channels == 3) &&
                   image.bytes.size() == static_cast<size_t>(image.width * image.height * image.channels),
               "letterbox: malformed image ", image.width, "x", image.height, "x", image.channels);
  const int64_t w = image.width, h = image.height;
  const int channels = image.channels;
  const double s = std::min(static_cast<double>(canvas) / static_cast<double>(w),
                            static_cast<double>(canvas) / static_cast<double>(h));
  Letterbox out;
  out.canvas = canvas;
  out.channels = channels;
  // lround of w * s: for the longer side w * (C / w), which double may put a
  // hair off C, rounds back to C exactly.
  out.resized_width = std::clamp<int64_t>(std::lround(static_cast<double>(w) * s), 1, canvas);
  out.resized_height = std::clamp<int64_t>(std::lround(static_cast<double>(h) * s), 1, canvas);
  out.scale_x = static_cast<double>(out.resized_width) / static_cast<double>(w);
  out.scale_y = static_cast<double>(out.resized_height) / static_cast<double>(h);
  out.pixels.assign(static_cast<size_t>(channels * canvas * canvas), 0);

  const int64_t rw = out.resized_width, rh = out.resized_height;
  const int64_t plane = canvas * canvas;
  if (rw == w && rh == h) {
    // Already the target size: a copy, so the identity holds by construction.
    for (int64_t y = 0; y < h; ++y) {
      const uint8_t* from = image.pixel(0, y);
      for (int c = 0; c < channels; ++c) {
        uint8_t* to = out.pixels.data() + c * plane + y * canvas;
        for (int64_t x = 0; x < w; ++x) to[x] = from[x * channels + c];
      }
    }
  } else {
    const AxisTaps across = axisTaps(w, rw), down = axisTaps(h, rh);
    const int64_t stride = w * channels;
    for (int64_t y = 0; y < rh; ++y) {
      const uint8_t* top = image.bytes.data() + down.lo[static_cast<size_t>(y)] * stride;
      const uint8_t* bottom = image.bytes.data() + down.hi[static_cast<size_t>(y)] * stride;
      const float fy = down.frac[static_cast<size_t>(y)];
      for (int c = 0; c < channels; ++c) {
        uint8_t* to = out.pixels.data() + c * plane + y * canvas;
        for (int64_t x = 0; x < rw; ++x) {
          const int64_t x0 = across.lo[static_cast<size_t>(x)] * channels + c;
          const int64_t x1 = across.hi[static_cast<size_t>(x)] * channels + c;
          const float fx = across.frac[static_cast<size_t>(x)];
          // The order of operations of mosaicScaleItem, so both round alike.
          const float upper = (1 - fx) * static_cast<float>(top[x0]) + fx * static_cast<float>(top[x1]);
          const float lower = (1 - fx) * static_cast<float>(bottom[x0]) + fx * static_cast<float>(bottom[x1]);
          to[x] = toByte((1 - fy) * upper + fy * lower);
        }
      }
    }
  }

  out.boxes.reserve(boxes.size());
  for (const CocoBox& box : boxes) {
    PTRAIN_CHECK(std::isfinite(box.x) && std::isfinite(box.y) && std::isfinite(box.width) && std::isfinite(box.height),
                 "letterbox: box ", box.id, " has a coordinate that is not a finite number");
    // Multiplied by the resized size before dividing by the source size, so
    // a whole-pixel corner of a whole-pixel scale stays exact.
    const auto mapX = [&](double v) { return v * static_cast<double>(rw) / static_cast<double>(w); };
    const auto mapY = [&](double v) { return v * static_cast<double>(rh) / static_cast<double>(h); };
    const int64_t x0 = std::clamp<int64_t>(static_cast<int64_t>(std::floor(mapX(box.x) + kSnapTolerance)), 0, rw);
    const int64_t y0 = std::clamp<int64_t>(static_cast<int64_t>(std::floor(mapY(box.y) + kSnapTolerance)), 0, rh);
    const int64_t x1 =
        std::clamp<int64_t>(static_cast<int64_t>(std::ceil(mapX(box.x + box.width) - kSnapTolerance)), 0, rw);
    const int64_t y1 =
        std::clamp<int64_t>(static_cast<int64_t>(std::ceil(mapY(box.y + box.height) - kSnapTolerance)), 0, rh);
    if (x1 <= x0 || y1 <= y0) continue;
    CanvasBox mapped;
    mapped.x = x0;
    mapped.y = y0;
    mapped.width = x1 - x0;
    mapped.height = y1 - y0;
    mapped.label = box.label;
    mapped.area = mapped.width * mapped.height;
    out.boxes.push_back(mapped);
  }
  return out;
}

}  // namespace ptrain::datasets
