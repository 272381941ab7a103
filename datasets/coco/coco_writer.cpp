// CocoWriter: PNGs as they come, the instances JSON at finish().
#include "ptrain/datasets/coco_dataset.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>

namespace ptrain::datasets {
namespace {

// nlohmann::ordered_json keeps members in insertion order, so the file reads
// images, annotations, categories as a person expects; the bytes are still a
// pure function of the input.
using OrderedJson = nlohmann::ordered_json;

// Whole numbers as integers ([12, 30, 5, 7], the mosaics' whole-pixel boxes,
// as writeCocoGroundTruth writes them); others as the shortest decimal that
// reads back to the same double.
OrderedJson number(double value) {
  if (std::isfinite(value) && value == std::floor(value) && std::abs(value) < 9.0e15) {
    return OrderedJson(static_cast<int64_t>(value));
  }
  return OrderedJson(value);
}

bool plainPngName(const std::string& name) {
  return name.size() > 4 && name.compare(name.size() - 4, 4, ".png") == 0 && name.find('/') == std::string::npos &&
         name.find('\\') == std::string::npos;
}

}  // namespace

CocoWriter::CocoWriter(std::string outDirectory, std::string split, std::vector<CocoCategory> categories)
    : out_directory_(std::move(outDirectory)), split_(std::move(split)), categories_(std::move(categories)) {
  const auto nameChar = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'; };
  PTRAIN_CHECK(!split_.empty() && std::all_of(split_.begin(), split_.end(), nameChar),
               "coco writer: split \"", split_, "\" must be letters, digits, '_' or '-'");
  for (size_t i = 1; i < categories_.size(); ++i) {
    PTRAIN_CHECK(categories_[i - 1].id < categories_[i].id, "coco writer: category ids must ascend (label = index): ",
                 categories_[i - 1].id, " comes before ", categories_[i].id);
  }
  for (const std::string& folder : {imageDirectory(), out_directory_ + "/annotations"}) {
    std::error_code ec;
    std::filesystem::create_directories(folder, ec);
    if (ec) throw ConfigError("coco writer: cannot create " + folder + ": " + ec.message() + "; check the output path");
  }
}

std::string CocoWriter::annotationsPath() const {
  return out_directory_ + "/annotations/instances_" + split_ + ".json";
}

std::string CocoWriter::imageDirectory() const { return out_directory_ + "/images"; }

void CocoWriter::add(int64_t imageId, const std::string& fileName, const Image& image,
                     const std::vector<CocoBox>& boxes) {
  PTRAIN_CHECK(plainPngName(fileName), "coco writer: image file name \"", fileName,
               "\" must be a plain name (no folder) ending in .png");
  PTRAIN_CHECK(ids_.count(imageId) == 0, "coco writer: image id ", imageId, " added twice");
  PTRAIN_CHECK(file_names_.count(fileName) == 0, "coco writer: image file ", fileName, " added twice");
  Entry entry;
  entry.id = imageId;
  entry.file_name = fileName;
  entry.width = image.width;
  entry.height = image.height;
  for (const CocoBox& box : boxes) {
    PTRAIN_CHECK(box.label >= 0 && box.label < static_cast<int64_t>(categories_.size()), "coco writer: image ",
                 imageId, " has a box of label ", box.label, " outside [0, ", categories_.size(), ")");
    PTRAIN_CHECK(std::isfinite(box.x) && std::isfinite(box.y) && box.width > 0 && box.height > 0 &&
                     std::isfinite(box.width) && std::isfinite(box.height) && std::isfinite(box.area) && box.area >= 0,
                 "coco writer: image ", imageId, " has a malformed box [", box.x, ", ", box.y, ", ", box.width, ", ",
                 box.height, "] area ", box.area);
    CocoBox kept = box;
    if (kept.area == 0) kept.area = kept.width * kept.height;
    entry.boxes.push_back(kept);
  }
  // encodePng checks the image itself (size, channels).
  writeFileAtomically(imageDirectory() + "/" + fileName, encodePng(image));
  entries_.push_back(std::move(entry));
  ids_.insert(imageId);
  file_names_.insert(fileName);
}

std::string CocoWriter::finish() {
  std::vector<const Entry*> ordered;
  ordered.reserve(entries_.size());
  for (const Entry& entry : entries_) ordered.push_back(&entry);
  std::sort(ordered.begin(), ordered.end(), [](const Entry* a, const Entry* b) { return a->id < b->id; });

  OrderedJson images = OrderedJson::array();
  OrderedJson annotations = OrderedJson::array();
  int64_t annotationId = 1;
  for (const Entry* entry : ordered) {
    images.push_back(
        {{"id", entry->id}, {"file_name", entry->file_name}, {"width", entry->width}, {"height", entry->height}});
    for (const CocoBox& box : entry->boxes) {
      annotations.push_back({{"id", annotationId++},
                             {"image_id", entry->id},
                             {"category_id", categories_[static_cast<size_t>(box.label)].id},
                             {"bbox", {number(box.x), number(box.y), number(box.width), number(box.height)}},
                             {"area", number(box.area)},
                             {"iscrowd", 0}});
    }
  }
  OrderedJson categories = OrderedJson::array();
  for (const CocoCategory& category : categories_) categories.push_back({{"id", category.id}, {"name", category.name}});
  // "info" and "licenses" carry no date or path, so the bytes stay the same;
  // pycocotools' loadRes copies "info".
  OrderedJson document;
  document["info"] = {{"description", "written by ptrain's CocoWriter"}, {"version", "1.0"}};
  document["licenses"] = OrderedJson::array();
  document["images"] = std::move(images);
  document["annotations"] = std::move(annotations);
  document["categories"] = std::move(categories);
  const std::string text = document.dump() + "\n";
  const std::string path = annotationsPath();
  writeFileAtomically(path, std::vector<uint8_t>(text.begin(), text.end()));
  return path;
}

}  // namespace ptrain::datasets
