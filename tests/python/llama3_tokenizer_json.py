"""Llama 3's tokenizer.json for lockstep's tokenizer tests, and Hugging Face's
tokenizers as the judge of what it encodes.

    python llama3_tokenizer_json.py make TOKENIZER_MODEL OUT_JSON
    python llama3_tokenizer_json.py encode TOKENIZER_JSON TEXT OUT
    python llama3_tokenizer_json.py hub TOKENIZER_JSON OUT_DIR
    python llama3_tokenizer_json.py logits FOLDER LOGITS IDS

make: transformers' TikTokenConverter (what converted Meta's tokenizer.model
into the tokenizer.json of the Llama 3 checkpoints on the Hub) with Meta's
pattern and 256 special tokens: a Split pre-tokenizer with the pattern, a
ByteLevel without its own regex, model.ignore_merges true.
encode: Tokenizer.from_file(...).encode(text, add_special_tokens=False), the
ids as little-endian uint32.
hub: a folder laid out as the Hub's Llama 3.2 checkpoints are (config.json
with rope_scaling llama3 factor 32 and rope_theta 500000, a tied head, the
vocabulary of 128,256, model.safetensors, tokenizer.json), a random
LlamaForCausalLM of that kind, small (2 layers, 64 wide, 4 query heads
sharing 2).
logits: transformers' logits of FOLDER on the comma-separated IDS against
lockstep generate --logits' float32 file: exit 1 past 1e-4 (bfloat16
weights were trained, the export is float32).
"""
import os
import struct
import sys

from tiktoken_reference import LLAMA3_PAT


def special_tokens():
    names = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
             "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|step_id|>",
             "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>",
             "<|python_tag|>", "<|image|>"]
    return names + [f"<|reserved_special_token_{2 + i}|>" for i in range(256 - len(names))]


def make(model, out):
    from transformers.convert_slow_tokenizer import TikTokenConverter
    tok = TikTokenConverter(vocab_file=model, pattern=LLAMA3_PAT,
                            extra_special_tokens=special_tokens()).converted()
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    tok.save(out)


def encode(path, text, out):
    from tokenizers import Tokenizer
    ids = Tokenizer.from_file(path).encode(open(text, encoding="utf-8").read(),
                                           add_special_tokens=False).ids
    with open(out, "wb") as f:
        f.write(struct.pack(f"<{len(ids)}I", *ids))


def hub(tokenizer_json, out):
    import json
    import shutil
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(7)
    config = LlamaConfig(vocab_size=128256, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=131072, rms_norm_eps=1e-5,
                         tie_word_embeddings=True, bos_token_id=128000, eos_token_id=128001,
                         rope_parameters=dict(rope_type="llama3", rope_theta=500000.0,
                                              factor=32.0, low_freq_factor=1.0,
                                              high_freq_factor=4.0,
                                              original_max_position_embeddings=8192))
    LlamaForCausalLM(config).save_pretrained(out, safe_serialization=True)
    # The Hub's Llama 3.2 folders write the scaling as rope_scaling beside rope_theta.
    path = os.path.join(out, "config.json")
    doc = json.load(open(path))
    rope = doc.pop("rope_parameters")
    doc["rope_theta"] = rope.pop("rope_theta")
    doc["rope_scaling"] = rope
    json.dump(doc, open(path, "w"), indent=2)
    shutil.copy(tokenizer_json, os.path.join(out, "tokenizer.json"))


def logits(folder, ours_path, ids_text):
    import numpy as np
    import torch
    from transformers import LlamaForCausalLM
    ids = [int(x) for x in ids_text.split(",")]
    model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        theirs = model(torch.tensor([ids])).logits[0].numpy()
    ours = np.fromfile(ours_path, dtype="<f4").reshape(len(ids), -1)
    diff = float(np.abs(ours - theirs).max()) if ours.shape == theirs.shape else float("inf")
    print(f"{ours.shape[0]} positions x {ours.shape[1]} logits: largest difference {diff:.3g}")
    sys.exit(0 if diff <= 1e-4 else 1)


if __name__ == "__main__":
    {"make": make, "encode": encode, "hub": hub, "logits": logits}[sys.argv[1]](*sys.argv[2:])
