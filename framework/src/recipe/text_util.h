// Text helpers only the recipe and the schema use: how a YAML node reads in a
// message, key paths. The strict scalar parses (the same rules for validation
// and getters), "did you mean" and the number and list formats for messages
// are public, in ptrain/core/text.h, which this header includes.
#pragma once

#include <string>

#include "ptrain/core/text.h"

namespace YAML {
class Node;
}

namespace ptrain::text {

// "'abc'" for a scalar, "a list", "a mapping", "nothing" for null.
std::string describeNode(const YAML::Node& node);

// Dotted key path: names of [A-Za-z0-9_-] joined by single dots.
bool isKeyPath(const std::string& s);

}  // namespace ptrain::text
