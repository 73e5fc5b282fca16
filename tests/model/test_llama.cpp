// The Llama (model/llama.h) and its Hugging Face folders: the parameter
// table against the module, the shape rules, config.json checked field by
// field, hostile indexes; "[.llama_logits]" is the transformers comparison's
// lockstep side (tests/multiproc/llama.sh).
#include <ATen/ATen.h>

#include <cmath>
#include <cstdlib>

#include "lockstep/io/hf_folder.h"
#include "lockstep/io/safetensors.h"
#include "lockstep/io/state_dict.h"
#include "lockstep/model/llama.h"
#include "lockstep/model/llama_layout.h"
#include "lockstep/util/error.h"
#include "lockstep/util/fs.h"
#include "lockstep/util/json.h"
#include "support/catch.h"
#include "support/temp_dir.h"

using namespace lockstep;
using namespace lockstep::testing;

namespace {

LlamaOptions tiny(bool tied) {
  LlamaOptions o;
  o.vocab_size = 50;
  o.block_size = 16;
  o.n_layer = 2;
  o.n_head = 4;
  o.n_kv_head = 2;
  o.n_embd = 32;
  o.intermediate_size = 48;
  o.tie_embeddings = tied;
  return o;
}

}  // namespace

TEST_CASE("Llama: its parameters are the table's, Hugging Face's names", "[llama]") {
  for (bool tied : {false, true}) {
    torch::manual_seed(0);
    Llama model(tiny(tied));
    const auto table = llama_parameter_shapes(tiny(tied));
    const auto params = model.named_parameters();
    REQUIRE(params.size() == table.size());
    size_t i = 0;
    for (const auto& p : params) {
      CHECK(p.key() == table[i].first);
      CHECK(p.value().sizes().vec() == table[i].second);
      ++i;
    }
    const at::Tensor logits = model.forward(at::randint(0, 50, {2, 16}, at::kLong));
    CHECK(logits.sizes() == at::IntArrayRef{2, 16, 50});
    // Causal: the first position's logits do not see the second token.
    at::Tensor a = at::zeros({1, 3}, at::kLong), b = a.clone();
    b[0][1] = 7;
    CHECK(at::allclose(model.forward(a)[0][0], model.forward(b)[0][0]));
    CHECK_FALSE(at::allclose(model.forward(a)[0][1], model.forward(b)[0][1]));
  }
  ModelConfig c;
  c.n_embd = 32;
  c.n_head = 4;
  c.n_kv_head = 3;
  CHECK_THROWS_WITH(llama_options(c, 10), Contains("model.n_kv_head=3 must divide model.n_head=4"));
  c.n_kv_head = 0;
  c.n_head = 32;
  CHECK_THROWS_WITH(llama_options(c, 10), Contains("even head size"));
}

TEST_CASE("Llama's config.json: checked field by field, written back", "[llama]") {
  const LlamaOptions o = tiny(false);
  const std::string ours = llama_hf_config_json(o);
  CHECK_NOTHROW(llama_check_hf_config(ours, o, "config.json"));
  LlamaOptions deeper = o;
  deeper.n_layer = 3;
  CHECK_THROWS_WITH(
      llama_check_hf_config(ours, deeper, "config.json"),
      Contains("num_hidden_layers is 2, but model.n_layer is 3 (--set model.n_layer=2)"));
  const auto edited = [&](const std::string& from, const std::string& to) {
    std::string t = ours;
    t.replace(t.find(from), from.size(), to);
    return t;
  };
  CHECK_THROWS_WITH(llama_check_hf_config(edited("\"llama\"", "\"mistral\""), o, "c"),
                    Contains("model_type is 'mistral', not llama"));
  CHECK_THROWS_WITH(llama_check_hf_config(edited("\"silu\"", "\"gelu\""), o, "c"),
                    Contains("hidden_act 'gelu'"));
  CHECK_THROWS_WITH(
      llama_check_hf_config(edited("\"mlp_bias\": false", "\"mlp_bias\": true"), o, "c"),
      Contains("mlp_bias is true"));
  CHECK_THROWS_WITH(llama_check_hf_config(edited("\"attention_bias\": false",
                                                 "\"rope_scaling\": {\"rope_type\": \"llama3\"}"),
                                          o, "c"),
                    Contains("rope_scaling.rope_type is llama3, but model.rope_scaling is none "
                             "(--set model.rope_scaling=llama3)"));
  CHECK_THROWS_WITH(
      llama_check_hf_config(edited("\"vocab_size\": 50", "\"vocab_size\": 49152"), o, "c"),
      Contains("the data's vocabulary has 50 tokens"));
  CHECK_THROWS_WITH(llama_check_hf_config("[1]", o, "c"), Contains("c: not a JSON object"));
  // transformers 5's rope_parameters: its rope_theta wins, an old "type"
  // is a rope_type, anything but default is refused.
  const auto rope = [&](const std::string& parameters) {
    return edited("\"rope_theta\": 10000",
                  "\"rope_theta\": 10000, \"rope_parameters\": " + parameters);
  };
  CHECK_NOTHROW(
      llama_check_hf_config(rope("{\"rope_theta\": 10000, \"rope_type\": \"default\"}"), o, "c"));
  CHECK_THROWS_WITH(llama_check_hf_config(rope("{\"rope_theta\": 500000}"), o, "c"),
                    Contains("rope_theta 10000 and rope_parameters.rope_theta 500000 differ"));
  CHECK_THROWS_WITH(llama_check_hf_config(rope("{\"type\": \"linear\", \"factor\": 4}"), o, "c"),
                    Contains("rope_parameters.rope_type is 'linear'"));
  // Llama 3.1's scaling, as the Hub's folders write it (rope_scaling) and
  // as transformers 5 does (rope_parameters): each number a model.rope_* key.
  LlamaOptions scaled = o;
  scaled.rope_llama3 = true;
  scaled.rope_factor = 32;
  const std::string llama3 =
      "{\"rope_type\": \"llama3\", \"factor\": 32.0, \"low_freq_factor\": 1.0, "
      "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}";
  const std::string hub =
      edited("\"rope_theta\": 10000", "\"rope_theta\": 10000, \"rope_scaling\": " + llama3);
  CHECK_NOTHROW(llama_check_hf_config(hub, scaled, "c"));
  CHECK_NOTHROW(llama_check_hf_config(rope(llama3), scaled, "c"));
  CHECK_THROWS_WITH(llama_check_hf_config(rope(llama3), o, "c"),
                    Contains("(--set model.rope_scaling=llama3)"));
  CHECK_THROWS_WITH(llama_check_hf_config(ours, scaled, "c"),
                    Contains("no rope scaling, but model.rope_scaling is llama3"));
  LlamaOptions eight = scaled;
  eight.rope_factor = 8;
  CHECK_THROWS_WITH(llama_check_hf_config(hub, eight, "c"),
                    Contains("rope_scaling.factor is 32, but model.rope_factor is 8 (--set "
                             "model.rope_factor=32)"));
  CHECK_THROWS_WITH(
      llama_check_hf_config(rope("{\"rope_type\": \"llama3\", \"factor\": 32.0}"), scaled, "c"),
      Contains("rope_parameters.low_freq_factor is missing"));
  CHECK_THROWS_WITH(
      llama_check_hf_config(rope("{\"rope_type\": \"llama3\", \"factor\": 32.0, \"beta_fast\": 1}"),
                            scaled, "c"),
      Contains("rope_parameters.beta_fast is set"));
  // transformers takes a top-level original_max_position_embeddings over
  // the dict's (Phi-3's layout).
  CHECK_THROWS_WITH(
      llama_check_hf_config(edited("\"rope_theta\": 10000",
                                   "\"rope_theta\": 10000, \"original_max_position_embeddings\": "
                                   "4096, \"rope_scaling\": " +
                                       llama3),
                            scaled, "c"),
      Contains("original_max_position_embeddings is 4096, but "
               "model.rope_original_max_position_embeddings is 8192"));
  // What export writes for it, read back, to the last bit.
  scaled.rope_low_freq_factor = 0.30000000000000004;
  CHECK_NOTHROW(llama_check_hf_config(llama_hf_config_json(scaled), scaled, "c"));
  scaled.rope_low_freq_factor = 1;
  // What export writes for it, read back.
  CHECK_NOTHROW(llama_check_hf_config(llama_hf_config_json(scaled), scaled, "c"));
  CHECK_THROWS_WITH(
      llama_check_hf_config(
          edited("\"tie_word_embeddings\": false", "\"tie_word_embeddings\": \"false\""), o, "c"),
      Contains("tie_word_embeddings is not a boolean"));
  CHECK_THROWS_WITH(
      llama_check_hf_config(
          edited("\"mlp_bias\": false", "\"mlp_bias\": false, \"attention_dropout\": 0.5"), o, "c"),
      Contains("attention_dropout is 0.5"));
  LlamaOptions all_heads = o;
  all_heads.n_kv_head = o.n_head;
  CHECK_NOTHROW(llama_check_hf_config(
      edited("\"num_key_value_heads\": 2", "\"num_key_value_heads\": null"), all_heads, "c"));
  CHECK_THROWS_WITH(
      llama_check_hf_config(edited("\"num_hidden_layers\": 2", "\"num_hidden_layers\": -2"), o,
                            "c"),
      Contains("num_hidden_layers is -2, but model.n_layer is 2") && !Contains("--set"));
}

TEST_CASE("Llama 3.1's rope scaling: the frequencies of the closed form, in three bands",
          "[llama]") {
  // head_dim 16, theta 10000: wavelengths 2 pi / inv_freq from 6.3 to
  // 19,869; with original_max_position_embeddings 64, low 1, high 4 the
  // band edges are 16 and 64: one kept, two blended, five divided by 8.
  LlamaOptions o = tiny(false);
  o.n_embd = 64;
  o.n_head = 4;
  o.rope_llama3 = true;
  o.rope_factor = 8;
  o.rope_low_freq_factor = 1;
  o.rope_high_freq_factor = 4;
  o.rope_original_max_position_embeddings = 64;
  const at::Tensor got = llama_inv_freq(o, at::kCPU);
  REQUIRE(got.numel() == 8);
  int kept = 0, blended = 0, divided = 0;
  for (int64_t i = 0; i < 8; ++i) {
    const double plain = 1 / std::pow(10000.0, 2.0 * static_cast<double>(i) / 16);
    const double wavelen = 2 * M_PI / plain;
    double want = plain;
    if (wavelen > 64) {
      want = plain / 8, ++divided;
    } else if (wavelen >= 16) {
      const double smooth = (64 / wavelen - 1) / (4 - 1);
      want = (1 - smooth) * plain / 8 + smooth * plain, ++blended;
    } else {
      ++kept;
    }
    CHECK(got[i].item<float>() == Approx(want).epsilon(1e-6));
  }
  CHECK(kept == 1);
  CHECK(blended == 2);
  CHECK(divided == 5);
  o.rope_llama3 = false;
  CHECK(llama_inv_freq(o, at::kCPU)[7].item<float>() ==
        Approx(1 / std::pow(10000.0, 14.0 / 16)).epsilon(1e-6));
}

TEST_CASE("Llama weights from a folder: integers, a tied head that differs", "[llama]") {
  const LlamaOptions tied = tiny(true);
  const at::Tensor embed = at::ones({50, 32});
  CHECK_THROWS_WITH(
      llama_state_from_hf({{"model.embed_tokens.weight", at::ones({50, 32}, at::kChar)}}, tied,
                          "f"),
      Contains("f: 'model.embed_tokens.weight' holds Char, not floating-point weights"));
  CHECK_THROWS_WITH(llama_state_from_hf({{"model.embed_tokens.weight", embed},
                                         {"lm_head.weight", at::zeros({50, 32})}},
                                        tied, "f"),
                    Contains("lm_head.weight differs from model.embed_tokens.weight"));
  CHECK_THROWS_WITH(llama_state_from_hf({{"lm_head.weight", embed}}, tied, "f"),
                    Contains("holds lm_head.weight but no model.embed_tokens.weight"));
  // A stored head equal to the embedding is dropped; bfloat16 becomes float32.
  const auto state = llama_state_from_hf(
      {{"model.embed_tokens.weight", embed.to(at::kBFloat16)}, {"lm_head.weight", embed}}, tied,
      "f");
  REQUIRE(state.size() == 1);
  CHECK(state[0].second.scalar_type() == at::kFloat);
}

TEST_CASE("Hugging Face folders: one file, a sharded index, hostile indexes", "[llama]") {
  TempDir dir;
  const std::string f = dir.path;
  write_file(f + "/config.json", "{}");
  CHECK(is_hf_folder(f));
  CHECK_THROWS_WITH(hf_folder_weights(f), Contains("neither model.safetensors nor"));
  safetensors_save({{"a", at::ones({2})}, {"b", at::zeros({3})}}, f + "/one.safetensors");
  safetensors_save({{"c", at::ones({1})}}, f + "/two.safetensors");
  const auto index = [&](const std::string& map) {
    write_file(f + "/model.safetensors.index.json",
               "{\"metadata\": {}, \"weight_map\": {" + map + "}}");
  };
  index("\"a\": \"one.safetensors\", \"b\": \"one.safetensors\", \"c\": \"two.safetensors\"");
  const StateDict all = hf_folder_weights(f);
  REQUIRE(all.size() == 3);
  CHECK(all[2].first == "c");
  index("\"a\": \"../one.safetensors\"");
  CHECK_THROWS_WITH(hf_folder_weights(f),
                    Contains("weight_map['a'] is not a file name in the folder"));
  index("\"a\": \"one.safetensors\", \"c\": \"two.safetensors\"");
  CHECK_THROWS_WITH(hf_folder_weights(f), Contains("holds 'b', which the index does not give"));
  index(
      "\"a\": \"one.safetensors\", \"b\": \"one.safetensors\", \"c\": \"two.safetensors\", \"d\": "
      "\"two.safetensors\"");
  CHECK_THROWS_WITH(hf_folder_weights(f), Contains("'d' is said to be in two.safetensors"));
  index("");
  CHECK_THROWS_WITH(hf_folder_weights(f), Contains("no weight_map"));
  safetensors_save({{"a", at::ones({2})}}, f + "/model.safetensors");
  CHECK_THROWS_WITH(hf_folder_weights(f), Contains("holds both model.safetensors and"));
}

// tests/multiproc/llama.sh with LOCKSTEP_LLAMA_FOLDER (a Hugging Face folder),
// LOCKSTEP_LLAMA_IDS (a .pt holding "ids") and LOCKSTEP_LLAMA_OUT: the
// folder read as model.init_from reads it, its logits on the ids saved.
TEST_CASE("Llama logits of a Hugging Face folder, for tests/multiproc/llama.sh",
          "[.llama_logits]") {
  const char* folder = std::getenv("LOCKSTEP_LLAMA_FOLDER");
  const char* ids_path = std::getenv("LOCKSTEP_LLAMA_IDS");
  const char* out = std::getenv("LOCKSTEP_LLAMA_OUT");
  REQUIRE(folder != nullptr);
  REQUIRE(ids_path != nullptr);
  REQUIRE(out != nullptr);
  const std::string text = hf_config_text(folder);
  const JsonDocument doc(text, "config.json");
  const JsonValue r = doc.root();
  ModelConfig c;
  c.n_embd = static_cast<int64_t>(r.get("hidden_size").number());
  c.n_layer = static_cast<int64_t>(r.get("num_hidden_layers").number());
  c.n_head = static_cast<int64_t>(r.get("num_attention_heads").number());
  c.n_kv_head = static_cast<int64_t>(r.get("num_key_value_heads").number());
  c.intermediate_size = static_cast<int64_t>(r.get("intermediate_size").number());
  const JsonValue theta = r.get("rope_theta").missing() ? r.get("rope_parameters").get("rope_theta")
                                                        : r.get("rope_theta");
  c.rope_theta = theta.is(JsonKind::kNumber) ? theta.number() : 10000.0;
  c.rms_norm_eps = r.get("rms_norm_eps").number();
  c.tie_embeddings = r.get("tie_word_embeddings").boolean();
  c.block_size = static_cast<int64_t>(r.get("max_position_embeddings").number());
  const JsonValue scaling = r.get("rope_scaling").is(JsonKind::kObject) ? r.get("rope_scaling")
                                                                        : r.get("rope_parameters");
  if (scaling.get("rope_type").text() == "llama3") {
    c.rope_scaling = RopeScaling::kLlama3;
    c.rope_factor = scaling.get("factor").number();
    c.rope_low_freq_factor = scaling.get("low_freq_factor").number();
    c.rope_high_freq_factor = scaling.get("high_freq_factor").number();
    c.rope_original_max_position_embeddings =
        static_cast<int64_t>(scaling.get("original_max_position_embeddings").number());
  }
  const LlamaOptions o = llama_options(c, static_cast<int64_t>(r.get("vocab_size").number()));
  llama_check_hf_config(text, o, "config.json");
  Llama model(o);
  state_dict_load(model, llama_state_from_hf(hf_folder_weights(folder), o, folder), folder);
  model.eval();
  at::Tensor ids;
  for (auto& [k, t] : state_dict_load_file(ids_path))
    if (k == "ids") ids = t;
  REQUIRE(ids.defined());
  at::NoGradGuard no_grad;
  state_dict_save_file({{"logits", model.forward(ids)}}, out);
}
