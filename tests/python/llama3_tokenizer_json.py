"""Llama 3's tokenizer.json for lockstep's tokenizer tests, and Hugging Face's
tokenizers as the judge of what it encodes.

    python llama3_tokenizer_json.py make TOKENIZER_MODEL OUT_JSON
    python llama3_tokenizer_json.py encode TOKENIZER_JSON TEXT OUT

make: transformers' TikTokenConverter (what converted Meta's tokenizer.model
into the tokenizer.json of the Llama 3 checkpoints on the Hub) with Meta's
pattern and 256 special tokens: a Split pre-tokenizer with the pattern, a
ByteLevel without its own regex, model.ignore_merges true.
encode: Tokenizer.from_file(...).encode(text, add_special_tokens=False), the
ids as little-endian uint32.
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


if __name__ == "__main__":
    {"make": make, "encode": encode}[sys.argv[1]](*sys.argv[2:])
