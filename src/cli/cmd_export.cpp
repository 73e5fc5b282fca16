// `lockstep export --checkpoint DIR --format safetensors [--layout hf|lockstep] --out DIR`:
// a checkpoint's weights as model.safetensors, in Hugging Face's GPT-2
// layout with its config.json (Note [GPT-2 layout]) or with lockstep's own
// names beside the checkpoint's config.yaml.
#include <cstdio>

#include "common.h"
#include "lockstep/checkpoint/checkpoint.h"
#include "lockstep/cli/generate.h"
#include "lockstep/config/config.h"
#include "lockstep/io/safetensors.h"
#include "lockstep/model/gpt_layout.h"
#include "lockstep/model/llama_layout.h"
#include "lockstep/util/error.h"
#include "lockstep/util/fs.h"

namespace lockstep::cli {

int cmd_export(int argc, char** argv) {
  return run_guarded("export", [&] {
    cxxopts::Options options("lockstep export",
                             "Writes a checkpoint's weights as safetensors (Hugging Face's GPT-2 "
                             "layout, or lockstep's names).");
    // clang-format off
    options.add_options()
        ("checkpoint", "a checkpoint folder, or a run folder (its newest checkpoint)", cxxopts::value<std::string>())
        ("format", "safetensors", cxxopts::value<std::string>()->default_value("safetensors"))
        ("layout", "hf: Hugging Face's names and config.json (GPT2LMHeadModel's, Conv1D weights, for model.name: gpt; LlamaForCausalLM's for llama); lockstep: lockstep's own names", cxxopts::value<std::string>()->default_value("hf"))
        ("out", "the folder to write model.safetensors and config.json (or config.yaml) into", cxxopts::value<std::string>());
    // clang-format on
    const auto parsed = parse_command_line(options, argc, argv);
    if (!parsed) return kExitOk;
    const cxxopts::ParseResult& args = *parsed;
    if (args.count("checkpoint") == 0) throw ConfigError("--checkpoint PATH is required");
    if (args.count("out") == 0) throw ConfigError("--out FOLDER is required");
    if (args["format"].as<std::string>() != "safetensors")
      throw ConfigError("--format: '" + shown_name(args["format"].as<std::string>()) +
                        "' is not one of safetensors");
    const std::string layout = args["layout"].as<std::string>();
    if (layout != "hf" && layout != "lockstep")
      throw ConfigError("--layout: '" + shown_name(layout) + "' is not one of hf, lockstep");
    const std::string folder = checkpoint_folder(args["checkpoint"].as<std::string>());
    const auto loaded = Checkpointer::load(folder, nullptr, {"model.pt"});
    const StateDict& weights = loaded.part("model.pt");
    const Config config = config_load(folder + "/config.yaml");
    const std::string out = args["out"].as<std::string>();
    const bool llama = is_model(config.model.name, BuiltinModel::kLlama);
    if (layout == "hf" && !is_model(config.model.name, BuiltinModel::kGpt) && !llama)
      throw ConfigError("--layout hf is GPT-2's or Llama's; checkpoint '" + folder + "' holds a " +
                        config.model.name + " model: use --layout lockstep");
    // Nothing is overwritten: not an earlier export, not a checkpoint or a
    // run folder (whose MANIFEST would no longer match).
    for (const char* name : {"model.safetensors", "model.safetensors.index.json", "config.json",
                             "config.yaml", "MANIFEST"}) {
      if (path_exists(out + "/" + name))
        throw ConfigError("--out '" + out + "' already holds " + name +
                          ": give an empty or new folder (lockstep export overwrites nothing)");
    }
    make_directories(out);
    std::map<std::string, std::string> metadata{{"format", "pt"}};
    // The config first, each file through a temporary: a failure leaves no
    // model without its config, and no half file.
    // Note [Untrusted model shapes]: config.json says what the weights are.
    int64_t vocab = 0;
    if (layout == "hf") check_language_model_shapes(weights, config.model, folder, &vocab);
    if (layout == "hf" && llama) {
      // lockstep's names are LlamaForCausalLM's (model/llama.h).
      write_file_replacing(out + "/config.json",
                           llama_hf_config_json(llama_options(config.model, vocab)));
      safetensors_save(weights, out + "/model.safetensors", metadata);
    } else if (layout == "hf") {
      const GptOptions gpt = gpt_options(config.model, vocab);
      const StateDict hf = gpt_state_to_hf(weights, gpt);
      write_file_replacing(out + "/config.json", gpt_hf_config_json(gpt));
      safetensors_save(hf, out + "/model.safetensors", metadata);
    } else {
      metadata["layout"] = "lockstep";
      write_file_replacing(out + "/config.yaml", config_to_yaml(config));
      safetensors_save(weights, out + "/model.safetensors", metadata);
    }
    std::printf("exported %zu tensors of %s (step %lld) to %s/model.safetensors (%s layout)\n",
                weights.size(), folder.c_str(), static_cast<long long>(loaded.state.step),
                out.c_str(), layout.c_str());
    return kExitOk;
  });
}

}  // namespace lockstep::cli
