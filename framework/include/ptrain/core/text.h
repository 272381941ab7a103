// Text for messages and settings: numbers as people write them, lists that
// read as a sentence ("1, 2 or 4"), strict whole-string parses of a setting's
// value, and the "did you mean" of a misspelt name. Shared by the recipe, the
// schema, the NCCL settings, the layout checks, the plugin registry and the
// command line, and free for plugins to use in their own messages.
//
// Thread-safety: pure functions of their arguments.
#pragma once

#include <cstddef>
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

// Whole-string parses, the rules a recipe's values and NCCL's variables are
// read by; false (and *out untouched) when `s` is not exactly one value of
// the kind. Integers: decimal, or 0x hex, with an optional sign, in int64.
// Numbers: decimal or exponent notation, finite only. Booleans:
// true/false/yes/no/on/off, any case.
PTRAIN_API bool parseInt(const std::string& s, int64_t* out);
PTRAIN_API bool parseFloat(const std::string& s, double* out);
PTRAIN_API bool parseBool(const std::string& s, bool* out);

// The fewest edits (insert, delete or replace one character, or swap two
// neighbours) that turn `a` into `b`, ignoring case: the optimal string
// alignment distance. editDistance("tarin", "Train") == 1.
PTRAIN_API size_t editDistance(const std::string& a, const std::string& b);

// The candidate nearest to `s` (editDistance; the first of equals) when it is
// close enough to be a likely typo of it, else "": at most a quarter of the
// length of `s` (rounded) edits away, and at least one. So
// "parallel.tensor_parallel_size" finds "parallel.tensor_model_parallel_size",
// and "dir" does not find "keep".
PTRAIN_API std::string nearest(const std::string& s, const std::vector<std::string>& candidates);
// The same with a fixed limit: the nearest candidate at most `maxEdits`
// edits away, else "" (short names, such as commands and plugins: 2).
PTRAIN_API std::string nearest(const std::string& s, const std::vector<std::string>& candidates, size_t maxEdits);

}  // namespace ptrain::text
