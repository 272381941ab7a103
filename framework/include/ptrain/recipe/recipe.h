// Recipe: typed, validated access to a YAML training recipe.
//
// Loading resolves `defaults: [base.yaml, ...]` (paths relative to the file
// that names them; later values win, the recipe itself last), then applies
// command-line overrides `a.b.c=value` (value parsed as YAML). Each leaf keeps
// where it came from, so every error can say file:line:col and the key path.
//
// Merging: mappings merge key by key; a scalar or a list replaces what an
// earlier source had at that path (lists are never concatenated); `null` (or
// an empty value, `key=` on the command line) removes the key so that its
// default applies again. Keys may also be written dotted (`train.steps: 5`).
//
// Two phases: load() checks syntax and structure; validate(schema) checks
// every key against the schema (unknown keys with "did you mean", types,
// ranges, choices, required keys, values a reserved key cannot run yet) and
// fills defaults. Getters are used after
// validate(). All failures throw ConfigError with one line of text of the form
// `<file>:<line>:<col>: <key.path>: <what is wrong>; <how to fix>`; values from
// the command line say `<command line>` and schema defaults `<default>`.
//
// Thread-safety: const methods may be called from several threads at once;
// anything else needs exclusive access. Copies are independent.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ptrain/core/error.h"
#include "ptrain/recipe/schema.h"

namespace YAML {
class Node;
}

namespace ptrain {

struct PTRAIN_API SourceLocation {
  std::string file;  // recipe path, "<command line>" or "<default>"
  int line = 0;      // 1-based; 0 when unknown
  int column = 0;    // 1-based
  // "file:line:col" (or just "file" when the line is unknown)
  std::string str() const;
};

class PTRAIN_API Recipe {
 public:
  Recipe();
  ~Recipe();
  Recipe(const Recipe&);
  Recipe& operator=(const Recipe&);
  Recipe(Recipe&&) noexcept;
  Recipe& operator=(Recipe&&) noexcept;

  // Reads `path` with its defaults chain and applies `overrides`.
  // Throws ConfigError: missing file, YAML syntax error (file:line:col),
  // a cycle in defaults, a malformed override.
  static Recipe load(const std::string& path, const std::vector<std::string>& overrides = {});
  // Same, from text; `sourceName` stands in for the file name in messages and
  // `baseDir` resolves relative `defaults` entries.
  static Recipe fromString(const std::string& yaml, const std::string& sourceName = "<string>",
                           const std::vector<std::string>& overrides = {},
                           const std::string& baseDir = ".");

  // Checks every key against `schema` and fills its defaults. May be called
  // again with a larger schema (e.g. after the trainer added its keys); the
  // defaults of the earlier schema are dropped first. With `allowUnknown`,
  // keys the schema does not know are passed over (a first pass with the core
  // keys, before the trainer adds its own); everything else is checked.
  // Throws ConfigError with the first problem (saying how many more there are).
  void validate(const Schema& schema, bool allowUnknown = false);
  // Same checks, but returns every problem (one line each, in recipe order,
  // missing required keys last) instead of throwing; empty when the recipe
  // fits the schema. Defaults are filled either way.
  std::vector<std::string> validateAll(const Schema& schema, bool allowUnknown = false);

  // Recipe name: the `name` key, else the file name without extension.
  const std::string& name() const;
  // The recipe file as given (empty for fromString).
  const std::string& path() const;

  // True when the key has a value (set in a file, an override, or a default),
  // or, for a section or map key, when some key below it has one.
  bool has(const std::string& key) const;
  // True when the key (or, for a section, a key below it) was written in a
  // recipe file, an override or set() rather than filled from a default.
  bool isExplicit(const std::string& key) const;

  // Typed values. Throw ConfigError (location and key path) when the key has
  // no value or its value does not convert.
  int64_t getInt(const std::string& key) const;
  double getFloat(const std::string& key) const;
  bool getBool(const std::string& key) const;
  std::string getString(const std::string& key) const;
  std::vector<int64_t> getIntList(const std::string& key) const;
  std::vector<double> getFloatList(const std::string& key) const;
  std::vector<std::string> getStringList(const std::string& key) const;
  // A list of mappings of single values (ValueType::kMapList), each entry
  // with where it was written, for the reader's own one-line messages.
  struct MapField {
    std::string key, value;  // the value as written (a scalar)
    SourceLocation at;       // where the key was written
  };
  struct MapEntry {
    SourceLocation at;       // where the mapping starts
    std::vector<MapField> fields;  // in the order written
  };
  std::vector<MapEntry> getMapList(const std::string& key) const;

  // A key's value as one line of YAML (flow style: "[1, 2]"), as written;
  // "" when the key has no value.
  std::string valueText(const std::string& key) const;

  // Every key path under `prefix` (e.g. "model") that has a value, sorted.
  std::vector<std::string> keysUnder(const std::string& prefix) const;

  // Where `key` was written (the key itself, not its value). For a key with no
  // value: the nearest enclosing section that was written, else the recipe
  // file at 1:1.
  SourceLocation location(const std::string& key) const;
  // Throws ConfigError "<location>: <key>: <message>".
  [[noreturn]] void fail(const std::string& key, const std::string& message) const;

  // Which values toYaml writes.
  enum class Values {
    kResolved,  // every value, defaults included
    kWritten,   // the keys written in the recipe files, overrides or set()
  };
  // The recipe as YAML text (sections in the schema's order, `defaults`
  // includes resolved away). kResolved pins every default: a record of what
  // ran, whatever later versions default to; a key the schema marks reserved
  // appears only when the recipe set it (its default may be a value a recipe
  // may not write). Loading it back may be refused where a default does not
  // apply to the layout (fp16's settings under fp32, say), since every key it
  // writes reads as written. kWritten gives what the user wrote: it loads
  // back and runs as the original did, which is what a run folder keeps.
  std::string toYaml(Values values = Values::kResolved) const;

  // Sets a value programmatically (YAML text), as an override would; its
  // location reads `<set>`. Throws ConfigError for a malformed key or value.
  // Call validate() again afterwards to check it.
  void set(const std::string& key, const std::string& yamlValue);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ptrain
