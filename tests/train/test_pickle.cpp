// The opcode machine of the state-dict reader (src/io/pickle_machine.h):
// what Python's pickle writes comes out as the same values; malformed input
// is an error naming the file and the fault, never a crash; persistent ids
// and REDUCE go to the resolver, which alone decides what may be built.
#include "support/catch.h"

#include <string>

#include "io/pickle_machine.h"
#include "lockstep/util/error.h"

using namespace lockstep;
using lockstep::testing::Contains;
using pickle::Value;
using pickle::ValuePtr;

namespace {

std::string unhex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

// Refuses everything, recording what it was asked.
struct Refuser : pickle::Resolver {
  std::string asked;
  ValuePtr persistent(const ValuePtr& pid) override {
    asked = "persistent";
    throw DataError("persistent id refused");
  }
  ValuePtr reduce(const pickle::Global& g, const ValuePtr&) override {
    asked = g.module + "." + g.name;
    throw DataError("refused " + asked);
  }
};

ValuePtr run(const std::string& bytes, pickle::Resolver& resolver) {
  pickle::Machine machine(resolver, "input.pkl");
  return machine.run(bytes.data(), bytes.size());
}

std::string error_of(const std::string& bytes) {
  Refuser refuser;
  try {
    run(bytes, refuser);
  } catch (const DataError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("pickle machine: Python's protocol-2 values come out as written", "[pickle]") {
  // pickle.dumps({'a': (1, 2.5, 'x'), 'b': [True, None], 'c': -70000}, protocol=2)
  const auto bytes = unhex(
      "80027d71002858010000006171014b01474004000000000000580100000078710287710358010000006271045d"
      "710528884e6558010000006371064a90eefeff752e");
  Refuser refuser;
  const auto root = run(bytes, refuser);
  REQUIRE(root->kind == Value::Kind::kDict);
  REQUIRE(root->entries.size() == 3);
  CHECK(root->entries[0].first->s == "a");
  const auto& a = root->entries[0].second;
  REQUIRE(a->kind == Value::Kind::kTuple);
  REQUIRE(a->items.size() == 3);
  CHECK(a->items[0]->i == 1);
  CHECK(a->items[1]->f == 2.5);
  CHECK(a->items[2]->s == "x");
  const auto& b = root->entries[1].second;
  REQUIRE(b->kind == Value::Kind::kList);
  REQUIRE(b->items.size() == 2);
  CHECK(b->items[0]->kind == Value::Kind::kBool);
  CHECK(b->items[0]->i == 1);
  CHECK(b->items[1]->kind == Value::Kind::kNone);
  CHECK(root->entries[2].second->i == -70000);
  CHECK(refuser.asked.empty());
}

TEST_CASE("pickle machine: malformed input is an error naming the fault", "[pickle]") {
  CHECK_THAT(error_of(unhex("800271002e")),
             Contains("input.pkl: malformed pickle (memo of an empty stack)"));
  CHECK_THAT(error_of(unhex("8002852e")), Contains("malformed pickle (stack underflow)"));
  CHECK_THAT(error_of(unhex("80024e862e")), Contains("malformed pickle (stack underflow)"));
  CHECK_THAT(error_of(unhex("80026802")), Contains("malformed pickle (unknown memo entry)"));
  CHECK_THAT(error_of(unhex("8002ff")), Contains("unsupported pickle opcode 0xff"));
  CHECK_THAT(error_of(unhex("80025805000000ab")), Contains("truncated pickle"));
  CHECK_THAT(error_of(unhex("8002")), Contains("truncated pickle"));
  // TUPLE1 nested 70 deep (a million would overflow a recursive reader's stack).
  std::string deep = "80024e";
  for (int i = 0; i < 70; ++i) deep += "85";
  CHECK_THAT(error_of(unhex(deep + "2e")), Contains("nested more than 64 deep"));
  // 64 deep is still fine.
  std::string ok = "80024e";
  for (int i = 0; i < 64; ++i) ok += "85";
  Refuser refuser;
  CHECK(run(unhex(ok + "2e"), refuser)->kind == Value::Kind::kTuple);
}

TEST_CASE("pickle machine: objects and storages are the resolver's to allow", "[pickle]") {
  // cos\nsystem\n ( X'ls' t R .   -- os.system('ls')
  const auto call = unhex("8002636f730a73797374656d0a2858020000006c7374522e");
  Refuser refuser;
  CHECK_THROWS_WITH(run(call, refuser), Contains("refused os.system"));
  CHECK(refuser.asked == "os.system");
  // A persistent id (how torch.save points at a storage).
  Refuser storages;
  const auto pid = unhex("8002580700000073746f7261676585512e");
  CHECK_THROWS_WITH(run(pid, storages), Contains("persistent id refused"));
  CHECK(storages.asked == "persistent");
}
