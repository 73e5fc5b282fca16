// The opcode machine of the state-dict reader (src/io/pickle_machine.h):
// what Python's pickle writes comes out as the same values; malformed input
// is an error naming the file and the fault, never a crash; persistent ids
// and REDUCE go to the resolver, which alone decides what may be built.
#include "support/catch.h"

#include <string>

#include <ATen/ATen.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <utility>
#include <vector>

#include "io/pickle_machine.h"
#include "lockstep/io/safetensors.h"
#include "lockstep/util/error.h"
#include "support/temp_dir.h"

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

namespace {
// A safetensors file from a header's JSON and `data` bytes.
std::string safetensors_bytes(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(header.size() >> (8 * i) & 0xff);
  return out + header + data;
}
}  // namespace

TEST_CASE("safetensors: every dtype round-trips, and hostile files name the entry",
          "[io][safetensors]") {
  testing::TempDir dir;
  StateDict state{{"f32", at::arange(6, at::kFloat).reshape({2, 3})},
                  {"bf16", at::arange(4, at::kFloat).to(at::kBFloat16)},
                  {"f16", at::ones({3}, at::kHalf)},
                  {"i64", at::arange(5, at::kLong)},
                  {"u8", at::arange(3, at::kByte)},
                  {"flag", at::ones({2}, at::kBool)},
                  {"scalar", at::tensor(2.5, at::kDouble)},
                  {"empty", at::empty({0, 4}, at::kFloat)}};
  const std::string path = dir.path + "/all.safetensors";
  safetensors_save(state, path, {{"format", "pt"}});
  std::map<std::string, std::string> metadata;
  const StateDict back = safetensors_load(path, &metadata);
  CHECK(metadata["format"] == "pt");
  REQUIRE(back.size() == state.size());
  for (size_t i = 0; i < state.size(); ++i) {  // the file's order is the writer's
    CHECK(back[i].first == state[i].first);
    CHECK(back[i].second.scalar_type() == state[i].second.scalar_type());
    CHECK(at::equal(back[i].second, state[i].second));
  }
  const auto bad = [&](const std::string& name, const std::string& bytes, const std::string& want) {
    const std::string file = dir.write(name, bytes);
    INFO(name);
    CHECK_THROWS_WITH(safetensors_load(file), Contains("'" + file + "': " + want));
  };
  const std::string f32x2 = std::string(8, '\0');
  bad("short", "abc", "shorter than the 8-byte header length");
  bad("huge_header", std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8) + "{}",
      "header length 9223372036854775807 is past the file's");
  bad("not_json", safetensors_bytes("{\"a\": [1, 2", ""), "the header is not JSON");
  bad("list", safetensors_bytes("[1, 2]", ""), "the header is not a JSON object of entries");
  bad("deep", safetensors_bytes(std::string(100000, '[') + std::string(100000, ']'), ""),
      "the header nests deeper than safetensors' entries do");
  bad("dtype",
      safetensors_bytes(R"({"w": {"dtype": "F8", "shape": [2], "data_offsets": [0, 2]}})", "xx"),
      "entry 'w': dtype 'F8' is not one of");
  bad("mismatch",
      safetensors_bytes(R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", f32x2),
      "entry 'w': its shape needs 12 bytes, its data_offsets hold 8");
  bad("outside",
      safetensors_bytes(R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", f32x2),
      "entry 'w': data_offsets [0, 16] outside the data's 8 bytes");
  bad("reversed",
      safetensors_bytes(R"({"w": {"dtype": "F32", "shape": [0], "data_offsets": [8, 0]}})", f32x2),
      "entry 'w': data_offsets [8, 0] outside");
  bad("overflow",
      safetensors_bytes(
          R"({"w": {"dtype": "F64", "shape": [1099511627776, 1099511627776, 1099511627776], "data_offsets": [0, 8]}})",
          f32x2),
      "entry 'w': its shape needs more than 2^64 bytes");
  bad("negative",
      safetensors_bytes(R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 8]}})", f32x2),
      "entry 'w': shape: each size an integer in [0, 2^40]");
  bad("overlap",
      safetensors_bytes(
          R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
          f32x2),
      "entries 'a' and 'b' overlap");
  bad("twice",
      safetensors_bytes(
          R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
          f32x2),
      "entry 'a': appears twice");
  bad("fields", safetensors_bytes(R"({"w": {"dtype": "F32"}})", ""),
      "entry 'w': needs dtype, shape and data_offsets");
  bad("metadata", safetensors_bytes(R"({"__metadata__": [1]})", ""),
      "entry '__metadata__': must be an object");
  CHECK_THROWS_WITH(safetensors_load(dir.path), Contains("not a regular file"));
}

TEST_CASE("safetensors: the spec's JSON only, empty tensors anywhere", "[io][safetensors]") {
  testing::TempDir dir;
  const std::string four(4, '\0');
  // An empty tensor at the end of another's bytes overlaps nothing.
  const std::string ok = dir.write(
      "empty_between",
      safetensors_bytes(
          R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}, "c": {"dtype": "F32", "shape": [0], "data_offsets": [4, 4]}})",
          four + four));
  CHECK(safetensors_load(ok).size() == 3);
  // YAML's other spellings of numbers are no JSON whole numbers.
  for (const char* shape : {"[0x1]", "[\"1\"]", "[1e0]", "[1.0]"}) {
    INFO(shape);
    const std::string file =
        dir.write("yaml", safetensors_bytes(std::string(R"({"w": {"dtype": "F32", "shape": )") +
                                                shape + R"(, "data_offsets": [0, 4]}})",
                                            four));
    CHECK_THROWS_WITH(safetensors_load(file), Contains("entry 'w': shape: each size an integer"));
  }
  const std::string quoted = dir.write(
      "quoted", safetensors_bytes(
                    R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": ["0", 4]}})", four));
  CHECK_THROWS_WITH(safetensors_load(quoted),
                    Contains("entry 'w': data_offsets: two whole numbers"));
}

namespace {

// The interop check's values (tests/python/real_clients.py's `expected`):
// arange(12) as [3, 4] minus 5, cast; U8 without the minus; BOOL the odd ones.
at::Tensor interop_expected(const std::string& dtype, at::ScalarType type) {
  const at::Tensor base = at::arange(12, at::kLong).reshape({3, 4});
  if (dtype == "BOOL") return base.remainder(2).eq(1);
  if (dtype == "U8") return base.to(type);
  return (base - 5).to(type);
}

}  // namespace

// Run by tests/multiproc/real_clients.sh with LOCKSTEP_INTEROP_DIR set: reads
// what Hugging Face's safetensors library wrote (py_<dtype>.safetensors)
// and writes lockstep's own (lockstep_<dtype>.safetensors) for it to read.
TEST_CASE("safetensors: the library's files read, and ours written for it",
          "[.interop_safetensors]") {
  const char* dir = std::getenv("LOCKSTEP_INTEROP_DIR");
  REQUIRE(dir != nullptr);
  const std::vector<std::pair<std::string, at::ScalarType>> dtypes{
      {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf},  {"BF16", at::kBFloat16},
      {"I64", at::kLong},   {"I32", at::kInt},   {"I16", at::kShort}, {"I8", at::kChar},
      {"U8", at::kByte},    {"BOOL", at::kBool}};
  for (const auto& [name, type] : dtypes) {
    INFO(name);
    const at::Tensor want = interop_expected(name, type);
    std::map<std::string, std::string> metadata;
    const StateDict read =
        safetensors_load(std::string(dir) + "/py_" + name + ".safetensors", &metadata);
    REQUIRE(read.size() == 2);
    for (const auto& [key, tensor] : read) {
      CHECK(tensor.scalar_type() == type);
      if (key == "t") CHECK(at::equal(tensor, want));
      if (key == "scalar") CHECK(at::equal(tensor, want.reshape({-1})[0]));
    }
    CHECK(metadata["writer"] == "safetensors");
    const StateDict ours{{"t", want}, {"scalar", want.reshape({-1})[0].clone()}};
    safetensors_save(ours, std::string(dir) + "/lockstep_" + name + ".safetensors",
                     {{"writer", "lockstep"}});
  }
}
