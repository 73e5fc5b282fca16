// `lockstep generate`: samples from a trained GPT's checkpoint, streaming
// each token as it is drawn (lockstep/cli/generate.h). Byte-level models
// (data.name: text) read the prompt as UTF-8 bytes and print text; models
// trained on token ids (data.name: tokens) take and print text through the
// tokenizer their config records (data.tokenizer: gpt2 for lockstep
// tokenize's files), else ids.
#include <cerrno>
#include <cstdio>
#include <sstream>

#include <optional>

#include "common.h"
#include "lockstep/cli/generate.h"
#include "lockstep/data/bpe.h"
#include "lockstep/util/error.h"
#include "lockstep/util/fs.h"
#include "lockstep/util/utf8.h"

namespace lockstep::cli {
namespace {

std::vector<int64_t> parse_ids(const std::string& text) {
  std::vector<int64_t> ids;
  std::stringstream items(text);
  for (std::string item; std::getline(items, item, ',');) {
    char* end = nullptr;
    errno = 0;
    const long long value = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || value < 0 || errno == ERANGE)
      throw ConfigError("--prompt-tokens: '" + item.substr(0, 40) +
                        "' is not a token id (a whole number from 0 to the vocabulary's size)");
    ids.push_back(value);
  }
  return ids;
}

// The model's logits at every position of `prompt`, as float32 bytes: what
// another implementation (transformers, a Python twin) is compared with.
void write_logits(Classifier& model, const std::vector<int64_t>& prompt, const std::string& path) {
  at::NoGradGuard no_grad;
  const at::Tensor idx = at::tensor(prompt, at::kLong).unsqueeze(0);
  const at::Tensor logits = model.forward(idx).squeeze(0).to(at::kFloat).contiguous().cpu();
  write_file_replacing(path, std::string(static_cast<const char*>(logits.data_ptr()),
                                         static_cast<size_t>(logits.numel()) * sizeof(float)));
}

// The command's options and their help.
cxxopts::Options generate_options() {
  cxxopts::Options options(
      "lockstep generate",
      "Samples text from a language model's checkpoint (model.name: gpt or llama).");
  // clang-format off
  options.add_options()
      ("checkpoint", "a checkpoint folder, or a run folder (its newest checkpoint)", cxxopts::value<std::string>())
      ("prompt", "text to continue (data.name: text models, or tokens with data.tokenizer)", cxxopts::value<std::string>())
      ("prompt-tokens", "token ids to continue, comma-separated (data.name: tokens models)", cxxopts::value<std::string>())
      ("max-new-tokens", "tokens to draw", cxxopts::value<int64_t>()->default_value("256"))
      ("temperature", "divides the logits; 0 (or below 1e-5): greedy", cxxopts::value<double>()->default_value("0.8"))
      ("top-k", "draw among the k likeliest tokens only (0: all)", cxxopts::value<int64_t>()->default_value("0"))
      ("seed", "the same seed, the same text", cxxopts::value<uint64_t>()->default_value("0"))
      ("special", "read special tokens' names in --prompt as their ids (<|begin_of_text|>, chat templates)")
      ("logits", "instead of drawing: write the logits at every prompt position to FILE (float32, little-endian, [prompt tokens, vocabulary], row-major) and exit", cxxopts::value<std::string>());
  // clang-format on
  return options;
}

// data.tokenizer: the BPE that made the model's token files (text in and
// out); none for byte-level models and models of bare ids.
std::optional<BpeTokenizer> load_tokenizer(const LoadedLanguageModel& loaded) {
  std::optional<BpeTokenizer> bpe;
  if (loaded.bytes || loaded.config.data.tokenizer.empty()) return bpe;
  try {
    bpe = BpeTokenizer::load(bpe_vocab_folder(loaded.config.data.tokenizer));
  } catch (const Error& e) {  // DataError (a bad file), ConfigError (gpt2 not installed)
    throw ConfigError(std::string("data.tokenizer '") + loaded.config.data.tokenizer +
                      "' of checkpoint '" + loaded.folder + "': " + e.what());
  }
  const int64_t vocab = loaded.vocab_size;
  if (bpe->vocab_size() > vocab)
    throw ConfigError("data.tokenizer '" + loaded.config.data.tokenizer + "' has " +
                      std::to_string(bpe->vocab_size()) + " tokens, more than the model's " +
                      std::to_string(vocab) + " (not the tokenizer of this model's data?)");
  return bpe;
}

// The prompt as token ids: --prompt through the tokenizer or as bytes, or
// --prompt-tokens, as the model was trained.
std::vector<int64_t> prompt_from_args(const cxxopts::ParseResult& args,
                                      const LoadedLanguageModel& loaded,
                                      const std::optional<BpeTokenizer>& bpe) {
  std::vector<int64_t> prompt;
  if (args.count("special") != 0 && !(bpe && args.count("prompt") != 0))
    throw ConfigError(
        "--special reads special tokens in --prompt text: it needs a --prompt and a "
        "model with data.tokenizer");
  if (bpe && args.count("prompt") != 0) {
    const std::string text = args["prompt"].as<std::string>();
    if (text.empty()) throw ConfigError("--prompt is empty: give the text to continue");
    const bool specials = args.count("special") != 0;
    for (const int32_t id : specials ? bpe->encode_with_specials(text) : bpe->encode(text))
      prompt.push_back(id);
  } else if (loaded.bytes) {
    if (args.count("prompt-tokens") != 0)
      throw ConfigError("this model reads bytes (data.name: text): give --prompt TEXT");
    const std::string text = args.count("prompt") ? args["prompt"].as<std::string>() : "";
    if (text.empty()) throw ConfigError("--prompt is empty: give the text to continue");
    for (unsigned char c : text) prompt.push_back(c);
  } else {
    if (args.count("prompt") != 0)
      throw ConfigError(
          "this model was trained on token ids (data.name: tokens) without data.tokenizer: "
          "give --prompt-tokens ID,ID,... and read ids back");
    if (args.count("prompt-tokens") == 0)
      throw ConfigError("--prompt-tokens is required for a model of token ids");
    prompt = parse_ids(args["prompt-tokens"].as<std::string>());
  }
  return prompt;
}

// What the command line asks of a loaded model.
struct Job {
  std::vector<int64_t> prompt;
  SampleOptions sample;
  std::optional<std::string> logits;  // --logits FILE: write the logits instead of drawing
  bool as_text = false;               // the prompt and the tokens drawn printed as text, not ids
  std::string shown;                  // the prompt as given, when as_text
};

Job job_from_args(const cxxopts::ParseResult& args, const LoadedLanguageModel& loaded,
                  const std::optional<BpeTokenizer>& bpe) {
  Job job;
  job.prompt = prompt_from_args(args, loaded, bpe);
  job.sample.max_new_tokens = args["max-new-tokens"].as<int64_t>();
  job.sample.temperature = args["temperature"].as<double>();
  job.sample.top_k = args["top-k"].as<int64_t>();
  job.sample.seed = args["seed"].as<uint64_t>();
  if (bpe) job.sample.vocab_limit = bpe->vocab_size();  // never an id of the padding
  if (args.count("logits") != 0) job.logits = args["logits"].as<std::string>();
  job.as_text = loaded.bytes || (bpe && args.count("prompt") != 0);
  if (job.as_text) job.shown = args["prompt"].as<std::string>();
  return job;
}

// Prints the prompt, then each token as it is drawn: text as valid UTF-8
// (Utf8Stream), ids space-separated.
void generate(const LoadedLanguageModel& loaded, const std::optional<BpeTokenizer>& bpe,
              const Job& job) {
  Utf8Stream text([](const std::string& s) {
    std::fwrite(s.data(), 1, s.size(), stdout);
    std::fflush(stdout);
  });
  if (job.as_text) {
    std::fwrite(job.shown.data(), 1, job.shown.size(), stdout);
  } else {
    for (std::size_t i = 0; i < job.prompt.size(); ++i)
      std::printf("%s%lld", i ? " " : "", static_cast<long long>(job.prompt[i]));
  }
  std::fflush(stdout);
  sample(*loaded.model, loaded.vocab_size, loaded.block_size, job.prompt, job.sample,
         [&](int64_t token) {
           if (loaded.bytes) {
             text.put(static_cast<unsigned char>(token));
           } else if (job.as_text) {
             for (const char c : bpe->token_bytes(token)) text.put(static_cast<unsigned char>(c));
           } else {
             std::printf(" %lld", static_cast<long long>(token));
             std::fflush(stdout);
           }
         });
  text.finish();
  std::fputs("\n", stdout);
  if (text.replaced() > 0)
    std::fprintf(stderr,
                 "lockstep generate: %zu byte sequence(s) the model drew are not UTF-8; they "
                 "were printed as U+FFFD\n",
                 text.replaced());
}

}  // namespace

int cmd_generate(int argc, char** argv) {
  return run_guarded("generate", [&] {
    cxxopts::Options options = generate_options();
    const auto parsed = parse_command_line(options, argc, argv);
    if (!parsed) return kExitOk;
    const cxxopts::ParseResult& args = *parsed;
    if (args.count("checkpoint") == 0) throw ConfigError("--checkpoint PATH is required");
    const auto loaded =
        load_language_model(checkpoint_folder(args["checkpoint"].as<std::string>()));
    const std::optional<BpeTokenizer> bpe = load_tokenizer(loaded);
    const Job job = job_from_args(args, loaded, bpe);
    sample_check(loaded.vocab_size, loaded.block_size, job.prompt,
                 job.sample);  // before any output
    if (job.logits) {
      write_logits(*loaded.model, job.prompt, *job.logits);
      return kExitOk;
    }
    generate(loaded, bpe, job);
    return kExitOk;
  });
}

}  // namespace lockstep::cli
