// util/json.h: the compact JSON document the vocabulary readers walk.
#include "support/catch.h"

#include <string>

#include "lockstep/util/error.h"
#include "lockstep/util/json.h"

using namespace lockstep;
using lockstep::testing::Contains;

TEST_CASE("JSON values, members and escapes read as RFC 8259 says", "[json]") {
  const JsonDocument doc(
      R"({"a": [1, 2.5, -3, 1e2, true, false, null, "x\"\\\/\b\f\n\r\t\u00e9\ud83d\ude42"],
          "b": {"c": {}, "d": []}, "a": "second a", "big": 1234567890123456})",
      "t.json");
  const JsonValue root = doc.root();
  REQUIRE(root.is(JsonKind::kObject));
  CHECK(root.size() == 4);
  CHECK_THROWS_WITH(root.get("a"), Contains("t.json: the key \"a\" is given twice"));
  const JsonValue a = root.at(0);
  REQUIRE(a.is(JsonKind::kArray));
  CHECK(a.size() == 8);
  CHECK(a.at(0).number() == 1);
  CHECK(a.at(0).whole());
  CHECK(a.at(1).number() == 2.5);
  CHECK_FALSE(a.at(1).whole());
  CHECK(a.at(2).number() == -3);
  CHECK_FALSE(a.at(2).whole());  // negative
  CHECK(a.at(3).number() == 100);
  CHECK_FALSE(a.at(3).whole());  // written with an exponent
  CHECK(a.at(4).boolean());
  CHECK(a.at(5).is(JsonKind::kBool));
  CHECK_FALSE(a.at(5).boolean());
  CHECK(a.at(6).is(JsonKind::kNull));
  CHECK(a.at(7).text() == "x\"\\/\b\f\n\r\t\xc3\xa9\xf0\x9f\x99\x82");
  CHECK(a.at(8).missing());
  CHECK_FALSE(root.get("big").whole());  // 16 digits: past what a double holds exactly
  const JsonValue b = root.get("b");
  CHECK(b.get("c").is(JsonKind::kObject));
  CHECK(b.get("c").size() == 0);
  CHECK(b.get("d").size() == 0);
  CHECK(b.get("nothing").missing());
  CHECK(b.get("nothing").get("deeper").missing());
  std::string keys;
  for (const JsonValue v : root) keys += std::string(v.key()) + ",";
  CHECK(keys == "a,b,a,big,");
  CHECK(root.at(2).text() == "second a");
}

TEST_CASE("malformed JSON is a DataError naming the source and the byte", "[json]") {
  const auto refused = [](const std::string& text, const std::string& why) {
    CHECK_THROWS_WITH(JsonDocument(text, "v.json"),
                      Contains("v.json: not valid JSON at byte") && Contains(why));
  };
  refused("", "not a value");
  refused("[1,]", "not a value");
  refused("{\"a\" 1}", "expected ':'");
  refused("{1: 2}", "expected a member's name");
  refused("\"abc", "an unterminated string");
  refused("\"a\nb\"", "a control character");
  refused("\"\\ud800\"", "a lone surrogate");
  refused("\"\\udc00\"", "a lone surrogate");
  refused("\"\\q\"", "a bad escape");
  refused("\"\\u12zz\"", "a bad \\u escape");
  refused("\"\\u12\"", "a short \\u escape");
  refused("1 2", "text after the value");
  refused("-", "not a value");
  refused("1.", "a bad number");
  refused("[007]", "a number with a leading zero");
  CHECK(JsonDocument("[0, 0.5, 10]", "v.json").root().size() == 3);
  CHECK(JsonDocument("\xEF\xBB\xBF{\"a\": 1}", "v.json").root().get("a").number() == 1);
  // The top value is depth 0: 65 levels read, 66 refused.
  refused(std::string(66, '[') + std::string(66, ']'), "nested deeper than 64");
  CHECK_NOTHROW(JsonDocument(std::string(65, '[') + std::string(65, ']'), "v.json"));
}

TEST_CASE("a document's memory is bounded by its text, and values by the cap", "[json]") {
  // Note [Bounded JSON]: 16 bytes a node, reserved once from the text's size.
  std::string zeros = "[";
  for (int i = 0; i < 99999; ++i) zeros += "0,";
  zeros += "0]";
  const JsonDocument doc(zeros, "zeros.json");
  CHECK(doc.root().size() == 100000);
  CHECK(doc.reserved_bytes() <= 9 * zeros.size() + 64);
  CHECK_THROWS_WITH(JsonDocument(zeros, "zeros.json", 100000), Contains("more than 100000 values"));
  CHECK_NOTHROW(JsonDocument(zeros, "zeros.json", 100001));
}
