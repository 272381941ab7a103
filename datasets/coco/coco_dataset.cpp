// CocoDataset: the instances JSON checked whole up front, images decoded one
// at a time on demand.
#include "ptrain/datasets/coco_dataset.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <unordered_map>

namespace ptrain::datasets {
namespace {

using Json = nlohmann::json;

// A value quoted in an error, cut short so the line stays one readable line.
std::string shown(const Json& value) {
  std::string text = value.dump();
  if (text.size() > 80) text = text.substr(0, 77) + "...";
  return text;
}

// An integer, or a float with no fraction (some converters write 640.0).
std::optional<int64_t> wholeNumber(const Json& value) {
  if (value.is_number_unsigned()) {
    const uint64_t v = value.get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(v);
  }
  if (value.is_number_integer()) return value.get<int64_t>();
  if (value.is_number_float()) {
    const double v = value.get<double>();
    if (std::isfinite(v) && v == std::floor(v) && std::abs(v) < 9.0e15) return static_cast<int64_t>(v);
  }
  return std::nullopt;
}

// Errors about the JSON, all in one shape: "coco dataset: FILE: WHERE: WHAT".
class JsonErrors {
 public:
  explicit JsonErrors(const std::string& file) : file_(file) {}
  [[noreturn]] void fail(const std::string& where, const std::string& what) const {
    throw ConfigError("coco dataset: " + file_ + ": " + where + ": " + what);
  }
  // A required member of an object, or a refusal naming it.
  const Json& member(const Json& object, const char* key, const std::string& where, const char* expected) const {
    const auto it = object.find(key);
    if (it == object.end()) fail(where, std::string("has no \"") + key + "\"; expected " + expected);
    return *it;
  }
  int64_t integer(const Json& object, const char* key, const std::string& where) const {
    const Json& value = member(object, key, where, "an integer");
    const std::optional<int64_t> number = wholeNumber(value);
    if (!number) fail(where, std::string("\"") + key + "\" must be an integer, got " + shown(value));
    return *number;
  }

 private:
  const std::string& file_;
};

std::string annotationWhere(size_t index, const Json& annotation) {
  std::string where = "annotations[" + std::to_string(index) + "]";
  if (annotation.is_object()) {
    const auto id = annotation.find("id");
    if (id != annotation.end()) where += " (id " + shown(*id) + ")";
  }
  return where;
}

// Segmentations (polygons, RLE) are most of a real instances file and no
// part of a box dataset; dropping them while parsing keeps train2017's
// 450 MB file from costing gigabytes as a DOM.
bool dropSegmentations(int depth, Json::parse_event_t event, Json& parsed) {
  return !(event == Json::parse_event_t::key && depth == 3 && parsed.is_string() &&
           parsed.get_ref<const std::string&>() == "segmentation");
}

Json parseFile(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw ConfigError("coco dataset: annotations file " + path +
                      (std::filesystem::exists(path, ec) ? " is not a regular file" : " does not exist") +
                      "; give the path of an instances JSON (e.g. annotations/instances_val2017.json)");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError("coco dataset: cannot open annotations file " + path + ": " + std::strerror(errno));
  try {
    return Json::parse(in, dropSegmentations);
  } catch (const Json::parse_error& e) {
    // what() is "[json.exception.parse_error.101] parse error at line L,
    // column C: ..."; the bracketed id means nothing to a user.
    std::string message = e.what();
    const size_t start = message.find("] ");
    if (start != std::string::npos) message = message.substr(start + 2);
    std::replace(message.begin(), message.end(), '\n', ' ');
    throw ConfigError("coco dataset: " + path + " is not JSON: " + message +
                      " (byte " + std::to_string(e.byte) + "); fix the file or point at the instances JSON");
  }
}

}  // namespace

CocoDataset::CocoDataset(std::string annotationsFile, std::string imageDirectory, CocoDatasetOptions options)
    : annotations_file_(std::move(annotationsFile)),
      image_directory_(std::move(imageDirectory)),
      options_(std::move(options)) {
  const Json document = parseFile(annotations_file_);
  const JsonErrors errors(annotations_file_);
  if (!document.is_object()) {
    errors.fail("top level", "expected an object with \"images\", \"annotations\" and \"categories\", got " +
                                 std::string(document.type_name()));
  }

  // ---- categories: ascending id -> label ----
  const Json& categories = errors.member(document, "categories", "top level", "an array of {id, name}");
  if (!categories.is_array()) errors.fail("categories", "expected an array, got " + std::string(categories.type_name()));
  for (size_t i = 0; i < categories.size(); ++i) {
    const Json& category = categories[i];
    const std::string where = "categories[" + std::to_string(i) + "]";
    if (!category.is_object()) errors.fail(where, "expected an object {id, name}, got " + shown(category));
    CocoCategory entry;
    entry.id = errors.integer(category, "id", where);
    const Json& name = errors.member(category, "name", where, "a string");
    if (!name.is_string()) errors.fail(where, "\"name\" must be a string, got " + shown(name));
    entry.name = name.get<std::string>();
    categories_.push_back(std::move(entry));
  }
  std::stable_sort(categories_.begin(), categories_.end(),
                   [](const CocoCategory& a, const CocoCategory& b) { return a.id < b.id; });
  std::unordered_map<int64_t, int64_t> labelOf;
  for (size_t label = 0; label < categories_.size(); ++label) {
    if (!labelOf.emplace(categories_[label].id, static_cast<int64_t>(label)).second) {
      errors.fail("categories", "category id " + std::to_string(categories_[label].id) +
                                    " appears twice; category ids must be unique");
    }
  }

  // ---- images: ascending id ----
  const Json& images = errors.member(document, "images", "top level", "an array of {id, file_name, width, height}");
  if (!images.is_array()) errors.fail("images", "expected an array, got " + std::string(images.type_name()));
  std::unordered_map<int64_t, size_t> firstIndexOfId;
  for (size_t i = 0; i < images.size(); ++i) {
    const Json& image = images[i];
    const std::string where = "images[" + std::to_string(i) + "]";
    if (!image.is_object()) errors.fail(where, "expected an object {id, file_name, width, height}, got " + shown(image));
    CocoImageInfo entry;
    entry.id = errors.integer(image, "id", where);
    const std::string named = where + " (id " + std::to_string(entry.id) + ")";
    const auto [previous, fresh] = firstIndexOfId.emplace(entry.id, i);
    if (!fresh) {
      errors.fail(named, "image id " + std::to_string(entry.id) + " is already used by images[" +
                             std::to_string(previous->second) + "]; image ids must be unique");
    }
    const Json& fileName = errors.member(image, "file_name", named, "a file name");
    if (!fileName.is_string() || fileName.get_ref<const std::string&>().empty()) {
      errors.fail(named, "\"file_name\" must be a non-empty string, got " + shown(fileName));
    }
    entry.file_name = fileName.get<std::string>();
    entry.width = errors.integer(image, "width", named);
    entry.height = errors.integer(image, "height", named);
    if (entry.width <= 0 || entry.height <= 0) {
      errors.fail(named, "width " + std::to_string(entry.width) + " and height " + std::to_string(entry.height) +
                             " must both be > 0");
    }
    images_.push_back(std::move(entry));
  }
  std::sort(images_.begin(), images_.end(), [](const CocoImageInfo& a, const CocoImageInfo& b) { return a.id < b.id; });
  std::unordered_map<int64_t, size_t> indexOfId;
  for (size_t i = 0; i < images_.size(); ++i) indexOfId.emplace(images_[i].id, i);

  // ---- annotations: boxes per image in file order ----
  const auto annotationsIt = document.find("annotations");
  if (annotationsIt == document.end()) return;  // an image list (test-dev): no boxes
  const Json& annotations = *annotationsIt;
  if (!annotations.is_array()) {
    errors.fail("annotations", "expected an array, got " + std::string(annotations.type_name()));
  }
  std::unordered_map<int64_t, size_t> annotationIndexOfId;
  for (size_t i = 0; i < annotations.size(); ++i) {
    const Json& annotation = annotations[i];
    const std::string where = annotationWhere(i, annotation);
    if (!annotation.is_object()) {
      errors.fail(where, "expected an object {id, image_id, category_id, bbox, area, iscrowd}, got " +
                             shown(annotation));
    }
    CocoBox box;
    box.id = errors.integer(annotation, "id", where);
    const auto [previous, fresh] = annotationIndexOfId.emplace(box.id, i);
    if (!fresh) {
      errors.fail(where, "annotation id " + std::to_string(box.id) + " is already used by annotations[" +
                             std::to_string(previous->second) + "]; annotation ids must be unique");
    }
    const int64_t imageId = errors.integer(annotation, "image_id", where);
    const auto image = indexOfId.find(imageId);
    if (image == indexOfId.end()) {
      errors.fail(where, "image_id " + std::to_string(imageId) +
                             " is not in \"images\"; list the image or remove the annotation");
    }
    const int64_t categoryId = errors.integer(annotation, "category_id", where);
    const auto label = labelOf.find(categoryId);
    if (label == labelOf.end()) {
      errors.fail(where, "category_id " + std::to_string(categoryId) +
                             " is not in \"categories\"; add the category or fix the annotation");
    }
    box.label = label->second;

    const Json& bbox = errors.member(annotation, "bbox", where, "4 numbers [x, y, width, height]");
    if (!bbox.is_array() || bbox.size() != 4 ||
        !std::all_of(bbox.begin(), bbox.end(), [](const Json& v) { return v.is_number(); })) {
      errors.fail(where, "\"bbox\" must be 4 numbers [x, y, width, height], got " + shown(bbox));
    }
    box.x = bbox[0].get<double>();
    box.y = bbox[1].get<double>();
    box.width = bbox[2].get<double>();
    box.height = bbox[3].get<double>();
    if (!(box.width > 0) || !(box.height > 0)) {
      errors.fail(where, "bbox " + shown(bbox) + " has a width or height <= 0; fix or remove the annotation");
    }
    const CocoImageInfo& owner = images_[image->second];
    // One pixel of slack: exporters that round corners outwards, or write
    // x + width = W + 0.5, are common and harmless; the letterbox clamps.
    if (box.x < -1 || box.y < -1 || box.x + box.width > static_cast<double>(owner.width) + 1 ||
        box.y + box.height > static_cast<double>(owner.height) + 1) {
      errors.fail(where, "bbox " + shown(bbox) + " lies outside its " + std::to_string(owner.width) + "x" +
                             std::to_string(owner.height) + " image (id " + std::to_string(owner.id) +
                             ") by more than a pixel; fix the box or the image's width and height");
    }
    box.area = box.width * box.height;
    const auto area = annotation.find("area");
    if (area != annotation.end()) {
      if (!area->is_number() || !(area->get<double>() >= 0)) {
        errors.fail(where, "\"area\" must be a number >= 0, got " + shown(*area));
      }
      box.area = area->get<double>();
    }
    bool crowd = false;
    const auto iscrowd = annotation.find("iscrowd");
    if (iscrowd != annotation.end()) {
      const std::optional<int64_t> flag = iscrowd->is_boolean() ? std::optional<int64_t>(iscrowd->get<bool>())
                                                                 : wholeNumber(*iscrowd);
      if (!flag || (*flag != 0 && *flag != 1)) errors.fail(where, "\"iscrowd\" must be 0 or 1, got " + shown(*iscrowd));
      crowd = *flag == 1;
    }
    if (crowd) {
      ++crowd_skipped_;
      continue;
    }
    images_[image->second].boxes.push_back(box);
    ++box_count_;
  }
}

const CocoImageInfo& CocoDataset::info(int64_t index) const {
  PTRAIN_CHECK(index >= 0 && index < size(), "coco dataset: image index ", index, " outside [0, ", size(), ")");
  return images_[static_cast<size_t>(index)];
}

std::string CocoDataset::imagePath(int64_t index) const {
  return (std::filesystem::path(image_directory_) / info(index).file_name).string();
}

Image CocoDataset::image(int64_t index, int channels) const {
  const CocoImageInfo& entry = info(index);
  const std::string path = imagePath(index);
  opened_->fetch_add(1);
  if (options_.on_image_open) options_.on_image_open(index, path);
  Image decoded = readImageFile(path, channels);
  if (decoded.width != entry.width || decoded.height != entry.height) {
    throw ConfigError("coco dataset: " + path + " is " + std::to_string(decoded.width) + "x" +
                      std::to_string(decoded.height) + " but " + annotations_file_ + " lists image id " +
                      std::to_string(entry.id) + " as " + std::to_string(entry.width) + "x" +
                      std::to_string(entry.height) + "; its boxes would not fit: fix the JSON or the image");
  }
  return decoded;
}

CocoSample CocoDataset::sample(int64_t index, int64_t canvas, int channels) const {
  const CocoImageInfo& entry = info(index);
  CocoSample result;
  result.canvas = letterbox(image(index, channels), entry.boxes, canvas);
  result.image_id = entry.id;
  result.file_name = entry.file_name;
  return result;
}

std::vector<std::string> CocoDataset::missingImageFiles() const {
  std::vector<std::string> missing;
  for (int64_t i = 0; i < size(); ++i) {
    std::error_code ec;
    const std::string path = imagePath(i);
    if (!std::filesystem::is_regular_file(path, ec)) missing.push_back(path);
  }
  return missing;
}

void CocoDataset::checkImageFiles() const {
  const std::vector<std::string> missing = missingImageFiles();
  if (missing.empty()) return;
  int64_t firstIndex = 0;
  while (imagePath(firstIndex) != missing.front()) ++firstIndex;
  throw ConfigError("coco dataset: " + std::to_string(missing.size()) + " of " + std::to_string(size()) +
                    " image files listed in " + annotations_file_ + " are missing from " + image_directory_ +
                    ", the first " + missing.front() + " (image id " + std::to_string(info(firstIndex).id) +
                    "); fix the image folder or the path to it");
}

}  // namespace ptrain::datasets
