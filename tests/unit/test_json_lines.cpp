// text::firstNonUtf8Byte against hand-made sequences (Unicode's table of
// well-formed byte sequences, chapter 3), and text::parseJsonLine's messages.
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "ptrain/core/text.h"

namespace ptrain {
namespace {

constexpr size_t kAll = std::string::npos;

TEST(Utf8, WellFormedTextHasNoBadByte) {
  EXPECT_EQ(text::firstNonUtf8Byte(""), kAll);
  EXPECT_EQ(text::firstNonUtf8Byte("plain ascii {\"a\": 1}"), kAll);
  EXPECT_EQ(text::firstNonUtf8Byte("\xC3\xA9t\xC3\xA9"), kAll);          // été
  EXPECT_EQ(text::firstNonUtf8Byte("\xE2\x82\xAC 5"), kAll);             // € (3 bytes)
  EXPECT_EQ(text::firstNonUtf8Byte("\xF0\x9F\x98\x80"), kAll);           // U+1F600 (4 bytes)
  EXPECT_EQ(text::firstNonUtf8Byte("\xED\x9F\xBF"), kAll);               // U+D7FF, the last before the surrogates
  EXPECT_EQ(text::firstNonUtf8Byte("\xF4\x8F\xBF\xBF"), kAll);           // U+10FFFF, the last code point
}

TEST(Utf8, EachKindOfBadSequenceIsFoundWhereItStarts) {
  EXPECT_EQ(text::firstNonUtf8Byte("ab\x80"), 2u);                // a continuation byte alone
  EXPECT_EQ(text::firstNonUtf8Byte("ab\xFF"), 2u);                // never in UTF-8
  EXPECT_EQ(text::firstNonUtf8Byte("a\xC3"), 1u);                 // cut short at the end
  EXPECT_EQ(text::firstNonUtf8Byte("a\xE2\x82z"), 1u);            // cut short by another character
  EXPECT_EQ(text::firstNonUtf8Byte("\xC0\x80"), 0u);              // overlong NUL
  EXPECT_EQ(text::firstNonUtf8Byte("\xC1\xBF"), 0u);              // overlong
  EXPECT_EQ(text::firstNonUtf8Byte("x\xE0\x80\x80"), 1u);         // overlong 3-byte form
  EXPECT_EQ(text::firstNonUtf8Byte("\xF0\x80\x80\x80"), 0u);      // overlong 4-byte form
  EXPECT_EQ(text::firstNonUtf8Byte("ok\xED\xA0\x80"), 2u);        // a surrogate, U+D800
  EXPECT_EQ(text::firstNonUtf8Byte("\xF4\x90\x80\x80"), 0u);      // past U+10FFFF
  EXPECT_EQ(text::firstNonUtf8Byte("\xF5\x80\x80\x80"), 0u);      // a lead byte past F4
  EXPECT_EQ(text::firstNonUtf8Byte("\xC3\xA9\xE9t\xC3\xA9"), 2u); // Latin-1 é between UTF-8 ones
}

TEST(JsonLine, ParsesALineAndNamesWhatIsWrongWithOne) {
  EXPECT_EQ(text::parseJsonLine("{\"a\": [1, 2]}", "f.jsonl", 3, 40, "one object")["a"][1], 2);
  try {
    text::parseJsonLine("{\"a\": \"caf\xE9\"}", "f.jsonl", 3, 40, "one object");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), "f.jsonl:3:11: not UTF-8 (byte 0xE9 at offset 50 of the file); save it as UTF-8 text");
    EXPECT_EQ(e.exitCode(), 2);
  }
  try {
    text::parseJsonLine("{\"a\": tru}", "f.jsonl", 7, 0, "one object a line");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("f.jsonl:7:", 0), 0u) << what;
    EXPECT_NE(what.find(": not valid JSON (syntax error while parsing value - invalid literal; last read: '\"a\": tru}'); "
                        "expected one object a line"),
              std::string::npos)
        << what;
    EXPECT_EQ(what.find("json.exception"), std::string::npos) << what;
  }
}

TEST(JsonLine, ACutRowIsTheStartOfAnObjectInUtf8) {
  EXPECT_TRUE(text::isCutJsonRow("{\"step\": 3, \"lo"));
  EXPECT_TRUE(text::isCutJsonRow("  {\"caf\xC3\xA9\": "));
  EXPECT_FALSE(text::isCutJsonRow("step 3 loss 1.5"));
  EXPECT_FALSE(text::isCutJsonRow("{\"a\": \"\xFF"));
  EXPECT_FALSE(text::isCutJsonRow("   "));
}

}  // namespace
}  // namespace ptrain
