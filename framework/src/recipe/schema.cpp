#include "ptrain/recipe/schema.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <sstream>

#include <yaml-cpp/yaml.h>

#include "recipe/text_util.h"

namespace ptrain {

const char* toString(ValueType type) {
  switch (type) {
    case ValueType::kInt: return "int";
    case ValueType::kFloat: return "float";
    case ValueType::kBool: return "bool";
    case ValueType::kString: return "string";
    case ValueType::kIntList: return "int list";
    case ValueType::kFloatList: return "float list";
    case ValueType::kStringList: return "string list";
    case ValueType::kMap: return "map";
    case ValueType::kMapList: return "map list";
  }
  return "?";
}

Schema::Schema() = default;
Schema::~Schema() = default;
Schema::Schema(const Schema&) = default;
Schema& Schema::operator=(const Schema&) = default;

namespace {

bool isListType(ValueType t) {
  return t == ValueType::kIntList || t == ValueType::kFloatList || t == ValueType::kStringList;
}

ValueType elementType(ValueType t) {
  switch (t) {
    case ValueType::kIntList: return ValueType::kInt;
    case ValueType::kFloatList: return ValueType::kFloat;
    case ValueType::kStringList: return ValueType::kString;
    default: return t;
  }
}

// An example value for "how to fix" hints: the default when there is one,
// else something inside the range.
std::string exampleScalar(const KeySpec& spec, ValueType t) {
  if (!spec.choices.empty()) return spec.choices.front();
  if (!spec.default_value.empty() && !isListType(spec.type) && spec.type != ValueType::kMap &&
      spec.type != ValueType::kMapList)
    return spec.default_value;
  switch (t) {
    case ValueType::kInt: {
      double v = spec.min ? *spec.min + (spec.min_exclusive ? 1 : 0) : 1;
      if (spec.max && v > *spec.max) v = *spec.max;
      return text::formatNumber(std::ceil(v));
    }
    case ValueType::kFloat: {
      if (spec.min && spec.max) return text::formatNumber((*spec.min + *spec.max) / 2);
      if (spec.min) return text::formatNumber(*spec.min + 1);
      return "0.5";
    }
    case ValueType::kBool: return "true";
    default: return "";
  }
}

// Value of one scalar against the element type; "" when fine.
std::string checkScalar(const KeySpec& spec, ValueType t, const YAML::Node& v) {
  const std::string got = text::describeNode(v);
  if (!v.IsScalar()) {
    std::string example = exampleScalar(spec, t);
    return "expected " + Schema::typeDescription(t) + ", got " + got + "; write a single value" +
           (example.empty() ? "" : " such as " + example);
  }
  const std::string& s = v.Scalar();
  double number = 0;
  switch (t) {
    case ValueType::kInt: {
      int64_t i = 0;
      if (!text::parseInt(s, &i)) {
        return "expected an integer, got " + got + "; write a whole number such as " + exampleScalar(spec, t);
      }
      number = static_cast<double>(i);
      break;
    }
    case ValueType::kFloat: {
      if (!text::parseFloat(s, &number)) {
        return "expected a number, got " + got + "; write a number such as " + exampleScalar(spec, t);
      }
      break;
    }
    case ValueType::kBool: {
      bool b = false;
      if (!text::parseBool(s, &b)) return "expected true or false, got " + got + "; write true or false";
      return "";
    }
    case ValueType::kString: {
      if (!spec.choices.empty() &&
          std::find(spec.choices.begin(), spec.choices.end(), s) == spec.choices.end()) {
        std::string msg = got + " is not one of " + text::joinOr(spec.choices, ", ", ", ");
        std::string near = text::nearest(s, spec.choices);
        if (!near.empty()) return msg + "; did you mean '" + near + "'?";
        return msg + "; use one of them";
      }
      return "";
    }
    default: return "";
  }
  bool low = spec.min && (spec.min_exclusive ? !(number > *spec.min) : !(number >= *spec.min));
  bool high = spec.max && (spec.max_exclusive ? !(number < *spec.max) : !(number <= *spec.max));
  if (low || high) return s + " is out of range; use a value " + Schema::rangeText(spec);
  return "";
}

}  // namespace

std::string Schema::typeDescription(ValueType type) {
  switch (type) {
    case ValueType::kInt: return "an integer";
    case ValueType::kFloat: return "a number";
    case ValueType::kBool: return "true or false";
    case ValueType::kString: return "a string";
    case ValueType::kIntList: return "a list of integers";
    case ValueType::kFloatList: return "a list of numbers";
    case ValueType::kStringList: return "a list of strings";
    case ValueType::kMap: return "a mapping";
    case ValueType::kMapList: return "a list of mappings";
  }
  return "a value";
}

std::string Schema::rangeText(const KeySpec& spec) {
  using text::formatNumber;
  if (spec.min && spec.max) {
    return std::string("in ") + (spec.min_exclusive ? "(" : "[") + formatNumber(*spec.min) + ", " +
           formatNumber(*spec.max) + (spec.max_exclusive ? ")" : "]");
  }
  if (spec.min) return std::string(spec.min_exclusive ? "> " : ">= ") + formatNumber(*spec.min);
  if (spec.max) return std::string(spec.max_exclusive ? "< " : "<= ") + formatNumber(*spec.max);
  return "";
}

std::string Schema::checkValue(const KeySpec& spec, const YAML::Node& value, int* badElement) {
  if (badElement) *badElement = -1;
  if (spec.type == ValueType::kMap) {
    if (value.IsMap()) return "";
    return "expected a mapping, got " + text::describeNode(value) + "; write keys below it, e.g. {key: value}";
  }
  if (spec.type == ValueType::kMapList) {
    if (!value.IsSequence()) {
      return "expected a list of mappings, got " + text::describeNode(value) + "; write [{key: value, ...}, ...]";
    }
    int index = 0;
    for (const auto& item : value) {
      bool flat = item.IsMap();
      if (flat)
        for (auto it = item.begin(); it != item.end(); ++it) flat = flat && it->first.IsScalar() && it->second.IsScalar();
      if (!flat) {
        if (badElement) *badElement = index;
        return "entry " + std::to_string(index + 1) + " is " + text::describeNode(item) +
               ", expected a mapping of single values; write {key: value, ...}";
      }
      ++index;
    }
    return "";
  }
  if (isListType(spec.type)) {
    ValueType et = elementType(spec.type);
    if (value.IsScalar()) {
      return "expected " + typeDescription(spec.type) + ", got " + text::describeNode(value) + "; write [" +
             value.Scalar() + "]";
    }
    if (!value.IsSequence()) {
      return "expected " + typeDescription(spec.type) + ", got " + text::describeNode(value) + "; write [" +
             exampleScalar(spec, et) + ", ...]";
    }
    for (size_t i = 0; i < value.size(); ++i) {
      std::string err = checkScalar(spec, et, value[i]);
      if (!err.empty()) {
        if (badElement) *badElement = static_cast<int>(i);
        return "element " + std::to_string(i) + ": " + err;
      }
    }
    return "";
  }
  return checkScalar(spec, spec.type, value);
}

namespace {

// True when `value` and the YAML text `accepted` are the same value of the
// key's type: `no` is false, `0x10` is 16.
bool sameValue(const KeySpec& spec, const YAML::Node& value, const std::string& accepted) {
  const YAML::Node want = YAML::Load(accepted);
  if (!value.IsScalar() || !want.IsScalar()) return YAML::Dump(value) == YAML::Dump(want);
  const std::string& a = value.Scalar();
  const std::string& b = want.Scalar();
  switch (spec.type) {
    case ValueType::kInt: {
      int64_t x = 0, y = 0;
      return text::parseInt(a, &x) && text::parseInt(b, &y) && x == y;
    }
    case ValueType::kFloat: {
      double x = 0, y = 0;
      return text::parseFloat(a, &x) && text::parseFloat(b, &y) && x == y;
    }
    case ValueType::kBool: {
      bool x = false, y = false;
      return text::parseBool(a, &x) && text::parseBool(b, &y) && x == y;
    }
    default: return a == b;
  }
}

}  // namespace

std::string Schema::checkReserved(const KeySpec& spec, const YAML::Node& value) {
  if (spec.reserved.empty()) return "";
  for (const auto& accepted : spec.reserved_accepts) {
    if (sameValue(spec, value, accepted)) return "";
  }
  const std::string shown = value.IsScalar() ? value.Scalar() : text::describeNode(value);
  std::string msg = shown + " is not implemented yet (" + spec.reserved + "); remove it";
  if (!spec.reserved_accepts.empty()) msg += " or set " + text::joinOr(spec.reserved_accepts);
  return msg;
}

void Schema::add(KeySpec spec) {
  const std::string where = "schema key '" + spec.path + "': ";
  PTRAIN_CHECK(text::isKeyPath(spec.path), where, "not a dotted key path");
  PTRAIN_CHECK(!(spec.required && !spec.default_value.empty()), where, "a required key has no default");
  if (!spec.default_value.empty()) {
    YAML::Node node;
    try {
      node = YAML::Load(spec.default_value);
    } catch (const YAML::Exception& e) {
      PTRAIN_CHECK(false, where, "default '", spec.default_value, "' is not YAML: ", e.msg);
    }
    if (!node.IsNull()) {
      std::string err = checkValue(spec, node);
      PTRAIN_CHECK(err.empty(), where, "default '", spec.default_value, "' does not fit: ", err);
    }
  }
  PTRAIN_CHECK(!spec.reserved.empty() || spec.reserved_accepts.empty(), where,
               "accepted values without a reason why the rest are reserved");
  for (const auto& accepted : spec.reserved_accepts) {
    YAML::Node node;
    try {
      node = YAML::Load(accepted);
    } catch (const YAML::Exception& e) {
      PTRAIN_CHECK(false, where, "accepted value '", accepted, "' is not YAML: ", e.msg);
    }
    std::string err = node.IsNull() ? "it is empty" : checkValue(spec, node);
    PTRAIN_CHECK(err.empty(), where, "accepted value '", accepted, "' does not fit: ", err);
  }
  // A path cannot be both a key and a section (except below a free-form map).
  for (const auto& k : keys_) {
    if (k.path == spec.path) continue;
    bool below = spec.path.compare(0, k.path.size() + 1, k.path + ".") == 0;
    bool above = k.path.compare(0, spec.path.size() + 1, spec.path + ".") == 0;
    PTRAIN_CHECK(!(below || above), where, "clashes with key '", k.path, "'");
  }
  if (spec.owner.empty()) spec.owner = owner_;
  auto it = index_.find(spec.path);
  if (it != index_.end()) {
    keys_[it->second] = std::move(spec);
  } else {
    index_.emplace(spec.path, keys_.size());
    keys_.push_back(std::move(spec));
  }
}

void Schema::addFrom(const std::string& owner, const std::function<void(Schema&)>& describe) {
  const std::string before = owner_;
  owner_ = owner;
  try {
    describe(*this);
  } catch (...) {
    owner_ = before;
    throw;
  }
  owner_ = before;
}

void Schema::remove(const std::string& path) {
  auto it = index_.find(path);
  if (it == index_.end()) return;
  keys_.erase(keys_.begin() + static_cast<std::ptrdiff_t>(it->second));
  index_.clear();
  for (size_t i = 0; i < keys_.size(); ++i) index_.emplace(keys_[i].path, i);
}

void Schema::addUnused(const std::string& path, std::string reason) {
  unused_.emplace(path, std::move(reason));
}

const std::string* Schema::unusedReason(const std::string& path) const {
  if (index_.count(path) != 0) return nullptr;
  auto it = unused_.find(path);
  return it == unused_.end() ? nullptr : &it->second;
}

const KeySpec* Schema::find(const std::string& path) const {
  auto it = index_.find(path);
  return it == index_.end() ? nullptr : &keys_[it->second];
}

bool Schema::isSection(const std::string& path) const {
  const std::string prefix = path + ".";
  auto it = index_.lower_bound(prefix);
  return it != index_.end() && it->first.compare(0, prefix.size(), prefix) == 0;
}

std::string Schema::suggest(const std::string& path) const {
  auto parent = [](const std::string& p) { return p.substr(0, p.rfind('.') == std::string::npos ? 0 : p.rfind('.')); };
  auto commonPrefix = [](const std::string& a, const std::string& b) {
    size_t i = 0;
    while (i < a.size() && i < b.size() && std::tolower(static_cast<unsigned char>(a[i])) ==
                                               std::tolower(static_cast<unsigned char>(b[i])))
      ++i;
    return i;
  };
  const std::string leaf = path.substr(path.rfind('.') + 1);
  std::string best;
  size_t bestDistance = 0, bestPrefix = 0;
  for (const auto& k : keys_) {
    // Within the same section only the last name can be wrong, so measure the
    // distance against its length: "dir" is not a typo of "keep", but
    // "tensor_parallel_size" is one of "tensor_model_parallel_size".
    // Across sections the whole path may be misspelt ("trian.seed").
    size_t limit = parent(k.path) == parent(path) ? std::max<size_t>(1, leaf.size() / 3)
                                                  : std::max<size_t>(1, (path.size() + 2) / 4);
    size_t d = text::editDistance(path, k.path);
    if (d > limit) continue;
    size_t prefix = commonPrefix(path, k.path);
    if (best.empty() || d < bestDistance || (d == bestDistance && prefix > bestPrefix)) {
      best = k.path;
      bestDistance = d;
      bestPrefix = prefix;
    }
  }
  if (!best.empty()) return best;
  // The right name in the wrong section: "train.lr" -> "optimizer.lr".
  for (const auto& k : keys_) {
    if (k.path.substr(k.path.rfind('.') + 1) != leaf) continue;
    size_t d = text::editDistance(path, k.path);
    if (best.empty() || d < bestDistance) {
      best = k.path;
      bestDistance = d;
    }
  }
  return best;
}

namespace {

std::string section(const std::string& path) { return path.substr(0, path.find('.')); }

std::string defaultText(const KeySpec& k) {
  if (k.required) return "required";
  if (k.default_value.empty()) return "not set";
  return k.default_value;
}

// What a reserved key accepts today, then what waits: "false (true: not
// implemented yet)", "fp32 (others: not implemented yet)". `quote` wraps each
// value (backticks in markdown).
std::string reservedText(const KeySpec& k, const std::string& quote) {
  if (k.reserved_accepts.empty()) return "unset only (not implemented yet)";
  auto accepted = [&](const std::string& v) {
    for (const auto& a : k.reserved_accepts) {
      if (sameValue(k, YAML::Load(v), a)) return true;
    }
    return false;
  };
  std::vector<std::string> now, later;
  for (const auto& a : k.reserved_accepts) now.push_back(quote + a + quote);
  std::vector<std::string> known = k.choices;
  if (k.type == ValueType::kBool) known = {"true", "false"};
  for (const auto& v : known) {
    if (!accepted(v)) later.push_back(quote + v + quote);
  }
  const bool closed = !known.empty();
  if (closed && later.empty()) return text::joinOr(now, ", ", ", ");
  return text::joinOr(now, ", ", ", ") + " (" + (closed ? text::joinOr(later, ", ", ", ") : "others") +
         ": not implemented yet)";
}

std::string allowedText(const KeySpec& k, const std::string& sep) {
  if (!k.reserved.empty()) return reservedText(k, "");
  if (!k.choices.empty()) {
    std::string out;
    for (size_t i = 0; i < k.choices.size(); ++i) out += (i ? sep : "") + k.choices[i];
    return out;
  }
  return Schema::rangeText(k);
}

// The doc, and for a reserved key why it does not run yet.
std::string meaningText(const KeySpec& k) {
  if (k.reserved.empty()) return k.doc;
  return k.doc + " Not implemented yet: " + k.reserved + ".";
}

std::string escapeCell(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '|') out += "\\|";
    else out += c;
  }
  return out;
}

// Whether `ptrain keys` lists the key: not one that is reserved and accepts
// no value yet, which nobody can use (the recipe still refuses it with its
// reason, for users who bring it from another framework).
bool listed(const KeySpec& k) { return k.reserved.empty() || !k.reserved_accepts.empty(); }

}  // namespace

std::string Schema::markdown() const {
  std::ostringstream os;
  // (owner, section) in order of first appearance, the core's first.
  std::vector<std::pair<std::string, std::string>> groups;
  for (int core = 1; core >= 0; --core) {
    for (const auto& k : keys_) {
      if (k.owner.empty() != static_cast<bool>(core)) continue;
      std::pair<std::string, std::string> g{k.owner, section(k.path)};
      if (std::find(groups.begin(), groups.end(), g) == groups.end()) groups.push_back(g);
    }
  }
  bool first = true;
  for (const auto& [owner, s] : groups) {
    if (!first) os << "\n";
    first = false;
    os << "### `" << s << "`" << (owner.empty() ? "" : " (plugin `" + owner + "`)") << "\n\n";
    os << "| Key | Type | Default | Allowed | Meaning |\n";
    os << "|---|---|---|---|---|\n";
    for (const auto& k : keys_) {
      if (k.owner != owner || section(k.path) != s || !listed(k)) continue;
      std::string def = defaultText(k);
      if (!k.required && !k.default_value.empty()) def = "`" + escapeCell(def) + "`";
      std::string allowed;
      if (!k.reserved.empty()) {
        allowed = escapeCell(reservedText(k, "`"));
      } else if (!k.choices.empty()) {
        for (size_t i = 0; i < k.choices.size(); ++i) allowed += (i ? ", " : "") + ("`" + k.choices[i] + "`");
      } else {
        allowed = escapeCell(rangeText(k));
      }
      os << "| `" << k.path << "` | " << toString(k.type) << " | " << def << " | " << allowed << " | "
         << escapeCell(meaningText(k)) << " |\n";
    }
  }
  return os.str();
}

std::string Schema::text() const {
  size_t wPath = 3, wType = 4, wDefault = 7, wAllowed = 7;
  for (const auto& k : keys_) {
    if (!listed(k)) continue;
    wPath = std::max(wPath, k.path.size());
    wType = std::max(wType, std::string(toString(k.type)).size());
    wDefault = std::max(wDefault, defaultText(k).size());
    wAllowed = std::max(wAllowed, allowedText(k, "|").size());
  }
  auto pad = [](const std::string& s, size_t w) { return s + std::string(w > s.size() ? w - s.size() : 0, ' '); };
  std::ostringstream os;
  os << pad("key", wPath) << "  " << pad("type", wType) << "  " << pad("default", wDefault) << "  "
     << pad("allowed", wAllowed) << "  meaning\n";
  std::vector<std::string> owners;
  for (int core = 1; core >= 0; --core) {
    for (const auto& k : keys_) {
      if (k.owner.empty() == static_cast<bool>(core) &&
          std::find(owners.begin(), owners.end(), k.owner) == owners.end())
        owners.push_back(k.owner);
    }
  }
  for (const auto& owner : owners) {
    bool headed = owner.empty();
    for (const auto& k : keys_) {
      if (k.owner != owner || !listed(k)) continue;
      if (!headed) os << "keys of plugin " << owner << ":\n";
      headed = true;
      os << pad(k.path, wPath) << "  " << pad(toString(k.type), wType) << "  " << pad(defaultText(k), wDefault)
         << "  " << pad(allowedText(k, "|"), wAllowed) << "  " << meaningText(k) << "\n";
    }
  }
  return os.str();
}

}  // namespace ptrain
