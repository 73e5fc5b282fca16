"""lockstep's model.name: gpt (src/model/gpt.cpp) in PyTorch: GPT-2 as
nanoGPT's model.py writes it, with the same parameter names, less lm_head:
the output head is the token embedding's own weight (F.linear below), so a
lockstep checkpoint's model.pt loads here with strict=True and back."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class LayerNorm(nn.Module):
    def __init__(self, n, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.bias = nn.Parameter(torch.zeros(n)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


def causal_attention(q, k, v, dropout, training):
    p = dropout if training else 0.0
    if hasattr(F, "scaled_dot_product_attention"):  # PyTorch 2.x, as lockstep on LibTorch 2.x
        return F.scaled_dot_product_attention(q, k, v, None, p, True)
    # 1.13: the same product written out as lockstep on LibTorch 1.13 writes it
    # (src/util/torch_compat.cpp): one baddbmm adds the causal mask as a
    # bias of 0 and -inf to scale x q k^T.
    b, h, t, hs = q.shape
    bias = torch.full((t, t), float("-inf"), dtype=q.dtype).triu(1)
    att = torch.baddbmm(bias, q.reshape(-1, t, hs), k.reshape(-1, t, hs).transpose(1, 2),
                        beta=1, alpha=1.0 / math.sqrt(hs))
    att = torch.softmax(att, -1)
    if p > 0:
        att = F.dropout(att, p, True)
    return torch.bmm(att, v.reshape(-1, t, v.size(-1))).view(b, h, t, v.size(-1))


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_attn = nn.Linear(c.n_embd, 3 * c.n_embd, bias=c.bias)
        self.c_proj = nn.Linear(c.n_embd, c.n_embd, bias=c.bias)
        self.n_head, self.dropout = c.n_head, c.dropout

    def forward(self, x):
        b, t, n = x.shape
        q, k, v = self.c_attn(x).split(n, 2)
        heads = lambda z: z.view(b, t, self.n_head, n // self.n_head).transpose(1, 2)
        y = causal_attention(heads(q), heads(k), heads(v), self.dropout, self.training)
        y = y.transpose(1, 2).contiguous().view(b, t, n)
        return F.dropout(self.c_proj(y), self.dropout, self.training)


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc = nn.Linear(c.n_embd, 4 * c.n_embd, bias=c.bias)
        self.c_proj = nn.Linear(4 * c.n_embd, c.n_embd, bias=c.bias)
        self.dropout = c.dropout

    def forward(self, x):
        return F.dropout(self.c_proj(F.gelu(self.c_fc(x))), self.dropout, self.training)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1, self.attn = LayerNorm(c.n_embd, c.bias), Attention(c)
        self.ln_2, self.mlp = LayerNorm(c.n_embd, c.bias), MLP(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, c):  # c: vocab_size, block_size, n_layer, n_head, n_embd, dropout, bias
        super().__init__()
        self.config = c
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(c.vocab_size, c.n_embd),
            wpe=nn.Embedding(c.block_size, c.n_embd),
            h=nn.ModuleList([Block(c) for _ in range(c.n_layer)]),
            ln_f=LayerNorm(c.n_embd, c.bias)))
        for name, p in self.named_parameters():  # GPT-2's initialisation
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * c.n_layer))
            elif name.endswith("weight") and p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)
            elif name.endswith("bias") and ".ln_" not in name and "ln_f" not in name:
                nn.init.zeros_(p)

    def forward(self, idx, targets=None):
        t = idx.size(1)
        tr = self.transformer
        x = F.dropout(tr.wte(idx) + tr.wpe.weight[:t], self.config.dropout, self.training)
        for block in tr.h:
            x = block(x)
        logits = F.linear(tr.ln_f(x), tr.wte.weight)  # the head is the token embedding
        if targets is None:
            return logits
        return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    @torch.no_grad()
    def greedy(self, idx, new_tokens):
        for _ in range(new_tokens):
            logits = self(idx[:, -self.config.block_size:])
            idx = torch.cat([idx, logits[:, -1].argmax(-1, keepdim=True)], 1)
        return idx
