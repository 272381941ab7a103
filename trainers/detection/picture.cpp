#include "picture.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>

#include "ptrain/core/error.h"

namespace ptrain::detection {

RgbImage::RgbImage(int64_t w, int64_t h, Rgb fill) : width(w), height(h) {
  PTRAIN_CHECK(w > 0 && h > 0, "picture: size ", w, "x", h);
  pixels.resize(static_cast<size_t>(w * h * 3));
  for (int64_t i = 0; i < w * h; ++i) {
    pixels[static_cast<size_t>(3 * i)] = fill.r;
    pixels[static_cast<size_t>(3 * i + 1)] = fill.g;
    pixels[static_cast<size_t>(3 * i + 2)] = fill.b;
  }
}

void RgbImage::set(int64_t x, int64_t y, Rgb c) {
  if (x < 0 || y < 0 || x >= width || y >= height) return;
  const size_t at = static_cast<size_t>(3 * (y * width + x));
  pixels[at] = c.r;
  pixels[at + 1] = c.g;
  pixels[at + 2] = c.b;
}

void RgbImage::outline(double x, double y, double w, double h, Rgb c, int thickness) {
  const int64_t x0 = std::llround(x), y0 = std::llround(y);
  const int64_t x1 = std::llround(x + w) - 1, y1 = std::llround(y + h) - 1;
  for (int t = 0; t < thickness; ++t) {
    for (int64_t i = x0 + t; i <= x1 - t; ++i) {
      set(i, y0 + t, c);
      set(i, y1 - t, c);
    }
    for (int64_t j = y0 + t; j <= y1 - t; ++j) {
      set(x0 + t, j, c);
      set(x1 - t, j, c);
    }
  }
}

namespace {

void putUint32(std::string& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>((v >> shift) & 0xff));
}

// A chunk: length, type, data, and the CRC-32 of type and data.
void putChunk(std::string& out, const char* type, const std::string& data) {
  putUint32(out, static_cast<uint32_t>(data.size()));
  const std::string typed = std::string(type, 4) + data;
  out += typed;
  putUint32(out, static_cast<uint32_t>(
                     crc32(0L, reinterpret_cast<const Bytef*>(typed.data()), static_cast<uInt>(typed.size()))));
}

double iou(const Box& a, const Box& b) {
  const double ix = std::max(0.0, std::min(a.x + a.width, b.x + b.width) - std::max(a.x, b.x));
  const double iy = std::max(0.0, std::min(a.y + a.height, b.y + b.height) - std::max(a.y, b.y));
  const double inter = ix * iy;
  const double uni = a.width * a.height + b.width * b.height - inter;
  return uni > 0 ? inter / uni : 0.0;
}

}  // namespace

void writePng(const std::string& path, const RgbImage& image) {
  // Each row: filter type 0 (none), then its pixels.
  const size_t stride = static_cast<size_t>(image.width * 3);
  std::string raw;
  raw.reserve(static_cast<size_t>(image.height) * (stride + 1));
  for (int64_t y = 0; y < image.height; ++y) {
    raw.push_back('\0');
    raw.append(reinterpret_cast<const char*>(image.pixels.data()) + static_cast<size_t>(y) * stride, stride);
  }
  uLongf packedSize = compressBound(static_cast<uLong>(raw.size()));
  std::string packed(packedSize, '\0');
  const int rc = compress2(reinterpret_cast<Bytef*>(packed.data()), &packedSize,
                           reinterpret_cast<const Bytef*>(raw.data()), static_cast<uLong>(raw.size()), 6);
  PTRAIN_CHECK(rc == Z_OK, "picture: zlib compress2 failed (", rc, ")");
  packed.resize(packedSize);

  std::string header;
  putUint32(header, static_cast<uint32_t>(image.width));
  putUint32(header, static_cast<uint32_t>(image.height));
  header += std::string("\x08\x02\x00\x00\x00", 5);  // 8 bits, RGB, deflate, adaptive filters, no interlace
  std::string png("\x89PNG\r\n\x1a\n", 8);
  putChunk(png, "IHDR", header);
  putChunk(png, "IDAT", packed);
  putChunk(png, "IEND", "");

  std::ofstream out(path, std::ios::binary);
  out.write(png.data(), static_cast<std::streamsize>(png.size()));
  out.close();
  PTRAIN_CHECK_AS(ConfigError, static_cast<bool>(out), "picture: cannot write ", path, ": ", std::strerror(errno));
}

RgbImage predictionPicture(const datasets::MosaicOptions& data, int64_t count, int64_t columns, int64_t zoom,
                           const std::vector<GroundTruth>& truth, const std::vector<Detection>& found,
                           double minScore) {
  PTRAIN_CHECK(count > 0 && columns > 0 && zoom > 0, "picture: ", count, " canvases, ", columns, " columns, zoom ",
               zoom);
  constexpr int64_t kMargin = 4;
  const int64_t cell = data.canvas * zoom;
  const int64_t rows = (count + columns - 1) / columns;
  const int64_t shown = std::min(count, columns);
  RgbImage picture(shown * cell + (shown + 1) * kMargin, rows * cell + (rows + 1) * kMargin, Rgb{255, 255, 255});
  for (int64_t i = 0; i < count; ++i) {
    const int64_t left = kMargin + (i % columns) * (cell + kMargin);
    const int64_t top = kMargin + (i / columns) * (cell + kMargin);
    const datasets::MosaicSample sample = datasets::mosaicSample(data, datasets::MosaicSplit::kValidation, i);
    const at::Tensor grey = sample.image.contiguous();
    const float* px = grey.data_ptr<float>();
    for (int64_t y = 0; y < cell; ++y) {
      for (int64_t x = 0; x < cell; ++x) {
        const float v = px[(y / zoom) * data.canvas + x / zoom];
        const auto level = static_cast<uint8_t>(std::clamp(std::lround(v * 255.0f), 0L, 255L));
        picture.set(left + x, top + y, Rgb{level, level, level});
      }
    }
    auto place = [&](const Box& b, Rgb colour, int thickness) {
      picture.outline(left + b.x * zoom, top + b.y * zoom, b.width * zoom, b.height * zoom, colour, thickness);
    };
    for (const GroundTruth& g : truth) {
      if (g.image_id == i) place(g.bbox, kTrueBoxColour, 2);
    }
    for (const Detection& d : found) {
      if (d.image_id != i || d.score < minScore) continue;
      bool right = false;
      for (const GroundTruth& g : truth) {
        right = right || (g.image_id == i && g.category_id == d.category_id && iou(g.bbox, d.bbox) >= 0.5);
      }
      place(d.bbox, right ? kRightDetectionColour : kWrongDetectionColour, 1);
    }
  }
  return picture;
}

}  // namespace ptrain::detection
