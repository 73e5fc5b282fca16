// Config: defaults, file, --set precedence, and every error naming its path.
#include "support/catch.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "lockstep/config/config.h"
#include "lockstep/util/error.h"

using namespace lockstep;
using lockstep::testing::Contains;

namespace {
std::string write_config(const std::string& name, const std::string& text) {
  const std::string path = "/tmp/lockstep-config-test-" + name + ".yaml";
  std::ofstream(path) << text;
  return path;
}
}  // namespace

TEST_CASE("defaults, then the file, then --set", "[config]") {
  const Config defaults = config_load("");
  CHECK(defaults.optim.lr == 0.1);
  CHECK(defaults.data.name == DatasetKind::kDigits);
  const auto path =
      write_config("good", "optim:\n  lr: 0.5\n  name: adam\ndata:\n  batch_size: 8\n");
  const Config file = config_load(path);
  CHECK(file.optim.lr == 0.5);
  CHECK(file.optim.name == OptimizerKind::kAdam);
  CHECK(file.data.batch_size == 8);
  CHECK(file.model.hidden == defaults.model.hidden);
  const Config both = config_load(path, {"optim.lr=0.25", "ddp.gradient_as_bucket_view=false"});
  CHECK(both.optim.lr == 0.25);
  CHECK_FALSE(both.ddp.gradient_as_bucket_view);
  CHECK(config_to_yaml(both).find("  lr: 0.25\n") != std::string::npos);
}

TEST_CASE("config errors name the path, the value and the fix", "[config]") {
  REQUIRE_THROWS_WITH(config_load(write_config("typo", "optim:\n  lrr: 0.1\n")),
                      Contains("typo.yaml:2: unknown key 'optim.lrr' (did you mean 'optim.lr'?)"));
  REQUIRE_THROWS_WITH(config_load(write_config("section", "optimm:\n  lr: 0.1\n")),
                      Contains("unknown section 'optimm' (did you mean 'optim'?)"));
  REQUIRE_THROWS_WITH(config_load(write_config("type", "optim:\n  lr: fast\n")),
                      Contains("type.yaml:2: optim.lr: 'fast' is not a number"));
  REQUIRE_THROWS_WITH(config_load("", {"optim.schedule=cosin"}),
                      Contains("'cosin' is not one of constant, step, cosine (did you mean "
                               "'cosine'?)"));
  REQUIRE_THROWS_WITH(
      config_load("", {"optim.schedule=linear"}),
      Contains("'linear' is not one of constant, step, cosine") && !Contains("did you mean"));
  REQUIRE_THROWS_WITH(config_load(write_config("range", "data:\n  batch_size: 0\n")),
                      Contains("data.batch_size: 0 is out of range [1, 1048576]"));
  REQUIRE_THROWS_WITH(config_load(write_config("choice", "optim:\n  name: lbfgs\n")),
                      Contains("optim.name: 'lbfgs' is not one of sgd, adam, adamw"));
  REQUIRE_THROWS_WITH(config_load(write_config("bool", "data:\n  shuffle: maybe\n")),
                      Contains("data.shuffle: 'maybe' is not a boolean"));
  REQUIRE_THROWS_WITH(config_load(write_config("yaml", "optim:\n  lr: [0.1\n")),
                      Contains("malformed YAML"));
  REQUIRE_THROWS_WITH(config_load(write_config("yaml2", "optim:\n  lr: 0.1\n bad: 1\n")),
                      Contains("yaml2.yaml:3:"));
  REQUIRE_THROWS_WITH(config_load(write_config("list", "optim:\n  lr: [1, 2]\n")),
                      Contains("optim.lr must be a single value"));
  REQUIRE_THROWS_WITH(config_load("", {"optim.lr"}),
                      Contains("--set optim.lr: expected section.key=value"));
  REQUIRE_THROWS_WITH(config_load("", {"optim.momentun=0.5"}),
                      Contains("did you mean 'optim.momentum'?"));
  REQUIRE_THROWS_WITH(config_load("/nonexistent/x.yaml"),
                      Contains("cannot read config '/nonexistent/x.yaml'"));
  REQUIRE_THROWS_AS(config_load("", {"optim.lr=-1"}), ConfigError);
}

TEST_CASE("careless config files are bad input, never internal errors", "[config]") {
  REQUIRE_THROWS_WITH(config_load("/tmp"), Contains("cannot read config '/tmp': '/tmp' is not a "
                                                    "regular file"));
  REQUIRE_THROWS_WITH(config_load(write_config("empty", "")), Contains("empty.yaml is empty"));
  REQUIRE_THROWS_WITH(config_load(write_config("comments", "# nothing\n")),
                      Contains("comments.yaml is empty"));
  REQUIRE_THROWS_WITH(config_load(write_config("two",
                                               "optim:\n  lr: 0.1\n---\ndata:\n  "
                                               "batch_size: 8\n")),
                      Contains("two.yaml holds 2 YAML documents"));
  REQUIRE_THROWS_WITH(config_load(write_config("dupsec",
                                               "optim:\n  lr: 0.1\ndata:\n  batch_size: 8\noptim:\n"
                                               "  lr: 0.2\n")),
                      Contains("dupsec.yaml:5: section 'optim' appears twice"));
  REQUIRE_THROWS_WITH(config_load(write_config("dupkey", "optim:\n  lr: 0.1\n  lr: 0.2\n")),
                      Contains("dupkey.yaml:3: optim.lr is set twice"));
  REQUIRE_THROWS_WITH(config_load(write_config("complex", "? [a, b]\n: 1\n")),
                      Contains("a section name must be plain text"));
  REQUIRE_THROWS_WITH(config_load(write_config("complexkey", "optim:\n  ? {a: 1}\n  : 2\n")),
                      Contains("a key must be plain text"));
}

TEST_CASE("docs/config.md holds the reference generated from the field table", "[config]") {
  std::ifstream doc(LOCKSTEP_SOURCE_DIR "/docs/config.md");
  REQUIRE(doc);
  const std::string text((std::istreambuf_iterator<char>(doc)), std::istreambuf_iterator<char>());
  INFO("regenerate with: build/lockstep train --config-reference, and paste between the markers");
  const auto begin = text.find("<!-- reference:begin -->\n");
  const auto end = text.find("<!-- reference:end -->");
  REQUIRE(begin != std::string::npos);
  REQUIRE(end != std::string::npos);
  const std::string documented = text.substr(begin + 25, end - begin - 25);
  CHECK(documented == config_reference_markdown());
}

TEST_CASE("input paths in a file resolve against its folder, on the command line against the cwd",
          "[config]") {
  const auto path = write_config("paths",
                                 "data:\n  name: csv\n  path: tables/x.csv\nmodel:\n  init_from: "
                                 "w.pt\n  path: /abs/m.pt\ncheckpoint:\n  resume: auto\nrun:\n  "
                                 "dir: out\n");
  const Config file = config_load(path);
  CHECK(file.data.path == "/tmp/tables/x.csv");
  CHECK(file.model.init_from == "/tmp/w.pt");
  // A relative config path: the resolved paths are absolute, so the saved
  // config (config_to_yaml) reads back the same from any folder.
  const std::string cwd = std::filesystem::current_path().string();
  std::filesystem::create_directories("lockstep-config-test-dir");
  std::ofstream("lockstep-config-test-dir/run.yaml") << "data:\n  path: ../data/x.csv\n";
  const Config relative = config_load("lockstep-config-test-dir/run.yaml");
  CHECK(relative.data.path == cwd + "/data/x.csv");
  const auto saved = write_config("saved", config_to_yaml(relative));
  CHECK(config_load(saved).data.path == relative.data.path);
  std::filesystem::remove_all("lockstep-config-test-dir");
  CHECK(file.model.path == "/abs/m.pt");    // absolute: as written
  CHECK(file.checkpoint.resume == "auto");  // a word, not a path
  CHECK(file.run.dir == "out");             // output: the working directory's
  // On the command line: the working directory's, and saved absolute too
  // (eval --checkpoint reads config.yaml from elsewhere).
  const Config cli = config_load(path, {"data.path=here.csv", "model.init_from=../w.pt"});
  CHECK(cli.data.path == cwd + "/here.csv");
  CHECK(cli.model.init_from == std::filesystem::path(cwd).parent_path().string() + "/w.pt");
  CHECK(config_load(path, {"checkpoint.resume=auto"}).checkpoint.resume == "auto");
  // data.tokenizer: a file's folder too, but the name gpt2 is no path.
  const auto tok = write_config("tok", "data:\n  tokenizer: vocab/tok.json\n");
  CHECK(config_load(tok).data.tokenizer == "/tmp/vocab/tok.json");
  CHECK(config_load(tok, {"data.tokenizer=gpt2"}).data.tokenizer == "gpt2");
  CHECK(config_load(tok, {"data.tokenizer=t.json"}).data.tokenizer == cwd + "/t.json");
  // A config.yaml of an older lockstep kept data.tokenizer as given,
  // relative to the working directory: where the file's folder has no such
  // file and the working directory has, that one is meant.
  std::filesystem::create_directories("lockstep-old-vocab");
  std::ofstream("lockstep-old-vocab/tok.json") << "{}";
  const auto old = write_config("old", "data:\n  tokenizer: lockstep-old-vocab/tok.json\n");
  CHECK(config_load(old).data.tokenizer == cwd + "/lockstep-old-vocab/tok.json");
  std::filesystem::remove_all("lockstep-old-vocab");
  CHECK(config_load(old).data.tokenizer == "/tmp/lockstep-old-vocab/tok.json");
}

TEST_CASE("config.yaml reads back every string as it was, or refuses it at start", "[config]") {
  // Note [Strings in config.yaml]: quotes, backslashes, tabs, newlines,
  // control characters, non-ASCII and C1 controls.
  const std::vector<std::string> names{"exp \"best\"",
                                       "back\\slash \\n not a newline",
                                       "tab\there",
                                       "two\nlines\r\n",
                                       "bell\a del\x7f",
                                       "\xc3\xa9t\xc3\xa9 \xe2\x9c\x93 \xf0\x9f\x99\x82",
                                       "c1 \xc2\x85 \xc2\x9f",
                                       "'single' # not a comment: [x] {y} &z *w !t %p @q `r",
                                       " lead and trail "};
  for (const auto& name : names) {
    const Config config = config_load("", {"run.name=" + name, "data.path=/d/" + name});
    const std::string yaml = config_to_yaml(config);
    const Config back = config_load(write_config("strings", yaml));
    CHECK(back.run.name == name);
    CHECK(back.data.path == config.data.path);
    CHECK(config_to_yaml(back) == yaml);
  }
  CHECK(config_to_yaml(config_load("", {"run.name=a\"b\\c\td"}))
            .find("  name: \"a\\\"b\\\\c\\td\"\n") != std::string::npos);
  CHECK_THROWS_WITH(config_load("", {std::string("run.name=bad\xff")}),
                    Contains("--set run.name: not UTF-8 text"));
  // A NUL cannot come through argv; YAML's "\0" escape brings one.
  CHECK_THROWS_WITH(config_load(write_config("nul", "run:\n  name: \"a\\0b\"\n")),
                    Contains("run.name: not UTF-8 text (a NUL"));
}

TEST_CASE("check, eval and train validate through one function", "[config]") {
  CHECK_THROWS_WITH(config_load_validated("", {"model.name=gpt"}),
                    Contains("model.name: gpt is a language model"));
  CHECK_THROWS_WITH(config_load_validated("", {"optim.zero=2", "ddp.comm_hook=fp16"}),
                    Contains("takes no ddp.comm_hook"));
  CHECK(config_summary(config_load_validated("", {})) == "model.name mlp on data.name digits");
  CHECK(config_summary(config_load("", {"model.name=gpt", "data.name=text", "data.path=/k.txt"})) ==
        "model.name gpt on data.name text (/k.txt)");
}

TEST_CASE("an unknown key far from every valid one lists them instead of a wrong guess",
          "[config]") {
  // 'amp' once drew "did you mean 'train.epochs'?".
  // (The list grows with the section: its start, and the key a user
  // looking for "amp" wants.)
  REQUIRE_THROWS_WITH(config_load("", {"train.amp=true"}),
                      Contains("unknown key 'train.amp' (valid: train.epochs, train.max_steps, "
                               "train.accumulation_steps, train.clip_grad_norm, "));
  REQUIRE_THROWS_WITH(config_load("", {"train.amp=true"}), Contains(", train.precision, "));
  REQUIRE_THROWS_WITH(config_load("", {"train.epoch=3"}), Contains("did you mean 'train.epochs'?"));
}

TEST_CASE("the resolved config prints numbers as written", "[config]") {
  const std::string yaml = config_to_yaml(config_load("", {"optim.lr=0.1", "optim.gamma=0.3"}));
  CHECK(yaml.find("  lr: 0.1\n") != std::string::npos);
  CHECK(yaml.find("  gamma: 0.3\n") != std::string::npos);
  CHECK(yaml.find("0000000") == std::string::npos);
}

#include "lockstep/check/fault.h"

TEST_CASE("LOCKSTEP_FAULT: typed kinds, and every malformed value named", "[config]") {
  auto with = [](const std::string& value) {
    return fault_from_env([value](const std::string& name) -> std::optional<std::string> {
      if (name == "LOCKSTEP_FAULT") return value;
      return std::nullopt;
    });
  };
  CHECK_FALSE(with(""));
  const auto hang = with("hang:rank=1:step=30:attempt=2");
  REQUIRE(hang);
  CHECK(hang->kind == FaultKind::kHang);
  CHECK(hang->rank == 1);
  CHECK(hang->step == 30);
  CHECK(hang->attempt == 2);
  CHECK(with("exit:step=0:rank=0")->kind == FaultKind::kExit);
  const auto flip = with("grad-flip:rank=1:step=10:bit=30");
  REQUIRE(flip);
  CHECK(flip->kind == FaultKind::kGradFlip);
  CHECK(flip->bit == 30);
  CHECK(flip->in_step());
  CHECK(with("act-flip:rank=0:step=2")->bit == -1);  // the highest mantissa bit
  REQUIRE_THROWS_WITH(with("grad-flip:rank=0:step=1:bit=64"),
                      Contains("bit=64 is out of range [0, 63]"));
  REQUIRE_THROWS_WITH(with("explode:rank=0:step=1"), Contains("unknown kind 'explode'"));
  REQUIRE_THROWS_WITH(with("crash:rank=0"), Contains("needs rank= and step="));
  REQUIRE_THROWS_WITH(with("crash:rank=x:step=1"), Contains("'rank=x' is not key=number"));
  REQUIRE_THROWS_WITH(with("crash:rank=:step=1"), Contains("'rank=' is not key=number"));
  // Numbers that overflow are refused, not wrapped into a step that never comes.
  REQUIRE_THROWS_WITH(with("crash:rank=0:step=99999999999999999999"),
                      Contains("'step=99999999999999999999' is not key=number"));
  REQUIRE_THROWS_WITH(with("crash:rank=4294967296:step=1"),
                      Contains("'rank=4294967296' is out of range"));
  // A rank outside the job would never fire: refused, naming the world.
  auto in_world = [](const std::string& value, int world) {
    return fault_from_env(
        [value](const std::string& name) -> std::optional<std::string> {
          if (name == "LOCKSTEP_FAULT") return value;
          return std::nullopt;
        },
        world);
  };
  REQUIRE_THROWS_WITH(in_world("crash:rank=2:step=1", 2),
                      Contains("rank=2 is outside this job's 2 rank(s)"));
  CHECK(in_world("crash:rank=1:step=1", 2)->rank == 1);
}

TEST_CASE("include: files merged before the file's own keys, --set over all", "[config]") {
  // Note [Config includes]: --set > the file > its includes (the last listed
  // first) > defaults; paths in an included file follow that file's folder.
  const std::string dir = "/tmp/lockstep-config-include-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir + "/base");
  std::ofstream(dir + "/base/common.yaml")
      << "optim:\n  lr: 0.5\n  name: adam\ndata:\n  batch_size: 8\n  path: tables/x.csv\n"
         "train:\n  epochs: 7\n";
  std::ofstream(dir + "/base/second.yaml") << "include: common.yaml\noptim:\n  lr: 0.25\n";
  std::ofstream(dir + "/more.yaml") << "train:\n  epochs: 9\n  max_steps: 3\n";
  std::ofstream(dir + "/run.yaml")
      << "include: [base/second.yaml, more.yaml]\ndata:\n  batch_size: 16\n";
  const Config c = config_load(dir + "/run.yaml", {"train.max_steps=5"});
  CHECK(c.optim.name == OptimizerKind::kAdam);       // from common.yaml, two levels down
  CHECK(c.optim.lr == 0.25);                         // second.yaml over the common.yaml it includes
  CHECK(c.train.epochs == 9);                        // more.yaml, listed after, over common.yaml
  CHECK(c.data.batch_size == 16);                    // the file over its includes
  CHECK(c.train.max_steps == 5);                     // --set over every file
  CHECK(c.data.path == dir + "/base/tables/x.csv");  // the including file's folder
  CHECK(c.model.hidden == Config{}.model.hidden);    // defaults under all
  CHECK(config_origin(c, "optim.name") == " (set at " + dir + "/base/common.yaml:3)");
  CHECK(config_origin(c, "optim.lr") == " (set at " + dir + "/base/second.yaml:3)");
  CHECK(config_origin(c, "data.batch_size") == " (set at " + dir + "/run.yaml:3)");
  CHECK(config_origin(c, "train.max_steps") == " (set by --set)");
  CHECK(config_origin(c, "model.hidden") == "");
  // The merged config is flat: the saved copy needs none of the files.
  CHECK(config_to_yaml(c).find("include:") == std::string::npos);

  // Errors name the file and line the key came from, and the include line.
  std::ofstream(dir + "/bad.yaml") << "optim:\n  lr: 0.1\n  lrr: 2\n";
  std::ofstream(dir + "/uses_bad.yaml") << "run:\n  seed: 1\ninclude: bad.yaml\n";
  REQUIRE_THROWS_WITH(config_load(dir + "/uses_bad.yaml"),
                      Contains(dir + "/bad.yaml:3: unknown key 'optim.lrr'"));
  std::ofstream(dir + "/missing.yaml") << "include:\n  - more.yaml\n  - nowhere.yaml\n";
  REQUIRE_THROWS_WITH(
      config_load(dir + "/missing.yaml"),
      Contains(dir + "/missing.yaml:3: include 'nowhere.yaml': cannot read config '" + dir +
               "/nowhere.yaml'"));
  std::ofstream(dir + "/a.yaml") << "include: b.yaml\n";
  std::ofstream(dir + "/b.yaml") << "run:\n  seed: 2\ninclude: a.yaml\n";
  REQUIRE_THROWS_WITH(
      config_load(dir + "/a.yaml"),
      Contains("include cycle: " + dir + "/a.yaml -> " + dir + "/b.yaml -> " + dir + "/a.yaml"));
  std::ofstream(dir + "/self.yaml") << "include: self.yaml\n";
  REQUIRE_THROWS_WITH(config_load(dir + "/self.yaml"), Contains("include cycle"));
  std::ofstream(dir + "/map.yaml") << "include: {file: a.yaml}\n";
  REQUIRE_THROWS_WITH(config_load(dir + "/map.yaml"),
                      Contains("map.yaml:1: include: a config file's path, or a list of them"));
  std::ofstream(dir + "/empty_list.yaml") << "include: []\n";
  REQUIRE_THROWS_WITH(
      config_load(dir + "/empty_list.yaml"),
      Contains("empty_list.yaml:1: include: a config file's path, or a list of them"));
  std::ofstream(dir + "/twice.yaml") << "include: more.yaml\ninclude: a.yaml\n";
  REQUIRE_THROWS_WITH(config_load(dir + "/twice.yaml"),
                      Contains("twice.yaml:2: section 'include' appears twice"));
  // No cycle, but each level lists the next 20 times: 20^5 loads unless capped.
  for (int level = 0; level < 5; ++level) {
    std::ofstream f(dir + "/fan" + std::to_string(level) + ".yaml");
    f << "include: [";
    for (int i = 0; i < 20; ++i) f << (i ? ", " : "") << "fan" << level + 1 << ".yaml";
    f << "]\n";
  }
  std::ofstream(dir + "/fan5.yaml") << "run:\n  seed: 1\n";
  REQUIRE_THROWS_WITH(config_load(dir + "/fan0.yaml"),
                      Contains("more than 64 config files loaded for one config"));
  std::ofstream(dir + "/nested.yaml") << "include: [[a.yaml]]\n";
  REQUIRE_THROWS_WITH(config_load(dir + "/nested.yaml"),
                      Contains("nested.yaml:1: include: each entry must be a file's path"));
  // A later validation error says where the offending key was set.
  std::ofstream(dir + "/heads.yaml")
      << "include: base/common.yaml\nmodel:\n  name: transformer\n  heads: 3\n";
  const Config heads = config_load(dir + "/heads.yaml");
  REQUIRE_THROWS_WITH(config_validate(heads, 1),
                      Contains("model.heads=3 (set at " + dir + "/heads.yaml:4) must divide"));
  std::filesystem::remove_all(dir);
}
