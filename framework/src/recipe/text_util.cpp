#include "recipe/text_util.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include <yaml-cpp/yaml.h>

namespace ptrain::text {

bool parseInt(const std::string& s, int64_t* out) {
  if (s.empty()) return false;
  size_t i = (s[0] == '+' || s[0] == '-') ? 1 : 0;
  int base = 10;
  if (s.size() > i + 2 && s[i] == '0' && (s[i + 1] == 'x' || s[i + 1] == 'X')) base = 16;
  size_t digits = base == 16 ? i + 2 : i;
  if (digits >= s.size()) return false;
  for (size_t k = digits; k < s.size(); ++k) {
    if (base == 10 ? !std::isdigit(static_cast<unsigned char>(s[k]))
                   : !std::isxdigit(static_cast<unsigned char>(s[k])))
      return false;
  }
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, base);
  if (errno == ERANGE || end != s.c_str() + s.size()) return false;
  *out = static_cast<int64_t>(v);
  return true;
}

bool parseFloat(const std::string& s, double* out) {
  if (s.empty()) return false;
  bool digit = false;
  for (char c : s) {
    if (std::isdigit(static_cast<unsigned char>(c))) digit = true;
    else if (c != '+' && c != '-' && c != '.' && c != 'e' && c != 'E') return false;
  }
  if (!digit) return false;
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (errno == ERANGE || end != s.c_str() + s.size() || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

bool parseBool(const std::string& s, bool* out) {
  std::string l;
  for (char c : s) l += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (l == "true" || l == "yes" || l == "on") {
    *out = true;
    return true;
  }
  if (l == "false" || l == "no" || l == "off") {
    *out = false;
    return true;
  }
  return false;
}

std::string describeNode(const YAML::Node& node) {
  if (!node.IsDefined() || node.IsNull()) return "nothing";
  if (node.IsSequence()) return "a list";
  if (node.IsMap()) return "a mapping";
  return "'" + node.Scalar() + "'";
}

size_t editDistance(const std::string& a0, const std::string& b0) {
  std::string a, b;
  for (char c : a0) a += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (char c : b0) b += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<size_t>> d(n + 1, std::vector<size_t>(m + 1));
  for (size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (size_t i = 1; i <= n; ++i) {
    for (size_t j = 1; j <= m; ++j) {
      size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[n][m];
}

std::string nearest(const std::string& s, const std::vector<std::string>& candidates) {
  // A quarter of the length (at least one edit) catches typos, swapped
  // letters and a forgotten word ("tensor_parallel_size") without pairing
  // unrelated names.
  const size_t limit = std::max<size_t>(1, (s.size() + 2) / 4);
  std::string best;
  size_t bestDistance = limit + 1;
  for (const auto& c : candidates) {
    size_t d = editDistance(s, c);
    if (d < bestDistance) {
      best = c;
      bestDistance = d;
    }
  }
  return best;
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
