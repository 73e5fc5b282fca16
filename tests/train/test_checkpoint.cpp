// Checkpoint policy (train/checkpoint.h, docs/checkpoints.md): the folder and
// its MANIFEST, a round trip of model, optimizer and generator states, the
// refusal of anything modified, and rotation that keeps only the newest of
// our own folders.
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include "support/catch.h"
#include "support/temp_dir.h"

#include <filesystem>

#include "lockstep/train/checkpoint.h"
#include "lockstep/train/optim.h"
#include "lockstep/util/error.h"
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

bool exists(const std::string& path) {
  return std::filesystem::exists(path);
}

}  // namespace

TEST_CASE("checkpoint: the folder, its MANIFEST and a round trip", "[checkpoint]") {
  TempDir dir;
  Setup a;
  Checkpointer checkpoints(dir.path, 3);
  const auto folder =
      checkpoints.save(state_at(5), state_dict_of(*a.model), optim_of(a), kRng, "x: 1\n");
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
  CHECK(torch::equal(loaded.rng_states, kRng));
  REQUIRE(loaded.model.size() == 2);
  CHECK(loaded.model[0].first == "weight");
  CHECK(torch::equal(loaded.model[0].second, a.model->weight));
  CHECK(torch::equal(loaded.model[1].second, a.model->bias));
  // The optimizer's momentum came back (the next step moves b as it moves a).
  state_dict_load(*b.model, loaded.model, "test");
  // optimizer.pt: a state dict by parameter name (torch.load reads it).
  REQUIRE(loaded.optimizer.size() == 2);
  CHECK(loaded.optimizer[0].first == "weight.momentum_buffer");
  CHECK(loaded.optimizer[1].first == "bias.momentum_buffer");
  optimizer_load_state_dict(*b.optimizer, module_tensors(*b.model, false), loaded.optimizer, {},
                            "test");
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
  const auto folder =
      checkpoints.save(state_at(5), state_dict_of(*a.model), optim_of(a), kRng, "x: 1\n");
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
  const auto other =
      checkpoints.save(state_at(6), state_dict_of(*a.model), optim_of(a), kRng, "x: 1\n");
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
  for (int64_t step : {1, 2, 3})
    checkpoints.save(state_at(step), state_dict_of(*a.model), optim_of(a), kRng, "x: 1\n");
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
