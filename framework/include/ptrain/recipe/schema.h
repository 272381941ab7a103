// Schema: every recipe key ptrain knows, with its type, default, range and doc.
//
// The core describes its own sections (describeCoreKeys); every plugin a
// recipe uses adds its own keys (PluginDescriptor::describe_keys, and a
// trainer's describeKeys), each key marked with the plugin that owns it
// (engine/recipe_schema.h assembles the schema of one recipe). Validation
// rejects any key that the schema does not list, suggesting the nearest known
// one, naming the plugin when the key belongs to one the recipe does not use,
// and any value that a reserved key (planned, not built yet) cannot run.
// docs/recipes.md is generated from the same table (`ptrain keys
// --markdown`). The builders in ptrain/recipe/key_specs.h fill a KeySpec in
// one line.
//
// Thread-safety: a Schema is a plain value; build it on one thread, then read
// it from any number of threads.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ptrain/core/error.h"

namespace YAML {
class Node;
}

namespace ptrain {

// kMap: a free-form mapping; every key below the path is accepted as is (the
// plugin that owns it reads it with Recipe::keysUnder and the getters).
// kMapList: a list of mappings of single values (parallel.groups); the schema
// checks the shape, whoever reads it (Recipe::getMapList) checks the keys.
enum class ValueType { kInt, kFloat, kBool, kString, kIntList, kFloatList, kStringList, kMap, kMapList };
// "int", "float", "bool", "string", "int list", "float list", "string list", "map", "map list".
PTRAIN_API const char* toString(ValueType type);

struct KeySpec {
  std::string path;                   // dotted, e.g. "train.steps"
  ValueType type = ValueType::kString;
  std::string default_value;          // YAML text; empty with required=false: no value
  bool required = false;              // no default, must be set
  std::optional<double> min;          // inclusive bounds for numbers (and list elements)
  std::optional<double> max;
  bool min_exclusive = false;         // e.g. lr > 0
  bool max_exclusive = false;         // e.g. beta1 < 1
  std::vector<std::string> choices;   // allowed strings (and list elements)
  std::string doc;                    // one sentence for docs/recipes.md
  // Planned but not built yet (keys::reserved): why, in a few words, e.g.
  // "bf16 and fp16 arrive with the precision plugins"; empty for a key that
  // runs whatever its value. A recipe that sets a reserved key to a value
  // outside reserved_accepts is refused; the schema default never is.
  std::string reserved;
  std::vector<std::string> reserved_accepts;  // YAML text of the values that run today; empty: none
  // Who reads the key: "" for the core, else the plugin, "kind/name" (e.g.
  // "precision/fp16", "trainer/llm"). Set by Schema::addFrom.
  std::string owner;
};

class PTRAIN_API Schema {
 public:
  Schema();
  ~Schema();
  Schema(const Schema&);
  Schema& operator=(const Schema&);

  // Adds or replaces (same path) a key. A replaced key keeps its place in
  // keys(). Throws InternalError when the spec contradicts itself (a malformed
  // path, a default of the wrong type, out of its own range or choices, a
  // default on a required key, accepted values without a reserved reason or
  // that do not fit the key): that is a bug in whoever describes the key.
  void add(KeySpec spec);
  // Adds the keys `describe` adds, each owned by `owner` ("kind/name"). A key
  // `describe` replaces (same path) takes the new owner.
  void addFrom(const std::string& owner, const std::function<void(Schema&)>& describe);
  // Removes a key (no-op when absent): a plugin that builds on another's
  // keys but does not read one of them (e.g. a trainer without some setting).
  void remove(const std::string& path);
  // A key that exists but is not read by this recipe: validation refuses a
  // recipe that sets it with "<path>: <reason>" (e.g. "read only by plugin
  // precision/fp16, which this recipe does not use; remove it or set
  // precision.name: fp16"). Ignored for a path that is a key of the schema.
  void addUnused(const std::string& path, std::string reason);
  // The reason addUnused gave for `path`; nullptr when none.
  const std::string* unusedReason(const std::string& path) const;
  // nullptr when `path` is not a key.
  const KeySpec* find(const std::string& path) const;
  // In the order they were first added.
  const std::vector<KeySpec>& keys() const { return keys_; }
  // True when some key lies below `path` (e.g. "train" for "train.steps").
  bool isSection(const std::string& path) const;
  // The known key nearest to `path` (edit distance on the whole path, else the
  // same last name in another section, e.g. "train.lr" -> "optimizer.lr"), or
  // "" when none is close.
  std::string suggest(const std::string& path) const;
  // Markdown: one heading and table (key, type, default, allowed, meaning)
  // per owner and top-level section, the core's first, then each plugin's, in
  // the order keys were added; a plugin's headings name it.
  std::string markdown() const;
  // Plain text for a terminal: one key per line, aligned columns, a plugin's
  // keys under a line naming it.
  std::string text() const;

  // Checks one value against `spec`. Returns "" when it is fine, else
  // "<what is wrong>; <how to fix>" (no location, no key path). For a list
  // whose element is wrong, `badElement` (when given) receives its index.
  static std::string checkValue(const KeySpec& spec, const YAML::Node& value,
                                int* badElement = nullptr);
  // For a reserved key: "" when `value` (already fine by checkValue) is one
  // of spec.reserved_accepts, else "<value> is not implemented yet (<reason>);
  // remove it or set <accepted>". Always "" for a key that is not reserved.
  static std::string checkReserved(const KeySpec& spec, const YAML::Node& value);
  // "an integer", "true or false", "a list of numbers", ... for messages.
  static std::string typeDescription(ValueType type);
  // Human range of a numeric spec: ">= 1", "> 0", "in [0, 1)"; "" when unbounded.
  static std::string rangeText(const KeySpec& spec);

 private:
  std::vector<KeySpec> keys_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> unused_;
  std::string owner_;  // of the keys add() takes now (addFrom)
};

// Keys of the sections the core owns: name, device, launch, plugins, trainer,
// data.name, train, optimizer, parallel (the layout), communication,
// precision.name, cpu, offload.name, checkpoint, log. Every other key belongs
// to the plugin that reads it: model.* and data.* to the trainer
// (Trainer::describeKeys, with the shared groups of keys::addTransformerShape
// and the others in key_specs.h), fp16's loss scale to precision/fp16, the
// offload levers to offload/tiered.
PTRAIN_API void describeCoreKeys(Schema& schema);

}  // namespace ptrain
