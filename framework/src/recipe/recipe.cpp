#include "ptrain/recipe/recipe.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <yaml-cpp/yaml.h>

#include "recipe/text_util.h"

namespace fs = std::filesystem;

namespace ptrain {

std::string SourceLocation::str() const {
  if (line <= 0) return file;
  return file + ":" + std::to_string(line) + ":" + std::to_string(column);
}

namespace {

const char* const kCommandLine = "<command line>";
const char* const kDefault = "<default>";
const char* const kSet = "<set>";

SourceLocation at(const std::string& file, const YAML::Mark& mark) {
  SourceLocation loc;
  loc.file = file;
  if (mark.line >= 0) {
    loc.line = mark.line + 1;
    loc.column = mark.column + 1;
  }
  return loc;
}

// yaml-cpp's Node::operator= rebinds every handle sharing the node, so leaf
// values are only ever copy-constructed, never assigned.
struct Leaf {
  YAML::Node value;
  SourceLocation key_loc;    // where the key was written
  SourceLocation value_loc;  // where its value starts
  bool is_explicit = true;
  uint64_t order = 0;        // when it was set: base files, then the recipe, then overrides
};

// One change from one source: set a leaf, or remove a path (null value).
struct Op {
  bool unset = false;
  std::string path;
  YAML::Node value;
  SourceLocation key_loc;
  SourceLocation value_loc;
};

struct Written {
  SourceLocation key_loc;
  SourceLocation value_loc;
};

std::string parentOf(const std::string& path) {
  auto dot = path.rfind('.');
  return dot == std::string::npos ? "" : path.substr(0, dot);
}

std::string lastName(const std::string& path) { return path.substr(path.rfind('.') + 1); }

// What a recipe may be, so that no input can take minutes or gigabytes
// before its one line (docs/recipes.md, "Limits"). A real recipe is a few
// kilobytes, a dozen keys deep at most, with a handful of includes.
constexpr uintmax_t kMaxRecipeBytes = 1 << 20;  // per file
constexpr int kMaxRecipeFiles = 64;             // the recipe and every file its defaults read
constexpr int kMaxRecipeDepth = 32;             // nested sections and lists
constexpr int64_t kMaxRecipeNodes = 100000;     // values and keys, aliases expanded

// Counts the nodes a recipe expands to (an alias counts again each time it
// is used) and their nesting, over every document of one load.
struct NodeBudget {
  int64_t nodes = 0;

  void visit(const YAML::Node& n, int depth, const std::string& file, const std::string& path) {
    if (++nodes > kMaxRecipeNodes) {
      throw ConfigError(at(file, n.Mark()).str() + ": " + (path.empty() ? "" : path + ": ") +
                        "the recipe expands to more than " + std::to_string(kMaxRecipeNodes) +
                        " values (aliases count each time they are used); a recipe this large is refused");
    }
    if (depth > kMaxRecipeDepth) {
      throw ConfigError(at(file, n.Mark()).str() + ": " + (path.empty() ? "" : path + ": ") + "nested more than " +
                        std::to_string(kMaxRecipeDepth) + " levels deep; a recipe this deep is refused");
    }
  }

  // A list or scalar value, with everything inside it.
  void value(const YAML::Node& n, int depth, const std::string& file, const std::string& path) {
    visit(n, depth, file, path);
    if (n.IsSequence()) {
      for (const auto& e : n) value(e, depth + 1, file, path);
    } else if (n.IsMap()) {
      for (auto it = n.begin(); it != n.end(); ++it) {
        value(it->first, depth + 1, file, path);
        value(it->second, depth + 1, file, path);
      }
    }
  }
};

// Turns one YAML document (or an override value) into ops, recording where
// every mapping key was written.
class Flattener {
 public:
  Flattener(std::vector<Op>& ops, std::map<std::string, Written>& written, NodeBudget* budget = nullptr)
      : ops_(ops), written_(written), budget_(budget != nullptr ? budget : &ownBudget_) {}

  void mapping(const YAML::Node& map, const std::string& prefix, const std::string& file,
               std::map<std::string, SourceLocation>& seen, bool topLevel) {
    const int depth = prefix.empty() ? 0 : static_cast<int>(std::count(prefix.begin(), prefix.end(), '.')) + 1;
    for (auto it = map.begin(); it != map.end(); ++it) {
      budget_->visit(it->first, depth + 1, file, prefix);
      const YAML::Node k = it->first;  // copies: `it->` yields a temporary
      const YAML::Node v = it->second;
      SourceLocation keyLoc = at(file, k.Mark());
      if (!k.IsScalar() || !text::isKeyPath(k.Scalar())) {
        std::string shown = k.IsScalar() ? "'" + k.Scalar() + "'" : text::describeNode(k);
        throw ConfigError(keyLoc.str() + ": " + (prefix.empty() ? "" : prefix + ": ") + "key " + shown +
                          " is not a name; use letters, digits and '_' (dots nest sections)");
      }
      if (topLevel && k.Scalar() == "defaults") continue;
      std::string path = prefix.empty() ? k.Scalar() : prefix + "." + k.Scalar();
      auto dup = seen.find(path);
      if (dup != seen.end()) {
        throw ConfigError(keyLoc.str() + ": " + path + ": duplicate key (first written at " + dup->second.str() +
                          "); remove one of them");
      }
      seen.emplace(path, keyLoc);
      SourceLocation valueLoc = at(file, v.Mark());
      if (valueLoc.line == 0) valueLoc = keyLoc;  // an empty value has no mark of its own
      written_.erase(path);
      written_.emplace(path, Written{keyLoc, valueLoc});
      value(v, path, file, keyLoc, valueLoc, seen);
    }
  }

  void value(const YAML::Node& v, const std::string& key, const std::string& file, const SourceLocation& keyLoc,
             const SourceLocation& valueLoc, std::map<std::string, SourceLocation>& seen) {
    // `device: cuda` is short for `device.type: cuda` (the device section
    // also holds device.tf32), in files and overrides alike.
    const std::string path = key == "device" && v.IsScalar() ? "device.type" : key;
    const int depth = static_cast<int>(std::count(path.begin(), path.end(), '.')) + 1;
    if (v.IsMap()) {
      budget_->visit(v, depth, file, path);
      mapping(v, path, file, seen, false);
    } else if (v.IsNull()) {
      ops_.push_back(Op{true, path, YAML::Node(), keyLoc, valueLoc});
    } else {
      budget_->value(v, depth, file, path);
      ops_.push_back(Op{false, path, v, keyLoc, valueLoc});
    }
  }

 private:
  std::vector<Op>& ops_;
  std::map<std::string, Written>& written_;
  NodeBudget ownBudget_;
  NodeBudget* budget_;
};

// Refuses what is not a regular file of a recipe's size before opening it
// (opening a FIFO would wait for a writer; /dev/zero never ends).
std::string readText(const std::string& path) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (!ec && !fs::is_regular_file(status)) {
    throw ConfigError("recipe " + path + " is not a regular file (a device, pipe or socket); give a .yaml file");
  }
  const uintmax_t size = fs::file_size(path, ec);
  if (!ec && size > kMaxRecipeBytes) {
    throw ConfigError("recipe " + path + " is " + std::to_string(size) + " bytes, over the " +
                      std::to_string(kMaxRecipeBytes) + " a recipe may have; is it the right file?");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError("cannot read recipe " + path + "; check its permissions");
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

YAML::Node parseYaml(const std::string& textIn, const std::string& file) {
  try {
    return YAML::Load(textIn);
  } catch (const YAML::Exception& e) {
    std::string msg = e.msg;
    if (!msg.empty()) msg[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(msg[0])));
    throw ConfigError(at(file, e.mark).str() + ": YAML syntax error: " + msg +
                      "; check the indentation, colons, quotes and brackets there");
  }
}

// Resolves the defaults chain of one document into ops, bases first.
class Loader {
 public:
  Loader(std::vector<Op>& ops, std::map<std::string, Written>& written) : ops_(ops), written_(written) {}

  void file(const std::string& shownPath) {
    if (++files_ > kMaxRecipeFiles) {
      throw ConfigError(shownPath + ": the recipe reads more than " + std::to_string(kMaxRecipeFiles) +
                        " files through its defaults (a file named by several others counts each time); a recipe "
                        "graph this large is refused");
    }
    std::error_code ec;
    fs::path p(shownPath);
    if (!fs::exists(p, ec)) throw ConfigError("recipe not found: " + shownPath);
    if (fs::is_directory(p, ec)) throw ConfigError("recipe " + shownPath + " is a folder; give a .yaml file");
    std::string canonical = fs::weakly_canonical(p, ec).string();
    stack_.push_back(canonical);
    shownStack_.push_back(shownPath);
    document(readText(shownPath), shownPath, p.parent_path());
    stack_.pop_back();
    shownStack_.pop_back();
  }

  void text(const std::string& yaml, const std::string& sourceName, const fs::path& baseDir) {
    if (yaml.size() > kMaxRecipeBytes) {
      throw ConfigError(sourceName + ": " + std::to_string(yaml.size()) + " bytes, over the " +
                        std::to_string(kMaxRecipeBytes) + " a recipe may have");
    }
    ++files_;
    shownStack_.push_back(sourceName);
    document(yaml, sourceName, baseDir);
    shownStack_.pop_back();
  }

 private:
  void document(const std::string& yaml, const std::string& file, const fs::path& dir) {
    YAML::Node root = parseYaml(yaml, file);
    if (!root.IsDefined() || root.IsNull()) return;
    if (!root.IsMap()) {
      throw ConfigError(at(file, root.Mark()).str() + ": expected a mapping of sections at the top level, got " +
                        text::describeNode(root) + "; start with keys such as 'train:'");
    }
    // Looked up through a const node: a non-const lookup would add the key.
    const YAML::Node defaults = static_cast<const YAML::Node&>(root)["defaults"];
    if (defaults.IsDefined() && !defaults.IsNull()) includeDefaults(defaults, file, dir);
    std::map<std::string, SourceLocation> seen;
    Flattener(ops_, written_, &budget_).mapping(root, "", file, seen, true);
  }

  void includeDefaults(const YAML::Node& defaults, const std::string& file, const fs::path& dir) {
    std::vector<YAML::Node> entries;
    if (defaults.IsScalar()) {
      entries.push_back(defaults);
    } else if (defaults.IsSequence()) {
      for (const auto& e : defaults) entries.push_back(e);
    } else {
      throw ConfigError(at(file, defaults.Mark()).str() + ": defaults: expected a list of recipe files, got " +
                        text::describeNode(defaults) + "; write defaults: [base.yaml]");
    }
    for (const auto& e : entries) {
      SourceLocation loc = at(file, e.Mark());
      if (!e.IsScalar() || e.Scalar().empty()) {
        throw ConfigError(loc.str() + ": defaults: expected a recipe file name, got " + text::describeNode(e) +
                          "; write defaults: [base.yaml]");
      }
      fs::path base = fs::path(e.Scalar());
      if (base.is_relative()) base = dir / base;
      std::string shown = base.lexically_normal().string();
      std::error_code ec;
      if (!fs::exists(base, ec) || fs::is_directory(base, ec)) {
        throw ConfigError(loc.str() + ": defaults: recipe not found: " + shown +
                          "; paths are relative to the file that names them");
      }
      std::string canonical = fs::weakly_canonical(base, ec).string();
      auto cycle = std::find(stack_.begin(), stack_.end(), canonical);
      if (cycle != stack_.end()) {
        std::string chain;
        for (size_t i = static_cast<size_t>(cycle - stack_.begin()) + (shownStack_.size() - stack_.size());
             i < shownStack_.size(); ++i) {
          chain += shownStack_[i] + " -> ";
        }
        throw ConfigError(loc.str() + ": defaults: cycle " + chain + shown + "; remove one of these defaults");
      }
      this->file(shown);
    }
  }

  std::vector<Op>& ops_;
  std::map<std::string, Written>& written_;
  std::vector<std::string> stack_;       // canonical paths of the files being read
  std::vector<std::string> shownStack_;  // the same (plus a string source) as shown in messages
  int files_ = 0;
  NodeBudget budget_;
};

// "a.b=value" -> ops; `file` names the source in messages.
void overrideOps(const std::string& arg, const std::string& file, std::vector<Op>& ops,
                 std::map<std::string, Written>& written) {
  const std::string where = file + ": override '" + arg + "'";
  auto eq = arg.find('=');
  if (eq == std::string::npos) {
    throw ConfigError(where + ": expected key=value; write it as a.b.c=value, e.g. train.steps=100");
  }
  std::string key = arg.substr(0, eq);
  std::string valueText = arg.substr(eq + 1);
  if (key.empty()) {
    throw ConfigError(where + ": the key before '=' is missing; write it as a.b.c=value, e.g. train.steps=100");
  }
  if (!text::isKeyPath(key)) {
    throw ConfigError(where + ": '" + key +
                      "' is not a key path; use names joined by single dots, e.g. train.steps=100");
  }
  if (key == "defaults" || key.compare(0, 9, "defaults.") == 0) {
    throw ConfigError(where + ": defaults cannot be overridden; name the base recipe in the recipe file");
  }
  YAML::Node value;
  try {
    value = YAML::Load(valueText);
  } catch (const YAML::Exception& e) {
    throw ConfigError(where + ": the value is not valid YAML (" + e.msg + "); fix it, or quote it to pass it as a string");
  }
  SourceLocation loc{file, 0, 0};
  std::map<std::string, SourceLocation> seen;
  written.erase(key);
  written.emplace(key, Written{loc, loc});
  Flattener flat(ops, written);
  // Locations inside an override value say only where the override came from.
  if (value.IsMap()) {
    std::vector<Op> inner;
    std::map<std::string, Written> innerWritten;
    Flattener(inner, innerWritten).mapping(value, key, file, seen, false);
    for (auto& op : inner) {
      op.key_loc = loc;
      op.value_loc = loc;
      ops.push_back(std::move(op));
    }
    for (auto& w : innerWritten) {
      written.erase(w.first);
      written.emplace(w.first, Written{loc, loc});
    }
  } else {
    flat.value(value, key, file, loc, loc, seen);
  }
}

}  // namespace

struct Recipe::Impl {
  std::string path;         // as given to load()
  std::string source;       // the main source's name in messages
  std::string name;
  std::map<std::string, Leaf> leaves;
  std::map<std::string, Written> written;   // every mapping key ever written, last writer wins
  std::vector<std::string> schemaOrder;     // key order of the last schema, for toYaml
  std::set<std::string> reservedKeys;       // keys the last schema marks reserved
  uint64_t nextOrder = 0;

  void apply(const Op& op, bool isExplicit = true) {
    // A new value replaces whatever lay at, below or above its path.
    leaves.erase(op.path);
    const std::string below = op.path + ".";
    auto it = leaves.lower_bound(below);
    while (it != leaves.end() && it->first.compare(0, below.size(), below) == 0) it = leaves.erase(it);
    for (std::string up = parentOf(op.path); !up.empty(); up = parentOf(up)) leaves.erase(up);
    if (!op.unset) {
      leaves.emplace(op.path, Leaf{op.value, op.key_loc, op.value_loc, isExplicit, nextOrder++});
    }
  }

  void applyAll(const std::vector<Op>& ops) {
    for (const auto& op : ops) apply(op);
  }

  void refreshName() {
    auto it = leaves.find("name");
    if (it != leaves.end() && it->second.value.IsScalar()) {
      name = it->second.value.Scalar();
    } else {
      name = fs::path(source).stem().string();
    }
  }

  const Leaf* leaf(const std::string& key) const {
    auto it = leaves.find(key);
    return it == leaves.end() ? nullptr : &it->second;
  }

  // Leaves at or below `key`.
  template <typename F>
  void forEachAtOrBelow(const std::string& key, F f) const {
    if (const Leaf* l = leaf(key)) f(key, *l);
    const std::string below = key + ".";
    for (auto it = leaves.lower_bound(below); it != leaves.end() && it->first.compare(0, below.size(), below) == 0;
         ++it) {
      f(it->first, it->second);
    }
  }

  SourceLocation locationOf(const std::string& key) const {
    if (const Leaf* l = leaf(key)) return l->key_loc;
    for (std::string p = key; !p.empty(); p = parentOf(p)) {
      auto w = written.find(p);
      if (w != written.end()) return w->second.key_loc;
    }
    return SourceLocation{source, 1, 1};
  }
};

Recipe::Recipe() : impl_(std::make_unique<Impl>()) {}
Recipe::~Recipe() = default;
Recipe::Recipe(const Recipe& other) : impl_(std::make_unique<Impl>(*other.impl_)) {}
Recipe& Recipe::operator=(const Recipe& other) {
  if (this != &other) impl_ = std::make_unique<Impl>(*other.impl_);
  return *this;
}
Recipe::Recipe(Recipe&&) noexcept = default;
Recipe& Recipe::operator=(Recipe&&) noexcept = default;

Recipe Recipe::load(const std::string& path, const std::vector<std::string>& overrides) {
  Recipe r;
  r.impl_->path = path;
  r.impl_->source = path;
  std::vector<Op> ops;
  Loader(ops, r.impl_->written).file(path);
  for (const auto& o : overrides) overrideOps(o, kCommandLine, ops, r.impl_->written);
  r.impl_->applyAll(ops);
  r.impl_->refreshName();
  return r;
}

Recipe Recipe::fromString(const std::string& yaml, const std::string& sourceName,
                          const std::vector<std::string>& overrides, const std::string& baseDir) {
  Recipe r;
  r.impl_->source = sourceName;
  std::vector<Op> ops;
  Loader(ops, r.impl_->written).text(yaml, sourceName, fs::path(baseDir));
  for (const auto& o : overrides) overrideOps(o, kCommandLine, ops, r.impl_->written);
  r.impl_->applyAll(ops);
  r.impl_->refreshName();
  return r;
}

void Recipe::validate(const Schema& schema, bool allowUnknown) {
  std::vector<std::string> problems = validateAll(schema, allowUnknown);
  if (problems.empty()) return;
  std::string msg = problems.front();
  if (problems.size() == 2) msg += " (and 1 more problem: `ptrain check` lists all)";
  if (problems.size() > 2) {
    msg += " (and " + std::to_string(problems.size() - 1) + " more problems: `ptrain check` lists all)";
  }
  throw ConfigError(msg);
}

std::vector<std::string> Recipe::validateAll(const Schema& schema, bool allowUnknown) {
  Impl& im = *impl_;
  // Defaults of an earlier schema may differ from this one's.
  for (auto it = im.leaves.begin(); it != im.leaves.end();) {
    it = it->second.is_explicit ? std::next(it) : im.leaves.erase(it);
  }

  std::vector<std::pair<const std::string*, const Leaf*>> ordered;
  for (const auto& kv : im.leaves) ordered.emplace_back(&kv.first, &kv.second);
  std::sort(ordered.begin(), ordered.end(), [](const auto& a, const auto& b) { return a.second->order < b.second->order; });

  std::vector<std::string> problems;
  std::set<std::string> reported;  // paths already blamed, so one mistake gives one line
  for (const auto& [pathPtr, leafPtr] : ordered) {
    const std::string& path = *pathPtr;
    const Leaf& leaf = *leafPtr;
    if (const KeySpec* spec = schema.find(path)) {
      int bad = -1;
      std::string err = Schema::checkValue(*spec, leaf.value, &bad);
      // Every leaf here was written (defaults are filled below), so a
      // reserved key's value is the recipe's own.
      if (err.empty()) err = Schema::checkReserved(*spec, leaf.value);
      if (!err.empty()) {
        SourceLocation loc = leaf.value_loc;
        if (bad >= 0 && leaf.value_loc.line > 0) loc = at(leaf.value_loc.file, leaf.value[bad].Mark());
        problems.push_back(loc.str() + ": " + path + ": " + err);
      }
      continue;
    }
    // Below a key: fine under a free-form map, else the key got a mapping it cannot hold.
    const KeySpec* owner = nullptr;
    for (std::string up = parentOf(path); !up.empty(); up = parentOf(up)) {
      if ((owner = schema.find(up))) break;
    }
    if (owner) {
      if (owner->type == ValueType::kMap) continue;
      if (!reported.insert(owner->path).second) continue;
      auto w = im.written.find(owner->path);
      SourceLocation loc = w != im.written.end() ? w->second.value_loc : leaf.key_loc;
      problems.push_back(loc.str() + ": " + owner->path + ": expected " + Schema::typeDescription(owner->type) +
                         ", got a mapping; write " + (Schema::rangeText(*owner).empty() ? "a single value" : "a value " + Schema::rangeText(*owner)) +
                         " instead of the keys below it");
      continue;
    }
    if (schema.isSection(path)) {
      problems.push_back(leaf.value_loc.str() + ": " + path + ": expected a section of keys, got " +
                         text::describeNode(leaf.value) + "; write its keys below it (`ptrain keys` lists them)");
      continue;
    }
    // Unknown. Blame the first unknown level once when nothing close exists.
    if (allowUnknown) continue;
    if (const std::string* reason = schema.unusedReason(path)) {
      problems.push_back(leaf.key_loc.str() + ": " + path + ": " + *reason);
      continue;
    }
    std::string suggestion = schema.suggest(path);
    if (!suggestion.empty()) {
      problems.push_back(leaf.key_loc.str() + ": " + path + ": unknown key; did you mean '" + suggestion + "'?");
      continue;
    }
    std::string unknown = path;
    for (std::string up = parentOf(path); !up.empty() && !schema.isSection(up); up = parentOf(up)) unknown = up;
    if (!reported.insert(unknown).second) continue;
    auto w = im.written.find(unknown);
    SourceLocation loc = w != im.written.end() ? w->second.key_loc : leaf.key_loc;
    std::string parent = parentOf(unknown);
    if (unknown != path) {
      problems.push_back(loc.str() + ": " + unknown + ": unknown section; remove it (`ptrain keys` lists the known keys)");
    } else if (parent.empty()) {
      problems.push_back(loc.str() + ": " + unknown + ": unknown key; remove it (`ptrain keys` lists the known keys)");
    } else {
      problems.push_back(loc.str() + ": " + unknown + ": unknown key; remove it (`ptrain keys` lists the keys of '" +
                         parent + "')");
    }
  }

  for (const auto& spec : schema.keys()) {
    bool present = false;
    im.forEachAtOrBelow(spec.path, [&](const std::string&, const Leaf&) { present = true; });
    if (present) continue;
    if (spec.required) {
      std::string parent = parentOf(spec.path);
      SourceLocation loc = parent.empty() ? SourceLocation{im.source, 1, 1} : im.locationOf(parent);
      if (loc.line == 0 && loc.file != im.source) loc = SourceLocation{im.source, 1, 1};
      std::string example = lastName(spec.path) + ": <" + toString(spec.type) + ">";
      problems.push_back(loc.str() + ": " + spec.path + ": missing required key; add '" + example + "'" +
                         (parent.empty() ? " at the top level" : " under '" + parent + ":'"));
      continue;
    }
    if (spec.default_value.empty()) continue;
    YAML::Node def = YAML::Load(spec.default_value);
    if (def.IsNull()) continue;
    SourceLocation loc{kDefault, 0, 0};
    std::vector<Op> ops;
    std::map<std::string, Written> unused;
    std::map<std::string, SourceLocation> seen;
    Flattener(ops, unused).value(def, spec.path, kDefault, loc, loc, seen);
    for (auto& op : ops) {
      op.key_loc = loc;
      op.value_loc = loc;
      im.apply(op, false);
    }
  }

  im.schemaOrder.clear();
  im.reservedKeys.clear();
  for (const auto& spec : schema.keys()) {
    im.schemaOrder.push_back(spec.path);
    if (!spec.reserved.empty()) im.reservedKeys.insert(spec.path);
  }
  im.refreshName();
  return problems;
}

const std::string& Recipe::name() const { return impl_->name; }
const std::string& Recipe::path() const { return impl_->path; }

bool Recipe::has(const std::string& key) const {
  bool found = false;
  impl_->forEachAtOrBelow(key, [&](const std::string&, const Leaf&) { found = true; });
  return found;
}

bool Recipe::isExplicit(const std::string& key) const {
  bool found = false;
  impl_->forEachAtOrBelow(key, [&](const std::string&, const Leaf& l) { found = found || l.is_explicit; });
  return found;
}

// Getters share one shape: find the leaf, convert strictly, blame the value.
#define PTRAIN_RECIPE_LEAF(key)                                                                  \
  const Leaf* leaf = impl_->leaf(key);                                                           \
  if (!leaf) {                                                                                   \
    fail(key, has(key) ? "is a section, not a value; read the keys below it"                     \
                       : "not set; add it to the recipe or pass " + key + "=<value>");           \
  }

namespace {

[[noreturn]] void badValue(const std::string& key, const Leaf& leaf, const YAML::Node& node, const std::string& what) {
  SourceLocation loc = leaf.value_loc;
  if (&node != &leaf.value && loc.line > 0) loc = at(loc.file, node.Mark());
  throw ConfigError(loc.str() + ": " + key + ": expected " + what + ", got " + text::describeNode(node) +
                    "; fix the value");
}

int64_t toInt(const std::string& key, const Leaf& leaf, const YAML::Node& n) {
  int64_t v = 0;
  if (!n.IsScalar() || !text::parseInt(n.Scalar(), &v)) badValue(key, leaf, n, "an integer");
  return v;
}

double toFloat(const std::string& key, const Leaf& leaf, const YAML::Node& n) {
  double v = 0;
  if (!n.IsScalar() || !text::parseFloat(n.Scalar(), &v)) badValue(key, leaf, n, "a number");
  return v;
}

std::string toStr(const std::string& key, const Leaf& leaf, const YAML::Node& n) {
  if (!n.IsScalar()) badValue(key, leaf, n, "a string");
  return n.Scalar();
}

const YAML::Node& seqOf(const std::string& key, const Leaf& leaf, const char* what) {
  if (!leaf.value.IsSequence()) badValue(key, leaf, leaf.value, what);
  return leaf.value;
}

}  // namespace

int64_t Recipe::getInt(const std::string& key) const {
  PTRAIN_RECIPE_LEAF(key);
  return toInt(key, *leaf, leaf->value);
}

double Recipe::getFloat(const std::string& key) const {
  PTRAIN_RECIPE_LEAF(key);
  return toFloat(key, *leaf, leaf->value);
}

bool Recipe::getBool(const std::string& key) const {
  PTRAIN_RECIPE_LEAF(key);
  bool v = false;
  if (!leaf->value.IsScalar() || !text::parseBool(leaf->value.Scalar(), &v)) {
    badValue(key, *leaf, leaf->value, "true or false");
  }
  return v;
}

std::string Recipe::getString(const std::string& key) const {
  PTRAIN_RECIPE_LEAF(key);
  return toStr(key, *leaf, leaf->value);
}

std::vector<int64_t> Recipe::getIntList(const std::string& key) const {
  PTRAIN_RECIPE_LEAF(key);
  std::vector<int64_t> out;
  for (const auto& n : seqOf(key, *leaf, "a list of integers")) out.push_back(toInt(key, *leaf, n));
  return out;
}

std::vector<double> Recipe::getFloatList(const std::string& key) const {
  PTRAIN_RECIPE_LEAF(key);
  std::vector<double> out;
  for (const auto& n : seqOf(key, *leaf, "a list of numbers")) out.push_back(toFloat(key, *leaf, n));
  return out;
}

std::vector<std::string> Recipe::getStringList(const std::string& key) const {
  PTRAIN_RECIPE_LEAF(key);
  std::vector<std::string> out;
  for (const auto& n : seqOf(key, *leaf, "a list of strings")) out.push_back(toStr(key, *leaf, n));
  return out;
}

std::vector<Recipe::MapEntry> Recipe::getMapList(const std::string& key) const {
  PTRAIN_RECIPE_LEAF(key);
  std::vector<MapEntry> out;
  for (const auto& n : seqOf(key, *leaf, "a list of mappings")) {
    if (!n.IsMap()) badValue(key, *leaf, n, "a list of mappings");
    MapEntry entry;
    entry.at = leaf->value_loc.line > 0 ? at(leaf->value_loc.file, n.Mark()) : leaf->value_loc;
    for (auto it = n.begin(); it != n.end(); ++it) {
      if (!it->first.IsScalar() || !it->second.IsScalar()) badValue(key, *leaf, n, "a list of mappings of single values");
      MapField field;
      field.key = it->first.Scalar();
      field.value = it->second.Scalar();
      field.at = leaf->value_loc.line > 0 ? at(leaf->value_loc.file, it->first.Mark()) : leaf->value_loc;
      entry.fields.push_back(std::move(field));
    }
    out.push_back(std::move(entry));
  }
  return out;
}

#undef PTRAIN_RECIPE_LEAF

std::vector<std::string> Recipe::keysUnder(const std::string& prefix) const {
  std::vector<std::string> out;
  if (prefix.empty()) {
    for (const auto& kv : impl_->leaves) out.push_back(kv.first);
    return out;
  }
  impl_->forEachAtOrBelow(prefix, [&](const std::string& k, const Leaf&) { out.push_back(k); });
  return out;
}

SourceLocation Recipe::location(const std::string& key) const { return impl_->locationOf(key); }

void Recipe::fail(const std::string& key, const std::string& message) const {
  const std::string prefix = location(key).str() + ": " + key + ": ";
  // A message from the recipe itself about the same key (a caller passing
  // on what getString threw) already says where: once is enough.
  if (message.rfind(prefix, 0) == 0) throw ConfigError(message);
  throw ConfigError(prefix + message);
}

namespace {

// Leaves nested back into sections, in schema order, for emitting.
struct Tree {
  std::vector<std::pair<std::string, Tree>> children;
  const Leaf* leaf = nullptr;

  Tree& child(const std::string& name) {
    for (auto& c : children) {
      if (c.first == name) return c.second;
    }
    children.emplace_back(name, Tree{});
    return children.back().second;
  }
};

void emitScalar(YAML::Emitter& out, const YAML::Node& n) {
  // A value quoted in its source stays quoted, so "123" or "yes" read back
  // as the same string.
  if (n.Tag() == "!") out << YAML::DoubleQuoted << n.Scalar();
  else out << n.Scalar();
}

void emitValue(YAML::Emitter& out, const YAML::Node& n) {
  if (n.IsScalar()) {
    emitScalar(out, n);
    return;
  }
  if (n.IsSequence()) {
    bool flat = true;
    for (const auto& e : n) flat = flat && e.IsScalar();
    out << (flat ? YAML::Flow : YAML::Block) << YAML::BeginSeq;
    for (const auto& e : n) emitValue(out, e);
    out << YAML::EndSeq;
    return;
  }
  if (n.IsMap()) {
    out << YAML::BeginMap;
    for (auto it = n.begin(); it != n.end(); ++it) {
      out << YAML::Key << it->first.Scalar() << YAML::Value;
      emitValue(out, it->second);
    }
    out << YAML::EndMap;
    return;
  }
  out << YAML::Null;
}

}  // namespace

std::string Recipe::valueText(const std::string& key) const {
  const Leaf* l = impl_->leaf(key);
  if (l == nullptr) return "";
  YAML::Emitter out;
  out << YAML::Flow;
  emitValue(out, l->value);
  return out.c_str();
}

namespace {

void emitTree(YAML::Emitter& out, const Tree& t) {
  out << YAML::BeginMap;
  for (const auto& [name, child] : t.children) {
    out << YAML::Key << name << YAML::Value;
    if (child.leaf) emitValue(out, child.leaf->value);
    else emitTree(out, child);
  }
  out << YAML::EndMap;
}

}  // namespace

std::string Recipe::toYaml(Values values) const {
  const Impl& im = *impl_;
  std::map<std::string, size_t> rank;
  for (size_t i = 0; i < im.schemaOrder.size(); ++i) rank.emplace(im.schemaOrder[i], i);
  // Keys below a free-form map sort with their map; unknown ones go last.
  auto rankOf = [&](const std::string& path) {
    for (std::string p = path; !p.empty(); p = parentOf(p)) {
      auto it = rank.find(p);
      if (it != rank.end()) return it->second;
    }
    return im.schemaOrder.size();
  };
  std::vector<std::pair<size_t, const std::string*>> keys;
  for (const auto& kv : im.leaves) {
    // A reserved key's default may be one that no recipe may write
    // (train.eval_batches): leave it out, loading the text back restores it.
    if (!kv.second.is_explicit && (values == Values::kWritten || im.reservedKeys.count(kv.first) > 0)) continue;
    keys.emplace_back(rankOf(kv.first), &kv.first);
  }
  std::stable_sort(keys.begin(), keys.end(), [](const auto& a, const auto& b) { return a.first < b.first; });

  // Sections appear in the order of their first key, so place each section
  // by the smallest rank below it.
  Tree root;
  for (const auto& [r, path] : keys) {
    Tree* t = &root;
    size_t start = 0;
    while (true) {
      size_t dot = path->find('.', start);
      t = &t->child(path->substr(start, dot == std::string::npos ? std::string::npos : dot - start));
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    t->leaf = &im.leaves.at(*path);
  }
  YAML::Emitter out;
  out.SetIndent(2);
  if (root.children.empty()) {
    out << YAML::BeginMap << YAML::EndMap;
  } else {
    emitTree(out, root);
  }
  return std::string(out.c_str()) + "\n";
}

void Recipe::set(const std::string& key, const std::string& yamlValue) {
  std::vector<Op> ops;
  overrideOps(key + "=" + yamlValue, kSet, ops, impl_->written);
  impl_->applyAll(ops);
  impl_->refreshName();
}

}  // namespace ptrain
