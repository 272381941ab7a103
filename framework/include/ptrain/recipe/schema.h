// Schema: every recipe key ptrain knows, with its type, default, range and doc.
//
// The core describes its own sections (describeCoreKeys); a trainer plugin adds
// the keys of its model and data sections. Validation rejects any key that the
// schema does not list, suggesting the nearest known one. docs/recipes.md is
// generated from the same table (`ptrain keys --markdown`).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "ptrain/core/error.h"

namespace ptrain {

enum class ValueType { kInt, kFloat, kBool, kString, kIntList, kFloatList, kStringList, kMap };
PTRAIN_API const char* toString(ValueType type);

struct KeySpec {
  std::string path;                   // dotted, e.g. "train.steps"
  ValueType type = ValueType::kString;
  std::string default_value;          // YAML text; empty with required=false: no value
  bool required = false;              // no default, must be set
  std::optional<double> min;          // inclusive bounds for numbers (and list elements)
  std::optional<double> max;
  bool min_exclusive = false;         // e.g. lr > 0
  std::vector<std::string> choices;   // allowed strings
  std::string doc;                    // one sentence for docs/recipes.md
};

class PTRAIN_API Schema {
 public:
  // Adds or replaces (same path) a key.
  void add(KeySpec spec);
  const KeySpec* find(const std::string& path) const;
  const std::vector<KeySpec>& keys() const { return keys_; }
  // The known key nearest to `path` (edit distance), or "" when none is close.
  std::string suggest(const std::string& path) const;
  // Markdown table of every key, grouped by section.
  std::string markdown() const;

 private:
  std::vector<KeySpec> keys_;
};

// Keys of the sections the core owns: name, launch, plugins, trainer, model
// (the common Megatron-style shape keys), data.name, train, optimizer,
// parallel, communication, precision, offload, fusion, checkpoint, log.
PTRAIN_API void describeCoreKeys(Schema& schema);

}  // namespace ptrain
