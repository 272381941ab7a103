#include "ptrain/core/text.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
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

std::string nearest(const std::string& s, const std::vector<std::string>& candidates, size_t maxEdits) {
  const std::string* best = nullptr;
  size_t bestDistance = 0;
  for (const auto& c : candidates) {
    const size_t d = editDistance(s, c);
    if (d <= maxEdits && (best == nullptr || d < bestDistance)) {
      best = &c;
      bestDistance = d;
    }
  }
  return best == nullptr ? std::string() : *best;
}

size_t firstNonUtf8Byte(const std::string& s) {
  const auto* b = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = b[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    // The sequence's length and the range its second byte must fall in
    // (which rules out overlong forms, surrogates and code points past U+10FFFF).
    size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      return i;
    }
    if (i + 1 >= n || b[i + 1] < lo || b[i + 1] > hi) return i;
    for (size_t k = 2; k < len; ++k) {
      if (i + k >= n || b[i + k] < 0x80 || b[i + k] > 0xBF) return i;
    }
    i += len;
  }
  return std::string::npos;
}

std::string nearest(const std::string& s, const std::vector<std::string>& candidates) {
  // A quarter of the length (at least one edit) catches typos, swapped
  // letters and a forgotten word ("parallel.tensor_parallel_size") without
  // pairing unrelated names.
  return nearest(s, candidates, std::max<size_t>(1, (s.size() + 2) / 4));
}

}  // namespace ptrain::text
