// Checkpoint policy (train/checkpoint.h, docs/checkpoints.md): the folder and
// its MANIFEST, a round trip of model, optimizer and generator states, the
// refusal of anything modified, and rotation that keeps only the newest of
// our own folders.
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include "support/catch.h"
#include "support/temp_dir.h"

#include <unistd.h>

#include <filesystem>
#include <limits>
#include <set>

#include <yaml-cpp/yaml.h>
#include "checkpoint/state_yaml.h"
#include "lockstep/checkpoint/checkpoint.h"
#include "lockstep/checkpoint/sharded_checkpoint.h"
#include "lockstep/io/shard_index.h"
#include "lockstep/optim/optim.h"
#include "lockstep/util/error.h"
#include "lockstep/util/fs.h"
#include "lockstep/util/module_tensors.h"
#include "lockstep/util/sha256.h"

using namespace lockstep;
using lockstep::testing::Contains;
using lockstep::testing::TempDir;

namespace {

struct Setup {
  torch::nn::Linear model{torch::nn::LinearOptions(3, 2)};
  std::unique_ptr<torch::optim::SGD> optimizer;
  Setup() {
    optimizer = std::make_unique<torch::optim::SGD>(model->parameters(),
                                                    torch::optim::SGDOptions(0.1).momentum(0.9));
    model->forward(torch::ones({4, 3})).sum().backward();
    optimizer->step();  // momentum buffers exist now
  }
};

TrainerState state_at(int64_t step) {
  TrainerState s;
  s.step = step;
  s.epoch = 1;
  s.batch_in_epoch = 7;
  s.world_size = 2;
  s.model = "mlp";
  return s;
}

StateDict optim_of(Setup& s) {
  return optimizer_state_dict(*s.optimizer, module_tensors(*s.model, false));
}

const at::Tensor kRng = torch::arange(0, 12, torch::kUInt8).reshape({2, 6});

// What the trainer's Stateful parts give the checkpointer (run_stateful.h).
std::vector<SavedPart> parts_of(Setup& s) {
  return {{"model.pt", state_dict_of(*s.model)},
          {"optimizer.pt", optim_of(s)},
          {"rng.pt", {{"", kRng}}}};
}

bool exists(const std::string& path) {
  return std::filesystem::exists(path);
}

}  // namespace

TEST_CASE(
    "checkpoint: any Stateful part's file round-trips, and a folder without a required one is "
    "refused",
    "[checkpoint]") {
  TempDir dir;
  Setup a;
  Checkpointer checkpoints(dir.path, 3);
  auto parts = parts_of(a);
  const at::Tensor extra = torch::arange(5, torch::kFloat) * 0.25;
  parts.push_back({"scheduler.pt", {{"last_epoch", torch::full({}, 7.0)}, {"values", extra}}});
  const auto folder = checkpoints.save(state_at(5), parts, "x: 1\n");
  const auto loaded = Checkpointer::load(folder, nullptr);
  const StateDict& back = loaded.part("scheduler.pt");
  REQUIRE(back.size() == 2);
  CHECK(back[0].first == "last_epoch");
  CHECK(back[0].second.item<double>() == 7.0);
  CHECK(back[1].first == "values");
  CHECK(torch::equal(back[1].second, extra));
  CHECK(loaded.part("absent.pt").empty());
  // rng.pt stays a bare tensor: what torch.load gives Python.
  CHECK(torch::equal(loaded.rng_states(), kRng));
  // Without rng.pt the checkpoint could not resume: never written.
  parts = parts_of(a);
  parts.pop_back();
  CHECK_THROWS_WITH(checkpoints.save(state_at(6), parts, "x: 1\n"),
                    Contains("checkpoint without rng.pt"));
  CHECK_FALSE(exists(dir.path + "/checkpoints/step_00000006"));
}

TEST_CASE("checkpoint: the folder, its MANIFEST and a round trip", "[checkpoint]") {
  TempDir dir;
  Setup a;
  Checkpointer checkpoints(dir.path, 3);
  const auto folder = checkpoints.save(state_at(5), parts_of(a), "x: 1\n");
  CHECK(folder == dir.path + "/checkpoints/step_00000005");
  // MANIFEST: one line per file, each the SHA-256 of the file's bytes.
  std::ifstream manifest(folder + "/MANIFEST");
  std::string hash, file;
  int lines = 0;
  while (manifest >> hash >> file) {
    std::ifstream in(folder + "/" + file, std::ios::binary);
    CHECK(hash == sha256_hex(std::string(std::istreambuf_iterator<char>(in), {})));
    ++lines;
  }
  CHECK(lines == 5);
  CHECK_NOTHROW(Checkpointer::verify(folder));

  Setup b;  // other weights, other momentum
  const auto loaded = Checkpointer::load(folder, nullptr);
  CHECK(loaded.state.step == 5);
  CHECK(loaded.state.epoch == 1);
  CHECK(loaded.state.batch_in_epoch == 7);
  CHECK(loaded.state.world_size == 2);
  CHECK(loaded.state.model == "mlp");
  CHECK(torch::equal(loaded.rng_states(), kRng));
  REQUIRE(loaded.part("model.pt").size() == 2);
  CHECK(loaded.part("model.pt")[0].first == "weight");
  CHECK(torch::equal(loaded.part("model.pt")[0].second, a.model->weight));
  CHECK(torch::equal(loaded.part("model.pt")[1].second, a.model->bias));
  // The optimizer's momentum came back (the next step moves b as it moves a).
  state_dict_load(*b.model, loaded.part("model.pt"), "test");
  // optimizer.pt: a state dict by parameter name (torch.load reads it).
  REQUIRE(loaded.part("optimizer.pt").size() == 2);
  CHECK(loaded.part("optimizer.pt")[0].first == "weight.momentum_buffer");
  CHECK(loaded.part("optimizer.pt")[1].first == "bias.momentum_buffer");
  optimizer_load_state_dict(*b.optimizer, module_tensors(*b.model, false),
                            loaded.part("optimizer.pt"), {}, "test");
  for (auto* s : {&a, &b}) {
    s->optimizer->zero_grad();
    s->model->forward(torch::ones({4, 3})).sum().backward();
    s->optimizer->step();
  }
  CHECK(torch::equal(a.model->weight, b.model->weight));
  CHECK(checkpoints.newest() == folder);
}

TEST_CASE("checkpoint: a modified, missing or forged file is refused by name", "[checkpoint]") {
  TempDir dir;
  Setup a;
  Checkpointer checkpoints(dir.path, 3);
  const auto folder = checkpoints.save(state_at(5), parts_of(a), "x: 1\n");
  const auto original = TempDir::read_file(folder + "/model.pt");
  auto bytes = original;
  bytes[bytes.size() / 2] ^= 1;
  std::ofstream(folder + "/model.pt", std::ios::binary) << bytes;
  REQUIRE_THROWS_WITH(Checkpointer::verify(folder),
                      Contains("model.pt's SHA-256 does not match its MANIFEST"));
  CHECK_THROWS_AS(Checkpointer::load(folder, nullptr), DataError);

  std::ofstream(folder + "/model.pt", std::ios::binary) << original;
  CHECK_NOTHROW(Checkpointer::verify(folder));
  std::filesystem::remove(folder + "/rng.pt");
  REQUIRE_THROWS_WITH(Checkpointer::verify(folder), Contains("rng.pt is missing"));

  // A forged state.yaml with a recomputed MANIFEST: the manifest proves the
  // files whole, not honest, so the values are still checked.
  const auto other = checkpoints.save(state_at(6), parts_of(a), "x: 1\n");
  std::ofstream(other + "/state.yaml")
      << "step: abc\nepoch: 0\nbatch_in_epoch: 0\nworld_size: 2\nmodel: mlp\n";
  std::string manifest;
  for (const char* f : {"model.pt", "optimizer.pt", "rng.pt", "state.yaml", "config.yaml"})
    manifest += sha256_hex(TempDir::read_file(other + "/" + f)) + "  " + f + "\n";
  std::ofstream(other + "/MANIFEST") << manifest;
  CHECK_NOTHROW(Checkpointer::verify(other));
  REQUIRE_THROWS_WITH(Checkpointer::load(other, nullptr), Contains("state.yaml"));
  CHECK_THROWS_AS(Checkpointer::load(other, nullptr), DataError);
}

TEST_CASE("checkpoint: keep K removes only the oldest of our own folders", "[checkpoint]") {
  TempDir dir;
  Setup a;
  std::filesystem::create_directories(dir.path + "/checkpoints/step_best_keep_me");
  std::filesystem::create_directories(dir.path + "/checkpoints/step_00000000");  // no MANIFEST
  Checkpointer checkpoints(dir.path, 2);
  for (int64_t step : {1, 2, 3}) checkpoints.save(state_at(step), parts_of(a), "x: 1\n");
  const std::string c = dir.path + "/checkpoints/";
  CHECK_FALSE(exists(c + "step_00000001"));
  CHECK(exists(c + "step_00000002"));
  CHECK(exists(c + "step_00000003"));
  CHECK(exists(c + "step_best_keep_me"));
  CHECK(exists(c + "step_00000000"));
  CHECK(checkpoints.newest() == c + "step_00000003");
  // No temporary folder is left behind.
  for (const auto& entry : std::filesystem::directory_iterator(c))
    CHECK(entry.path().filename().string().rfind(".tmp-", 0) != 0);
}

namespace {

// A loaded checkpoint of a Linear(3, 2) with Adam-like entries, for the
// value checks (Note [Checkpoint values]).
Checkpointer::Loaded adam_like() {
  Checkpointer::Loaded l;
  l.folder = "ck";
  l.state.world_size = 2;
  l.parts["model.pt"] = {{"weight", torch::ones({2, 3})}, {"bias", torch::zeros({2})}};
  l.parts["optimizer.pt"] = {{"weight.exp_avg", torch::full({2, 3}, 0.5)},
                             {"weight.exp_avg_sq", torch::full({2, 3}, 0.25)},
                             {"weight.step", torch::full({}, 3.0)}};
  l.parts["comm_hook.pt"] = {{"rank1.error.0", torch::zeros({4})}};
  l.parts["rng.pt"] = {{"", torch::zeros({2, 6}, torch::kUInt8)}};
  return l;
}

const std::set<std::string> kParams{"weight", "bias"};

}  // namespace

TEST_CASE(
    "checkpoint: NaN, inf, a negative second moment, a fractional step, a huge error and a "
    "malformed rng.pt are refused by file and entry",
    "[checkpoint]") {
  CHECK_NOTHROW(Checkpointer::check_values(adam_like(), kParams, 6));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  auto l = adam_like();
  l.parts["optimizer.pt"][0].second[1][2] = nan;
  CHECK_THROWS_WITH(
      Checkpointer::check_values(l, kParams, 6),
      Contains("ck/optimizer.pt: entry 'weight.exp_avg' is not finite: element 5 is nan"));
  l = adam_like();
  l.parts["optimizer.pt"][1].second[0][1] = -1e-12;
  CHECK_THROWS_WITH(Checkpointer::check_values(l, kParams, 6),
                    Contains("'weight.exp_avg_sq' is a second moment and cannot be negative"));
  l = adam_like();
  l.parts["optimizer.pt"][2].second.fill_(2.5);
  CHECK_THROWS_WITH(Checkpointer::check_values(l, kParams, 6),
                    Contains("'weight.step' is a step count"));
  l = adam_like();
  l.parts["comm_hook.pt"][0].second[3] = 1e38;
  CHECK_THROWS_WITH(Checkpointer::check_values(l, kParams, 6),
                    Contains("ck/comm_hook.pt: entry 'rank1.error.0' is out of range"));
  l = adam_like();
  l.parts["comm_hook.pt"][0].second[0] = 1e19;  // large, but its square is still a float
  CHECK_NOTHROW(Checkpointer::check_values(l, kParams, 6));
  l = adam_like();
  l.parts["model.pt"][1].second[0] = inf;
  CHECK_THROWS_WITH(Checkpointer::check_values(l, kParams, 6),
                    Contains("ck/model.pt: entry 'bias' is not finite"));
  // A buffer may hold -inf (a mask's), never NaN; running statistics are
  // finite and a variance is not negative.
  CHECK_NOTHROW(Checkpointer::check_values(l, {"weight"}, 6));
  l.parts["model.pt"][1].second[1] = nan;
  CHECK_THROWS_WITH(Checkpointer::check_values(l, {"weight"}, 6),
                    Contains("ck/model.pt: buffer 'bias' holds NaN: element 1 is nan"));
  StateDict bn{{"bn.running_var", torch::ones({3})}, {"bn.running_mean", torch::zeros({3})}};
  CHECK_NOTHROW(Checkpointer::check_model_values(bn, {}, "m.pt"));
  bn[0].second[2] = -0.5;
  CHECK_THROWS_WITH(Checkpointer::check_model_values(bn, {}, "m.pt"),
                    Contains("m.pt: buffer 'bn.running_var' is a variance and cannot be negative"));
  bn[0].second[2] = 1;
  bn[1].second[0] = -inf;
  CHECK_THROWS_WITH(Checkpointer::check_model_values(bn, {}, "m.pt"),
                    Contains("'bn.running_mean' is a running statistic and must be finite"));
  l = adam_like();
  l.parts["rng.pt"] = {{"", torch::zeros({0, 6}, torch::kUInt8)}};  // "silently reseeded" before
  CHECK_THROWS_WITH(Checkpointer::check_values(l, kParams, 6),
                    Contains("ck/rng.pt: holds 0 generator state(s) of 6 bytes; the 2 rank(s)"));
  l.parts["rng.pt"] = {{"", torch::zeros({2, 5}, torch::kUInt8)}};
  CHECK_THROWS_WITH(Checkpointer::check_values(l, kParams, 6), Contains("of 6 bytes"));
  l.parts["rng.pt"] = {{"", torch::zeros({2, 6}, torch::kFloat)}};
  CHECK_THROWS_WITH(Checkpointer::check_values(l, kParams, 6),
                    Contains("rng.pt: not a [ranks, state bytes] uint8 tensor"));
}

TEST_CASE("checkpoint: rotation never removes the checkpoint just written", "[checkpoint]") {
  TempDir dir;
  Setup a;
  Checkpointer old_run(dir.path, 5);
  for (int64_t step : {300, 400, 460}) old_run.save(state_at(step), parts_of(a), "x: 1\n");
  Checkpointer checkpoints(dir.path, 2);
  const auto folder = checkpoints.save(state_at(30), parts_of(a), "x: 1\n");
  CHECK(exists(folder));  // was removed at once: 300, 400 and 460 sort after it
  const std::string c = dir.path + "/checkpoints/";
  CHECK_FALSE(exists(c + "step_00000300"));
  CHECK(exists(c + "step_00000400"));
  CHECK(exists(c + "step_00000460"));
}

TEST_CASE(
    "checkpoint: best/ is replaced so that one always exists, and a replacement cut between "
    "two renames is repaired at the next start",
    "[checkpoint]") {
  TempDir dir;
  Setup a;
  Checkpointer checkpoints(dir.path, 2);
  const std::string c = dir.path + "/checkpoints/";
  checkpoints.save(state_at(10), parts_of(a), "x: 1\n", "metric: val_loss\nstep: 10\n");
  checkpoints.save(state_at(20), parts_of(a), "x: 1\n", "metric: val_loss\nstep: 20\n");
  CHECK(Checkpointer::load(c + "best", nullptr).state.step == 20);
  for (const auto& entry : std::filesystem::directory_iterator(c))
    CHECK(entry.path().filename().string()[0] != '.');  // nothing aside is left

  // A kill between the renames of the fallback: the old best aside, the
  // new one complete under its temporary name, no best/. Dead writers'
  // pids (above pid_max) name them; a half-written step folder too.
  std::filesystem::rename(c + "best", c + ".old-best-99999999");
  checkpoints.save(state_at(30), parts_of(a), "x: 1\n", "metric: val_loss\nstep: 30\n");
  std::filesystem::rename(c + "best", c + ".tmp-best-99999998");
  std::filesystem::create_directories(c + ".tmp-step_00000040-99999997");
  REQUIRE_FALSE(exists(c + "best"));
  const auto done = Checkpointer(dir.path, 2).repair();
  REQUIRE(exists(c + "best"));
  CHECK(Checkpointer::load(c + "best", nullptr).state.step == 30);  // the complete new one
  CHECK(done.size() == 3);
  for (const auto& entry : std::filesystem::directory_iterator(c))
    CHECK(entry.path().filename().string()[0] != '.');

  // Only the old one left (the new was cut while being written): it returns.
  std::filesystem::rename(c + "best", c + ".old-best-99999999");
  std::filesystem::create_directories(c + ".tmp-best-99999998");  // no MANIFEST: incomplete
  Checkpointer(dir.path, 2).repair();
  REQUIRE(exists(c + "best"));
  CHECK(Checkpointer::load(c + "best", nullptr).state.step == 30);
  CHECK_FALSE(exists(c + ".tmp-best-99999998"));

  // A live writer's folder (this process's parent) is left alone.
  const std::string live = c + ".tmp-step_00000050-" + std::to_string(getppid());
  std::filesystem::create_directories(live);
  Checkpointer(dir.path, 2).repair();
  CHECK(exists(live));
}

TEST_CASE("checkpoint: a full disk is a StorageError naming ENOSPC, the path and what is kept",
          "[checkpoint]") {
  CHECK_THROWS_AS(write_file("/dev/full", "bytes"), StorageError);
  CHECK_THROWS_WITH(write_file("/dev/full", "bytes"),
                    Contains("cannot write '/dev/full': ENOSPC: no space left on device"));
}

// Note [Shard index]: a sharded checkpoint's index written and read back,
// every range read alone, and each malformed line refused by what it is.
TEST_CASE("checkpoint: a shard index round trip and its hostile forms", "[checkpoint][shards]") {
  TempDir dir;
  const at::Tensor a = at::arange(12, at::kFloat).view({3, 4});
  const at::Tensor b = at::tensor({1, 0, 1}, at::kInt).to(at::kBool);
  const at::Tensor c = at::scalar_tensor(7, at::kLong);
  ShardIndex index;
  index.world_size = 2;
  index.zero = 3;
  index.step = 40;
  {
    ShardWriter writer(dir.path + "/" + shard_file_name(1));
    index.entries.push_back(writer.append("model.pt/a", a));
    index.entries.push_back(writer.append("model.pt/b", b));
    index.entries.push_back(writer.append("optimizer.pt/a.step", c));
    index.files.push_back(writer.finish());
  }
  CHECK(index.files[0].name == "shard_00001.bin");
  CHECK(index.entries[1].offset % 64 == 0);
  CHECK(index.entries[2].offset == 128);
  CHECK(index.files[0].size == 136);
  CHECK(index.files[0].sha256 == sha256_file_hex(dir.path + "/shard_00001.bin"));
  const std::string text = index.to_text();
  const ShardIndex back = ShardIndex::parse(text, "metadata.txt");
  REQUIRE(back.entries.size() == 3);
  CHECK(back.world_size == 2);
  CHECK(back.zero == 3);
  CHECK(back.step == 40);
  back.check_files(dir.path);
  CHECK(at::equal(shard_read(dir.path, back, back.entries[0]), a));
  CHECK(at::equal(shard_read(dir.path, back, back.entries[1]), b));
  const at::Tensor step = shard_read(dir.path, back, back.entries[2]);
  CHECK(step.dim() == 0);
  CHECK(step.item<int64_t>() == 7);
  CHECK(back.part("model.pt").size() == 2);

  const auto refused = [&](const std::string& from, const std::string& to,
                           const std::string& says) {
    std::string bad = text;
    const auto at = bad.find(from);
    REQUIRE(at != std::string::npos);
    bad.replace(at, from.size(), to);
    CHECK_THROWS_WITH(ShardIndex::parse(bad, "metadata.txt"), Contains(says));
  };
  refused("lockstep-sharded-checkpoint 1", "lockstep-sharded-checkpoint 2", "version 1");
  refused("end\n", "", "no 'end' line");
  refused("end\n", "end", "does not end with a line break");
  refused("float32 3,4", "float64 3,4", "48 bytes for a float64 tensor");
  refused("float32 3,4", "complex 3,4", "unknown dtype");
  refused("float32 3,4", "float32 3,4,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1", "up to 16 whole numbers");
  refused("float32 3,4", "float32 1099511627776,1099511627776", "overflows");
  refused("float32 3,4", "float32 3,-4", "up to 16 whole numbers");
  refused("model.pt/b", "model.pt/a", "listed twice");
  refused("model.pt/b", "b", "'<part>.pt/<entry>'");
  refused("bool 3 0 64 3", "bool 3 0 0 3", "overlap in shard_00001.bin");
  refused("int64 - 0 128 8", "int64 - 0 192 8", "lie outside shard_00001.bin");
  refused("int64 - 0 128 8", "int64 - 1 128 8", "names no 'file' line");
  refused("zero 3", "zero 4", "zero outside [0, 3]");
  refused("world_size 2", "world_size 0", "world_size outside");
  refused("step 40\n", "", "each required");
  refused("shard_00001.bin 136", "../shard_00001.bin 136", "no file name of this folder");
  refused("shard_00001.bin 136 ", "shard_00001.bin 136 x", "not 64 hex digits");
  refused("tensor model.pt/a", "tensor  model.pt/a", "unknown record");
  refused("model.pt/b", "model.pt/", "'<part>.pt/<entry>'");
  refused("model.pt/b", "model.pt/\xff", "in UTF-8");
  refused("bool 3 0 64 3", "bool 3 0 65 3", "not a multiple of 64");
  refused("float32 3,4", "float32 0,1099511627776,1099511627776", "overflows");
  {
    // An empty range between two overlapping ones hides nothing.
    std::string bad = text;
    bad.replace(bad.find("float32 3,4 0 0 48"), 18, "uint8 136 0 0 136");
    bad.replace(bad.find("bool 3 0 64 3"), 13, "bool 0 0 64 0");
    CHECK_THROWS_WITH(ShardIndex::parse(bad, "m"),
                      Contains("'model.pt/a' and 'optimizer.pt/a.step' overlap"));
  }

  // The files on disk against the index: a short or missing shard.
  ShardIndex longer = back;
  longer.files[0].size = 200;
  CHECK_THROWS_WITH(longer.check_files(dir.path), Contains("is 136 bytes, its index says 200"));
  CHECK_THROWS_WITH(ShardIndex::parse(text + text.substr(text.find("tensor")), "m"),
                    Contains("text after 'end'"));
  std::filesystem::remove(dir.path + "/shard_00001.bin");
  CHECK_THROWS_WITH(back.check_files(dir.path), Contains("shard_00001.bin is missing"));
  CHECK_THROWS_AS(shard_read(dir.path, back, back.entries[0]), DataError);
}

// Note [Sharded checkpoints]: rank 0's merge of the ranks' parts, and what
// ends its wait: a rank's failure in its words, a part that never comes
// (the ranks named), the process ending (cancel).
TEST_CASE("checkpoint: merging shard parts, and every way the wait ends", "[checkpoint][shards]") {
  TempDir dir;
  const at::Tensor w = at::arange(6, at::kFloat).view({2, 3});
  const at::Tensor s = at::scalar_tensor(3, at::kLong);
  write_rank_shard(dir.path, 1, 1, 9, {{"model.pt/b", w}, {"optimizer.pt/a.step", s}});
  write_rank_shard(dir.path, 0, 1, 9, {{"optimizer.pt/b.exp_avg", w}, {"model.pt/a", w}});
  CHECK(std::filesystem::exists(dir.path + "/.part-0"));
  const ShardIndex index =
      merge_shard_parts(dir.path, 2, 1, 9, {"m:a", "m:b", "p:a", "p:b"}, std::chrono::seconds(1));
  CHECK_FALSE(std::filesystem::exists(dir.path + "/.part-0"));  // merged and removed
  REQUIRE(index.entries.size() == 4);
  // The state dict's order, whoever wrote each: model.pt then optimizer.pt.
  CHECK(index.entries[0].name == "model.pt/a");
  CHECK(index.entries[0].file == 0);
  CHECK(index.entries[1].name == "model.pt/b");
  CHECK(index.entries[1].file == 1);
  CHECK(index.entries[2].name == "optimizer.pt/a.step");
  CHECK(index.entries[3].name == "optimizer.pt/b.exp_avg");
  CHECK(index.files.size() == 2);
  CHECK(index.world_size == 2);
  CHECK(index.files[1].sha256 == sha256_file_hex(dir.path + "/shard_00001.bin"));
  CHECK(at::equal(shard_read(dir.path, index, index.entries[1]), w));
  CHECK(read_whole_part(dir.path, index, "optimizer.pt").size() == 2);

  TempDir failing;
  write_rank_shard(failing.path, 0, 1, 9, {{"model.pt/a", w}});
  write_file(failing.path + "/.failed-2", "cannot write 'shard_00002.bin': ENOSPC");
  CHECK_THROWS_WITH(merge_shard_parts(failing.path, 3, 1, 9, {}, std::chrono::seconds(30)),
                    Contains("rank 2 could not write its shard: cannot write 'shard_00002.bin'"));
  CHECK_THROWS_WITH(merge_shard_parts(failing.path, 2, 1, 9, {}, std::chrono::seconds(0)),
                    Contains("the shards of rank(s) 1 did not appear"));
  std::atomic<bool> cancelled{true};
  const auto began = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(
      merge_shard_parts(failing.path, 2, 1, 9, {}, std::chrono::seconds(600), &cancelled),
      Contains("abandoned"));
  CHECK(std::chrono::steady_clock::now() - began < std::chrono::seconds(5));

  // Two ranks naming one tensor: refused before anything is published.
  TempDir twice;
  write_rank_shard(twice.path, 0, 1, 9, {{"model.pt/a", w}});
  write_rank_shard(twice.path, 1, 1, 9, {{"model.pt/a", w}});
  CHECK_THROWS_WITH(merge_shard_parts(twice.path, 2, 1, 9, {}, std::chrono::seconds(1)),
                    Contains("listed twice"));

  // The background job: its own shard's outcome is known before it ends,
  // and a cancel ends a wait for other ranks at once.
  BackgroundSave job;
  job.start([&] {
    job.mark_written(true);
    merge_shard_parts(failing.path, 2, 1, 9, {}, std::chrono::seconds(600), job.cancelled());
  });
  CHECK(job.wait_written());
  job.cancel();
  CHECK_THAT(job.wait(), Contains("abandoned"));
  job.start([] { throw StorageError("disk gone"); });
  CHECK_FALSE(job.wait_written());
  CHECK(job.wait() == "disk gone");
}

TEST_CASE("state.yaml: every field reads back as written, and a bad value is named by its key",
          "[checkpoint]") {
  TrainerState s;
  s.step = 1234;
  s.epoch = 7;
  s.batch_in_epoch = 21;
  s.epoch_offset = 96;
  s.world_size = 3;
  s.zero = 2;
  s.batch_size = 32;
  s.accumulation_steps = 4;
  s.total_steps = 5000;
  s.schedule_from = ScheduleFrom::kDecaySteps;
  s.model = "gpt";
  s.data_size = 1438;
  s.data_id = "0123456789abcdef";
  s.scaler = {{"scale", 32768.5}, {"_growth_tracker", 17}, {"growth_factor", 2.0}};
  s.keep_best = {0.125, 900, 0};
  s.early_stop = {0.3333333333333333, 800, 2};
  const std::string text = state_yaml_text(s);
  const TrainerState r = state_yaml_read(YAML::Load(text));
  CHECK(r.step == 1234);
  CHECK(r.epoch == 7);
  CHECK(r.batch_in_epoch == 21);
  CHECK(r.epoch_offset == 96);
  CHECK(r.world_size == 3);
  CHECK(r.zero == 2);
  CHECK(r.batch_size == 32);
  CHECK(r.accumulation_steps == 4);
  CHECK(r.total_steps == 5000);
  CHECK(r.schedule_from == ScheduleFrom::kDecaySteps);
  CHECK(r.model == "gpt");
  CHECK(r.data_size == 1438);
  CHECK(r.data_id == "0123456789abcdef");
  CHECK(r.scaler == s.scaler);
  CHECK(r.keep_best.best == 0.125);
  CHECK(r.keep_best.best_step == 900);
  CHECK(r.early_stop.best == s.early_stop.best);  // 17 digits: exact
  CHECK(r.early_stop.bad == 2);
  // The keys in the order readers have always seen them.
  CHECK(text.rfind("step: 1234\nepoch: 7\nbatch_in_epoch: 21\nepoch_offset: 96\nworld_size: 3\n",
                   0) == 0);
  CHECK_THAT(text, Contains("_growth_tracker: 17\n"));

  const auto read = [](std::string t) { return state_yaml_read(YAML::Load(t)); };
  const auto with = [&](const std::string& from, const std::string& to) {
    std::string t = text;
    t.replace(t.find(from), from.size(), to);
    return t;
  };
  CHECK_THROWS_WITH(read(with("world_size: 3", "world_size: 0")),
                    Contains("world_size: 0 is out of range [1, 2^20]"));
  CHECK_THROWS_WITH(read(with("zero: 2", "zero: 4")), Contains("zero: 4 is out of range [0, 3]"));
  CHECK_THROWS_WITH(read(with("step: 1234\n", "")), Contains("no step"));
  CHECK_THROWS_WITH(read(with("decay_steps", "weekly")),
                    Contains("schedule_from: one of epochs, max_steps, decay_steps"));
  CHECK_THROWS_WITH(read(with("0123456789abcdef", std::string(65, 'a'))),
                    Contains("data_id: over 64 characters"));
  // Optional keys (older checkpoints): absent, unknown.
  const TrainerState old = read(with("epoch_offset: 96\n", ""));
  CHECK(old.epoch_offset == 0);
  // Without the data's identity, neither data_size nor data_id is written.
  s.data_size = 0;
  CHECK(state_yaml_text(s).find("data_id") == std::string::npos);
  CHECK_THAT(state_yaml_keys(), Contains("world_size") && Contains("model, data_id: text"));
}
