// Text helpers only the recipe and the schema use: strict scalar parsing (the
// same rules for validation and getters), "did you mean" distances, key
// paths. Number formatting and lists for messages are public, in
// ptrain/core/text.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ptrain/core/text.h"

namespace YAML {
class Node;
}

namespace ptrain::text {

// Whole-string parses; false when `s` is not exactly one value of the kind.
// Integers: decimal or 0x hex with an optional sign. Numbers: decimal or
// exponent notation, finite only. Booleans: true/false/yes/no/on/off, any case.
bool parseInt(const std::string& s, int64_t* out);
bool parseFloat(const std::string& s, double* out);
bool parseBool(const std::string& s, bool* out);

// "'abc'" for a scalar, "a list", "a mapping", "nothing" for null.
std::string describeNode(const YAML::Node& node);

// Optimal-string-alignment distance (a swap of neighbours counts once), ignoring case.
size_t editDistance(const std::string& a, const std::string& b);
// The candidate nearest to `s` when it is close enough to be a likely typo, else "".
std::string nearest(const std::string& s, const std::vector<std::string>& candidates);

// Dotted key path: names of [A-Za-z0-9_-] joined by single dots.
bool isKeyPath(const std::string& s);

}  // namespace ptrain::text
