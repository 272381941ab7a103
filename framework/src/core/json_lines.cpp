// text::parseJsonLine: one line of a JSON Lines file, with the messages every
// reader of such files gives (prompts, `ptrain data prepare`'s inputs,
// `ptrain plot`'s metrics.jsonl).
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "ptrain/core/text.h"

namespace ptrain::text {

bool isCutJsonRow(const std::string& line) {
  const size_t first = line.find_first_not_of(" \t");
  return first != std::string::npos && line[first] == '{' && firstNonUtf8Byte(line) == std::string::npos;
}

nlohmann::json parseJsonLine(const std::string& line, const std::string& path, int64_t lineNumber,
                             uint64_t lineOffset, const std::string& expected) {
  const std::string where = path + ":" + std::to_string(lineNumber) + ":";
  const size_t bad = firstNonUtf8Byte(line);
  if (bad != std::string::npos) {
    char byte[8];
    std::snprintf(byte, sizeof byte, "0x%02X", static_cast<unsigned>(static_cast<unsigned char>(line[bad])));
    throw ConfigError(where + std::to_string(bad + 1) + ": not UTF-8 (byte " + byte + " at offset " +
                      std::to_string(lineOffset + bad) + " of the file); save it as UTF-8 text");
  }
  try {
    return nlohmann::json::parse(line);
  } catch (const nlohmann::json::parse_error& e) {
    // nlohmann's message is "[json.exception.parse_error.101] parse error at
    // line 1, column 5: syntax error while parsing value - invalid literal;
    // last read: 'x'": what is wrong follows the position.
    std::string what = e.what();
    const size_t colon = what.find(": ", what.find("column"));
    if (colon != std::string::npos) what = what.substr(colon + 2);
    const size_t column = e.byte == 0 ? 1 : e.byte;
    throw ConfigError(where + std::to_string(column) + ": not valid JSON (" + what + "); expected " + expected);
  } catch (const nlohmann::json::exception& e) {
    // A number past a double's range (out_of_range.406).
    std::string what = e.what();
    const size_t bracket = what.find("] ");
    if (bracket != std::string::npos) what = what.substr(bracket + 2);
    throw ConfigError(where + "1: not valid JSON (" + what + "); expected " + expected);
  }
}

}  // namespace ptrain::text
