// Text for messages: numbers as people write them and lists that read as a
// sentence ("1, 2 or 4"). Shared by the recipe, the schema and the layout
// checks, and free for plugins to use in their own messages.
//
// Thread-safety: pure functions of their arguments.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ptrain/core/error.h"

namespace ptrain::text {

// The shortest text that reads back as `v`: "8", "0.001", "1e-8" (a whole
// number below 1e15 without a decimal point, an exponent without padding).
PTRAIN_API std::string formatNumber(double v);

// The items joined as a sentence: "a, b or c" with the default separators,
// "a" for one item, "" for none.
PTRAIN_API std::string joinOr(const std::vector<std::string>& items, const std::string& sep = ", ",
                              const std::string& last = " or ");
PTRAIN_API std::string joinOr(const std::vector<int64_t>& items, const std::string& sep = ", ",
                              const std::string& last = " or ");

// Whether `s` ends with `suffix` (e.g. a parameter name with ".bias").
PTRAIN_API bool endsWith(const std::string& s, const std::string& suffix);

}  // namespace ptrain::text
