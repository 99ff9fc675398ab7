#!/usr/bin/python3
"""Generates tests/golden/moe_{softmax,sigmoid,capacity}_golden.safetensors, the reference
values of kiln's mixture-of-experts Llama (issue 38; token dropping, issue 39).

A 2-block Qwen3-MoE-like decoder written here in plain PyTorch (float64), as transformers'
Qwen3MoeForCausalLM computes it, without transformers: token embedding; per block RMSNorm
(x * rsqrt(mean(x^2) + eps) * w), the fused projection qkv_proj [(NH + 2 NKV) HD, C] split
into q, k, v of head size HD (here HD != C / NH), QK-norm (an RMSNorm over each head's HD
values with the gains q_norm / k_norm [HD], eps norm_eps, after the projection and before
rotary: Qwen3's q_norm/k_norm), rotary in the rotate-half layout with inv_freq =
theta^(-2i/HD) (no rope scaling), grouped-query causal softmax attention scaled by
1/sqrt(HD), o_proj [C, NH HD], residual; RMSNorm and the MoE feed-forward, residual; final
RMSNorm and an untied lm_head. Both blocks are MoE. The MoE of one block, x [N, C] its
N = B T input rows:
  logits [N, E] = x router^T; scores = softmax(logits) or sigmoid(logits);
  the k experts of largest score (ties to the lower index; the script checks that the
  k-th and (k+1)-th router logits of every token are at least MARGIN apart, so that fp32
  kiln chooses the same); w [N, k] = their scores, / their sum when norm_topk_prob;
  y_n = sum_j w[n, j] down_e(silu(gate_e x_n) * up_e x_n)  (e the j-th choice of token n;
  gate_e / up_e rows [0, F) / [F, 2F) of gate_up_proj[e]), plus the shared expert
  down_s(silu(gate_s x_n) * up_s x_n) of width shared_experts * F, ungated.
  (Every expert is evaluated on every token here and weighted by w, 0 off the choices:
  the same sums as kiln's dropless permutation.)
  Token dropping (moe.capacity_factor f > 0; Switch, Megatron-core's get_capacity and
  "position" drop policy): capacity = max(1, ceil((N k / E) f)); going through the
  (token, choice) slots in token order, each expert keeps its first `capacity` and a
  later slot's weight is 0 (the other weights are not renormalised); c_e below counts the
  choice before dropping (as Megatron-core's aux loss).
Losses, c_e the (token, choice) slots routed to expert e in a layer, L the MoE layers:
  aux "hf" (transformers' load_balancing_loss_func, no attention mask; softmax only):
    the L layers' router logits concatenated [L N, E], p = softmax, top-k of p, C_e = the
    slots of e over all layers, S_e = sum of p[., e]; aux = coef E sum_e (C_e / LN)(S_e / LN);
  aux "per_layer" (Switch/GShard, Megatron-core's switch_load_balancing_loss_func):
    coef sum_l E / (N k) sum_e c_e mean_n p[n, e], p = softmax scores, or for sigmoid the
    sigmoid scores normalised per token to sum 1 (Megatron);
  z (ST-MoE, Zoph et al. 2022 eq. 5): coef sum_l mean_n logsumexp_e(logits[n, e])^2;
  tokens with an ignored target count in aux and z.
The optimised loss is LM (mean cross entropy over the non-ignored targets) + aux + z.
The script refuses (check_sharpness) weights under which the router-logit gap above is
under MARGIN in any forward (the AdamW steps' too), or where the aux or z loss moves a
router's gradient by under 1e-2 of its norm (100 times the test's gradient bound).

Three cases, one file each, the same weights, tokens and targets:
  softmax: scoring softmax, norm_topk_prob false, aux_loss_type "hf", z-loss on;
  sigmoid: scoring sigmoid, norm_topk_prob true, aux_loss_type "per_layer", z-loss on;
  capacity: scoring softmax, norm_topk_prob true, aux_loss_type "per_layer", z-loss on,
    capacity_factor 0.8 (capacity 8 of the 44 slots' 8.8 per expert: slots dropped).
The file's metadata "case" names its case.
The embedding rows share a common direction u and layer 0's router row of expert
DEAD_EXPERT points against it, so that this expert receives no token in layer 0 (an
expert with zero rows; its gate_up/down gradients there are exactly 0).

Tensors of each file (kiln's parameter names of a MoE block, issue 38):
  <param>, grad.<param>  every parameter and the gradient of the total loss, F32; the
                         experts stacked: mlp.experts.gate_up_proj.weight [E, 2F, C],
                         mlp.experts.down_proj.weight [E, C, F]
  input_tokens, target_tokens  I32 [B, T] (N_IGNORED targets -1)
  logits [B, T, V]; loss [1] (LM); aux_loss [1]; z_loss [1]; total_loss [1]
                         (aux and z with their coefficients)
  tokens_per_expert      I32 [L, E]: c_e of each MoE layer
  adamw_losses, adamw_aux_losses, adamw_z_losses  [ADAMW_STEPS]: LM, aux and z before
                         each of ADAMW_STEPS torch.optim.AdamW steps on the total loss of
                         the same batch (decay on the parameters of 2 or more dimensions)
The safetensors writer, the metadata conventions and --check are make_gpt2_golden.py's.

Usage: /usr/bin/python3 tests/golden/make_moe_golden.py [--out-dir DIR] [--check [FILE ...]]
"""

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_gpt2_golden as g  # noqa: E402  (the safetensors writer and header check)
import make_llama_golden as llama  # noqa: E402  (rms_norm, rotate_half)

FORMAT_VERSION = "1"

CONFIG = {  # kiln's [model] keys (llama family)
    "n_layer": 2,
    "n_head": 4,
    "n_kv_head": 2,
    "n_embd": 16,
    "head_dim": 12,  # != n_embd / n_head; q is 48 wide, 3 n_embd
    "qk_norm": True,
    "ffn_hidden_size": 40,  # the dense MLP's (no dense block here)
    "vocab_size": 67,
    "padded_vocab_size": 128,
    "block_size": 16,
    "norm_eps": 1e-6,
    "rope_theta": 1000.0,
    "tie_embeddings": False,
    "moe.num_experts": 5,
    "moe.top_k": 2,
    "moe.ffn_hidden_size": 12,
    "moe.shared_experts": 1,
    "moe.aux_loss_coef": 0.02,
    "moe.z_loss_coef": 0.005,
    "moe.capacity_factor": 0.0,
}
CASES = {
    "softmax": {"moe.scoring": "softmax", "moe.norm_topk_prob": False, "moe.aux_loss_type": "hf"},
    "sigmoid": {"moe.scoring": "sigmoid", "moe.norm_topk_prob": True,
                "moe.aux_loss_type": "per_layer"},
    "capacity": {"moe.scoring": "softmax", "moe.norm_topk_prob": True,
                 "moe.aux_loss_type": "per_layer", "moe.capacity_factor": 0.8},
}
B, T = 2, 11
IGNORE_INDEX = -1
N_IGNORED = 3
SEED = 20261224  # searched from 20261204: router gaps >= 7e-3, layer 0 leaves expert 1 unused too
ADAMW = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1}
ADAMW_STEPS = 10
MARGIN = 1e-3  # least gap between the k-th and (k+1)-th router logit of any token
DEAD_EXPERT = 4  # receives no token in layer 0
COMMON_SHIFT = 1.0  # the embedding rows' shared direction u, times this
DEAD_ROUTER = 3.0  # layer 0's router row DEAD_EXPERT = -DEAD_ROUTER u / |u| + noise


def case_config(case):
    return {**CONFIG, **CASES[case]}


def out_name(case):
    return f"moe_{case}_golden.safetensors"


def param_specs(cfg):
    """(name, shape) of every parameter in kiln's order (Llama::params() with MoE blocks)."""
    C, nh, nkv, hd = cfg["n_embd"], cfg["n_head"], cfg["n_kv_head"], cfg["head_dim"]
    E, F = cfg["moe.num_experts"], cfg["moe.ffn_hidden_size"]
    Fs = cfg["moe.shared_experts"] * F
    Vp = cfg["padded_vocab_size"]
    specs = [("model.embed_tokens.weight", [Vp, C])]
    for l in range(cfg["n_layer"]):
        p = f"model.layers.{l}."
        specs += [(p + "input_layernorm.weight", [C]),
                  (p + "self_attn.qkv_proj.weight", [(nh + 2 * nkv) * hd, C]),
                  (p + "self_attn.q_norm.weight", [hd]),
                  (p + "self_attn.k_norm.weight", [hd]),
                  (p + "self_attn.o_proj.weight", [C, nh * hd]),
                  (p + "post_attention_layernorm.weight", [C]),
                  (p + "mlp.router.weight", [E, C]),
                  (p + "mlp.experts.gate_up_proj.weight", [E, 2 * F, C]),
                  (p + "mlp.experts.down_proj.weight", [E, C, F]),
                  (p + "mlp.shared_experts.gate_up_proj.weight", [2 * Fs, C]),
                  (p + "mlp.shared_experts.down_proj.weight", [C, Fs])]
    specs += [("model.norm.weight", [C]), ("lm_head.weight", [Vp, C])]
    return specs


def tensor_specs(cfg):
    """(name, safetensors dtype, shape) of every tensor of a file, in file order."""
    params = param_specs(cfg)
    specs = [(n, "F32", s) for n, s in params]
    specs += [("input_tokens", "I32", [B, T]), ("target_tokens", "I32", [B, T]),
              ("logits", "F32", [B, T, cfg["vocab_size"]])]
    specs += [(n, "F32", [1]) for n in ("loss", "aux_loss", "z_loss", "total_loss")]
    specs += [("tokens_per_expert", "I32", [cfg["n_layer"], cfg["moe.num_experts"]])]
    specs += [("grad." + n, "F32", s) for n, s in params]
    specs += [(n, "F32", [ADAMW_STEPS])
              for n in ("adamw_losses", "adamw_aux_losses", "adamw_z_losses")]
    return specs


def metadata(case, torch_version=None):
    m = {
        "format": "pt",
        "kiln.golden": "moe",
        "kiln.golden.version": FORMAT_VERSION,
        "generator": "tests/golden/make_moe_golden.py",
        "generator_fnv1a64": g.fnv1a64(open(os.path.abspath(__file__), "rb").read()),
        "reference_dtype": "float64",
        "batch_size": str(B),
        "seq_len": str(T),
        "ignore_index": str(IGNORE_INDEX),
        "n_targets": str(B * T - N_IGNORED),
        "case": case,
        "seed": str(SEED),
        "dead_expert": str(DEAD_EXPERT),
        "adamw.steps": str(ADAMW_STEPS),
        "adamw.loss": "LM + aux + z (adamw_losses: the LM part)",
        "adamw.decay": "parameters of 2 or more dimensions (embedding, projections, router, "
                       "experts, lm_head)",
        "adamw.grad_clip": "none",
    }
    for k, v in case_config(case).items():
        m[k] = v if isinstance(v, str) else repr(v)
    for k, v in ADAMW.items():
        m["adamw." + k] = repr(v)
    if torch_version is not None:
        m["torch_version"] = torch_version
    return m


# ---- the model (torch is imported only when generating) ---------------------------------

def attention(P, p, h, cfg, cos, sin):
    """Self-attention with QK-norm of h [B, T, C]: [B, T, C] (before the residual)."""
    import math
    import torch.nn.functional as F
    Bb, Tt, _ = h.shape
    nh, nkv, hd, eps = cfg["n_head"], cfg["n_kv_head"], cfg["head_dim"], cfg["norm_eps"]
    q, k, v = F.linear(h, P[p + "self_attn.qkv_proj.weight"]).split(
        [nh * hd, nkv * hd, nkv * hd], dim=-1)
    q = llama.rms_norm(q.view(Bb, Tt, nh, hd), P[p + "self_attn.q_norm.weight"], eps)
    k = llama.rms_norm(k.view(Bb, Tt, nkv, hd), P[p + "self_attn.k_norm.weight"], eps)
    q, k = q.transpose(1, 2), k.transpose(1, 2)  # [B, heads, T, HD]
    v = v.view(Bb, Tt, nkv, hd).transpose(1, 2)
    q = q * cos + llama.rotate_half(q) * sin
    k = k * cos + llama.rotate_half(k) * sin
    k = k.repeat_interleave(nh // nkv, dim=1)  # repeat_kv
    v = v.repeat_interleave(nh // nkv, dim=1)
    att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
    causal = att.new_ones(Tt, Tt).tril().bool()
    att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
    y = (att @ v).transpose(1, 2).reshape(Bb, Tt, nh * hd)
    return F.linear(y, P[p + "self_attn.o_proj.weight"])


def top_k(scores, k):
    """The k largest scores' experts [N, k], ties to the lower index (a stable sort)."""
    import torch
    return torch.sort(scores.detach(), dim=-1, descending=True, stable=True).indices[:, :k]


def capacity_mask(chosen, E, factor):
    """[N, k] 1 for the kept slots of chosen [N, k]: each expert's first
    max(1, ceil((N k / E) factor)) slots in token order; all ones when factor is 0."""
    import math
    import torch
    keep = torch.ones(chosen.shape, dtype=torch.bool)
    if factor <= 0:
        return keep
    N, k = chosen.shape
    capacity = max(1, math.ceil((N * k / E) * factor))
    taken = [0] * E
    for n in range(N):
        for j in range(k):
            e = int(chosen[n, j])
            keep[n, j] = taken[e] < capacity
            taken[e] += 1
    return keep


def route(logits, cfg):
    """Routing of router logits [N, E]: the dense weights w [N, E] (the chosen experts'
    weights, 0 elsewhere and at dropped slots; differentiable) and the chosen experts
    [N, k] (before dropping)."""
    import torch
    scores = logits.softmax(-1) if cfg["moe.scoring"] == "softmax" else logits.sigmoid()
    chosen = top_k(scores, cfg["moe.top_k"])
    w = scores.gather(1, chosen)
    if cfg["moe.norm_topk_prob"]:
        w = w / w.sum(-1, keepdim=True)
    w = w * capacity_mask(chosen, scores.shape[1], cfg["moe.capacity_factor"]).to(w.dtype)
    return torch.zeros_like(scores).scatter(1, chosen, w), chosen


def swiglu(x, gate_up, down):
    """down(silu(gate x) * up x) of x [..., C], gate_up [2F, C] (gate rows first), down [C, F]."""
    import torch.nn.functional as F
    gate, up = F.linear(x, gate_up).chunk(2, dim=-1)
    return F.linear(F.silu(gate) * up, down)


def moe(P, p, x, cfg):
    """The MoE feed-forward of rows x [N, C]: (out [N, C], router logits [N, E], experts
    chosen [N, k])."""
    import torch
    logits = x @ P[p + "mlp.router.weight"].t()
    w, chosen = route(logits, cfg)
    gu, down = P[p + "mlp.experts.gate_up_proj.weight"], P[p + "mlp.experts.down_proj.weight"]
    every = torch.stack([swiglu(x, gu[e], down[e]) for e in range(gu.shape[0])], dim=1)
    routed = (w.unsqueeze(-1) * every).sum(1)  # [N, C]
    shared = swiglu(x, P[p + "mlp.shared_experts.gate_up_proj.weight"],
                    P[p + "mlp.shared_experts.down_proj.weight"])
    return routed + shared, logits, chosen


def forward(P, idx, cfg):
    """logits [B, T, Vp] and, per MoE layer, (router logits [N, E], chosen [N, k])."""
    import torch
    import torch.nn.functional as F
    Bb, Tt = idx.shape
    dt, hd, eps = P["model.norm.weight"].dtype, cfg["head_dim"], cfg["norm_eps"]
    inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hd, 2, dtype=dt) / hd))
    freqs = torch.arange(Tt, dtype=dt)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)  # [T, HD]
    cos, sin = emb.cos(), emb.sin()
    x = P["model.embed_tokens.weight"][idx]
    routers = []
    for l in range(cfg["n_layer"]):
        p = f"model.layers.{l}."
        h = llama.rms_norm(x, P[p + "input_layernorm.weight"], eps)
        x = x + attention(P, p, h, cfg, cos, sin)
        h = llama.rms_norm(x, P[p + "post_attention_layernorm.weight"], eps)
        y, logits, chosen = moe(P, p, h.reshape(Bb * Tt, -1), cfg)
        x = x + y.view_as(x)
        routers.append((logits, chosen))
    x = llama.rms_norm(x, P["model.norm.weight"], eps)
    return F.linear(x, P["lm_head.weight"]), routers


def counts(chosen, E):
    """Slots per expert [E] of chosen experts [N, k]."""
    import torch
    return torch.bincount(chosen.reshape(-1), minlength=E)


def aux_loss(routers, cfg):
    """The load-balancing loss, its coefficient applied ("hf" or "per_layer")."""
    import torch
    E, k, coef = cfg["moe.num_experts"], cfg["moe.top_k"], cfg["moe.aux_loss_coef"]
    if cfg["moe.aux_loss_type"] == "hf":
        assert cfg["moe.scoring"] == "softmax", "aux_loss_type hf is softmax only"
        p = torch.cat([lg for lg, _ in routers]).softmax(-1)  # [L N, E]
        slots = counts(top_k(p, k), E).to(p.dtype)
        LN = p.shape[0]
        return coef * E * ((slots / LN) * (p.sum(0) / LN)).sum()
    total = 0.0
    for lg, chosen in routers:
        p = lg.softmax(-1) if cfg["moe.scoring"] == "softmax" else lg.sigmoid()
        p = p / p.sum(-1, keepdim=True)  # a no-op for softmax
        N = p.shape[0]
        total = total + E / (N * k) * (counts(chosen, E).to(p.dtype) * p.mean(0)).sum()
    return coef * total


def z_loss(routers, cfg):
    return cfg["moe.z_loss_coef"] * sum(lg.logsumexp(-1).pow(2).mean() for lg, _ in routers)


def losses(P, idx, targets, cfg):
    """logits [B, T, V] and a dict of the losses (lm, aux, z, total) and the routers."""
    import torch.nn.functional as F
    V = cfg["vocab_size"]
    logits, routers = forward(P, idx, cfg)
    logits = logits[..., :V]
    lm = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), reduction="mean",
                         ignore_index=IGNORE_INDEX)
    aux, z = aux_loss(routers, cfg), z_loss(routers, cfg)
    return logits, {"lm": lm, "aux": aux, "z": z, "total": lm + aux + z, "routers": routers}


def least_gap(routers, k):
    """The smallest gap between the k-th and (k+1)-th router logit over tokens and layers."""
    gaps = [lg.detach().sort(-1, descending=True).values for lg, _ in routers]
    return min((s[:, k - 1] - s[:, k]).min().item() for s in gaps)


def init_params(cfg, gen):
    """float32 weights, larger than Llama's 0.02 where that makes the test sharper
    (attention far from uniform, SiLU in its curved range, routing far from uniform,
    logits of order 1); the common direction and the dead expert (module docstring)."""
    import torch
    V, C = cfg["vocab_size"], cfg["n_embd"]
    scale = {"qkv_proj": 0.3, "o_proj": 0.15, "router": 0.5, "gate_up_proj": 0.3,
             "down_proj": 0.1, "embed_tokens": 1.0, "lm_head": 0.2}
    P = {}
    for name, shape in param_specs(cfg):
        r = torch.randn(shape, generator=gen, dtype=torch.float32)
        kind = name.split(".")[-2]
        if kind in ("q_norm", "k_norm"):
            t = 1.0 + 0.3 * r  # gains that differ per element: a misapplied one shows
        elif kind.endswith("norm") or kind.endswith("layernorm"):
            t = 1.0 + 0.1 * r
        else:
            t = scale[kind] * r
        if kind in ("embed_tokens", "lm_head"):
            t[V:] = 0.0  # padded vocabulary rows
        P[name] = t.contiguous()
    u = torch.randn(C, generator=gen, dtype=torch.float32)
    P["model.embed_tokens.weight"][:V] += COMMON_SHIFT * u
    router0 = P["model.layers.0.mlp.router.weight"]
    router0[DEAD_EXPERT] = 0.1 * router0[DEAD_EXPERT] - DEAD_ROUTER * u / u.norm()
    return P


def adamw(Q):
    """torch.optim.AdamW over the parameters Q, decaying those of 2 or more dimensions."""
    import torch
    return torch.optim.AdamW(
        [{"params": [p for p in Q.values() if p.dim() >= 2],
          "weight_decay": ADAMW["weight_decay"]},
         {"params": [p for p in Q.values() if p.dim() < 2], "weight_decay": 0.0}],
        lr=ADAMW["lr"], betas=(ADAMW["beta1"], ADAMW["beta2"]), eps=ADAMW["eps"])


def run_reference(P32, idx, targets, cfg, dtype):
    """In `dtype`: logits, the losses, tokens per expert, the gradients of the total loss,
    the losses before each AdamW step and the least router-logit gap of every forward."""
    import torch
    E, k = cfg["moe.num_experts"], cfg["moe.top_k"]
    P = {n: t.detach().to(dtype).clone().requires_grad_(True) for n, t in P32.items()}
    logits, ls = losses(P, idx, targets, cfg)
    ls["total"].backward()
    out = {"logits": logits.detach(), "grads": {n: p.grad.detach().clone() for n, p in P.items()},
           "slots": torch.stack([counts(c, E) for _, c in ls["routers"]]),
           "gap": least_gap(ls["routers"], k), "adamw": []}
    out.update({n: ls[n].detach() for n in ("lm", "aux", "z", "total")})
    Q = {n: t.detach().to(dtype).clone().requires_grad_(True) for n, t in P32.items()}
    opt = adamw(Q)
    for _ in range(ADAMW_STEPS):
        opt.zero_grad(set_to_none=True)
        _, li = losses(Q, idx, targets, cfg)
        out["adamw"].append([li[n].item() for n in ("lm", "aux", "z")])
        out["gap"] = min(out["gap"], least_gap(li["routers"], k))
        li["total"].backward()
        opt.step()
    return out


def balance_shares(P32, idx, targets, cfg):
    """Per MoE layer, ||d aux / d router|| and ||d z / d router|| relative to ||d total /
    d router||: the test sees the balancing losses' gradients mostly through the router's."""
    import torch
    P = {n: t.detach().double().requires_grad_(True) for n, t in P32.items()}
    _, ls = losses(P, idx, targets, cfg)
    routers = [P[f"model.layers.{l}.mlp.router.weight"] for l in range(cfg["n_layer"])]
    grad = {n: torch.autograd.grad(ls[n], routers, retain_graph=True)
            for n in ("aux", "z", "total")}
    return [(n, l, (grad[n][l].norm() / grad["total"][l].norm()).item())
            for n in ("aux", "z") for l in range(len(routers))]


def draw_batch(cfg, gen):
    """input tokens and targets int64 [B, T] (N_IGNORED targets IGNORE_INDEX)."""
    import torch
    V = cfg["vocab_size"]
    idx = torch.randint(0, V, (B, T), generator=gen, dtype=torch.int64)
    targets = torch.randint(0, V, (B, T), generator=gen, dtype=torch.int64)
    targets.view(-1)[torch.randperm(B * T, generator=gen)[:N_IGNORED]] = IGNORE_INDEX
    return idx, targets


def check_sharpness(ref, shares):
    """Refuses weights under which fp32 kiln could route differently, without the dead
    expert, or where the aux or z gradient is within 100x the test's tolerance (1e-4)."""
    print(f"least gap between the k-th and (k+1)-th router logit: {ref['gap']:.2e}")
    assert ref["gap"] >= MARGIN, f"a router near-tie ({ref['gap']:.1e} < {MARGIN}): change SEED"
    print("tokens per expert (layer x expert): " + str(ref["slots"].tolist()))
    assert ref["slots"][0][DEAD_EXPERT] == 0, "the dead expert got tokens in layer 0"
    assert (ref["slots"][1] > 0).all(), "an expert got no token in layer 1"
    for name, layer, share in shares:
        print(f"  |d {name} / d router {layer}| / |d total / d router {layer}| = {share:.2e}")
        assert share >= 1e-2, f"the {name} loss barely moves router {layer}'s gradient"


def print_fp32_distance(ref, r32):
    """How far plain float32 torch lands from the reference: a guide to the test's bounds."""
    grads, worst = ref["grads"], 0.0
    for n in grads:
        if grads[n].norm() > 0:
            worst = max(worst, g.rel(r32["grads"][n].double(), grads[n]))
    print(f"float32 torch vs float64: logits rel "
          f"{g.rel(r32['logits'].double(), ref['logits']):.2e}, total loss rel "
          f"{abs(r32['total'].item() / ref['total'].item() - 1):.2e}, worst grad rel {worst:.2e}")


def blobs_of(P32, idx, targets, ref):
    """The bytes of every tensor of the file, by name."""
    import torch

    def f32(t):
        return t.detach().to(torch.float32).contiguous().numpy().tobytes()

    def i32(t):
        return t.to(torch.int32).contiguous().numpy().tobytes()

    blobs = {n: f32(P32[n]) for n in P32}
    blobs.update({"grad." + n: f32(t) for n, t in ref["grads"].items()})
    blobs.update(input_tokens=i32(idx), target_tokens=i32(targets), logits=f32(ref["logits"]),
                 tokens_per_expert=i32(ref["slots"]))
    for key, name in (("lm", "loss"), ("aux", "aux_loss"), ("z", "z_loss"),
                      ("total", "total_loss")):
        blobs[name] = f32(ref[key].reshape(1))
    adam = torch.tensor(ref["adamw"], dtype=torch.float64)  # [steps, 3]
    for j, name in enumerate(("adamw_losses", "adamw_aux_losses", "adamw_z_losses")):
        blobs[name] = f32(adam[:, j])
    return blobs


def generate(case, out):
    import torch
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    cfg = case_config(case)
    gen = torch.Generator().manual_seed(SEED)
    P32 = init_params(cfg, gen)
    idx, targets = draw_batch(cfg, gen)
    ref = run_reference(P32, idx, targets, cfg, torch.float64)
    print(f"[{case}] lm {ref['lm'].item():.6f} aux {ref['aux'].item():.6f} "
          f"z {ref['z'].item():.6f}; adamw lm " + " ".join(f"{a[0]:.5f}" for a in ref["adamw"]))
    check_sharpness(ref, balance_shares(P32, idx, targets, cfg))
    r32 = run_reference(P32, idx, targets, cfg, torch.float32)
    print_fp32_distance(ref, r32)
    assert torch.equal(r32["slots"], ref["slots"]), "float32 routes differently"
    blobs = blobs_of(P32, idx, targets, ref)
    specs = tensor_specs(cfg)
    g.write_safetensors(out, specs, [blobs[n] for n, _, _ in specs],
                        metadata(case, torch_version=str(torch.__version__)))
    print(f"wrote {out} ({os.path.getsize(out)} bytes)")


def check(path):
    """Exit status 0 when the stored header is what this script writes for the case the
    file's metadata names ("case"); needs no torch."""
    try:
        case = g.read_header(path)["__metadata__"]["case"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"{path}: no safetensors header with a case metadata: {e!r}", file=sys.stderr)
        return 1
    if case not in CASES:
        print(f"{path}: case {case!r} is none of {sorted(CASES)}", file=sys.stderr)
        return 1
    g.CONFIG, g.tensor_specs = case_config(case), tensor_specs
    g.metadata = lambda torch_version=None: metadata(case, torch_version)
    return g.check(path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out-dir", default=HERE,
                    help="where to write the files (default: %(default)s)")
    ap.add_argument("--check", nargs="*", metavar="FILE",
                    help="only check that each FILE's header and metadata match this script "
                         "(default: the files of --out-dir)")
    args = ap.parse_args()
    files = [os.path.join(args.out_dir, out_name(case)) for case in CASES]
    if args.check is not None:
        return max([check(f) for f in args.check or files])
    for case, f in zip(CASES, files):
        generate(case, f)
    return max([check(f) for f in files])


if __name__ == "__main__":
    sys.exit(main())
