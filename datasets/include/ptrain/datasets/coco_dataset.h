// COCO detection data read and written natively: an image codec (PNG, JPEG),
// a reader of COCO instances files with their image folder, the letterbox
// that fits any image into the detection trainer's square canvas, and a writer
// of COCO folders (PNG images plus an instances JSON that pycocotools loads).
//
// Images (Image): 8-bit, `channels` 1 (grey) or 3 (RGB), row-major with the
// channels of a pixel next to each other (interleaved, what the codecs read
// and write). A canvas (CocoSample, Letterbox) is channel-first instead: one
// C x C plane per channel, so it copies straight into the [channels, C, C]
// tensor the detection models take (for grey both layouts are the same).
//
// Grey from colour: Y = (19595 R + 38470 G + 7471 B + 32768) >> 16, ITU-R
// BT.601's 0.299 / 0.587 / 0.114 in libjpeg's 16-bit fixed point, rounded half
// up: bit for bit what libjpeg's RGB-to-grey conversion and Pillow's
// convert("L") give. A colour JPEG asked for grey yields its stored luma plane
// (libjpeg's JCS_GRAYSCALE output), which can differ by a level or two from the
// formula applied to its decoded RGB. Colour from grey repeats the level.
// Alpha is dropped (the colour values are kept as stored, not composited), as
// Pillow's convert("RGB") does. 16-bit PNGs are scaled to 8 bits by libpng's
// png_set_scale_16 (rounded, not truncated). Gamma chunks and JPEG EXIF
// orientation are ignored: pixels are taken as stored, which is what COCO's
// widths, heights and boxes refer to.
//
// Letterbox (letterbox, CocoDataset::sample) of a w x h image into a C x C
// canvas:
//   - scale s = min(C / w, C / h); small images are scaled up too (no limit),
//     so every image fills the canvas along its longer side.
//   - the image is resized to W' x H' = max(1, round(w s)) x max(1, round(h s))
//     by bilinear interpolation with half-pixel centres (libtorch's
//     interpolate(size=...) with align_corners=false: source coordinate
//     (o + 0.5) w / W' - 0.5, negative ones clamped to 0, the last row and
//     column repeated at the edge; no antialiasing), computed in float as the
//     mosaic generator scales its items, then rounded half up to a byte.
//   - placed at the top-left corner (0, 0), the rest of the canvas 0. So an
//     image of exactly C x C maps to itself bit for bit, boxes included: that
//     is what makes exported mosaics train like the generator's canvases.
//   - boxes scale by W' / w across and H' / h down (s itself, up to the
//     rounding of W' and H'), then snap outwards to whole pixels, as the
//     trainer's boxes are: x0 = floor(x sx), x1 = ceil((x + width) sx), the
//     same for y, clamped to the resized image [0, W'] x [0, H'] (inside the
//     canvas). A tolerance of 1e-6 pixels absorbs decimal noise from the JSON
//     (12.000000001 stays 12). A box left with no width or height is dropped.
//
// Errors a user can cause (a missing or corrupt file, a malformed JSON)
// throw ptrain::ConfigError with one line naming the file and, where it
// applies, the JSON path, image id or annotation index and id.
//
// Thread-safety: the free functions and CocoDataset's const methods may be
// called from several threads at once; a CocoWriter belongs to one thread.
//
// Torch-free; linked statically into the trainers that use it
// (ptrain_datasets, which must link libpng and libjpeg).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "ptrain/core/error.h"

namespace ptrain::datasets {

// ---- Images ----

// An 8-bit image, row-major, channels interleaved (RGBRGB...).
struct Image {
  int64_t width = 0;
  int64_t height = 0;
  int channels = 1;            // 1 grey or 3 RGB
  std::vector<uint8_t> bytes;  // width * height * channels

  uint8_t* pixel(int64_t x, int64_t y) { return bytes.data() + (y * width + x) * channels; }
  const uint8_t* pixel(int64_t x, int64_t y) const { return bytes.data() + (y * width + x) * channels; }
};

// The grey level of an RGB pixel (the BT.601 fixed point above).
inline uint8_t lumaBt601(uint8_t r, uint8_t g, uint8_t b) {
  return static_cast<uint8_t>((19595u * r + 38470u * g + 7471u * b + 32768u) >> 16);
}

// `image` with `channels` (1 or 3) channels, converted as described above.
// Throws InternalError for another channel count.
Image convertChannels(const Image& image, int channels);

// Decodes a PNG or JPEG held in memory into `channels` (1 or 3) channels. The
// format is told by the leading bytes, not by a name. `name` (a file name)
// is only used in error messages. PNG: 1, 2, 4, 8 or 16 bits; grey, grey +
// alpha, RGB, RGBA, palette; interlaced or not. JPEG: baseline or progressive,
// grey or YCbCr/RGB; CMYK/YCCK are refused. Throws ConfigError naming `name`
// for anything else: an unknown format, a corrupt or truncated stream (the
// libraries' own message), a JPEG whose data ends early (libjpeg's "premature
// end" warning; its other corrupt-data warnings are recoverable and
// tolerated, as Pillow and OpenCV tolerate them), or an image of more than
// 2^28 pixels.
Image decodeImage(const uint8_t* data, size_t size, int channels, const std::string& name);

// Reads and decodes the file at `path` (see decodeImage). Throws ConfigError
// naming the file when it is missing or unreadable.
Image readImageFile(const std::string& path, int channels);

// A lossless PNG of a 1- or 3-channel image: 8-bit grey or RGB, not
// interlaced, no time or text chunk, zlib level 6 and libpng's default row
// filters, so the same pixels give the same bytes (with the same libpng and
// zlib). Throws InternalError for a malformed Image.
std::vector<uint8_t> encodePng(const Image& image);

// A baseline JPEG of a 1- or 3-channel image at `quality` (1-100), libjpeg's
// defaults otherwise (4:2:0 chroma for colour); for tests and tools. Throws
// InternalError for a malformed Image or quality.
std::vector<uint8_t> encodeJpeg(const Image& image, int quality);

// Writes `bytes` to `path` atomically: to a temporary name beside it
// (path + ".tmp.<pid>"), then renamed, so a reader never sees half a file.
// Throws ConfigError naming the path when it cannot be written.
void writeFileAtomically(const std::string& path, const std::vector<uint8_t>& bytes);

// ---- Boxes and the letterbox ----

// A COCO box as the JSON has it: xywh in (fractional) pixels of its image.
struct CocoBox {
  double x = 0, y = 0, width = 0, height = 0;
  int64_t label = 0;  // contiguous class 0..C-1 (CocoDataset::categories index)
  double area = 0;    // the annotation's "area" (its mask's area in real COCO); width * height when absent
  int64_t id = 0;     // the annotation id (the reader fills it; the writer numbers its own)
};

// A box on a canvas in whole pixels, the trainer's form (MosaicBox): it covers
// columns [x, x + width) and rows [y, y + height).
struct CanvasBox {
  int64_t x = 0, y = 0, width = 0, height = 0;
  int64_t label = 0;
  int64_t area = 0;  // width * height
};

struct Letterbox {
  int64_t canvas = 0;          // side C
  int channels = 1;
  std::vector<uint8_t> pixels; // channels * C * C, channel-first, row-major
  std::vector<CanvasBox> boxes;  // in the order of the source boxes, vanished ones dropped
  int64_t resized_width = 0;   // W': the image covers columns [0, W') and rows [0, H')
  int64_t resized_height = 0;
  double scale_x = 1;          // W' / w and H' / h: canvas x = source x * scale_x
  double scale_y = 1;
};

// `image` (any size, 1 or 3 channels) and its `boxes` fitted into a
// `canvas` x `canvas` square as described at the top of this file; the
// result has the image's channel count. Throws InternalError when canvas < 1
// or the image is empty.
Letterbox letterbox(const Image& image, const std::vector<CocoBox>& boxes, int64_t canvas);

// ---- Reading ----

struct CocoCategory {
  int64_t id = 0;    // the JSON's category_id
  std::string name;
};

// One entry of "images" with its kept (non-crowd) annotations.
struct CocoImageInfo {
  int64_t id = 0;
  std::string file_name;  // relative to the image folder
  int64_t width = 0;
  int64_t height = 0;
  std::vector<CocoBox> boxes;  // in the order of "annotations"
};

// A letterboxed image and its boxes (CocoDataset::sample).
struct CocoSample {
  Letterbox canvas;
  int64_t image_id = 0;
  std::string file_name;
};

struct CocoDatasetOptions {
  // Called once each time the dataset opens an image file (image(), sample()),
  // with the dataset index and full path, on the calling thread, before the
  // file is read. Must be safe to call from every thread that reads samples.
  // Lets tests and tools see which files a rank touches.
  std::function<void(int64_t index, const std::string& path)> on_image_open;
};

// A COCO instances file (the format pycocotools reads) and its image folder.
//
// The JSON is read and checked whole by the constructor; no image file is
// read until image(i) or sample(i) asks for that one image. What it holds:
//   - images: "images" ordered by ascending id (not file order), so index i is
//     the same whatever order a tool wrote them in. Ids must be unique
//     integers; file_name a non-empty string; width and height positive
//     integers.
//   - categories: "categories" ordered by ascending id; label = the position
//     in that order (contiguous 0..C-1, as Detectron2 maps them), names kept.
//     A category with no annotation still has its label.
//   - boxes: each image's annotations in file order. "iscrowd": 1 annotations
//     (a region of many objects, which COCO's evaluation ignores and trainers
//     do not learn from) are skipped and counted (crowdSkipped()). Every
//     annotation must have a unique integer id, a known image_id and
//     category_id, a bbox of 4 numbers with width and height > 0 lying inside
//     its image up to one pixel of slack on each side, "area" a number >= 0
//     when present, "iscrowd" 0 or 1 when present. A file without
//     "annotations" (COCO's test-dev image lists) has no boxes.
// Anything else throws ConfigError naming the JSON file, the JSON path
// (images[3], annotations[17] with its id) and what was expected.
class CocoDataset {
 public:
  // Reads `annotationsFile`; image file names are relative to
  // `imageDirectory`. Throws ConfigError as described above, or when the file
  // is missing or not JSON (with the parser's line and column).
  CocoDataset(std::string annotationsFile, std::string imageDirectory, CocoDatasetOptions options = {});

  int64_t size() const { return static_cast<int64_t>(images_.size()); }
  const std::vector<CocoCategory>& categories() const { return categories_; }
  // Image `index` (0 <= index < size(), else InternalError) in id order.
  const CocoImageInfo& info(int64_t index) const;
  const std::string& annotationsFile() const { return annotations_file_; }
  const std::string& imageDirectory() const { return image_directory_; }
  // The full path of image `index`'s file.
  std::string imagePath(int64_t index) const;
  // Kept boxes over all images, and the iscrowd annotations skipped.
  int64_t boxCount() const { return box_count_; }
  int64_t crowdSkipped() const { return crowd_skipped_; }

  // Decodes image `index` into `channels` (1 or 3). Throws ConfigError naming
  // the file when it is missing, corrupt (decodeImage), or not the width x
  // height the JSON lists.
  Image image(int64_t index, int channels) const;

  // Image `index` letterboxed into a `canvas` x `canvas` square of `channels`
  // channels, with its boxes (letterbox). Throws as image().
  CocoSample sample(int64_t index, int64_t canvas, int channels) const;

  // The image files (index order) that do not exist as regular files; only
  // stats them, reads nothing.
  std::vector<std::string> missingImageFiles() const;
  // Throws ConfigError when missingImageFiles() is not empty: how many of how
  // many are missing, the first one with its image id, and where they were
  // looked for. For `ptrain check`.
  void checkImageFiles() const;

  // Image files opened so far by this object (image() and sample()), over
  // all threads.
  int64_t imagesOpened() const { return opened_->load(); }

 private:
  std::string annotations_file_;
  std::string image_directory_;
  CocoDatasetOptions options_;
  std::vector<CocoCategory> categories_;
  std::vector<CocoImageInfo> images_;
  int64_t box_count_ = 0;
  int64_t crowd_skipped_ = 0;
  // Behind a pointer so the dataset stays movable.
  std::unique_ptr<std::atomic<int64_t>> opened_ = std::make_unique<std::atomic<int64_t>>(0);
};

// ---- Writing ----

// Writes a COCO folder:
//   OUT/images/<file_name>                  one PNG per add(), written at once
//   OUT/annotations/instances_<split>.json  written by finish()
// The JSON ("info", "licenses", "images", "annotations", "categories", in
// this order) lists the images by ascending id whatever order they were
// added in, annotations numbered 1..N in that image order then box order,
// with bbox [x, y, w, h], area, iscrowd 0 and category_id = the id of the
// box's label; whole numbers are written as integers. Every file is written
// atomically (writeFileAtomically) and the same input gives the same bytes.
// CocoDataset reads the folder back to the same pixels, boxes and labels.
//
// One thread uses a writer. An add() that throws records nothing.
class CocoWriter {
 public:
  // Creates OUT/images and OUT/annotations. `categories` are the label ->
  // category mapping (label = index) and must have strictly ascending ids, so
  // that a reader's ascending-id labels are the same labels. `split` names the
  // JSON (letters, digits, '_', '-'). Throws ConfigError when the folders
  // cannot be made, InternalError for bad categories or split.
  CocoWriter(std::string outDirectory, std::string split, std::vector<CocoCategory> categories);

  // Writes `image` (1 or 3 channels) as OUT/images/<fileName> (PNG; a plain
  // relative name ending in .png) and records it with id `imageId` and its
  // boxes (label in 0..C-1, width and height > 0; area = width * height when
  // the box's area is 0). Throws InternalError for a repeated id or file
  // name, a bad name or box; ConfigError when the file cannot be written.
  void add(int64_t imageId, const std::string& fileName, const Image& image, const std::vector<CocoBox>& boxes);

  // Writes the instances JSON and returns its path. May be called again after
  // more add()s (it rewrites the file).
  std::string finish();

  // OUT/annotations/instances_<split>.json.
  std::string annotationsPath() const;
  std::string imageDirectory() const;

 private:
  struct Entry {
    int64_t id = 0;
    std::string file_name;
    int64_t width = 0, height = 0;
    std::vector<CocoBox> boxes;
  };
  std::string out_directory_;
  std::string split_;
  std::vector<CocoCategory> categories_;
  std::vector<Entry> entries_;
  std::set<int64_t> ids_;          // ids and names added, to refuse repeats
  std::set<std::string> file_names_;
};

}  // namespace ptrain::datasets
