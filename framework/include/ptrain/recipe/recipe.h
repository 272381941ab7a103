// Recipe: typed, validated access to a YAML training recipe.
//
// Loading resolves `defaults: [base.yaml, ...]` (paths relative to the file
// that names them; later values win, the recipe itself last), then applies
// command-line overrides `a.b.c=value` (value parsed as YAML). Each leaf keeps
// where it came from, so every error can say file:line:col and the key path.
//
// Two phases: load() checks syntax and structure; validate(schema) checks
// every key against the schema (unknown keys with "did you mean", types,
// ranges, choices, required keys) and fills defaults. Getters are used after
// validate(). All failures throw ConfigError with one line of text.
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

struct SourceLocation {
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
  // again with a larger schema (e.g. after the trainer added its keys).
  void validate(const Schema& schema);

  // Recipe name: the `name` key, else the file name without extension.
  const std::string& name() const;
  // The recipe file as given (empty for fromString).
  const std::string& path() const;

  // True when the key has a value (set in a file, an override, or a default).
  bool has(const std::string& key) const;
  // True when the key was written in a recipe file or an override (not a default).
  bool isExplicit(const std::string& key) const;

  int64_t getInt(const std::string& key) const;
  double getFloat(const std::string& key) const;
  bool getBool(const std::string& key) const;
  std::string getString(const std::string& key) const;
  std::vector<int64_t> getIntList(const std::string& key) const;
  std::vector<double> getFloatList(const std::string& key) const;
  std::vector<std::string> getStringList(const std::string& key) const;

  // Every key path under `prefix` (e.g. "model") that has a value, sorted.
  std::vector<std::string> keysUnder(const std::string& prefix) const;

  // Where the value of `key` came from.
  SourceLocation location(const std::string& key) const;
  // Throws ConfigError "<location>: <key>: <message>".
  [[noreturn]] void fail(const std::string& key, const std::string& message) const;

  // The resolved recipe (every value, defaults included) as YAML text,
  // suitable for saving next to a run and loading back.
  std::string toYaml() const;

  // Sets a value programmatically (YAML text), as an override would.
  void set(const std::string& key, const std::string& yamlValue);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ptrain
