"""PyTorch's side of scripts/bench_llama.sh: transformers' LlamaForCausalLM
of the same shape as lockstep's model.name: llama run (the bytes of a text,
vocabulary 256), under PyTorch's own DistributedDataParallel, AdamW and
clipping 1.0, the windows in DistributedSampler's order. Run under
lockstep-run or torchrun. Prints one JSON line on rank 0: tokens/s over the
timed steps (the slowest rank's time)."""
import argparse
import json
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

p = argparse.ArgumentParser()
p.add_argument("--text", required=True)
p.add_argument("--backend", default="gloo")
p.add_argument("--steps", type=int, default=40)
p.add_argument("--warmup", type=int, default=10)
p.add_argument("--n_layer", type=int, default=4)
p.add_argument("--n_head", type=int, default=4)
p.add_argument("--n_kv_head", type=int, default=2)
p.add_argument("--n_embd", type=int, default=128)
p.add_argument("--intermediate_size", type=int, default=384)
p.add_argument("--block_size", type=int, default=128)
p.add_argument("--batch_size", type=int, default=16)
a = p.parse_args()
dist.init_process_group(a.backend)
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
config = LlamaConfig(vocab_size=256, hidden_size=a.n_embd, intermediate_size=a.intermediate_size,
                     num_hidden_layers=a.n_layer, num_attention_heads=a.n_head,
                     num_key_value_heads=a.n_kv_head, max_position_embeddings=a.block_size,
                     tie_word_embeddings=False)
model = torch.nn.parallel.DistributedDataParallel(LlamaForCausalLM(config))
opt = torch.optim.AdamW(model.parameters(), lr=2e-3, betas=(0.9, 0.99), weight_decay=0.1)
data = torch.tensor(list(open(a.text, "rb").read()), dtype=torch.long)
t = a.block_size
windows = (len(data) - 1) // t
order = list(torch.utils.data.distributed.DistributedSampler(range(windows), world, rank, seed=0))
for step in range(a.warmup + a.steps):
    if step == a.warmup:
        dist.barrier()
        start = time.perf_counter()
    rows = order[step * a.batch_size:(step + 1) * a.batch_size]
    x = torch.stack([data[i * t:i * t + t] for i in rows])
    y = torch.stack([data[i * t + 1:i * t + t + 1] for i in rows])
    opt.zero_grad(set_to_none=True)
    logits = model(input_ids=x).logits
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
if rank == 0:
    print(json.dumps({"impl": "pytorch (%s, transformers)" % a.backend,
                      "tokens_per_s": world * a.batch_size * t * a.steps / elapsed.item()}), flush=True)
dist.destroy_process_group()
