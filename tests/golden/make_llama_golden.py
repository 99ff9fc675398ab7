#!/usr/bin/python3
"""Generates tests/golden/llama_golden.safetensors, the reference values of kiln's Llama.

A small Llama 3 written here in plain PyTorch, as Hugging Face's LlamaForCausalLM computes
it (transformers' modeling_llama.py, rewritten without transformers): token embedding;
per block RMSNorm (x * rsqrt(mean(x^2) + eps) * w), q/k/v projections without bias,
rotary embeddings in the rotate-half layout (q * cos + rotate_half(q) * sin, cos/sin of
pos * inv_freq repeated over both halves) with inv_freq = theta^(-2i/HD) rescaled by the
"llama3" rope scaling (transformers' _compute_llama3_parameters), grouped-query
attention (each k/v head repeated n_head / n_kv_head times: repeat_kv), causal softmax
scaled by 1/sqrt(HD), o_proj, residual; RMSNorm, SwiGLU MLP down(silu(gate(x)) * up(x)),
residual; final RMSNorm and an untied lm_head. No dropout. The rope scaling has a small
original_max_position so that it changes frequencies here: one is blended, two divided.

Weights are drawn in float32 from a fixed seed, the model runs in float64 on a copy.
kiln fuses q/k/v and gate/up into one matrix each (src/models/llama/llama.h); the file
stores them so: self_attn.qkv_proj.weight = cat(q_proj, k_proj, v_proj) and
mlp.gate_up_proj.weight = cat(gate_proj, up_proj) along rows, gradients likewise, built
here from the separate torch matrices the reference computes with. Tensors, metadata and
the --check mode are as make_gpt2_golden.py (whose safetensors writer this reuses):
  <param>, grad.<param>, input_tokens, target_tokens, logits [B,T,V], loss [1],
  adamw_losses [ADAMW_STEPS]  (kiln names; embed_tokens and lm_head are [Vp, C], rows
  V..Vp-1 zero).

Usage: /usr/bin/python3 tests/golden/make_llama_golden.py [--check]
"""

import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_gpt2_golden as g  # noqa: E402  (the safetensors writer and header check)

DEFAULT_OUT = os.path.join(HERE, "llama_golden.safetensors")
FORMAT_VERSION = "1"

CONFIG = {
    "n_layer": 2,
    "n_head": 4,
    "n_kv_head": 2,
    "n_embd": 32,  # head size 8
    "ffn_hidden_size": 48,
    "vocab_size": 67,
    "padded_vocab_size": 128,
    "block_size": 16,
    "norm_eps": 1e-5,
    "rope_theta": 1000.0,  # inv_freq 1, .178, .0316, .0056: wavelengths 6, 35, 199, 1117
    "rope_scaling.factor": 8.0,
    "rope_scaling.low_freq_factor": 1.0,
    "rope_scaling.high_freq_factor": 4.0,
    "rope_scaling.original_max_position": 64.0,  # wavelengths 16..64 blended, > 64 / 8
    "tie_embeddings": False,
}
B, T = 2, 11
IGNORE_INDEX = -1
N_IGNORED = 3
SEED = 20250301
# Packed documents (make_gpt2_golden.py's packed case): each sequence's document lengths.
PACKED_DOCS = [[4, 1, 6], [2, 9]]
ADAMW = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1}
ADAMW_STEPS = 10


def dims(cfg):
    C, nh, nkv = cfg["n_embd"], cfg["n_head"], cfg["n_kv_head"]
    return C, nh, nkv, C // nh, cfg["ffn_hidden_size"]


def param_specs(cfg):
    """(name, shape) of every parameter in kiln's order (Llama::params())."""
    C, nh, nkv, hd, F = dims(cfg)
    Vp = cfg["padded_vocab_size"]
    specs = [("model.embed_tokens.weight", [Vp, C])]
    for l in range(cfg["n_layer"]):
        p = f"model.layers.{l}."
        specs += [(p + "input_layernorm.weight", [C]),
                  (p + "self_attn.qkv_proj.weight", [(nh + 2 * nkv) * hd, C]),
                  (p + "self_attn.o_proj.weight", [C, nh * hd]),
                  (p + "post_attention_layernorm.weight", [C]),
                  (p + "mlp.gate_up_proj.weight", [2 * F, C]),
                  (p + "mlp.down_proj.weight", [C, F])]
    specs += [("model.norm.weight", [C]), ("lm_head.weight", [Vp, C])]
    return specs


def hf_specs(cfg):
    """(name, shape) of the parameters as Hugging Face holds them (separate q/k/v, gate/up)."""
    C, nh, nkv, hd, F = dims(cfg)
    Vp = cfg["padded_vocab_size"]
    specs = [("model.embed_tokens.weight", [Vp, C])]
    for l in range(cfg["n_layer"]):
        p = f"model.layers.{l}."
        specs += [(p + "input_layernorm.weight", [C]),
                  (p + "self_attn.q_proj.weight", [nh * hd, C]),
                  (p + "self_attn.k_proj.weight", [nkv * hd, C]),
                  (p + "self_attn.v_proj.weight", [nkv * hd, C]),
                  (p + "self_attn.o_proj.weight", [C, nh * hd]),
                  (p + "post_attention_layernorm.weight", [C]),
                  (p + "mlp.gate_proj.weight", [F, C]),
                  (p + "mlp.up_proj.weight", [F, C]),
                  (p + "mlp.down_proj.weight", [C, F])]
    specs += [("model.norm.weight", [C]), ("lm_head.weight", [Vp, C])]
    return specs


def fuse(P, cfg):
    """kiln's tensors from Hugging Face's: qkv_proj = [q; k; v], gate_up_proj = [gate; up]."""
    import torch
    out = {}
    for name, _ in param_specs(cfg):
        if name.endswith("self_attn.qkv_proj.weight"):
            p = name[: -len("qkv_proj.weight")]
            out[name] = torch.cat([P[p + "q_proj.weight"], P[p + "k_proj.weight"],
                                   P[p + "v_proj.weight"]], dim=0)
        elif name.endswith("mlp.gate_up_proj.weight"):
            p = name[: -len("gate_up_proj.weight")]
            out[name] = torch.cat([P[p + "gate_proj.weight"], P[p + "up_proj.weight"]], dim=0)
        else:
            out[name] = P[name]
    return out


def tensor_specs(cfg):
    params = param_specs(cfg)
    specs = [(n, "F32", s) for n, s in params]
    specs += [("input_tokens", "I32", [B, T]), ("target_tokens", "I32", [B, T]),
              ("logits", "F32", [B, T, cfg["vocab_size"]]), ("loss", "F32", [1])]
    specs += [("grad." + n, "F32", s) for n, s in params]
    specs += [("adamw_losses", "F32", [ADAMW_STEPS])]
    return specs + g.packed_specs(params, B, T)


def metadata(torch_version=None):
    m = {
        "format": "pt",
        "kiln.golden": "llama",
        "kiln.golden.version": FORMAT_VERSION,
        "generator": "tests/golden/make_llama_golden.py",
        "generator_fnv1a64": g.fnv1a64(open(os.path.abspath(__file__), "rb").read()),
        "reference_dtype": "float64",
        "batch_size": str(B),
        "seq_len": str(T),
        "ignore_index": str(IGNORE_INDEX),
        "n_targets": str(B * T - N_IGNORED),
        "seed": str(SEED),
        "adamw.steps": str(ADAMW_STEPS),
        "adamw.decay": "2-D parameters (embedding, projections, lm_head)",
        "adamw.grad_clip": "none",
        "packed.documents": repr(PACKED_DOCS),
    }
    for k, v in CONFIG.items():
        m[k] = repr(v)
    for k, v in ADAMW.items():
        m["adamw." + k] = repr(v)
    if torch_version is not None:
        m["torch_version"] = torch_version
    return m


# ---- the model (torch is imported only when generating) ---------------------------------

def rope_inv_freq(cfg, dtype):
    """theta^(-2i/HD), then the llama3 rescaling (transformers' _compute_llama3_parameters)."""
    import torch
    hd = cfg["n_embd"] // cfg["n_head"]
    inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hd, 2, dtype=dtype) / hd))
    factor = cfg["rope_scaling.factor"]
    lo, hi = cfg["rope_scaling.low_freq_factor"], cfg["rope_scaling.high_freq_factor"]
    old = cfg["rope_scaling.original_max_position"]
    low_wavelen, high_wavelen = old / lo, old / hi
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rms_norm(x, w, eps):
    return x * (x.pow(2).mean(-1, keepdim=True) + eps).rsqrt() * w


def rotate_half(x):
    h = x.shape[-1] // 2
    return __import__("torch").cat((-x[..., h:], x[..., :h]), dim=-1)


def forward_logits(P, idx, cfg, packed=None):
    """packed: (positions [B,T], document ids [B,T]) of packed documents, or None."""
    import torch
    import torch.nn.functional as F
    Bb, Tt = idx.shape
    C, nh, nkv, hd, _ = dims(cfg)
    eps = cfg["norm_eps"]
    dtype = P["model.norm.weight"].dtype
    pos = torch.arange(Tt, dtype=dtype) if packed is None else packed[0].to(dtype)[:, None]
    freqs = pos[..., :, None] * rope_inv_freq(cfg, dtype)  # [T, HD/2] or [B, 1, T, HD/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    causal = g.attention_mask(Tt, None if packed is None else packed[1])
    x = P["model.embed_tokens.weight"][idx]
    for l in range(cfg["n_layer"]):
        p = f"model.layers.{l}."
        h = rms_norm(x, P[p + "input_layernorm.weight"], eps)
        q = F.linear(h, P[p + "self_attn.q_proj.weight"]).view(Bb, Tt, nh, hd).transpose(1, 2)
        k = F.linear(h, P[p + "self_attn.k_proj.weight"]).view(Bb, Tt, nkv, hd).transpose(1, 2)
        v = F.linear(h, P[p + "self_attn.v_proj.weight"]).view(Bb, Tt, nkv, hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(nh // nkv, dim=1)  # repeat_kv
        v = v.repeat_interleave(nh // nkv, dim=1)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(Bb, Tt, nh * hd)
        x = x + F.linear(y, P[p + "self_attn.o_proj.weight"])
        h = rms_norm(x, P[p + "post_attention_layernorm.weight"], eps)
        m = F.silu(F.linear(h, P[p + "mlp.gate_proj.weight"])) * F.linear(h, P[p + "mlp.up_proj.weight"])
        x = x + F.linear(m, P[p + "mlp.down_proj.weight"])
    x = rms_norm(x, P["model.norm.weight"], eps)
    return F.linear(x, P["lm_head.weight"])  # [B, T, Vp]


def mean_loss(P, idx, targets, cfg, packed=None):
    import torch.nn.functional as F
    V = cfg["vocab_size"]
    logits = forward_logits(P, idx, cfg, packed)[..., :V]
    loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), reduction="mean",
                           ignore_index=IGNORE_INDEX)
    return logits, loss


def init_params(cfg, gen):
    """float32 weights; scales larger than Llama's 0.02 where that makes the test sharper
    (attention far from uniform, SiLU in its curved range, logits of order 1)."""
    import torch
    V, L = cfg["vocab_size"], cfg["n_layer"]
    scale = {"q_proj": 0.3, "k_proj": 0.3, "v_proj": 0.2, "o_proj": 0.1, "gate_proj": 0.3,
             "up_proj": 0.2, "down_proj": 0.1 / math.sqrt(2 * L)}
    P = {}
    for name, shape in hf_specs(cfg):
        r = torch.randn(shape, generator=gen, dtype=torch.float32)
        if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
            t = 1.0 + 0.1 * r
        elif name == "model.embed_tokens.weight":
            t = 1.0 * r
        elif name == "lm_head.weight":
            t = 0.2 * r
        else:
            t = scale[name.split(".")[-2]] * r
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            t[V:] = 0.0  # padded vocabulary rows
        P[name] = t.contiguous()
    return P


def run_reference(P32, idx, targets, cfg, dtype):
    """logits, loss, gradients (kiln's fused names) and the AdamW losses in `dtype`."""
    import torch
    P = {n: t.detach().to(dtype).clone().requires_grad_(True) for n, t in P32.items()}
    logits, loss = mean_loss(P, idx, targets, cfg)
    loss.backward()
    grads = fuse({n: p.grad.detach().clone() for n, p in P.items()}, cfg)
    Q = {n: t.detach().to(dtype).clone().requires_grad_(True) for n, t in P32.items()}
    opt = torch.optim.AdamW(
        [{"params": [p for p in Q.values() if p.dim() == 2], "weight_decay": ADAMW["weight_decay"]},
         {"params": [p for p in Q.values() if p.dim() != 2], "weight_decay": 0.0}],
        lr=ADAMW["lr"], betas=(ADAMW["beta1"], ADAMW["beta2"]), eps=ADAMW["eps"])
    losses = []
    for _ in range(ADAMW_STEPS):
        opt.zero_grad(set_to_none=True)
        _, l = mean_loss(Q, idx, targets, cfg)
        losses.append(l.item())
        l.backward()
        opt.step()
    return logits.detach(), loss.detach(), grads, losses


def generate(out):
    import torch
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    cfg = CONFIG
    V = cfg["vocab_size"]
    gen = torch.Generator().manual_seed(SEED)
    P32 = init_params(cfg, gen)
    idx = torch.randint(0, V, (B, T), generator=gen, dtype=torch.int64)
    targets = torch.randint(0, V, (B, T), generator=gen, dtype=torch.int64)
    targets.view(-1)[torch.randperm(B * T, generator=gen)[:N_IGNORED]] = IGNORE_INDEX

    inv = rope_inv_freq(cfg, torch.float64)
    plain = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, 8, 2, dtype=torch.float64) / 8))
    print("inv_freq plain " + " ".join(f"{x:.5f}" for x in plain) +
          "; llama3-scaled " + " ".join(f"{x:.5f}" for x in inv))
    assert (inv != plain).sum() >= 2, "the rope scaling must change some frequencies"

    logits, loss, grads, losses = run_reference(P32, idx, targets, cfg, torch.float64)
    l32, loss32, g32, _ = run_reference(P32, idx, targets, cfg, torch.float32)
    print(f"float32 torch vs float64: logits rel {g.rel(l32.double(), logits):.2e}, loss rel "
          f"{abs(loss32.item() - loss.item()) / loss.item():.2e}, worst grad rel "
          f"{max(g.rel(g32[n].double(), grads[n]) for n in grads if grads[n].norm() > 0):.2e}")
    print(f"loss {loss.item():.6f}; adamw losses " + " ".join(f"{x:.5f}" for x in losses))
    packed = g.packed_reference(P32, idx, targets, cfg, mean_loss, PACKED_DOCS,
                                lambda gr: fuse(gr, cfg))
    print(f"packed documents {PACKED_DOCS}: loss {packed[2].item():.6f}")

    def f32(t):
        return t.detach().to(torch.float32).contiguous().numpy().tobytes()

    P = fuse(P32, cfg)
    blobs = {}
    for name, _ in param_specs(cfg):
        blobs[name] = f32(P[name])
        blobs["grad." + name] = f32(grads[name])
    blobs["input_tokens"] = idx.to(torch.int32).contiguous().numpy().tobytes()
    blobs["target_tokens"] = targets.to(torch.int32).contiguous().numpy().tobytes()
    blobs["logits"] = f32(logits)
    blobs["loss"] = f32(loss.reshape(1))
    blobs["adamw_losses"] = f32(torch.tensor(losses, dtype=torch.float64))
    g.packed_blobs(blobs, [n for n, _ in param_specs(cfg)], *packed)
    specs = tensor_specs(cfg)
    g.write_safetensors(out, specs, [blobs[n] for n, _, _ in specs],
                        metadata(torch_version=str(torch.__version__)))
    print(f"wrote {out} ({os.path.getsize(out)} bytes)")


def check(path):
    """Exit status 0 when the stored header is what this script would write (no torch)."""
    g.CONFIG, g.tensor_specs, g.metadata = CONFIG, tensor_specs, metadata
    return g.check(path)


def main():
    return g.cli(__doc__, DEFAULT_OUT, generate, check)


if __name__ == "__main__":
    sys.exit(main())
