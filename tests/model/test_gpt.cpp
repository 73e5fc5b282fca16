// model.name: gpt (model/gpt.h) and the token data it reads (data/tokens.h):
// the parameters against GPT-2's closed-form count and names, the
// initialisation's statistics, causality, attention against a reference
// written out by hand, the loss at initialisation against ln(vocab), the
// windows against the file's bytes, every malformed token file named, a
// 10 GB file opened with memory independent of its size, and a short run
// that learns a text.
#include <ATen/ATen.h>
#include "support/catch.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>

#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/functional.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include "lockstep/data/tokens.h"
#include "lockstep/distributed/torch_compat.h"

#include "lockstep/cli/generate.h"
#include "lockstep/model/gpt.h"
#include "lockstep/model/recompute.h"
#include "lockstep/train/recipe.h"
#include "lockstep/train/trainer.h"
#include "lockstep/util/error.h"
#include "lockstep/util/utf8.h"
#include "support/temp_dir.h"
#include "support/thread_world.h"

using namespace lockstep;
using lockstep::testing::Contains;
using lockstep::testing::TempDir;

namespace {

GptOptions tiny(int64_t layers = 2, bool bias = true) {
  GptOptions o;
  o.vocab_size = 50;
  o.block_size = 16;
  o.n_layer = layers;
  o.n_head = 4;
  o.n_embd = 32;
  o.bias = bias;
  return o;
}

double std_of(const at::Tensor& t) {
  return t.std().item<double>();
}

long rss_kb() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

}  // namespace

TEST_CASE("gpt: nanoGPT's parameter names and GPT-2's closed-form count", "[gpt]") {
  at::manual_seed(0);
  Gpt model(tiny());
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& p : model.named_parameters()) shapes[p.key()] = p.value().sizes().vec();
  const int64_t v = 50, t = 16, c = 32, l = 2;
  CHECK(shapes.at("transformer.wte.weight") == std::vector<int64_t>{v, c});
  CHECK(shapes.at("transformer.wpe.weight") == std::vector<int64_t>{t, c});
  CHECK(shapes.at("transformer.h.1.attn.c_attn.weight") == std::vector<int64_t>{3 * c, c});
  CHECK(shapes.at("transformer.h.1.attn.c_proj.bias") == std::vector<int64_t>{c});
  CHECK(shapes.at("transformer.h.0.mlp.c_fc.weight") == std::vector<int64_t>{4 * c, c});
  CHECK(shapes.at("transformer.h.0.mlp.c_proj.weight") == std::vector<int64_t>{c, 4 * c});
  CHECK(shapes.at("transformer.h.0.ln_1.weight") == std::vector<int64_t>{c});
  CHECK(shapes.at("transformer.ln_f.bias") == std::vector<int64_t>{c});
  CHECK(shapes.count("lm_head.weight") == 0);  // tied: the head is wte itself
  // Per block 12 C^2 + 13 C (LayerNorms, attention, MLP, with biases), the
  // embeddings, the final LayerNorm.
  int64_t total = 0;
  for (const auto& p : model.parameters()) total += p.numel();
  CHECK(total == v * c + t * c + l * (12 * c * c + 13 * c) + 2 * c);
  CHECK(model.parameters_without_positions() == total - t * c);
  CHECK(model.flops_per_token() == 6.0 * (total - t * c) + 12.0 * l * c * t);
  // Without biases: LayerNorms keep their weights, Linear layers lose theirs.
  Gpt plain(tiny(2, false));
  int64_t without = 0;
  for (const auto& p : plain.parameters()) without += p.numel();
  CHECK(without == v * c + t * c + l * (12 * c * c + 2 * c) + c);
}

TEST_CASE("gpt: GPT-2's initialisation, and a loss of ln(vocab) before training", "[gpt]") {
  at::manual_seed(1);
  auto o = tiny(4);
  o.n_embd = 128;
  o.vocab_size = 256;
  o.block_size = 64;
  Gpt model(o);
  const auto params = model.named_parameters();
  const double residual = 0.02 / std::sqrt(2.0 * 4);
  CHECK(std::abs(std_of(params["transformer.wte.weight"]) - 0.02) < 0.001);
  CHECK(std::abs(std_of(params["transformer.h.2.attn.c_attn.weight"]) - 0.02) < 0.001);
  CHECK(std::abs(std_of(params["transformer.h.2.attn.c_proj.weight"]) - residual) < 0.0005);
  CHECK(std::abs(std_of(params["transformer.h.3.mlp.c_proj.weight"]) - residual) < 0.0005);
  CHECK(params["transformer.h.0.mlp.c_fc.bias"].abs().max().item<double>() == 0);
  CHECK(params["transformer.h.0.ln_2.weight"].eq(1).all().item<bool>());
  model.eval();
  const auto idx = at::randint(256, {8, 64}, at::kLong);
  const auto logits = model.forward(idx);
  CHECK(logits.sizes() == std::vector<int64_t>{8, 64, 256});
  const double loss =
      loss_for(TaskKind::kLanguage, logits, at::randint(256, {8, 64}, at::kLong)).item<double>();
  CHECK(std::abs(loss - std::log(256.0)) < 0.05);  // near-uniform predictions
}

TEST_CASE("gpt: causal: a token changes no prediction before its position", "[gpt]") {
  at::manual_seed(2);
  Gpt model(tiny());
  model.eval();
  auto idx = at::randint(50, {2, 16}, at::kLong);
  const auto before = model.forward(idx);
  auto changed = idx.clone();
  changed.index_put_({0, 9}, (idx.index({0, 9}) + 1) % 50);
  const auto after = model.forward(changed);
  CHECK(at::equal(before.narrow(1, 0, 9), after.narrow(1, 0, 9)));
  CHECK_FALSE(at::allclose(before.narrow(1, 9, 1), after.narrow(1, 9, 1)));
  CHECK(at::equal(before[1], after[1]));  // the other row untouched
  // A shorter context gives the same predictions as the full one's prefix.
  const auto prefix = model.forward(idx.narrow(1, 0, 5));
  CHECK(at::allclose(prefix, before.narrow(1, 0, 5), 1e-5, 1e-6));
  REQUIRE_THROWS_WITH(model.forward(at::zeros({1, 17}, at::kLong)),
                      Contains("longer than model.block_size=16"));
}

TEST_CASE("gpt: causal attention equals softmax(q k^T / sqrt(d)) v written out by hand", "[gpt]") {
  at::manual_seed(3);
  const auto q = at::randn({2, 3, 7, 8}), k = at::randn({2, 3, 7, 8}), v = at::randn({2, 3, 7, 8});
  const auto got = causal_attention(q, k, v, 0.5, /*training=*/false);  // no dropout in eval
  auto expected = at::zeros_like(q);
  for (int64_t i = 0; i < 7; ++i) {
    // Position i attends to 0..i only.
    const auto scores =
        at::matmul(q.narrow(2, i, 1), k.narrow(2, 0, i + 1).transpose(-2, -1)) / std::sqrt(8.0);
    expected.narrow(2, i, 1).copy_(at::matmul(at::softmax(scores, -1), v.narrow(2, 0, i + 1)));
  }
  CHECK(at::allclose(got, expected, 1e-5, 1e-6));
  // Training with dropout changes the result; without it, it does not.
  CHECK_FALSE(at::allclose(causal_attention(q, k, v, 0.5, true), expected, 1e-3, 1e-3));
  CHECK(at::allclose(causal_attention(q, k, v, 0.0, true), expected, 1e-5, 1e-6));
}

TEST_CASE("tokens: windows of block_size + 1 bytes, block_size apart, as the file holds them",
          "[gpt][data]") {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 103; ++i) text.push_back(static_cast<char>(i));
  const auto file = TokenFile::open(dir.write("t.txt", text), TokenFormat::kBytes);
  CHECK(file->size() == 103);
  TokenWindows windows(file, 0, 103, 10, 256);
  CHECK(windows.size() == 10);  // starts 0, 10, ..., 90: the last needs bytes 90..100
  CHECK(token_window_count(103, 10) == 10);
  CHECK(token_window_count(101, 10) == 10);
  CHECK(token_window_count(100, 10) == 9);
  CHECK(token_window_count(10, 10) == 0);
  const auto e = windows.get(3);
  CHECK(at::equal(e.x, at::arange(30, 40, at::kLong)));
  CHECK(at::equal(e.y, at::arange(31, 41, at::kLong)));
  const auto batch = windows.get_batch({9, 0, 3});
  CHECK(batch.x.sizes() == std::vector<int64_t>{3, 10});
  CHECK(at::equal(batch.x[0], windows.get(9).x));
  CHECK(at::equal(batch.y[2], e.y));
  // A part of the file: windows start at its beginning.
  TokenWindows tail(file, 50, 103, 10, 256);
  CHECK(tail.size() == 5);
  CHECK(tail.get(0).x[0].item<int64_t>() == 50);
}

TEST_CASE("tokens: nanoGPT's and llm.c's files, and every malformed one named", "[gpt][data]") {
  TempDir dir;
  auto u16 = [](std::initializer_list<int> tokens) {
    std::string out;
    for (int t : tokens) out += std::string{static_cast<char>(t & 255), static_cast<char>(t >> 8)};
    return out;
  };
  const auto nano =
      TokenFile::open(dir.write("train.bin", u16({1, 300, 65535, 7})), TokenFormat::kUint16);
  CHECK(nano->format() == TokenFormat::kUint16);
  std::vector<int64_t> got(4);
  nano->read(0, 4, got.data());
  CHECK(got == std::vector<int64_t>{1, 300, 65535, 7});
  // A token outside the vocabulary: named with its position when read.
  TokenWindows windows(nano, 0, 4, 2, 50257);
  REQUIRE_THROWS_WITH(windows.get(0), Contains("token 65535 at position 2 is outside the "
                                               "vocabulary of 50257"));

  std::string header(1024, '\0');
  auto put = [&](int at, int32_t v) {
    for (int i = 0; i < 4; ++i) header[at * 4 + i] = static_cast<char>((v >> (8 * i)) & 255);
  };
  put(0, 20240520);
  put(1, 1);
  put(2, 3);
  const auto llmc =
      TokenFile::open(dir.write("llmc.bin", header + u16({5, 6, 7})), TokenFormat::kUint16);
  CHECK(llmc->format() == TokenFormat::kLlmc);
  CHECK(llmc->size() == 3);
  llmc->read(0, 3, got.data());
  CHECK(got[2] == 7);
  put(2, 1000);  // a header that claims more than the file holds
  REQUIRE_THROWS_WITH(
      TokenFile::open(dir.write("lies.bin", header + u16({5})), TokenFormat::kUint16),
      Contains("announces 1000 tokens but the file holds 1 (truncated?)"));
  put(2, 2);  // fewer than it holds: the tail would be left out silently
  REQUIRE_THROWS_WITH(
      TokenFile::open(dir.write("under.bin", header + u16({5, 6, 7})), TokenFormat::kUint16),
      Contains("announces 2 tokens but the file holds 3 (its tail would go unread)"));
  put(2, 3);
  REQUIRE_THROWS_WITH(
      TokenFile::open(dir.write("stray.bin", header + u16({5, 6, 7}) + "x"), TokenFormat::kUint16),
      Contains("announces 3 tokens but the file holds 3 and a stray byte"));
  // llm.c's newer files: magic 20240801, version 7, uint32 tokens (Llama 3's).
  std::string header7(1024, '\0');
  auto put7 = [&](int at, int32_t v) {
    for (int i = 0; i < 4; ++i) header7[at * 4 + i] = static_cast<char>((v >> (8 * i)) & 255);
  };
  put7(0, 20240801);
  put7(1, 7);
  put7(2, 3);
  auto u32 = [](std::initializer_list<int64_t> tokens) {
    std::string out;
    for (int64_t t : tokens)
      for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((t >> (8 * i)) & 255));
    return out;
  };
  const auto v7 =
      TokenFile::open(dir.write("v7.bin", header7 + u32({5, 70000, 128255})), TokenFormat::kUint16);
  CHECK(v7->format() == TokenFormat::kLlmc32);
  CHECK(v7->size() == 3);  // not (1024 + 12) / 2 = 518 uint16
  v7->read(0, 3, got.data());
  CHECK(got[0] == 5);
  CHECK(got[1] == 70000);
  CHECK(got[2] == 128255);
  put7(2, 4);
  REQUIRE_THROWS_WITH(
      TokenFile::open(dir.write("v7lies.bin", header7 + u32({1, 2, 3})), TokenFormat::kUint16),
      Contains("announces 4 tokens but the file holds 3"));
  put7(0, 20240999);  // a header of no format lockstep knows
  REQUIRE_THROWS_WITH(
      TokenFile::open(dir.write("unknown.bin", header7 + u32({1, 2, 3, 4})), TokenFormat::kUint16),
      Contains("magic 20240999 and version 7, which lockstep does not know "
               "(known: llm.c's magic 20240520"));
  put7(0, 20240520);
  put7(1, 7);  // a known magic, an unknown version
  REQUIRE_THROWS_WITH(
      TokenFile::open(dir.write("badver.bin", header7 + u32({1, 2, 3, 4})), TokenFormat::kUint16),
      Contains("does not know"));
  REQUIRE_THROWS_WITH(TokenFile::open(dir.write("odd.bin", "abc"), TokenFormat::kUint16),
                      Contains("an odd size (3 bytes)"));
  REQUIRE_THROWS_WITH(TokenFile::open(dir.write("empty.bin", ""), TokenFormat::kBytes),
                      Contains("empty"));
  REQUIRE_THROWS_WITH(TokenFile::open(dir.path + "/missing.bin", TokenFormat::kBytes),
                      Contains("missing.bin': No such file"));
  REQUIRE_THROWS_WITH(TokenFile::open(dir.path, TokenFormat::kBytes),
                      Contains("not a regular file"));
}

TEST_CASE("tokens: the config's data: val.bin beside train.bin, else the file's tail held out",
          "[gpt][data]") {
  TempDir dir;
  Config config;
  config.model.name = "gpt";
  config.model.block_size = 4;
  config.data.name = DatasetKind::kText;
  config.data.path = dir.write("book.txt", std::string(1000, 'a'));
  config.data.validation_fraction = 0.1;
  const TrainData text = data_from_config(config);
  CHECK(text.task == TaskKind::kLanguage);
  CHECK(text.num_classes == 256);
  CHECK(text.sample_shape == std::vector<int64_t>{4});
  CHECK(text.train->size() == token_window_count(900, 4));
  CHECK(text.validation->size() == token_window_count(100, 4));
  CHECK_THAT(text.summary, Contains("1,000 bytes of"));

  config.data.name = DatasetKind::kTokens;
  std::string tokens(2 * 200, '\0');
  config.data.path = dir.write("train.bin", tokens);
  dir.write("val.bin", std::string(2 * 40, '\0'));
  REQUIRE_THROWS_WITH(data_from_config(config), Contains("data.vocab_size must be set"));
  config.data.vocab_size = 100;
  const TrainData bins = data_from_config(config);
  CHECK(bins.num_classes == 100);
  CHECK(bins.train->size() == token_window_count(200, 4));  // all of train.bin
  CHECK(bins.validation->size() == token_window_count(40, 4));
  config.data.path = dir.path;  // the folder means the same
  CHECK(data_from_config(config).validation->size() == token_window_count(40, 4));

  config.model.block_size = 1000;
  REQUIRE_THROWS_WITH(data_from_config(config), Contains("gives no window of model.block_size"));
  // A classifier on token windows, or a GPT on a table: refused by name.
  config.model.block_size = 4;
  config.model.name = "mlp";
  REQUIRE_THROWS_WITH(
      config_validate(config, 1),
      Contains("data.name: tokens gives windows of token ids for a language model"));
  config.model.name = "gpt";
  config.data.name = DatasetKind::kDigits;
  REQUIRE_THROWS_WITH(config_validate(config, 1), Contains("gpt is a language model"));
}

TEST_CASE("tokens: a 10 GB token file starts with memory independent of its size", "[gpt][data]") {
  TempDir dir;
  const std::string path = dir.path + "/train.bin";
  const int fd = ::open(path.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0600);
  REQUIRE(fd >= 0);
  const off_t size = off_t{10} << 30;  // sparse: no disk, no page cache until read
  REQUIRE(ftruncate(fd, size) == 0);
  ::close(fd);
  Config config;
  config.model.name = "gpt";
  config.model.block_size = 256;
  config.data.name = DatasetKind::kTokens;
  config.data.path = path;
  config.data.vocab_size = 50257;
  const long before = rss_kb();
  const TrainData data = data_from_config(config);
  CHECK(data.train->size() + data.validation->size() >= (size / 2) / 256 - 2);
  // A few batches from all over the file.
  for (int64_t start : {int64_t{0}, data.train->size() / 2, data.train->size() - 8}) {
    std::vector<int64_t> rows(8);
    for (int i = 0; i < 8; ++i) rows[i] = start + i;
    const auto batch = data.train->get_batch(rows);
    CHECK(batch.x.sizes() == std::vector<int64_t>{8, 256});
  }
  const long grown_kb = rss_kb() - before;
  INFO("resident memory grew by " << grown_kb << " KiB for a 10 GiB file");
  CHECK(grown_kb < 32 * 1024);
}

TEST_CASE("gpt: two ranks learn a text through the trainer, far below ln(256)", "[gpt][train]") {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 400; ++i) text += "the quick brown fox jumps over the lazy dog. ";
  Config config;
  config.run.dir = dir.path;
  config.run.name = "gpt";
  config.model.name = "gpt";
  config.model.n_layer = 1;
  config.model.n_head = 2;
  config.model.n_embd = 32;
  config.model.block_size = 32;
  config.data.name = DatasetKind::kText;
  config.data.path = dir.write("fox.txt", text);
  config.data.batch_size = 16;
  config.optim.name = OptimizerKind::kAdamW;
  config.optim.lr = 3e-3;
  config.optim.weight_decay = 0;
  config.train.epochs = 100;
  config.train.max_steps = 60;
  config.log.every = 1000;
  config.log.progress = Progress::kPlain;
  auto outcomes = lockstep::testing::run_ranks<TrainResult>(2, [&](ProcessGroup& pg) {
    WorldInfo world;
    world.rank = pg.rank();
    world.world_size = pg.size();
    world.local_rank = pg.rank();
    world.local_world_size = pg.size();
    return Trainer(config, world, pg.shared_from_this()).run();
  });
  for (const auto& o : outcomes) REQUIRE(lockstep::testing::error_text(o.error) == "");
  // A repeated sentence: a bigram model gets well under 1 nat; 60 steps
  // of this GPT must at least get far from the uniform 5.55.
  CHECK(outcomes[0].result.val_loss < 1.5);
  CHECK(outcomes[0].result.val_loss == outcomes[1].result.val_loss);
  CHECK(outcomes[0].result.fingerprint == outcomes[1].result.fingerprint);

  // lockstep generate's library half: the run folder means its newest
  // checkpoint, which loads as the model trained.
  const std::string folder = checkpoint_folder(dir.path + "/gpt");
  CHECK_THAT(folder, Contains("step_00000060"));
  const LoadedLanguageModel loaded = load_language_model(folder);
  CHECK(loaded.bytes);
  CHECK(loaded.vocab_size == 256);
  // Greedy: each token the argmax of the model's own next-token logits.
  const std::string prompt = "the quick brown ";
  std::vector<int64_t> context(prompt.begin(), prompt.end());
  SampleOptions greedy;
  greedy.temperature = 0;
  greedy.max_new_tokens = 12;
  std::vector<int64_t> streamed;
  const auto drawn = sample(*loaded.model, loaded.vocab_size, loaded.block_size, context, greedy,
                            [&](int64_t t) { streamed.push_back(t); });
  CHECK(drawn == streamed);
  at::NoGradGuard no_grad;
  for (int64_t t : drawn) {
    const auto logits = loaded.model->forward(at::tensor(context, at::kLong).unsqueeze(0));
    CHECK(logits[0][-1].argmax().item<int64_t>() == t);
    context.push_back(t);
  }
  // 60 steps already write only the sentence's own characters.
  for (int64_t t : drawn)
    CHECK(std::string("the quick brown fox jumps over the lazy dog. ").find(static_cast<char>(t)) !=
          std::string::npos);
}

TEST_CASE("generate: sampling is determined by its seed, and bad requests are named", "[gpt]") {
  at::manual_seed(5);
  Gpt model(tiny());
  model.eval();
  SampleOptions o;
  o.max_new_tokens = 20;
  o.temperature = 1.0;
  o.top_k = 10;
  o.seed = 7;
  const auto a = gpt_sample(model, {1, 2, 3}, o);
  const auto b = gpt_sample(model, {1, 2, 3}, o);
  CHECK(a == b);
  CHECK(a.size() == 20);
  o.seed = 8;
  CHECK(gpt_sample(model, {1, 2, 3}, o) != a);
  // The context is cropped to block_size (16) as it grows past it.
  o.max_new_tokens = 40;
  CHECK(gpt_sample(model, {1}, o).size() == 40);
  REQUIRE_THROWS_WITH(gpt_sample(model, {}, o), Contains("the prompt is empty"));
  REQUIRE_THROWS_WITH(gpt_sample(model, std::vector<int64_t>(17, 1), o),
                      Contains("17 tokens, longer than the model's context of "
                               "model.block_size=16"));
  REQUIRE_THROWS_WITH(gpt_sample(model, {50}, o), Contains("token 50 is outside the vocabulary"));
  o.temperature = -1;
  REQUIRE_THROWS_WITH(gpt_sample(model, {1}, o), Contains("--temperature"));
}

TEST_CASE("generate: bytes become UTF-8 text, every invalid sequence one U+FFFD", "[gpt]") {
  auto run = [](const std::string& bytes, std::size_t* replaced = nullptr) {
    std::string out;
    Utf8Stream stream([&](const std::string& s) { out += s; });
    for (unsigned char c : bytes) stream.put(c);
    stream.finish();
    if (replaced) *replaced = stream.replaced();
    return out;
  };
  std::size_t bad = 0;
  CHECK(run("plain \xC3\xA9t\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80", &bad) ==
        "plain \xC3\xA9t\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80");
  CHECK(bad == 0);
  const std::string fffd = "\xEF\xBF\xBD";
  CHECK(run("a\x80"
            "b",
            &bad) == "a" + fffd + "b");  // a stray continuation byte
  CHECK(bad == 1);
  CHECK(run("\xC3(", &bad) == fffd + "(");                 // a character broken off
  CHECK(run("\xC0\xAF", &bad) == fffd + fffd);             // an overlong '/'
  CHECK(run("\xED\xA0\x80", &bad) == fffd + fffd + fffd);  // a surrogate
  CHECK(bad == 3);
  CHECK(run("end\xE2\x82", &bad) == "end" + fffd);  // unfinished at the end
  CHECK(bad == 1);
}

TEST_CASE(
    "tokens: a file that shrinks, is rewritten or replaced under the reader is an error naming "
    "it, never SIGBUS",
    "[gpt][data]") {
  TempDir dir;
  std::string bytes(4000, 'a');
  const std::string path = dir.write("book.txt", bytes);
  {
    const auto file = TokenFile::open(path, TokenFormat::kBytes);
    TokenWindows windows(file, 0, 4000, 10, 256);
    CHECK_NOTHROW(windows.get_batch({0, 398}));
    REQUIRE(truncate(path.c_str(), 100) == 0);  // a memory map would fault on window 399
    CHECK_THROWS_AS(windows.get_batch({398}), DataError);
    CHECK_THROWS_WITH(windows.get(0), Contains("text file '" + path +
                                               "' changed under the running job: its size "
                                               "changed from 4000 to 100 bytes"));
  }
  {
    dir.write("book.txt", bytes);
    const auto file = TokenFile::open(path, TokenFormat::kBytes);
    TokenWindows windows(file, 0, 4000, 10, 256);
    const std::string other = dir.write("other.txt", std::string(4000, 'b'));
    REQUIRE(std::rename(other.c_str(), path.c_str()) == 0);
    CHECK_THROWS_WITH(windows.get(0), Contains("another file was put in its place"));
  }
  {
    dir.write("book.txt", bytes);
    const auto file = TokenFile::open(path, TokenFormat::kBytes);
    std::vector<int64_t> got(4);
    REQUIRE(truncate(path.c_str(), 2) == 0);
    // A read past the new end (between two checks) is an error too.
    CHECK_THROWS_WITH(file->read(3000, 4, got.data()), Contains("changed under the running job"));
  }
}

TEST_CASE("gpt: gpt_parameter_shapes lists exactly the model's parameters and shapes", "[gpt]") {
  for (const bool bias : {true, false}) {
    GptOptions o;
    o.vocab_size = 37;
    o.block_size = 9;
    o.n_layer = 2;
    o.n_head = 2;
    o.n_embd = 8;
    o.bias = bias;
    Gpt model(o);
    std::vector<std::pair<std::string, std::vector<int64_t>>> actual;
    for (const auto& p : model.named_parameters())
      actual.emplace_back(p.key(), p.value().sizes().vec());
    auto expected = gpt_parameter_shapes(o);
    std::sort(actual.begin(), actual.end());
    std::sort(expected.begin(), expected.end());
    CHECK(actual == expected);
  }
}

namespace {
// One forward and backward of a GPT from seed 7 on a fixed batch, the
// generator at `seed` before the forward (dropout); its loss and gradients.
struct Pass {
  double loss = 0;
  std::vector<at::Tensor> grads;
  at::Tensor rng_after;  // the generator's state after backward
};
Pass gpt_pass(bool checkpointed, bool bf16, uint64_t dropout_seed = 11) {
  GptOptions o;
  o.vocab_size = 50;
  o.block_size = 16;
  o.n_layer = 3;
  o.n_head = 2;
  o.n_embd = 32;
  o.dropout = 0.1;
  o.activation_checkpointing = checkpointed;
  at::manual_seed(7);
  Gpt model(o);
  model.train();
  const auto idx = at::randint(0, 50, {4, 16}, at::kLong);
  const auto target = at::randint(0, 50, {4, 16}, at::kLong);
  at::manual_seed(dropout_seed);
  at::Tensor loss;
  {
    if (bf16) autocast_set(at::kCPU, true, at::kBFloat16);
    const auto logits = model.forward(idx);
    loss = at::cross_entropy_loss(logits.reshape({-1, 50}).to(at::kFloat), target.reshape({-1}));
    if (bf16) autocast_set(at::kCPU, false, at::kBFloat16);
  }
  loss.backward();
  Pass p;
  p.loss = loss.item<double>();
  for (const auto& param : model.parameters()) p.grads.push_back(param.grad().clone());
  p.rng_after = at::detail::getDefaultCPUGenerator().get_state();
  return p;
}
}  // namespace

TEST_CASE("activation checkpointing: the GPT's gradients are bit-identical", "[gpt][checkpoint]") {
  // Note [Activation checkpointing]: dropout 0.1 in every block, so the
  // recompute must draw the first run's masks; the generator ends where a
  // plain run leaves it; under bf16 autocast too.
  for (const bool bf16 : {false, true}) {
    INFO("bf16 " << bf16);
    const Pass plain = gpt_pass(false, bf16), kept = gpt_pass(true, bf16);
    CHECK(kept.loss == plain.loss);
    REQUIRE(kept.grads.size() == plain.grads.size());
    size_t identical = 0;
    for (size_t i = 0; i < plain.grads.size(); ++i)
      identical += at::equal(kept.grads[i], plain.grads[i]) ? 1 : 0;
    CHECK(identical == plain.grads.size());
    CHECK(at::equal(kept.rng_after, plain.rng_after));
  }
  // The control: other dropout masks give other gradients, so the equality
  // above needs the recompute to draw the first run's masks.
  const Pass plain = gpt_pass(false, false), other = gpt_pass(true, false, 12);
  size_t differ = 0;
  for (size_t i = 0; i < plain.grads.size(); ++i)
    differ += at::equal(other.grads[i], plain.grads[i]) ? 0 : 1;
  CHECK(differ > plain.grads.size() / 2);
}

TEST_CASE("activation checkpointing: any module, input gradients, no grad mode", "[checkpoint]") {
  torch::nn::Sequential net(torch::nn::Linear(8, 16), torch::nn::Functional(at::gelu, "none"),
                            torch::nn::Dropout(0.5), torch::nn::Linear(16, 4));
  net->train();
  const auto input = at::randn({5, 8});
  const auto run = [&](bool checkpointed) {
    net->zero_grad();
    auto x = input.clone().requires_grad_(true);
    at::manual_seed(3);
    const auto y = checkpointed
                       ? recompute(
                             *net, [&](const at::Tensor& in) { return net->forward(in); }, x)
                       : net->forward(x);
    y.pow(2).sum().backward();
    std::vector<at::Tensor> grads{x.grad().clone()};
    for (const auto& p : net->parameters()) grads.push_back(p.grad().clone());
    return grads;
  };
  const auto plain = run(false), kept = run(true);
  for (size_t i = 0; i < plain.size(); ++i) CHECK(at::equal(plain[i], kept[i]));
  // Without grad mode it is the function itself: nothing saved, no graph.
  at::NoGradGuard no_grad;
  at::manual_seed(3);
  const auto a = net->forward(input);
  at::manual_seed(3);
  const auto b = recompute(
      *net, [&](const at::Tensor& in) { return net->forward(in); }, input);
  CHECK(at::equal(a, b));
  CHECK_FALSE(b.requires_grad());
}
