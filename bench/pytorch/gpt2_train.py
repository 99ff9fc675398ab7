#!/usr/bin/python3
"""The same GPT-2 training step as `kiln bench`, in PyTorch, for bench/compare_pytorch.sh.

Loads the file of `kiln bench CONFIG --dump-init FILE` (arch gpt2) and trains as kiln
does; the loop, timing and output are bench/pytorch/peer.py's (see there). Model: pre-LN
GPT-2 (nanoGPT layout), tanh GELU, causal attention written out (torch 1.13 has no
scaled_dot_product_attention), output projection tied to wte (kiln's wte has Vp rows, of
which the first V are used).

  /usr/bin/python3 bench/pytorch/gpt2_train.py FILE [--threads N] [--steps N] [--warmup N]
"""
import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import peer


class Block(nn.Module):
    def __init__(self, C, n_head, eps):
        super().__init__()
        self.n_head = n_head
        self.ln_1 = nn.LayerNorm(C, eps=eps)
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C, eps=eps)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)

    def forward(self, x, mask):
        B, T, C = x.shape
        nh, hd = self.n_head, C // self.n_head
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q = q.view(B, T, nh, hd).transpose(1, 2)
        k = k.view(B, T, nh, hd).transpose(1, 2)
        v = v.view(B, T, nh, hd).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        att = att.masked_fill(mask[:, :, :T, :T], float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        x = x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))
        return x


class GPT2(nn.Module):
    def __init__(self, n_layer, n_head, C, V, block_size, eps):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(block_size, C)
        self.h = nn.ModuleList([Block(C, n_head, eps) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(C, eps=eps)
        mask = peer.causal_mask(block_size)
        self.register_buffer("mask", mask.view(1, 1, block_size, block_size), persistent=False)

    def forward(self, idx):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe.weight[:T]
        for b in self.h:
            x = b(x, self.mask)
        return F.linear(self.ln_f(x), self.wte.weight)  # tied output projection

    def load_kiln(self, w, V):
        """kiln's parameter names and [out, in] layouts -> this module."""
        with torch.no_grad():
            self.wte.weight.copy_(w["transformer.wte.weight"][:V])
            self.wpe.weight.copy_(w["transformer.wpe.weight"])
            for i, b in enumerate(self.h):
                p = f"transformer.h.{i}."
                for mod, name in [(b.ln_1, "ln_1"), (b.ln_2, "ln_2"), (b.c_attn, "attn.c_attn"),
                                  (b.c_proj, "attn.c_proj"), (b.c_fc, "mlp.c_fc"),
                                  (b.mlp_proj, "mlp.c_proj")]:
                    mod.weight.copy_(w[p + name + ".weight"])
                    mod.bias.copy_(w[p + name + ".bias"])
            self.ln_f.weight.copy_(w["transformer.ln_f.weight"])
            self.ln_f.bias.copy_(w["transformer.ln_f.bias"])


def build(cfg, w):
    L, NH, C, V = cfg["n_layer"], cfg["n_head"], cfg["n_embd"], cfg["vocab_size"]
    # GPT2Config::layernorm_eps: fixed at 1e-5, not part of kiln's GPT-2 config json.
    model = GPT2(L, NH, C, V, cfg["block_size"], cfg.get("layernorm_eps", 1e-5))
    model.load_kiln(w, V)
    return model, f"GPT-2 L={L} NH={NH} C={C} V={V}"


if __name__ == "__main__":
    sys.exit(peer.main("gpt2", build, __doc__))
