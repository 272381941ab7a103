#include "ptrain/core/text.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace ptrain::text {

std::string formatNumber(double v) {
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 1e15) {
    return std::to_string(static_cast<long long>(v));
  }
  char buf[64];
  for (int precision = 6; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  // "1e-08" -> "1e-8": the way people write it in a recipe.
  std::string s(buf);
  auto e = s.find('e');
  if (e != std::string::npos) {
    std::string mant = s.substr(0, e), exp = s.substr(e + 1);
    std::string sign;
    if (!exp.empty() && (exp[0] == '-' || exp[0] == '+')) {
      if (exp[0] == '-') sign = "-";
      exp = exp.substr(1);
    }
    exp.erase(0, std::min(exp.find_first_not_of('0'), exp.size() - 1));
    s = mant + "e" + sign + exp;
  }
  return s;
}

std::string joinOr(const std::vector<std::string>& items, const std::string& sep, const std::string& last) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += (i + 1 == items.size()) ? last : sep;
    out += items[i];
  }
  return out;
}

std::string joinOr(const std::vector<int64_t>& items, const std::string& sep, const std::string& last) {
  std::vector<std::string> s;
  for (int64_t v : items) s.push_back(std::to_string(v));
  return joinOr(s, sep, last);
}

bool endsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace ptrain::text
