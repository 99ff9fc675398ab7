#!/usr/bin/python3
"""The same Llama training step as `kiln bench`, in PyTorch, for bench/compare_pytorch.sh.

Loads the file of `kiln bench CONFIG --dump-init FILE` (arch llama) and trains as kiln
does; the loop, timing and output are bench/pytorch/peer.py's (see there). The model is
kiln's (src/models/llama/llama.h) in fp32 with torch's own ops, shaped like kiln's
parameters so that they load as they are: token embedding (no position table); per block
RMSNorm, one fused q/k/v matmul (qkv_proj = [q; k; v] rows: NH, NKV, NKV heads of HD),
rotary embeddings in the rotate-half layout (inv_freq as Hugging Face / kiln's
rope_inv_freq: fp32 powers of rope_theta, then the llama3 rescaling in double; angles
pos * inv_freq in fp32), grouped-query causal attention written out (torch 1.13 has no
scaled_dot_product_attention: matmul, masked softmax, matmul; each k/v head serves
NH / NKV query heads, by a broadcast over the group rather than a copy of k and v),
o_proj, residual; RMSNorm, SwiGLU (gate_up_proj = [gate; up] rows, down(silu(gate) *
up)), residual; final RMSNorm and the head: lm_head, or the embedding when tied
(tie_embeddings). No biases, no dropout. Kiln's embedding and head have Vp rows, of which
the first V are used.

Mixture of experts ([model.moe], kiln's nn::MoeMlp, src/nn/moe.h): in the blocks kiln
makes MoE (l >= first_k_dense, (l + 1) % sparse_step == 0, l not in dense_layers) the
SwiGLU is replaced by the usual dropless PyTorch implementation (Mixtral's in Hugging
Face transformers): router linear, softmax (or sigmoid) over the E experts, topk, the
k weights renormalised (norm_topk_prob); then per expert the slots routed to it
(nonzero), index_select of their tokens, its SwiGLU as two matmuls with its own weights
(one module per expert, as Mixtral's in transformers: kiln's [E, 2F, C] and [E, C, F]
tensors load as E pairs of [2F, C] and [C, F]), and index_add_ of the weighted outputs
back into the tokens' rows; plus the shared experts (a plain SwiGLU) when
moe.shared_experts > 0.
The balancing losses and the selection bias are not modelled: a file with
moe.aux_loss_coef, moe.z_loss_coef or moe.expert_bias set is refused.

  /usr/bin/python3 bench/pytorch/llama_train.py FILE [--threads N] [--steps N] [--warmup N]
"""
import math
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import peer


def rope_inv_freq(cfg, hd):
    """kiln's rope_inv_freq (src/backend/op.cpp): fp32 theta^(-2i/HD), llama3 rescaling."""
    e = np.arange(0, hd, 2, dtype=np.float32) / np.float32(hd)
    inv = (np.float32(1) / np.power(np.float32(cfg["rope_theta"]), e)).astype(np.float64)
    rs = cfg["rope_scaling"]
    factor = rs["factor"]
    if factor > 0:
        lo, hi, old = rs["low_freq_factor"], rs["high_freq_factor"], rs["original_max_position"]
        wavelen = 2 * math.pi / inv
        smooth = (old / wavelen - lo) / (hi - lo)
        inv = np.where(wavelen > old / lo, inv / factor,
                       np.where(wavelen >= old / hi, (1 - smooth) * inv / factor + smooth * inv, inv))
    return torch.from_numpy(inv.astype(np.float32))


class RMSNorm(nn.Module):
    def __init__(self, C, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(C))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate(x, cos, sin):
    h = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., h:], x[..., :h]), dim=-1) * sin


class SwiGLU(nn.Module):
    """down(silu(gate) * up), gate_up_proj [2F, C] (rows [0, F) gate), down_proj [C, F]."""

    def __init__(self, C, F_):
        super().__init__()
        self.gate_up_proj = nn.Linear(C, 2 * F_, bias=False)
        self.down_proj = nn.Linear(F_, C, bias=False)

    def forward(self, x):
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class MoeMlp(nn.Module):
    """Dropless mixture of experts on x [B, T, C] (see the top of this file)."""

    def __init__(self, C, moe, F_):
        super().__init__()
        self.E, self.k = moe["num_experts"], moe["top_k"]
        self.sigmoid, self.norm_topk = moe["scoring"] == "sigmoid", moe["norm_topk_prob"]
        Fe = moe["ffn_hidden_size"] or F_
        self.router = nn.Linear(C, self.E, bias=False)
        self.experts = nn.ModuleList([SwiGLU(C, Fe) for _ in range(self.E)])
        Fs = moe["shared_experts"] * Fe
        self.shared = SwiGLU(C, Fs) if Fs else None

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])                                  # [N, C]
        logits = self.router(x)                                       # [N, E] fp32
        scores = torch.sigmoid(logits) if self.sigmoid else F.softmax(logits, dim=-1)
        w, idx = scores.topk(self.k, dim=-1)                          # [N, k]
        if self.norm_topk:
            w = w / w.sum(dim=-1, keepdim=True)
        w, idx = w.reshape(-1), idx.reshape(-1)                       # slot n k + j
        out = torch.zeros_like(x)
        for e in range(self.E):
            slots = (idx == e).nonzero(as_tuple=True)[0]
            if slots.numel() == 0:
                continue
            tokens = slots // self.k
            y = self.experts[e](x.index_select(0, tokens))
            out.index_add_(0, tokens, y * w[slots, None])
        if self.shared is not None:
            out = out + self.shared(x)
        return out.view(shape)

    def load_kiln(self, w, prefix):
        self.router.weight.copy_(w[prefix + "router.weight"])
        for e, expert in enumerate(self.experts):
            expert.gate_up_proj.weight.copy_(w[prefix + "experts.gate_up_proj.weight"][e])
            expert.down_proj.weight.copy_(w[prefix + "experts.down_proj.weight"][e])
        if self.shared is not None:
            for name in ("gate_up_proj", "down_proj"):
                getattr(self.shared, name).weight.copy_(w[f"{prefix}shared_experts.{name}.weight"])


class Block(nn.Module):
    def __init__(self, C, NH, NKV, F_, eps, moe=None):
        super().__init__()
        self.NH, self.NKV, self.HD = NH, NKV, C // NH
        self.input_layernorm = RMSNorm(C, eps)
        self.qkv_proj = nn.Linear(C, (NH + 2 * NKV) * self.HD, bias=False)
        self.o_proj = nn.Linear(NH * self.HD, C, bias=False)
        self.post_attention_layernorm = RMSNorm(C, eps)
        self.moe = MoeMlp(C, moe, F_) if moe else None
        if not moe:
            self.gate_up_proj = nn.Linear(C, 2 * F_, bias=False)
            self.down_proj = nn.Linear(F_, C, bias=False)

    def forward(self, x, cos, sin, mask):
        B, T, C = x.shape
        NH, NKV, HD = self.NH, self.NKV, self.HD
        G = NH // NKV
        q, k, v = self.qkv_proj(self.input_layernorm(x)).split([NH * HD, NKV * HD, NKV * HD], dim=2)
        q = rotate(q.view(B, T, NH, HD).transpose(1, 2), cos, sin)   # [B, NH, T, HD]
        k = rotate(k.view(B, T, NKV, HD).transpose(1, 2), cos, sin)  # [B, NKV, T, HD]
        v = v.view(B, T, NKV, HD).transpose(1, 2)
        # Query head h reads k/v head h // G (Hugging Face's repeat_kv): the G query heads
        # of a group as G * T rows against the group's one k and v.
        att = (q.reshape(B, NKV, G * T, HD) @ k.transpose(-2, -1)) * (1.0 / math.sqrt(HD))
        att = att.view(B, NKV, G, T, T).masked_fill(mask, float("-inf"))
        y = F.softmax(att, dim=-1).view(B, NKV, G * T, T) @ v        # [B, NKV, G T, HD]
        y = y.view(B, NH, T, HD).transpose(1, 2).reshape(B, T, NH * HD)
        x = x + self.o_proj(y)
        h = self.post_attention_layernorm(x)
        if self.moe is not None:
            return x + self.moe(h)
        gate, up = self.gate_up_proj(h).chunk(2, dim=-1)
        return x + self.down_proj(F.silu(gate) * up)


def moe_blocks(cfg):
    """kiln's LlamaConfig::is_moe_block for every block (all False for a dense model)."""
    m = cfg.get("moe")
    if not m or m["num_experts"] == 0:
        return [False] * cfg["n_layer"]
    for key in ("aux_loss_coef", "z_loss_coef"):
        if m[key] != 0:
            raise SystemExit(f"llama_train.py: moe.{key} = {m[key]}: the peer has no balancing losses")
    if m["expert_bias"]:
        raise SystemExit("llama_train.py: moe.expert_bias: the peer has no selection bias")
    return [l >= m["first_k_dense"] and (l + 1) % m["sparse_step"] == 0 and l not in m["dense_layers"]
            for l in range(cfg["n_layer"])]


class Llama(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        C, NH, V = cfg["n_embd"], cfg["n_head"], cfg["vocab_size"]
        NKV, eps, BS = cfg["n_kv_head"], cfg["norm_eps"], cfg["block_size"]
        self.tied = cfg["tie_embeddings"]
        self.embed_tokens = nn.Embedding(V, C)
        if cfg.get("qk_norm") or cfg.get("head_dim", 0) not in (0, C // NH):
            raise SystemExit("llama_train.py: qk_norm and an explicit head_dim are not modelled")
        self.layers = nn.ModuleList([Block(C, NH, NKV, cfg["ffn_hidden_size"], eps,
                                           cfg["moe"] if is_moe else None)
                                     for is_moe in moe_blocks(cfg)])
        self.norm = RMSNorm(C, eps)
        self.lm_head = None if self.tied else nn.Linear(C, V, bias=False)
        ang = torch.arange(BS, dtype=torch.float32)[:, None] * rope_inv_freq(cfg, C // NH)[None, :]
        ang = torch.cat((ang, ang), dim=-1)  # [BS, HD]
        self.register_buffer("cos", ang.cos(), persistent=False)
        self.register_buffer("sin", ang.sin(), persistent=False)
        self.register_buffer("mask", peer.causal_mask(BS), persistent=False)

    def forward(self, idx):
        T = idx.shape[1]
        cos, sin, mask = self.cos[:T], self.sin[:T], self.mask[:T, :T]
        x = self.embed_tokens(idx)
        for b in self.layers:
            x = b(x, cos, sin, mask)
        x = self.norm(x)
        return F.linear(x, self.embed_tokens.weight) if self.tied else self.lm_head(x)

    def load_kiln(self, w, V):
        """kiln's parameter names and [out, in] layouts (src/models/llama/llama.h)."""
        with torch.no_grad():
            self.embed_tokens.weight.copy_(w["model.embed_tokens.weight"][:V])
            for i, b in enumerate(self.layers):
                p = f"model.layers.{i}."
                mods = [(b.input_layernorm, "input_layernorm"), (b.qkv_proj, "self_attn.qkv_proj"),
                        (b.o_proj, "self_attn.o_proj"),
                        (b.post_attention_layernorm, "post_attention_layernorm")]
                if b.moe is not None:
                    b.moe.load_kiln(w, p + "mlp.")
                else:
                    mods += [(b.gate_up_proj, "mlp.gate_up_proj"), (b.down_proj, "mlp.down_proj")]
                for mod, name in mods:
                    mod.weight.copy_(w[p + name + ".weight"])
            self.norm.weight.copy_(w["model.norm.weight"])
            if not self.tied:
                self.lm_head.weight.copy_(w["lm_head.weight"][:V])


def build(cfg, w):
    model = Llama(cfg)
    model.load_kiln(w, cfg["vocab_size"])
    desc = (f"Llama L={cfg['n_layer']} NH={cfg['n_head']} NKV={cfg['n_kv_head']} C={cfg['n_embd']} "
            f"F={cfg['ffn_hidden_size']} V={cfg['vocab_size']} "
            f"{'tied' if cfg['tie_embeddings'] else 'untied'}")
    n_moe = sum(moe_blocks(cfg))
    if n_moe:
        m = cfg["moe"]
        desc += (f" | MoE in {n_moe} blocks: E={m['num_experts']} top_k={m['top_k']} "
                 f"expert F={m['ffn_hidden_size'] or cfg['ffn_hidden_size']} shared={m['shared_experts']} "
                 f"{m['scoring']}; {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters")
    return model, desc


if __name__ == "__main__":
    sys.exit(peer.main("llama", build, __doc__))
