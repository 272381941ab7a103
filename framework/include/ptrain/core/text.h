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

#include <nlohmann/json_fwd.hpp>

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

// The index of the first byte of `s` that is not part of well-formed UTF-8
// (a stray continuation byte, a sequence cut short, an overlong form, a
// surrogate, a code point past U+10FFFF), or std::string::npos when all of it
// is: what readers of users' text files check before parsing, so that the
// message says "not UTF-8" and where.
PTRAIN_API size_t firstNonUtf8Byte(const std::string& s);

// The JSON value of one line of a JSON Lines file: `path`, its line number,
// and the offset of the line's first byte in the file locate a mistake.
// Throws ConfigError "<path>:<line>:<column>: not UTF-8 (byte 0xC3 at offset
// N of the file); save it as UTF-8 text" or "<path>:<line>:<column>: not
// valid JSON (what is wrong); expected <expected>", one line either way.
// Defined in json_lines.cpp (nlohmann's parser stays out of this header).
//
// isCutJsonRow: whether a last line that failed to parse is a row its
// writer was stopped in the middle of (a run still writing, or killed):
// UTF-8 that starts a JSON object. Readers of files ptrain appends to
// (metrics.jsonl) pass over such a line; anything else is damage.
PTRAIN_API bool isCutJsonRow(const std::string& line);
PTRAIN_API nlohmann::json parseJsonLine(const std::string& line, const std::string& path, int64_t lineNumber,
                                        uint64_t lineOffset, const std::string& expected);

}  // namespace ptrain::text
