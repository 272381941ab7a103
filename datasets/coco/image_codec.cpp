// PNG and JPEG through libpng and libjpeg(-turbo).
//
// Both libraries report errors by longjmp (libpng's png_error, libjpeg's
// error_exit, which we point at a longjmp). Jumping over a C++ frame skips its
// destructors, so every call that may jump happens inside one function per
// codec (pngDecodeSteps, jpegDecodeSteps, ...) that calls setjmp itself and
// keeps its state in a context struct reached through a pointer (locals
// changed after setjmp are indeterminate after the jump). Those functions
// return false on a jump, and their callers, which own the libraries' structs
// through RAII, turn the saved message into one ConfigError line.
#include "ptrain/datasets/coco_dataset.h"

#include <jpeglib.h>
#include <png.h>
#include <unistd.h>

#include <jerror.h>

#include <algorithm>
#include <cerrno>
#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace ptrain::datasets {
namespace {

// Past this a decode is refused rather than allocated: a 16k x 16k image,
// far above any photograph COCO holds, and it keeps a crafted header from
// asking for gigabytes.
constexpr int64_t kMaxPixels = int64_t{1} << 28;
constexpr size_t kMessageSize = 256;

void checkChannels(int channels) {
  PTRAIN_CHECK(channels == 1 || channels == 3, "image codec: ", channels, " channels asked; only 1 (grey) or 3 (RGB)");
}

void checkImage(const Image& image) {
  checkChannels(image.channels);
  PTRAIN_CHECK(image.width > 0 && image.height > 0 &&
                   image.bytes.size() == static_cast<size_t>(image.width * image.height * image.channels),
               "image codec: malformed image ", image.width, "x", image.height, "x", image.channels, " holding ",
               image.bytes.size(), " bytes");
}

// One line: the libraries' messages carry no newline today, but a message
// from a future version must not break the one-line rule.
std::string oneLine(const char* text) {
  std::string line(text);
  std::replace(line.begin(), line.end(), '\n', ' ');
  return line;
}

// ---- PNG ----

struct PngReadContext {
  png_structp png = nullptr;
  png_infop info = nullptr;
  const uint8_t* data = nullptr;
  size_t size = 0;
  size_t offset = 0;
  char message[kMessageSize] = {};
  int want_channels = 1;
  Image image;
  std::vector<png_bytep> rows;
  bool too_large = false;
};

void pngError(png_structp png, png_const_charp message) {
  auto* context = static_cast<PngReadContext*>(png_get_error_ptr(png));
  std::snprintf(context->message, kMessageSize, "%s", message);
  longjmp(png_jmpbuf(png), 1);
}

// Warnings (a bad CRC in an ancillary chunk, an unknown sRGB profile) leave
// the pixels intact; they are not worth a line per image.
void pngWarning(png_structp, png_const_charp) {}

void pngRead(png_structp png, png_bytep out, png_size_t length) {
  auto* context = static_cast<PngReadContext*>(png_get_io_ptr(png));
  if (length > context->size - context->offset) {
    // png_error longjmps; nothing with a destructor lives in this frame.
    png_error(png, "the file ends before the image does (truncated)");
  }
  std::memcpy(out, context->data + context->offset, length);
  context->offset += length;
}

bool pngDecodeSteps(PngReadContext* context) {
  if (setjmp(png_jmpbuf(context->png))) return false;
  png_structp png = context->png;
  png_infop info = context->info;
  png_set_read_fn(png, context, pngRead);
  png_read_info(png, info);
  const png_uint_32 width = png_get_image_width(png, info);
  const png_uint_32 height = png_get_image_height(png, info);
  if (static_cast<int64_t>(width) * static_cast<int64_t>(height) > kMaxPixels) {
    context->too_large = true;
    std::snprintf(context->message, kMessageSize, "%ux%u", width, height);
    return false;
  }
  // To 8-bit grey or RGB, whatever the stored form: palettes and low bit
  // depths expanded, 16 bits scaled with rounding, alpha (and tRNS) dropped.
  png_set_palette_to_rgb(png);
  png_set_expand_gray_1_2_4_to_8(png);
  png_set_scale_16(png);
  png_set_strip_alpha(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  const int channels = png_get_channels(png, info);
  if ((channels != 1 && channels != 3) || png_get_bit_depth(png, info) != 8) {
    png_error(png, "unexpected pixel layout after conversion to 8-bit grey or RGB");
  }
  context->image.width = width;
  context->image.height = height;
  context->image.channels = channels;
  context->image.bytes.resize(static_cast<size_t>(width) * height * static_cast<size_t>(channels));
  context->rows.resize(height);
  for (png_uint_32 y = 0; y < height; ++y) {
    context->rows[y] = context->image.bytes.data() + static_cast<size_t>(y) * width * static_cast<size_t>(channels);
  }
  png_read_image(png, context->rows.data());
  png_read_end(png, nullptr);
  return true;
}

Image decodePng(const uint8_t* data, size_t size, int channels, const std::string& name) {
  PngReadContext context;
  context.data = data;
  context.size = size;
  context.want_channels = channels;
  context.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &context, pngError, pngWarning);
  PTRAIN_CHECK(context.png != nullptr, "image codec: libpng could not allocate a reader for ", name);
  context.info = png_create_info_struct(context.png);
  struct Destroy {
    PngReadContext* c;
    ~Destroy() { png_destroy_read_struct(&c->png, c->info != nullptr ? &c->info : nullptr, nullptr); }
  } destroy{&context};
  PTRAIN_CHECK(context.info != nullptr, "image codec: libpng could not allocate a reader for ", name);
  if (!pngDecodeSteps(&context)) {
    if (context.too_large) {
      throw ConfigError(detail::concat("image codec: ", name, " is a ", context.message,
                                       " PNG, more than the 2^28 pixels an image may have; scale it down"));
    }
    throw ConfigError(detail::concat("image codec: ", name, " is not a readable PNG: ", oneLine(context.message),
                                     " (corrupt or truncated file; re-export or re-download it)"));
  }
  return convertChannels(context.image, channels);
}

struct PngWriteContext {
  png_structp png = nullptr;
  png_infop info = nullptr;
  const Image* image = nullptr;
  std::vector<uint8_t>* out = nullptr;
  char message[kMessageSize] = {};
};

void pngWriteError(png_structp png, png_const_charp message) {
  auto* context = static_cast<PngWriteContext*>(png_get_error_ptr(png));
  std::snprintf(context->message, kMessageSize, "%s", message);
  longjmp(png_jmpbuf(png), 1);
}

void pngWrite(png_structp png, png_bytep data, png_size_t length) {
  auto* context = static_cast<PngWriteContext*>(png_get_io_ptr(png));
  // insert() may throw bad_alloc through libpng's C frames; it is the one
  // exception that can, and the process is short of memory then anyway.
  context->out->insert(context->out->end(), data, data + length);
}

void pngFlush(png_structp) {}

bool pngEncodeSteps(PngWriteContext* context) {
  if (setjmp(png_jmpbuf(context->png))) return false;
  png_structp png = context->png;
  const Image& image = *context->image;
  png_set_write_fn(png, context, pngWrite, pngFlush);
  png_set_IHDR(png, context->info, static_cast<png_uint_32>(image.width), static_cast<png_uint_32>(image.height), 8,
               image.channels == 1 ? PNG_COLOR_TYPE_GRAY : PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  // Pinned rather than left to defaults so the bytes do not move if a
  // distribution changes them.
  png_set_compression_level(png, 6);
  png_write_info(png, context->info);
  for (int64_t y = 0; y < image.height; ++y) {
    png_write_row(png, image.bytes.data() + y * image.width * image.channels);
  }
  png_write_end(png, nullptr);
  return true;
}

// ---- JPEG ----

struct JpegErrorManager {
  jpeg_error_mgr base;  // first, so libjpeg's pointer to it is ours too
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX] = {};
};

void jpegErrorExit(j_common_ptr info) {
  auto* manager = reinterpret_cast<JpegErrorManager*>(info->err);
  manager->base.format_message(info, manager->message);
  longjmp(manager->jump, 1);
}

// libjpeg reports a stream that ends early only as a warning and pads the
// missing rows with grey; a truncated training image must fail instead. Its
// other corrupt-data warnings ("extraneous bytes before marker") come from
// files that decode fine otherwise, a few of them in COCO itself, so they pass.
void jpegEmitMessage(j_common_ptr info, int level) {
  auto* manager = reinterpret_cast<JpegErrorManager*>(info->err);
  if (level < 0 && manager->base.msg_code == JWRN_JPEG_EOF) jpegErrorExit(info);
  if (level < 0) manager->base.num_warnings++;
}

struct JpegReadContext {
  jpeg_decompress_struct info;
  JpegErrorManager error;
  const uint8_t* data = nullptr;
  size_t size = 0;
  int want_channels = 1;
  Image image;
  bool too_large = false;
  bool unsupported = false;
};

// jpeg_create_* fails (and jumps) only when out of memory.
bool jpegCreateSteps(JpegReadContext* context) {
  if (setjmp(context->error.jump)) return false;
  jpeg_create_decompress(&context->info);
  return true;
}

bool jpegDecodeSteps(JpegReadContext* context) {
  if (setjmp(context->error.jump)) return false;
  jpeg_decompress_struct* info = &context->info;
  jpeg_mem_src(info, context->data, static_cast<unsigned long>(context->size));
  jpeg_read_header(info, TRUE);
  if (info->jpeg_color_space == JCS_CMYK || info->jpeg_color_space == JCS_YCCK) {
    context->unsupported = true;
    return false;
  }
  if (static_cast<int64_t>(info->image_width) * info->image_height > kMaxPixels) {
    context->too_large = true;
    std::snprintf(context->error.message, JMSG_LENGTH_MAX, "%ux%u", info->image_width, info->image_height);
    return false;
  }
  // libjpeg converts: grey out of YCbCr is its luma plane, RGB out of grey
  // repeats the level.
  info->out_color_space = context->want_channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_start_decompress(info);
  const int64_t width = info->output_width;
  const int64_t height = info->output_height;
  const int channels = info->output_components;
  context->image.width = width;
  context->image.height = height;
  context->image.channels = channels;
  context->image.bytes.resize(static_cast<size_t>(width * height * channels));
  while (info->output_scanline < info->output_height) {
    JSAMPROW row = context->image.bytes.data() + static_cast<int64_t>(info->output_scanline) * width * channels;
    jpeg_read_scanlines(info, &row, 1);
  }
  jpeg_finish_decompress(info);
  return true;
}

Image decodeJpeg(const uint8_t* data, size_t size, int channels, const std::string& name) {
  JpegReadContext context;
  context.data = data;
  context.size = size;
  context.want_channels = channels;
  context.info.err = jpeg_std_error(&context.error.base);
  context.error.base.error_exit = jpegErrorExit;
  context.error.base.emit_message = jpegEmitMessage;
  PTRAIN_CHECK(jpegCreateSteps(&context), "image codec: libjpeg could not start a decompressor for ", name, ": ",
               context.error.message);
  struct Destroy {
    jpeg_decompress_struct* info;
    ~Destroy() { jpeg_destroy_decompress(info); }
  } destroy{&context.info};
  if (!jpegDecodeSteps(&context)) {
    if (context.unsupported) {
      throw ConfigError(detail::concat("image codec: ", name,
                                       " is a CMYK JPEG; only grey and colour (YCbCr/RGB) JPEGs are read: convert it "
                                       "to RGB (e.g. `convert IN -colorspace sRGB OUT`)"));
    }
    if (context.too_large) {
      throw ConfigError(detail::concat("image codec: ", name, " is a ", context.error.message,
                                       " JPEG, more than the 2^28 pixels an image may have; scale it down"));
    }
    throw ConfigError(detail::concat("image codec: ", name, " is not a readable JPEG: ",
                                     oneLine(context.error.message),
                                     " (corrupt or truncated file; re-export or re-download it)"));
  }
  return context.image.channels == channels ? std::move(context.image) : convertChannels(context.image, channels);
}

struct JpegWriteContext {
  jpeg_compress_struct info;
  JpegErrorManager error;
  const Image* image = nullptr;
  int quality = 90;
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
};

bool jpegCreateSteps(JpegWriteContext* context) {
  if (setjmp(context->error.jump)) return false;
  jpeg_create_compress(&context->info);
  return true;
}

bool jpegEncodeSteps(JpegWriteContext* context) {
  if (setjmp(context->error.jump)) return false;
  jpeg_compress_struct* info = &context->info;
  const Image& image = *context->image;
  jpeg_mem_dest(info, &context->buffer, &context->size);
  info->image_width = static_cast<JDIMENSION>(image.width);
  info->image_height = static_cast<JDIMENSION>(image.height);
  info->input_components = image.channels;
  info->in_color_space = image.channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(info);
  jpeg_set_quality(info, context->quality, TRUE);
  jpeg_start_compress(info, TRUE);
  while (info->next_scanline < info->image_height) {
    // libjpeg's API takes non-const rows but only reads them.
    JSAMPROW row = const_cast<uint8_t*>(image.bytes.data()) +
                   static_cast<int64_t>(info->next_scanline) * image.width * image.channels;
    jpeg_write_scanlines(info, &row, 1);
  }
  jpeg_finish_compress(info);
  return true;
}

}  // namespace

Image convertChannels(const Image& image, int channels) {
  checkChannels(channels);
  checkImage(image);
  if (image.channels == channels) return image;
  Image out;
  out.width = image.width;
  out.height = image.height;
  out.channels = channels;
  const size_t pixels = static_cast<size_t>(image.width * image.height);
  out.bytes.resize(pixels * static_cast<size_t>(channels));
  const uint8_t* in = image.bytes.data();
  uint8_t* to = out.bytes.data();
  if (channels == 1) {
    for (size_t p = 0; p < pixels; ++p) to[p] = lumaBt601(in[3 * p], in[3 * p + 1], in[3 * p + 2]);
  } else {
    for (size_t p = 0; p < pixels; ++p) to[3 * p] = to[3 * p + 1] = to[3 * p + 2] = in[p];
  }
  return out;
}

Image decodeImage(const uint8_t* data, size_t size, int channels, const std::string& name) {
  checkChannels(channels);
  static constexpr uint8_t kPngSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  if (size >= 8 && std::memcmp(data, kPngSignature, 8) == 0) return decodePng(data, size, channels, name);
  if (size >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF) return decodeJpeg(data, size, channels, name);
  if (size == 0) throw ConfigError("image codec: " + name + " is empty (0 bytes); re-export or re-download it");
  throw ConfigError("image codec: " + name +
                    " is neither a PNG nor a JPEG (its first bytes are no PNG or JPEG signature); only PNG and JPEG "
                    "images are read: convert it");
}

Image readImageFile(const std::string& path, int channels) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) {
      throw ConfigError("image codec: image file " + path +
                        " does not exist; check the image folder and the file_name in the annotations");
    }
    throw ConfigError("image codec: cannot open image file " + path + ": " + std::strerror(errno));
  }
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw ConfigError("image codec: cannot read image file " + path + ": " + std::strerror(errno));
  return decodeImage(bytes.data(), bytes.size(), channels, path);
}

std::vector<uint8_t> encodePng(const Image& image) {
  checkImage(image);
  std::vector<uint8_t> out;
  PngWriteContext context;
  context.image = &image;
  context.out = &out;
  context.png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &context, pngWriteError, pngWarning);
  PTRAIN_CHECK(context.png != nullptr, "image codec: libpng could not allocate a writer");
  context.info = png_create_info_struct(context.png);
  struct Destroy {
    PngWriteContext* c;
    ~Destroy() { png_destroy_write_struct(&c->png, c->info != nullptr ? &c->info : nullptr); }
  } destroy{&context};
  PTRAIN_CHECK(context.info != nullptr, "image codec: libpng could not allocate a writer");
  PTRAIN_CHECK(pngEncodeSteps(&context), "image codec: libpng failed to encode a ", image.width, "x", image.height,
               " image: ", context.message);
  return out;
}

std::vector<uint8_t> encodeJpeg(const Image& image, int quality) {
  checkImage(image);
  PTRAIN_CHECK(quality >= 1 && quality <= 100, "image codec: JPEG quality ", quality, " is outside 1-100");
  JpegWriteContext context;
  context.image = &image;
  context.quality = quality;
  context.info.err = jpeg_std_error(&context.error.base);
  context.error.base.error_exit = jpegErrorExit;
  PTRAIN_CHECK(jpegCreateSteps(&context), "image codec: libjpeg could not start a compressor: ",
               context.error.message);
  struct Destroy {
    JpegWriteContext* c;
    ~Destroy() {
      jpeg_destroy_compress(&c->info);
      std::free(c->buffer);  // jpeg_mem_dest's buffer is malloc'ed and ours to free
    }
  } destroy{&context};
  PTRAIN_CHECK(jpegEncodeSteps(&context), "image codec: libjpeg failed to encode a ", image.width, "x", image.height,
               " image: ", context.error.message);
  return std::vector<uint8_t>(context.buffer, context.buffer + context.size);
}

void writeFileAtomically(const std::string& path, const std::vector<uint8_t>& bytes) {
  const std::string temporary = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out) throw ConfigError("cannot write " + temporary + ": " + std::strerror(errno) + "; check the folder");
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    out.close();
    if (!out) {
      const std::string reason = std::strerror(errno);
      std::error_code ec;
      std::filesystem::remove(temporary, ec);
      throw ConfigError("cannot write " + temporary + ": " + reason + " (disk full?)");
    }
  }
  std::error_code ec;
  std::filesystem::rename(temporary, path, ec);
  if (ec) {
    std::error_code ignored;
    std::filesystem::remove(temporary, ignored);
    throw ConfigError("cannot rename " + temporary + " to " + path + ": " + ec.message());
  }
}

}  // namespace ptrain::datasets
