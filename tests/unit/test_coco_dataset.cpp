// COCO detection data (datasets/coco): the codec against PNG files built here
// byte by byte with zlib and against itself, the letterbox against
// hand-computed pixels and boxes, the reader against JSON written here and
// folders written by CocoWriter, and the writer's JSON against pycocotools.
#include <gtest/gtest.h>

#include <zlib.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "ptrain/datasets/coco_dataset.h"
#include "support/test_support.h"

using ptrain::ConfigError;
using ptrain::datasets::CanvasBox;
using ptrain::datasets::CocoBox;
using ptrain::datasets::CocoCategory;
using ptrain::datasets::CocoDataset;
using ptrain::datasets::CocoDatasetOptions;
using ptrain::datasets::CocoSample;
using ptrain::datasets::CocoWriter;
using ptrain::datasets::Image;
using ptrain::datasets::Letterbox;
using ptrain::test::TempDir;
using Json = nlohmann::json;

namespace {

// ---- helpers ----

// Deterministic pseudo-random bytes (an LCG), so failures reproduce.
Image noiseImage(int64_t width, int64_t height, int channels, uint32_t seed) {
  Image image;
  image.width = width;
  image.height = height;
  image.channels = channels;
  image.bytes.resize(static_cast<size_t>(width * height * channels));
  uint32_t state = seed * 2654435761u + 1;
  for (uint8_t& b : image.bytes) {
    state = state * 1664525u + 1013904223u;
    b = static_cast<uint8_t>(state >> 24);
  }
  return image;
}

// A smooth colour image: JPEG's compression error is small on it.
Image gradientImage(int64_t width, int64_t height) {
  Image image;
  image.width = width;
  image.height = height;
  image.channels = 3;
  for (int64_t y = 0; y < height; ++y) {
    for (int64_t x = 0; x < width; ++x) {
      image.bytes.push_back(static_cast<uint8_t>(40 + 160 * x / width));
      image.bytes.push_back(static_cast<uint8_t>(30 + 180 * y / height));
      image.bytes.push_back(static_cast<uint8_t>(200 - 100 * (x + y) / (width + height)));
    }
  }
  return image;
}

Image greyImage(int64_t width, int64_t height, std::vector<uint8_t> bytes) {
  Image image;
  image.width = width;
  image.height = height;
  image.channels = 1;
  image.bytes = std::move(bytes);
  return image;
}

void writeBytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

std::vector<uint8_t> readBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void appendBigEndian32(std::vector<uint8_t>& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(v >> shift));
}

void appendChunk(std::vector<uint8_t>& png, const char type[4], const std::vector<uint8_t>& data) {
  appendBigEndian32(png, static_cast<uint32_t>(data.size()));
  const size_t start = png.size();
  png.insert(png.end(), type, type + 4);
  png.insert(png.end(), data.begin(), data.end());
  appendBigEndian32(png, static_cast<uint32_t>(crc32(0, png.data() + start, static_cast<uInt>(png.size() - start))));
}

// A PNG assembled by hand (not by libpng), so the decoder is checked against
// the format rather than against its own library's encoder. `scanlines` are
// the filtered rows, each with its filter byte, passes one after another when
// interlaced.
std::vector<uint8_t> handMadePng(uint32_t width, uint32_t height, uint8_t bitDepth, uint8_t colorType,
                                 const std::vector<uint8_t>& scanlines, bool interlaced = false,
                                 const std::vector<uint8_t>& palette = {}, const std::vector<uint8_t>& transparency = {}) {
  std::vector<uint8_t> png = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  std::vector<uint8_t> header;
  appendBigEndian32(header, width);
  appendBigEndian32(header, height);
  header.insert(header.end(), {bitDepth, colorType, 0, 0, static_cast<uint8_t>(interlaced ? 1 : 0)});
  appendChunk(png, "IHDR", header);
  if (!palette.empty()) appendChunk(png, "PLTE", palette);
  if (!transparency.empty()) appendChunk(png, "tRNS", transparency);
  uLongf size = compressBound(static_cast<uLong>(scanlines.size()));
  std::vector<uint8_t> compressed(size);
  EXPECT_EQ(compress(compressed.data(), &size, scanlines.data(), static_cast<uLong>(scanlines.size())), Z_OK);
  compressed.resize(size);
  appendChunk(png, "IDAT", compressed);
  appendChunk(png, "IEND", {});
  return png;
}

Image decode(const std::vector<uint8_t>& bytes, int channels) {
  return ptrain::datasets::decodeImage(bytes.data(), bytes.size(), channels, "test.png");
}

// The ConfigError's message of `body`, or a failure.
template <typename Body>
std::string configErrorOf(Body body) {
  try {
    body();
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no ConfigError";
  return "";
}

#define EXPECT_ONE_LINE_WITH(message, part)                             \
  do {                                                                  \
    const std::string m_ = (message);                                   \
    EXPECT_NE(m_.find(part), std::string::npos) << "missing \"" << (part) << "\" in: " << m_; \
    EXPECT_EQ(m_.find('\n'), std::string::npos) << m_;                  \
  } while (0)

// Canvas boxes as tuples, for readable comparisons.
std::vector<std::vector<int64_t>> boxRows(const std::vector<CanvasBox>& boxes) {
  std::vector<std::vector<int64_t>> rows;
  for (const CanvasBox& b : boxes) rows.push_back({b.x, b.y, b.width, b.height, b.label, b.area});
  return rows;
}

CocoBox box(double x, double y, double w, double h, int64_t label = 0) {
  CocoBox b;
  b.x = x;
  b.y = y;
  b.width = w;
  b.height = h;
  b.label = label;
  return b;
}

// ---- codec ----

TEST(CocoDatasetCodec, PngRoundTripIsExact) {
  for (int channels : {1, 3}) {
    const Image source = noiseImage(37, 23, channels, 5);
    const std::vector<uint8_t> png = ptrain::datasets::encodePng(source);
    EXPECT_EQ(png, ptrain::datasets::encodePng(source)) << "same pixels, other bytes";
    const Image back = decode(png, channels);
    EXPECT_EQ(back.width, 37);
    EXPECT_EQ(back.height, 23);
    EXPECT_EQ(back.channels, channels);
    EXPECT_EQ(back.bytes, source.bytes) << channels << " channels";
  }
}

TEST(CocoDatasetCodec, ChannelConversionIsBt601InLibjpegsFixedPoint) {
  const Image rgb = noiseImage(16, 9, 3, 11);
  const Image grey = decode(ptrain::datasets::encodePng(rgb), 1);
  ASSERT_EQ(grey.channels, 1);
  for (size_t p = 0; p < grey.bytes.size(); ++p) {
    const double r = rgb.bytes[3 * p], g = rgb.bytes[3 * p + 1], b = rgb.bytes[3 * p + 2];
    // 0.299 R + 0.587 G + 0.114 B, rounded; the fixed point may differ from
    // the real-valued formula only where it lies within 0.01 of a half.
    const double exact = 0.299 * r + 0.587 * g + 0.114 * b;
    EXPECT_LE(std::abs(grey.bytes[p] - exact), 0.51) << "pixel " << p;
  }
  EXPECT_EQ(ptrain::datasets::lumaBt601(255, 255, 255), 255);
  EXPECT_EQ(ptrain::datasets::lumaBt601(255, 0, 0), 76);   // 76.245
  EXPECT_EQ(ptrain::datasets::lumaBt601(0, 255, 0), 150);  // 149.685
  EXPECT_EQ(ptrain::datasets::lumaBt601(0, 0, 255), 29);   // 29.07

  const Image fromGrey = decode(ptrain::datasets::encodePng(greyImage(2, 1, {7, 200})), 3);
  EXPECT_EQ(fromGrey.bytes, (std::vector<uint8_t>{7, 7, 7, 200, 200, 200}));
}

TEST(CocoDatasetCodec, PngLayoutsAllBecomeGreyOrRgb) {
  // Grey + alpha (type 4): alpha dropped, levels kept as stored.
  EXPECT_EQ(decode(handMadePng(2, 1, 8, 4, {0, 10, 255, 20, 0}), 1).bytes, (std::vector<uint8_t>{10, 20}));
  // RGBA (type 6) to RGB.
  EXPECT_EQ(decode(handMadePng(1, 1, 8, 6, {0, 1, 2, 3, 128}), 3).bytes, (std::vector<uint8_t>{1, 2, 3}));
  // Palette (type 3) with a tRNS entry: colours looked up, transparency dropped.
  EXPECT_EQ(decode(handMadePng(3, 1, 8, 3, {0, 2, 0, 1}, false, {9, 8, 7, 1, 2, 3, 200, 100, 50}, {0}), 3).bytes,
            (std::vector<uint8_t>{200, 100, 50, 9, 8, 7, 1, 2, 3}));
  // 16-bit grey: scaled with rounding (v / 257), not truncated (0x12FF -> 19, not 0x12 = 18).
  EXPECT_EQ(decode(handMadePng(4, 1, 16, 0, {0, 0x00, 0x00, 0xFF, 0xFF, 0x12, 0xFF, 0x81, 0x40}), 1).bytes,
            (std::vector<uint8_t>{0, 255, 19, 129}));
  // 1-bit grey: 0 -> 0, 1 -> 255.
  EXPECT_EQ(decode(handMadePng(3, 1, 1, 0, {0, 0b10100000}), 1).bytes, (std::vector<uint8_t>{255, 0, 255}));
  // Adam7-interlaced 2x2 grey: pass 1 holds (0,0), pass 6 (1,0), pass 7 row 1.
  EXPECT_EQ(decode(handMadePng(2, 2, 8, 0, {0, 11, 0, 12, 0, 21, 22}, true), 1).bytes,
            (std::vector<uint8_t>{11, 12, 21, 22}));
  // 16-bit RGB to grey: scaled first, then BT.601.
  const Image rgb16 = decode(handMadePng(1, 1, 16, 2, {0, 0xFF, 0xFF, 0, 0, 0, 0}), 1);
  EXPECT_EQ(rgb16.bytes, (std::vector<uint8_t>{76}));
}

TEST(CocoDatasetCodec, JpegAtQuality100DecodesCloseToItsSource) {
  const Image source = gradientImage(48, 32);
  const std::vector<uint8_t> jpeg = ptrain::datasets::encodeJpeg(source, 100);
  const Image rgb = decode(jpeg, 3);
  ASSERT_EQ(rgb.width, 48);
  ASSERT_EQ(rgb.height, 32);
  ASSERT_EQ(rgb.channels, 3);
  // Quality 100 still halves the chroma resolution (libjpeg's 4:2:0
  // default), so a colour pixel may move a few levels; on average well under one.
  int worst = 0;
  double total = 0;
  for (size_t i = 0; i < rgb.bytes.size(); ++i) {
    worst = std::max(worst, std::abs(rgb.bytes[i] - source.bytes[i]));
    total += std::abs(rgb.bytes[i] - source.bytes[i]);
  }
  EXPECT_LE(worst, 8);
  EXPECT_LE(total / static_cast<double>(rgb.bytes.size()), 1.0);

  // Asked for grey: libjpeg's luma plane, close to BT.601 of the source.
  const Image grey = decode(jpeg, 1);
  ASSERT_EQ(grey.channels, 1);
  int worstGrey = 0;
  for (size_t p = 0; p < grey.bytes.size(); ++p) {
    const int expected = ptrain::datasets::lumaBt601(source.bytes[3 * p], source.bytes[3 * p + 1], source.bytes[3 * p + 2]);
    worstGrey = std::max(worstGrey, std::abs(grey.bytes[p] - expected));
  }
  EXPECT_LE(worstGrey, 2);

  // A grey JPEG stays grey and close.
  const Image greySource = ptrain::datasets::convertChannels(source, 1);
  const Image greyBack = decode(ptrain::datasets::encodeJpeg(greySource, 100), 1);
  int worstPlain = 0;
  for (size_t p = 0; p < greyBack.bytes.size(); ++p) {
    worstPlain = std::max(worstPlain, std::abs(greyBack.bytes[p] - greySource.bytes[p]));
  }
  EXPECT_LE(worstPlain, 1);
}

TEST(CocoDatasetCodec, CorruptAndTruncatedFilesAreOneConfigErrorLine) {
  TempDir dir;
  std::vector<uint8_t> png = ptrain::datasets::encodePng(noiseImage(20, 20, 1, 3));
  std::vector<uint8_t> corrupt = png;
  corrupt[png.size() / 2] ^= 0x5A;  // inside IDAT: its CRC no longer matches
  const std::string corruptPath = dir.path() + "/corrupt.png";
  writeBytes(corruptPath, corrupt);
  std::string message = configErrorOf([&] { ptrain::datasets::readImageFile(corruptPath, 1); });
  EXPECT_ONE_LINE_WITH(message, corruptPath + " is not a readable PNG");

  const std::string shortPng = dir.path() + "/short.png";
  writeBytes(shortPng, std::vector<uint8_t>(png.begin(), png.begin() + static_cast<long>(png.size() / 2)));
  message = configErrorOf([&] { ptrain::datasets::readImageFile(shortPng, 1); });
  EXPECT_ONE_LINE_WITH(message, shortPng + " is not a readable PNG");
  EXPECT_ONE_LINE_WITH(message, "truncated");

  const std::vector<uint8_t> jpeg = ptrain::datasets::encodeJpeg(gradientImage(64, 64), 90);
  const std::string shortJpeg = dir.path() + "/short.jpg";
  writeBytes(shortJpeg, std::vector<uint8_t>(jpeg.begin(), jpeg.begin() + static_cast<long>(jpeg.size() / 2)));
  message = configErrorOf([&] { ptrain::datasets::readImageFile(shortJpeg, 3); });
  EXPECT_ONE_LINE_WITH(message, shortJpeg + " is not a readable JPEG");
  EXPECT_ONE_LINE_WITH(message, "Premature end");

  std::vector<uint8_t> badJpeg(jpeg.begin(), jpeg.begin() + 40);  // headers cut mid-table
  message = configErrorOf([&] { decode(badJpeg, 3); });
  EXPECT_ONE_LINE_WITH(message, "test.png is not a readable JPEG");

  const std::string text = dir.path() + "/notes.png";
  writeBytes(text, {'h', 'e', 'l', 'l', 'o'});
  message = configErrorOf([&] { ptrain::datasets::readImageFile(text, 1); });
  EXPECT_ONE_LINE_WITH(message, text + " is neither a PNG nor a JPEG");

  message = configErrorOf([&] { ptrain::datasets::readImageFile(dir.path() + "/absent.png", 1); });
  EXPECT_ONE_LINE_WITH(message, dir.path() + "/absent.png does not exist");
}

// ---- letterbox ----

TEST(CocoDatasetLetterbox, CanvasSizedImageIsTheIdentity) {
  const std::vector<CocoBox> boxes = {box(0, 0, 16, 16, 2), box(3, 5, 7, 2, 9), box(15, 0, 1, 1, 0)};
  for (int channels : {1, 3}) {
    const Image image = noiseImage(16, 16, channels, 21);
    const Letterbox out = ptrain::datasets::letterbox(image, boxes, 16);
    EXPECT_EQ(out.resized_width, 16);
    EXPECT_EQ(out.resized_height, 16);
    EXPECT_EQ(out.scale_x, 1.0);
    ASSERT_EQ(out.pixels.size(), image.bytes.size());
    // Channel-first: plane c holds channel c of every pixel.
    for (int c = 0; c < channels; ++c) {
      for (int64_t p = 0; p < 16 * 16; ++p) {
        ASSERT_EQ(out.pixels[static_cast<size_t>(c * 256 + p)], image.bytes[static_cast<size_t>(p * channels + c)]);
      }
    }
    EXPECT_EQ(boxRows(out.boxes), (std::vector<std::vector<int64_t>>{{0, 0, 16, 16, 2, 256}, {3, 5, 7, 2, 9, 14},
                                                                      {15, 0, 1, 1, 0, 1}}));
  }
}

TEST(CocoDatasetLetterbox, TwoToOneImageHandComputed) {
  // 4x2 into a 2-canvas: s = min(2/4, 2/2) = 1/2, resized to 2x1. Every
  // output pixel samples source (2o + 0.5, 0.5): the mean of a 2x2 block.
  const Image image = greyImage(4, 2, {10, 20, 30, 40, 50, 60, 70, 81});
  const Letterbox small = ptrain::datasets::letterbox(image, {box(1, 0, 2, 1, 4), box(3, 1, 1, 1, 5)}, 2);
  EXPECT_EQ(small.resized_width, 2);
  EXPECT_EQ(small.resized_height, 1);
  EXPECT_EQ(small.scale_x, 0.5);
  EXPECT_EQ(small.scale_y, 0.5);
  // (30 + 40 + 70 + 81) / 4 = 55.25 -> 55; row 1 is padding.
  EXPECT_EQ(small.pixels, (std::vector<uint8_t>{35, 55, 0, 0}));
  // [1, 0, 2, 1] -> corners (0.5, 0) (1.5, 0.5) -> floor/ceil [0, 2) x [0, 1).
  // [3, 1, 1, 1] -> corners (1.5, 0.5) (2, 1) -> [1, 2) x [0, 1).
  EXPECT_EQ(boxRows(small.boxes), (std::vector<std::vector<int64_t>>{{0, 0, 2, 1, 4, 2}, {1, 0, 1, 1, 5, 1}}));

  // The same image into a 4-canvas: s = 1, copied to the top-left, rows 2-3 zero.
  const Letterbox same = ptrain::datasets::letterbox(image, {box(1, 0, 2, 1)}, 4);
  EXPECT_EQ(same.pixels, (std::vector<uint8_t>{10, 20, 30, 40, 50, 60, 70, 81, 0, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(boxRows(same.boxes), (std::vector<std::vector<int64_t>>{{1, 0, 2, 1, 0, 2}}));
}

TEST(CocoDatasetLetterbox, UpscalingHandComputed) {
  // 2x1 into a 4-canvas: s = min(4/2, 4/1) = 2 (no upscaling limit), 4x2.
  // Source x of output o: (o + 0.5) / 2 - 0.5 = -0.25 (clamped to 0), 0.25,
  // 0.75, 1.25 (index 1, its neighbour clamped): 100, 125, 175, 200.
  const Letterbox out = ptrain::datasets::letterbox(greyImage(2, 1, {100, 200}), {box(1, 0, 1, 1)}, 4);
  EXPECT_EQ(out.resized_width, 4);
  EXPECT_EQ(out.resized_height, 2);
  EXPECT_EQ(out.pixels, (std::vector<uint8_t>{100, 125, 175, 200, 100, 125, 175, 200, 0, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(boxRows(out.boxes), (std::vector<std::vector<int64_t>>{{2, 0, 2, 2, 0, 4}}));

  // Bytes round half up: 2x1 {0, 1} into a 1-canvas samples x = 0.5: 0.5 -> 1.
  const Letterbox half = ptrain::datasets::letterbox(greyImage(2, 1, {0, 1}), {}, 1);
  EXPECT_EQ(half.resized_height, 1) << "never below one row";
  EXPECT_EQ(half.pixels, (std::vector<uint8_t>{1}));
}

TEST(CocoDatasetLetterbox, BoxMappingHandComputed) {
  // 10x5 into a 3-canvas: s = 0.3, resized 3 x round(1.5) = 3x2, so
  // scale_x = 0.3 and scale_y = 0.4.
  const Image image = noiseImage(10, 5, 1, 2);
  const Letterbox out = ptrain::datasets::letterbox(
      image,
      {box(0, 0, 10, 5, 1),            // everything -> [0, 3) x [0, 2)
       box(2.5, 1, 1, 1, 2),           // x 0.75..1.05 -> [0, 2); y 0.4..0.8 -> [0, 1)
       box(3.3333333333, 0, 3.3333333334, 2.5, 3),  // x 1.0000000..2.0000000 within tolerance -> [1, 2); y [0, 1)
       box(9.5, 4, 0.5, 1, 4),         // x 2.85..3 -> [2, 3); y 1.6..2 -> [1, 2)
       box(10, 0, 0.9, 1, 5),          // one pixel out of the image: clamped to nothing, dropped
       box(-0.5, -0.5, 1, 1, 6)},      // starts off the image: clamped to [0, 1) x [0, 1)
      3);
  EXPECT_EQ(out.resized_width, 3);
  EXPECT_EQ(out.resized_height, 2);
  EXPECT_DOUBLE_EQ(out.scale_y, 0.4);
  EXPECT_EQ(boxRows(out.boxes), (std::vector<std::vector<int64_t>>{{0, 0, 3, 2, 1, 6},
                                                                    {0, 0, 2, 1, 2, 2},
                                                                    {1, 0, 1, 1, 3, 1},
                                                                    {2, 1, 1, 1, 4, 1},
                                                                    {0, 0, 1, 1, 6, 1}}));
  // The padding row of the canvas stays 0.
  for (int64_t x = 0; x < 3; ++x) EXPECT_EQ(out.pixels[static_cast<size_t>(2 * 3 + x)], 0);
}

// ---- reader ----

// A valid instances file for images 8x6 a.png (id 1) and b.png (id 2).
Json baseInstances() {
  return Json::parse(R"({
    "images": [{"id": 1, "file_name": "a.png", "width": 8, "height": 6},
               {"id": 2, "file_name": "b.png", "width": 8, "height": 6}],
    "annotations": [{"id": 11, "image_id": 1, "category_id": 3, "bbox": [1, 1, 2, 2], "area": 4, "iscrowd": 0},
                    {"id": 12, "image_id": 2, "category_id": 5, "bbox": [0, 0, 8, 6], "area": 48, "iscrowd": 0}],
    "categories": [{"id": 3, "name": "cat"}, {"id": 5, "name": "dog"}]
  })");
}

std::string writeJson(const TempDir& dir, const Json& document, const std::string& name = "instances.json") {
  return dir.write(name, document.dump(1));
}

TEST(CocoDatasetReader, LabelsImagesAndBoxesFollowTheDocumentedOrder) {
  TempDir dir;
  const Json document = Json::parse(R"({
    "images": [{"id": 30, "file_name": "c.jpg", "width": 100, "height": 50},
               {"id": 4, "file_name": "a.jpg", "width": 40, "height": 40},
               {"id": 17, "file_name": "b.jpg", "width": 64, "height": 48}],
    "annotations": [
      {"id": 1, "image_id": 4, "category_id": 7, "bbox": [1.5, 2, 3, 4], "area": 10.5, "iscrowd": 0},
      {"id": 2, "image_id": 30, "category_id": 2, "bbox": [0, 0, 100, 50], "area": 5000, "iscrowd": 0},
      {"id": 3, "image_id": 4, "category_id": 2, "bbox": [0, 0, 40, 40], "area": 1, "iscrowd": 1},
      {"id": 9, "image_id": 4, "category_id": 5, "bbox": [10, 10, 5, 5]},
      {"id": 5, "image_id": 4, "category_id": 2, "bbox": [-0.5, 0, 41, 40.9], "area": 3, "iscrowd": 0}],
    "categories": [{"id": 7, "name": "seven"}, {"id": 2, "name": "two"}, {"id": 5, "name": "five"}]
  })");
  const CocoDataset dataset(writeJson(dir, document), dir.path());
  // Categories by ascending id: 2 -> 0, 5 -> 1, 7 -> 2.
  ASSERT_EQ(dataset.categories().size(), 3u);
  EXPECT_EQ(dataset.categories()[0].id, 2);
  EXPECT_EQ(dataset.categories()[0].name, "two");
  EXPECT_EQ(dataset.categories()[2].name, "seven");
  // Images by ascending id.
  ASSERT_EQ(dataset.size(), 3);
  EXPECT_EQ(dataset.info(0).id, 4);
  EXPECT_EQ(dataset.info(1).id, 17);
  EXPECT_EQ(dataset.info(2).id, 30);
  EXPECT_EQ(dataset.imagePath(0), dir.path() + "/a.jpg");
  // Image 4's boxes in annotation order, the crowd one skipped, area
  // defaulting to w * h, one pixel of slack accepted.
  const std::vector<CocoBox>& boxes = dataset.info(0).boxes;
  ASSERT_EQ(boxes.size(), 3u);
  EXPECT_EQ(boxes[0].id, 1);
  EXPECT_EQ(boxes[0].label, 2);
  EXPECT_EQ(boxes[0].x, 1.5);
  EXPECT_EQ(boxes[0].area, 10.5);
  EXPECT_EQ(boxes[1].id, 9);
  EXPECT_EQ(boxes[1].label, 1);
  EXPECT_EQ(boxes[1].area, 25);
  EXPECT_EQ(boxes[2].id, 5);
  EXPECT_EQ(boxes[2].label, 0);
  EXPECT_TRUE(dataset.info(1).boxes.empty());
  EXPECT_EQ(dataset.info(2).boxes.size(), 1u);
  EXPECT_EQ(dataset.crowdSkipped(), 1);
  EXPECT_EQ(dataset.boxCount(), 4);
  EXPECT_EQ(dataset.imagesOpened(), 0) << "reading the JSON opens no image";
}

TEST(CocoDatasetReader, AFileWithoutAnnotationsListsImagesOnly) {
  TempDir dir;
  Json document = baseInstances();
  document.erase("annotations");
  const CocoDataset dataset(writeJson(dir, document), dir.path());
  EXPECT_EQ(dataset.size(), 2);
  EXPECT_EQ(dataset.boxCount(), 0);
}

struct MalformedCase {
  const char* name;
  void (*mutate)(Json&);
  std::vector<std::string> expected;  // parts of the message
};

class CocoDatasetMalformed : public ::testing::TestWithParam<MalformedCase> {};

TEST_P(CocoDatasetMalformed, IsRefusedWithOneLineNamingWhereAndWhat) {
  TempDir dir;
  Json document = baseInstances();
  GetParam().mutate(document);
  const std::string path = writeJson(dir, document);
  const std::string message = configErrorOf([&] { CocoDataset(path, dir.path()); });
  EXPECT_ONE_LINE_WITH(message, "coco dataset: " + path + ": ");
  for (const std::string& part : GetParam().expected) EXPECT_ONE_LINE_WITH(message, part);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, CocoDatasetMalformed,
    ::testing::Values(
        MalformedCase{"BboxOfThreeNumbers", [](Json& j) { j["annotations"][1]["bbox"] = {0, 0, 8}; },
                      {"annotations[1] (id 12)", "\"bbox\" must be 4 numbers [x, y, width, height], got [0,0,8]"}},
        MalformedCase{"BboxWithAString", [](Json& j) { j["annotations"][1]["bbox"][2] = "8"; },
                      {"annotations[1] (id 12)", "must be 4 numbers"}},
        MalformedCase{"BboxMissing", [](Json& j) { j["annotations"][1].erase("bbox"); },
                      {"annotations[1] (id 12)", "has no \"bbox\""}},
        MalformedCase{"ZeroWidth", [](Json& j) { j["annotations"][1]["bbox"] = {0, 0, 0, 6}; },
                      {"annotations[1] (id 12)", "width or height <= 0"}},
        MalformedCase{"NegativeHeight", [](Json& j) { j["annotations"][0]["bbox"] = {1, 1, 2, -2}; },
                      {"annotations[0] (id 11)", "width or height <= 0"}},
        MalformedCase{"OutsideTheImage", [](Json& j) { j["annotations"][1]["bbox"] = {2, 0, 8, 6}; },
                      {"annotations[1] (id 12)", "outside its 8x6 image (id 2) by more than a pixel"}},
        MalformedCase{"UnknownImage", [](Json& j) { j["annotations"][1]["image_id"] = 99; },
                      {"annotations[1] (id 12)", "image_id 99 is not in \"images\""}},
        MalformedCase{"UnknownCategory", [](Json& j) { j["annotations"][1]["category_id"] = 4; },
                      {"annotations[1] (id 12)", "category_id 4 is not in \"categories\""}},
        MalformedCase{"DuplicateImageId", [](Json& j) { j["images"][1]["id"] = 1; },
                      {"images[1] (id 1)", "already used by images[0]"}},
        MalformedCase{"DuplicateAnnotationId", [](Json& j) { j["annotations"][1]["id"] = 11; },
                      {"annotations[1] (id 11)", "already used by annotations[0]"}},
        MalformedCase{"DuplicateCategoryId", [](Json& j) { j["categories"][1]["id"] = 3; },
                      {"category id 3 appears twice"}},
        MalformedCase{"AnnotationWithoutId", [](Json& j) { j["annotations"][1].erase("id"); },
                      {"annotations[1]: has no \"id\""}},
        MalformedCase{"FractionalImageId", [](Json& j) { j["annotations"][1]["image_id"] = 2.5; },
                      {"annotations[1] (id 12)", "\"image_id\" must be an integer, got 2.5"}},
        MalformedCase{"IscrowdTwo", [](Json& j) { j["annotations"][1]["iscrowd"] = 2; },
                      {"\"iscrowd\" must be 0 or 1"}},
        MalformedCase{"NegativeArea", [](Json& j) { j["annotations"][1]["area"] = -1; }, {"\"area\" must be a number >= 0"}},
        MalformedCase{"ImageWithoutSize", [](Json& j) { j["images"][0]["width"] = 0; },
                      {"images[0] (id 1)", "width 0 and height 6 must both be > 0"}},
        MalformedCase{"ImageWithoutFileName", [](Json& j) { j["images"][0].erase("file_name"); },
                      {"images[0] (id 1)", "has no \"file_name\""}},
        MalformedCase{"NoImages", [](Json& j) { j.erase("images"); }, {"top level: has no \"images\""}},
        MalformedCase{"AnnotationsNotAnArray", [](Json& j) { j["annotations"] = Json::object(); },
                      {"annotations: expected an array, got object"}},
        MalformedCase{"TopLevelArray", [](Json& j) { j = Json::array(); }, {"top level: expected an object"}}),
    [](const ::testing::TestParamInfo<MalformedCase>& info) { return std::string(info.param.name); });

TEST(CocoDatasetReader, NotJsonNamesLineAndColumn) {
  TempDir dir;
  const std::string path = dir.write("instances.json", "{\n  \"images\": [\n  }\n");
  const std::string message = configErrorOf([&] { CocoDataset(path, dir.path()); });
  EXPECT_ONE_LINE_WITH(message, "coco dataset: " + path + " is not JSON: parse error at line 3, column 3");

  const std::string missing = dir.path() + "/nowhere.json";
  EXPECT_ONE_LINE_WITH(configErrorOf([&] { CocoDataset(missing, dir.path()); }),
                       "coco dataset: annotations file " + missing + " does not exist");
}

TEST(CocoDatasetReader, ImageFilesAreCheckedByStatAndRefusedWhenBad) {
  TempDir dir;
  const std::string path = writeJson(dir, baseInstances());
  writeBytes(dir.path() + "/a.png", ptrain::datasets::encodePng(noiseImage(8, 6, 1, 1)));
  const CocoDataset dataset(path, dir.path());
  EXPECT_EQ(dataset.missingImageFiles(), (std::vector<std::string>{dir.path() + "/b.png"}));
  std::string message = configErrorOf([&] { dataset.checkImageFiles(); });
  EXPECT_ONE_LINE_WITH(message, "1 of 2 image files listed in " + path + " are missing from " + dir.path());
  EXPECT_ONE_LINE_WITH(message, "the first " + dir.path() + "/b.png (image id 2)");
  EXPECT_EQ(dataset.imagesOpened(), 0) << "the check only stats";
  message = configErrorOf([&] { dataset.image(1, 1); });
  EXPECT_ONE_LINE_WITH(message, dir.path() + "/b.png does not exist");

  // A corrupt PNG and a truncated JPEG behind a valid JSON.
  std::vector<uint8_t> png = ptrain::datasets::encodePng(noiseImage(8, 6, 1, 2));
  png[png.size() / 2] ^= 0xFF;
  writeBytes(dir.path() + "/b.png", png);
  EXPECT_ONE_LINE_WITH(configErrorOf([&] { dataset.sample(1, 8, 1); }), dir.path() + "/b.png is not a readable PNG");
  const std::vector<uint8_t> jpeg = ptrain::datasets::encodeJpeg(noiseImage(8, 6, 3, 2), 95);
  writeBytes(dir.path() + "/b.png", std::vector<uint8_t>(jpeg.begin(), jpeg.end() - 60));
  EXPECT_ONE_LINE_WITH(configErrorOf([&] { dataset.sample(1, 8, 3); }), dir.path() + "/b.png is not a readable JPEG");

  // A readable image of another size than the JSON says.
  writeBytes(dir.path() + "/b.png", ptrain::datasets::encodePng(noiseImage(6, 8, 1, 2)));
  EXPECT_ONE_LINE_WITH(configErrorOf([&] { dataset.image(1, 1); }),
                       dir.path() + "/b.png is 6x8 but " + path + " lists image id 2 as 8x6");
  dataset.checkImageFiles();  // all present now
}

std::vector<CocoCategory> fashionCategories() {
  const char* names[10] = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                           "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  std::vector<CocoCategory> categories;
  for (int64_t label = 0; label < 10; ++label) categories.push_back({label + 1, names[label]});
  return categories;
}

struct WrittenImage {
  int64_t id;
  std::string file_name;
  Image image;
  std::vector<CocoBox> boxes;
};

// Canvases like the mosaics: grey C x C, whole-pixel boxes, labels 0-9;
// added out of id order on purpose.
std::vector<WrittenImage> mosaicLikeImages(int channels) {
  std::vector<WrittenImage> images;
  images.push_back({7, "mosaic_000007.png", noiseImage(32, 32, channels, 7), {box(1, 2, 10, 12, 3), box(20, 20, 12, 12, 9)}});
  images.push_back({0, "mosaic_000000.png", noiseImage(32, 32, channels, 0), {box(0, 0, 32, 32, 0)}});
  images.push_back({3, "mosaic_000003.png", noiseImage(32, 32, channels, 3), {}});
  images.push_back({5, "mosaic_000005.png", noiseImage(32, 32, channels, 5), {box(4, 5, 6, 7, 5), box(4.5, 5.25, 6, 7, 8)}});
  return images;
}

std::string writeFolder(const std::string& out, const std::vector<WrittenImage>& images) {
  CocoWriter writer(out, "val", fashionCategories());
  for (const WrittenImage& w : images) writer.add(w.id, w.file_name, w.image, w.boxes);
  return writer.finish();
}

TEST(CocoDatasetWriter, FolderReadsBackIdentically) {
  for (int channels : {1, 3}) {
    TempDir dir;
    const std::vector<WrittenImage> written = mosaicLikeImages(channels);
    const std::string json = writeFolder(dir.path() + "/out", written);
    EXPECT_EQ(json, dir.path() + "/out/annotations/instances_val.json");
    EXPECT_TRUE(std::filesystem::exists(dir.path() + "/out/images/mosaic_000007.png"));

    const CocoDataset dataset(json, dir.path() + "/out/images");
    ASSERT_EQ(dataset.size(), 4);
    ASSERT_EQ(dataset.categories().size(), 10u);
    EXPECT_EQ(dataset.categories()[9].name, "Ankle boot");
    EXPECT_EQ(dataset.categories()[9].id, 10);
    std::vector<WrittenImage> byId = written;
    std::sort(byId.begin(), byId.end(), [](const WrittenImage& a, const WrittenImage& b) { return a.id < b.id; });
    int64_t annotationId = 1;
    for (int64_t i = 0; i < dataset.size(); ++i) {
      const WrittenImage& expected = byId[static_cast<size_t>(i)];
      EXPECT_EQ(dataset.info(i).id, expected.id);
      EXPECT_EQ(dataset.info(i).file_name, expected.file_name);
      const Image image = dataset.image(i, channels);
      EXPECT_EQ(image.bytes, expected.image.bytes) << "image " << expected.id;
      const std::vector<CocoBox>& boxes = dataset.info(i).boxes;
      ASSERT_EQ(boxes.size(), expected.boxes.size());
      for (size_t k = 0; k < boxes.size(); ++k) {
        EXPECT_EQ(boxes[k].id, annotationId++) << "annotations numbered 1..N in image-id order";
        EXPECT_EQ(boxes[k].x, expected.boxes[k].x);
        EXPECT_EQ(boxes[k].y, expected.boxes[k].y);
        EXPECT_EQ(boxes[k].width, expected.boxes[k].width);
        EXPECT_EQ(boxes[k].height, expected.boxes[k].height);
        EXPECT_EQ(boxes[k].label, expected.boxes[k].label);
        EXPECT_EQ(boxes[k].area, expected.boxes[k].width * expected.boxes[k].height);
      }
      // A canvas-sized image samples to itself: the exported mosaic trains
      // as the generated one.
      if (channels == 1) {
        const CocoSample sample = dataset.sample(i, 32, 1);
        EXPECT_EQ(sample.canvas.pixels, expected.image.bytes);
        EXPECT_EQ(sample.image_id, expected.id);
        EXPECT_EQ(sample.file_name, expected.file_name);
        ASSERT_EQ(sample.canvas.boxes.size(), expected.boxes.size());
        if (expected.id == 7) {
          EXPECT_EQ(boxRows(sample.canvas.boxes),
                    (std::vector<std::vector<int64_t>>{{1, 2, 10, 12, 3, 120}, {20, 20, 12, 12, 9, 144}}));
        }
      }
    }
    // Whole numbers are written as integers, fractions as they are.
    const std::string text = ptrain::test::readFile(json);
    EXPECT_NE(text.find("\"bbox\":[1,2,10,12]"), std::string::npos) << text;
    EXPECT_NE(text.find("\"bbox\":[4.5,5.25,6,7]"), std::string::npos) << text;
    EXPECT_EQ(text.find(".tmp"), std::string::npos);
    for (const auto& entry : std::filesystem::recursive_directory_iterator(dir.path())) {
      EXPECT_EQ(entry.path().string().find(".tmp."), std::string::npos) << "left behind: " << entry.path();
    }
  }
}

TEST(CocoDatasetWriter, SameInputSameBytes) {
  TempDir dir;
  std::vector<WrittenImage> images = mosaicLikeImages(1);
  const std::string first = writeFolder(dir.path() + "/one", images);
  std::reverse(images.begin(), images.end());  // the order of add() does not matter
  const std::string second = writeFolder(dir.path() + "/two", images);
  EXPECT_EQ(readBytes(first), readBytes(second));
  for (const WrittenImage& w : images) {
    EXPECT_EQ(readBytes(dir.path() + "/one/images/" + w.file_name), readBytes(dir.path() + "/two/images/" + w.file_name));
  }
}

TEST(CocoDatasetReader, ReadingARangeOpensOnlyThoseImages) {
  TempDir dir;
  CocoWriter writer(dir.path(), "train", fashionCategories());
  for (int64_t id = 0; id < 8; ++id) {
    writer.add(id, "img" + std::to_string(id) + ".png", noiseImage(16, 12, 1, static_cast<uint32_t>(id)),
               {box(1, 1, 4, 4, id)});
  }
  const std::string json = writer.finish();
  // Files outside the range are removed: a rank that touched them would fail.
  for (int64_t id : {0, 1, 5, 6, 7}) std::filesystem::remove(dir.path() + "/images/img" + std::to_string(id) + ".png");

  std::vector<int64_t> opened;
  CocoDatasetOptions options;
  options.on_image_open = [&](int64_t index, const std::string& path) {
    opened.push_back(index);
    EXPECT_EQ(path, dir.path() + "/images/img" + std::to_string(index) + ".png");
  };
  const CocoDataset dataset(json, dir.path() + "/images", options);
  EXPECT_EQ(dataset.imagesOpened(), 0);
  for (int64_t i = 2; i < 5; ++i) {
    const CocoSample sample = dataset.sample(i, 16, 1);
    EXPECT_EQ(sample.image_id, i);
    ASSERT_EQ(sample.canvas.boxes.size(), 1u);
    EXPECT_EQ(sample.canvas.boxes[0].label, i);
  }
  EXPECT_EQ(opened, (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(dataset.imagesOpened(), 3);
}

// ---- pycocotools ----

TEST(CocoDatasetWriter, PycocotoolsLoadsTheJson) {
  const std::string lacks = ptrain::test::pythonLacks({"pycocotools.coco", "pycocotools.cocoeval"});
  if (!lacks.empty()) GTEST_SKIP() << lacks;
  const std::string python = ptrain::test::testPython();
  TempDir dir;
  const std::vector<WrittenImage> written = mosaicLikeImages(1);
  const std::string json = writeFolder(dir.path() + "/out", written);
  // Loads the file, lists what it holds, and scores the ground truth against
  // itself (AP 1 when every field is what pycocotools expects).
  const std::string script = dir.write("check.py", R"(import contextlib, io, sys
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval
with contextlib.redirect_stdout(io.StringIO()):
    gt = COCO(sys.argv[1])
    anns = gt.loadAnns(gt.getAnnIds())
    dt = gt.loadRes([dict(image_id=a["image_id"], category_id=a["category_id"], bbox=a["bbox"], score=1.0) for a in anns])
    ev = COCOeval(gt, dt, "bbox")
    ev.evaluate(); ev.accumulate(); ev.summarize()
print(len(gt.getImgIds()), len(gt.getCatIds()), len(anns))
for a in sorted(anns, key=lambda a: a["id"]):
    print(a["id"], a["image_id"], a["category_id"], *a["bbox"])
print("AP %.6f" % ev.stats[0])
)");
  const ptrain::test::ProcessResult result = ptrain::test::runProcess({python, script, json}, {}, 120);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  std::string expected = "4 10 5\n";
  expected += "1 0 1 0 0 32 32\n";
  expected += "2 5 6 4 5 6 7\n";
  expected += "3 5 9 4.5 5.25 6 7\n";
  expected += "4 7 4 1 2 10 12\n";
  expected += "5 7 10 20 20 12 12\n";
  expected += "AP 1.000000\n";
  EXPECT_EQ(result.output, expected);
}

}  // namespace
