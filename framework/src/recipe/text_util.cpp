#include "recipe/text_util.h"

#include <cctype>

#include <yaml-cpp/yaml.h>

namespace ptrain::text {

std::string describeNode(const YAML::Node& node) {
  if (!node.IsDefined() || node.IsNull()) return "nothing";
  if (node.IsSequence()) return "a list";
  if (node.IsMap()) return "a mapping";
  return "'" + node.Scalar() + "'";
}

bool isKeyPath(const std::string& s) {
  if (s.empty() || s.front() == '.' || s.back() == '.') return false;
  char prev = '.';
  for (char c : s) {
    if (c == '.') {
      if (prev == '.') return false;
    } else if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') {
      return false;
    }
    prev = c;
  }
  return true;
}

}  // namespace ptrain::text
