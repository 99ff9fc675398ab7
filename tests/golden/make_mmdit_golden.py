#!/usr/bin/python3
"""Generates tests/golden/mmdit_golden.safetensors, the reference values of kiln's MMDiT.

A small text-conditioned diffusion transformer with joint attention (Esser et al. 2024,
Stable Diffusion 3's MMDiT) trained as a rectified flow, written here in plain PyTorch as
kiln defines it (src/models/mmdit/mmdit.h, src/nn/mmdit_block.h, src/nn/adaln_stream.h,
src/models/mmdit/text_encoder.h), the image side as make_dit_golden.py's:
  xt, target, patches, x = x_embedder.proj(patches) + pos_embed, temb   as the DiT's
  text (per image, its caption alone: no padding slots, so kiln's padding must not matter):
      h = text_encoder.wte[ids] + text_encoder.wpe[0..n-1]
      per text block (GPT-2's, bidirectional): h += c_proj(attn(c_attn(ln_1(h))));
          h += mlp.c_proj(gelu_tanh(mlp.c_fc(ln_2(h))))     LayerNorms with gain and shift
      enc = ln_f(h) [n, C]; ctx = context_embedder(enc); pooled = enc[n - 1] (0 when n = 0)
  c = temb + y_embedder.mlp.2(silu(y_embedder.mlp.0(pooled)))
  per joint block: for each stream s of (x, ctx): mod_s = s.adaLN_modulation.1(silu(c))
      chunked [6] (the last block's context: [2], shift and scale only);
      qkv_s = s.attn.qkv(modulate(norm(s), shift_msa, scale_msa));
      attention over the image's and the caption's tokens together (no mask);
      x = x + gate_msa * x.attn.proj(a_x);  x = x + gate_mlp * x.mlp(modulate(norm(x), ...))
      ctx likewise, except in the last block (pre-only: its output is not used)
  pred = final_layer(x, c) as the DiT's; loss_b = mean over pixels of (pred - v)^2;
  loss = the mean of loss_b over the counted images (counted flag 0; -1 not counted).
kiln zero-initialises every adaLN_modulation and final_layer.linear (adaLN-Zero), which
would make most gradients vanish; here every parameter, biases included, is random.
Captions of 4, 6 (all of kiln's slots), 0 (the empty caption of classifier-free guidance)
and 2 tokens; image 1 is not counted.

With --llama-text-encoder it writes mmdit_llama_golden.safetensors instead: the same model
with model.text.encoder = "llama" (src/models/mmdit/llama_text_encoder.h), a frozen Llama
of width Ct = 24 (not C: the embedders read Ct), 2 query heads over 1 key/value head, 2
blocks, as kiln holds it (fused qkv_proj = [q; k; v] and gate_up_proj = [gate; up] under
text_encoder.model.*, no lm_head):
      h = embed_tokens[ids]; per block: h += o_proj(causal attention of rotary q, k
      (positions 0..n-1, theta^(-2i/HD)), v of rms_norm(h)); h += down_proj(silu(gate) *
      up of rms_norm(h)); enc = rms_norm(h) [n, Ct] (RMSNorms with gains, eps text.norm_eps)
Its parameters are frozen: no gradient (grad.<name> zeros) and no AdamW update.

Weights are drawn in float32 from a fixed seed, the model runs in float64 on a copy.
Tensors (kiln's names and order, MMDiT::params()):
  <param>, grad.<param> (of loss), images F32 [B,S,S,Cin] (x0 in [-1, 1]), noise F32
  [B,S,S,Cin], t F32 [B] in (0, 1), counted I32 [B], captions I32 [B, caption_tokens]
  (ids, then -1), pred F32 [B,N,D] (every image), loss [1], adamw_losses [ADAMW_STEPS]
  (the loss before each AdamW step, the same draws every step).
The safetensors writer and --check are make_gpt2_golden.py's.

Usage: /usr/bin/python3 tests/golden/make_mmdit_golden.py [--llama-text-encoder] [--check]
"""

import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_gpt2_golden as g  # noqa: E402  (the safetensors writer and header check)
import make_dit_golden as dit  # noqa: E402  (patchify, timestep embedding, modulate)
import make_llama_golden as llama  # noqa: E402  (a Llama's parameters)

DEFAULT_OUT = os.path.join(HERE, "mmdit_golden.safetensors")
LLAMA_OUT = os.path.join(HERE, "mmdit_llama_golden.safetensors")
FORMAT_VERSION = "1"

CONFIG = {
    "n_layer": 2,  # block 0 full, block 1 with a pre-only context
    "n_head": 4,
    "n_embd": 32,  # head size 8
    "ffn_hidden_size": 48,
    "image_size": 12,
    "num_channels": 2,
    "patch_size": 4,  # 9 patches
    "vocab_size": 11,
    "caption_tokens": 6,
    "text.n_layer": 1,
    "frequency_dim": 256,
    "norm_eps": 1e-6,
}
B = 4
CAPTIONS = [[3, 7, 2, 10], [5, 1, 4, 9, 8, 6], [], [0, 10]]
COUNTED = [0, -1, 0, 0]  # image 1 is not counted
# The frozen Llama text encoder's keys (--llama-text-encoder), added to CONFIG.
LLAMA_TEXT = {
    "text.encoder": "llama",
    "text.n_layer": 2,
    "text.n_embd": 24,  # Ct != C
    "text.n_head": 2,  # head size 12
    "text.n_kv_head": 1,
    "text.ffn_hidden_size": 40,
    "text.norm_eps": 1e-5,
    "text.rope_theta": 10000.0,
}
SEED = 20261207
ADAMW = {"lr": 2e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1}
ADAMW_STEPS = 10
NO_DECAY_MATRICES = ("pos_embed",)


def stream_specs(prefix, C, H, pre_only):
    specs = [(prefix + "attn.qkv.weight", [3 * C, C]), (prefix + "attn.qkv.bias", [3 * C])]
    if not pre_only:
        specs += [(prefix + "attn.proj.weight", [C, C]), (prefix + "attn.proj.bias", [C]),
                  (prefix + "mlp.fc1.weight", [H, C]), (prefix + "mlp.fc1.bias", [H]),
                  (prefix + "mlp.fc2.weight", [C, H]), (prefix + "mlp.fc2.bias", [C])]
    M = 2 if pre_only else 6
    return specs + [(prefix + "adaLN_modulation.1.weight", [M * C, C]),
                    (prefix + "adaLN_modulation.1.bias", [M * C])]


def llama_text(cfg):
    """Whether the text encoder is the frozen Llama."""
    return cfg.get("text.encoder") == "llama"


def text_width(cfg):
    return cfg["text.n_embd"] if llama_text(cfg) else cfg["n_embd"]


def padded_vocab(cfg):
    return (cfg["vocab_size"] + 127) // 128 * 128  # a kiln Llama's embedding rows


def llama_text_specs(cfg):
    """The frozen Llama's parameters in kiln's order (LlamaTextEncoder::collect): a kiln
    Llama's (make_llama_golden.py's) but lm_head, under text_encoder."""
    shape = {k: cfg["text." + k] for k in ("n_layer", "n_embd", "n_head", "n_kv_head",
                                           "ffn_hidden_size")}
    shape["padded_vocab_size"] = padded_vocab(cfg)
    return [("text_encoder." + n, s) for n, s in llama.param_specs(shape) if n != "lm_head.weight"]


def param_specs(cfg):
    """(name, shape) of every parameter in kiln's order (MMDiT::params(): MMDiTLayers::parts)."""
    C, H, F = cfg["n_embd"], cfg["ffn_hidden_size"], cfg["frequency_dim"]
    V, Lc, Ct = cfg["vocab_size"], cfg["caption_tokens"], text_width(cfg)
    _, _, _, N, D = dit.dims(cfg)
    specs = [("x_embedder.proj.weight", [C, D]), ("x_embedder.proj.bias", [C]),
             ("pos_embed", [N, C]),
             ("t_embedder.mlp.0.weight", [C, F]), ("t_embedder.mlp.0.bias", [C]),
             ("t_embedder.mlp.2.weight", [C, C]), ("t_embedder.mlp.2.bias", [C])]
    specs += llama_text_specs(cfg) if llama_text(cfg) else joint_text_specs(cfg)
    specs += [("context_embedder.weight", [C, Ct]), ("context_embedder.bias", [C]),
              ("y_embedder.mlp.0.weight", [C, Ct]), ("y_embedder.mlp.0.bias", [C]),
              ("y_embedder.mlp.2.weight", [C, C]), ("y_embedder.mlp.2.bias", [C])]
    L = cfg["n_layer"]
    for l in range(L):
        p = f"joint_blocks.{l}."
        specs += stream_specs(p + "x_block.", C, H, False)
        specs += stream_specs(p + "context_block.", C, H, l == L - 1)
    specs += [("final_layer.adaLN_modulation.1.weight", [2 * C, C]),
              ("final_layer.adaLN_modulation.1.bias", [2 * C]),
              ("final_layer.linear.weight", [D, C]), ("final_layer.linear.bias", [D])]
    return specs


def joint_text_specs(cfg):
    """The joint text encoder's parameters in kiln's order (JointTextEncoder::collect)."""
    C, H, V, Lc = cfg["n_embd"], cfg["ffn_hidden_size"], cfg["vocab_size"], cfg["caption_tokens"]
    specs = [("text_encoder.wte.weight", [V, C]), ("text_encoder.wpe.weight", [Lc, C])]
    for l in range(cfg["text.n_layer"]):
        h = f"text_encoder.h.{l}."
        specs += [(h + "ln_1.weight", [C]), (h + "ln_1.bias", [C]),
                  (h + "attn.c_attn.weight", [3 * C, C]), (h + "attn.c_attn.bias", [3 * C]),
                  (h + "attn.c_proj.weight", [C, C]), (h + "attn.c_proj.bias", [C]),
                  (h + "ln_2.weight", [C]), (h + "ln_2.bias", [C]),
                  (h + "mlp.c_fc.weight", [H, C]), (h + "mlp.c_fc.bias", [H]),
                  (h + "mlp.c_proj.weight", [C, H]), (h + "mlp.c_proj.bias", [C])]
    return specs + [("text_encoder.ln_f.weight", [C]), ("text_encoder.ln_f.bias", [C])]


def frozen(name):
    """The frozen Llama text encoder's parameters (the joint one's names differ)."""
    return name.startswith("text_encoder.model.")


def decays(name, shape):
    """kiln's rule: the 2-D weights decay (the text tables too); pos_embed and biases do not."""
    return len(shape) == 2 and name not in NO_DECAY_MATRICES


def tensor_specs(cfg):
    params = param_specs(cfg)
    S, _, Cin, N, D = dit.dims(cfg)
    specs = [(n, "F32", s) for n, s in params]
    specs += [("images", "F32", [B, S, S, Cin]), ("noise", "F32", [B, S, S, Cin]),
              ("t", "F32", [B]), ("counted", "I32", [B]),
              ("captions", "I32", [B, cfg["caption_tokens"]]),
              ("pred", "F32", [B, N, D]), ("loss", "F32", [1])]
    specs += [("grad." + n, "F32", s) for n, s in params]
    specs += [("adamw_losses", "F32", [ADAMW_STEPS])]
    return specs


def metadata(torch_version=None):
    m = {
        "format": "pt",
        "kiln.golden": "mmdit",
        "kiln.golden.version": FORMAT_VERSION,
        "generator": "tests/golden/make_mmdit_golden.py",
        "generator_fnv1a64": g.fnv1a64(open(os.path.abspath(__file__), "rb").read()),
        "reference_dtype": "float64",
        "batch_size": str(B),
        "ignore_index": "-1",  # the counted flag of an image left out of the loss
        "n_targets": str(sum(c == 0 for c in COUNTED)),
        "seed": str(SEED),
        "adamw.steps": str(ADAMW_STEPS),
        "adamw.decay": "2-D parameters except " + " and ".join(NO_DECAY_MATRICES),
        "adamw.grad_clip": "none",
        "adamw.draws": "the same noise and t every step",
    }
    for k, v in CONFIG.items():
        m[k] = repr(v)
    for k, v in ADAMW.items():
        m["adamw." + k] = repr(v)
    if torch_version is not None:
        m["torch_version"] = torch_version
    return m


# ---- the model (torch is imported only when generating) ---------------------------------

def attention(qkv, C, nh):
    """Bidirectional multi-head attention of one sequence's fused rows qkv [T, 3C]."""
    q, k, v = qkv.split(C, dim=-1)
    T, hd = qkv.shape[0], C // nh
    q, k, v = (u.view(T, nh, hd).transpose(0, 1) for u in (q, k, v))
    att = ((q @ k.transpose(-2, -1)) / math.sqrt(hd)).softmax(dim=-1)
    return (att @ v).transpose(0, 1).reshape(T, C)


def text_encoder(P, ids, cfg):
    """enc [n, Ct] of one caption's ids (n >= 1)."""
    return (llama_text_encoder if llama_text(cfg) else joint_text_encoder)(P, ids, cfg)


def rms_norm(x, w, eps):
    return x * (x.pow(2).mean(-1, keepdim=True) + eps).rsqrt() * w


def llama_text_encoder(P, ids, cfg):
    """The frozen Llama's final-norm hidden states [n, Ct] (causal, rotary 0..n-1)."""
    import torch
    import torch.nn.functional as F
    Ct, nh, nkv, Fh = (cfg["text.n_embd"], cfg["text.n_head"], cfg["text.n_kv_head"],
                       cfg["text.ffn_hidden_size"])
    hd, eps, n = Ct // nh, cfg["text.norm_eps"], len(ids)
    h = P["text_encoder.model.embed_tokens.weight"][torch.tensor(ids, dtype=torch.int64)]
    dtype = h.dtype
    inv = 1.0 / (cfg["text.rope_theta"] ** (torch.arange(0, hd, 2, dtype=dtype) / hd))
    freqs = torch.arange(n, dtype=dtype)[:, None] * inv
    cos, sin = torch.cat((freqs, freqs), -1).cos(), torch.cat((freqs, freqs), -1).sin()

    def rotary(u):  # u [heads, n, hd]; rotate_half as Hugging Face's Llama
        return u * cos + torch.cat((-u[..., hd // 2:], u[..., : hd // 2]), -1) * sin

    causal = torch.ones(n, n, dtype=torch.bool).tril()
    for l in range(cfg["text.n_layer"]):
        p = f"text_encoder.model.layers.{l}."
        u = rms_norm(h, P[p + "input_layernorm.weight"], eps)
        q, k, v = F.linear(u, P[p + "self_attn.qkv_proj.weight"]).split(
            [nh * hd, nkv * hd, nkv * hd], dim=-1)
        q = rotary(q.view(n, nh, hd).transpose(0, 1))
        k = rotary(k.view(n, nkv, hd).transpose(0, 1)).repeat_interleave(nh // nkv, dim=0)
        v = v.view(n, nkv, hd).transpose(0, 1).repeat_interleave(nh // nkv, dim=0)
        att = ((q @ k.transpose(-2, -1)) / math.sqrt(hd)).masked_fill(~causal, float("-inf"))
        y = (att.softmax(dim=-1) @ v).transpose(0, 1).reshape(n, nh * hd)
        h = h + F.linear(y, P[p + "self_attn.o_proj.weight"])
        u = rms_norm(h, P[p + "post_attention_layernorm.weight"], eps)
        gate, up = F.linear(u, P[p + "mlp.gate_up_proj.weight"]).split(Fh, dim=-1)
        h = h + F.linear(F.silu(gate) * up, P[p + "mlp.down_proj.weight"])
    return rms_norm(h, P["text_encoder.model.norm.weight"], eps)


def joint_text_encoder(P, ids, cfg):
    """The joint encoder's enc [n, C]."""
    import torch
    import torch.nn.functional as F
    C, nh, eps = cfg["n_embd"], cfg["n_head"], cfg["norm_eps"]
    idx = torch.tensor(ids, dtype=torch.int64)
    h = P["text_encoder.wte.weight"][idx] + P["text_encoder.wpe.weight"][: len(ids)]
    for l in range(cfg["text.n_layer"]):
        p = f"text_encoder.h.{l}."

        def ln(x, name):
            return F.layer_norm(x, (C,), P[p + name + ".weight"], P[p + name + ".bias"], eps)

        a = F.linear(ln(h, "ln_1"), P[p + "attn.c_attn.weight"], P[p + "attn.c_attn.bias"])
        h = h + F.linear(attention(a, C, nh), P[p + "attn.c_proj.weight"],
                         P[p + "attn.c_proj.bias"])
        m = g.gelu_tanh(F.linear(ln(h, "ln_2"), P[p + "mlp.c_fc.weight"], P[p + "mlp.c_fc.bias"]))
        h = h + F.linear(m, P[p + "mlp.c_proj.weight"], P[p + "mlp.c_proj.bias"])
    return F.layer_norm(h, (C,), P["text_encoder.ln_f.weight"], P["text_encoder.ln_f.bias"], eps)


def joint_block(P, p, x, ctx, sc, pre_only, cfg):
    """One joint block on one image's x [N, C] and its context [n, C]; sc = silu(c) [C]."""
    import torch
    import torch.nn.functional as F
    C, nh, eps = cfg["n_embd"], cfg["n_head"], cfg["norm_eps"]

    def lin(name, u):
        return F.linear(u, P[p + name + ".weight"], P[p + name + ".bias"])

    def norm(u):
        return F.layer_norm(u, (C,), None, None, eps)  # no affine part

    def mod(u, shift, scale):
        return u * (1 + scale) + shift

    mx = lin("x_block.adaLN_modulation.1", sc).chunk(6)
    mc = lin("context_block.adaLN_modulation.1", sc).chunk(2 if pre_only else 6)
    qkv = torch.cat([lin("x_block.attn.qkv", mod(norm(x), mx[0], mx[1])),
                     lin("context_block.attn.qkv", mod(norm(ctx), mc[0], mc[1]))])
    a = attention(qkv, C, nh)
    N = x.shape[0]

    def post(s, u, m, au):
        u = u + m[2] * lin(s + "attn.proj", au)
        h = g.gelu_tanh(lin(s + "mlp.fc1", mod(norm(u), m[3], m[4])))
        return u + m[5] * lin(s + "mlp.fc2", h)

    x = post("x_block.", x, mx, a[:N])
    ctx = None if pre_only else post("context_block.", ctx, mc, a[N:])
    return x, ctx


def forward_pred(P, xt, t, captions, cfg):
    """pred [B, N, D] of the noisy images xt at times t, conditioned on the captions."""
    import torch
    import torch.nn.functional as F
    C, eps = cfg["n_embd"], cfg["norm_eps"]
    x_all = F.linear(dit.patchify(xt, cfg), P["x_embedder.proj.weight"],
                     P["x_embedder.proj.bias"]) + P["pos_embed"]
    temb = dit.timestep_embedding(t, cfg["frequency_dim"])
    temb = F.linear(F.silu(F.linear(temb, P["t_embedder.mlp.0.weight"],
                                    P["t_embedder.mlp.0.bias"])),
                    P["t_embedder.mlp.2.weight"], P["t_embedder.mlp.2.bias"])
    preds = []
    L = cfg["n_layer"]
    for b, ids in enumerate(captions):
        if ids:
            enc = text_encoder(P, ids, cfg)
            ctx = F.linear(enc, P["context_embedder.weight"], P["context_embedder.bias"])
            pooled = enc[-1]
        else:
            ctx = torch.zeros(0, C, dtype=x_all.dtype)
            pooled = torch.zeros(text_width(cfg), dtype=x_all.dtype)
        y = F.linear(F.silu(F.linear(pooled, P["y_embedder.mlp.0.weight"],
                                     P["y_embedder.mlp.0.bias"])),
                     P["y_embedder.mlp.2.weight"], P["y_embedder.mlp.2.bias"])
        sc = F.silu(temb[b] + y)
        x = x_all[b]
        for l in range(L):
            x, ctx = joint_block(P, f"joint_blocks.{l}.", x, ctx, sc, l == L - 1, cfg)
        shift, scale = F.linear(sc, P["final_layer.adaLN_modulation.1.weight"],
                                P["final_layer.adaLN_modulation.1.bias"]).chunk(2)
        h = F.layer_norm(x, (C,), None, None, eps) * (1 + scale) + shift
        preds.append(F.linear(h, P["final_layer.linear.weight"], P["final_layer.linear.bias"]))
    return torch.stack(preds)


def mean_loss(P, x0, noise, t, counted, captions, cfg):
    tb = t[:, None, None, None]
    xt = (1 - tb) * x0 + tb * noise
    target = dit.patchify(noise - x0, cfg)
    pred = forward_pred(P, xt, t, captions, cfg)
    per_image = ((pred - target) ** 2).mean(dim=(1, 2))
    return pred, per_image[counted == 0].mean()


def init_params(cfg, gen):
    """float32 weights, all non-zero: attention far from uniform, GELU in its curved range,
    c of order 1, adaLN shifts/scales/gates of order 0.5 (open gates), pred of order 1."""
    import torch
    scale = {"x_embedder.proj.weight": 0.2, "pos_embed": 0.3,
             "t_embedder.mlp.0.weight": 0.07, "t_embedder.mlp.2.weight": 0.2,
             "wte.weight": 0.5, "wpe.weight": 0.3, "ln_1.weight": 0.3, "ln_2.weight": 0.3,
             "ln_f.weight": 0.3, "c_attn.weight": 0.4, "c_proj.weight": 0.2, "c_fc.weight": 0.3,
             "context_embedder.weight": 0.3, "y_embedder.mlp.0.weight": 0.3,
             "y_embedder.mlp.2.weight": 0.3,
             "attn.qkv.weight": 0.4, "attn.proj.weight": 0.3, "mlp.fc1.weight": 0.3,
             "mlp.fc2.weight": 0.15, "adaLN_modulation.1.weight": 0.2,
             "final_layer.linear.weight": 0.3,
             "embed_tokens.weight": 0.5, "layernorm.weight": 0.3, "model.norm.weight": 0.3,
             "qkv_proj.weight": 0.4, "o_proj.weight": 0.3, "gate_up_proj.weight": 0.3,
             "down_proj.weight": 0.2}
    gains = ("ln_1.weight", "ln_2.weight", "ln_f.weight", "layernorm.weight", "model.norm.weight")
    P = {}
    for name, shape in param_specs(cfg):
        r = torch.randn(shape, generator=gen, dtype=torch.float32)
        if name.endswith(".bias"):
            u = 0.1 * r
        else:
            u = next(v for k, v in scale.items() if name.endswith(k)) * r
            if name.endswith(gains):
                u = 1 + u  # norm gains around 1
        if name.endswith("embed_tokens.weight"):
            u[cfg["vocab_size"]:] = 0  # a kiln Llama's padding rows
        P[name] = u.contiguous()
    return P


def generate(out):
    import torch
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    cfg = CONFIG
    gen = torch.Generator().manual_seed(SEED)
    P32 = init_params(cfg, gen)
    images, noise, t = dit.draw_batch(gen, cfg, B)
    counted = torch.tensor(COUNTED, dtype=torch.int64)
    inputs = (images, noise, t, counted, CAPTIONS)

    def run(dtype):
        return dit.run_reference(P32, inputs, cfg, dtype, mean_loss, decays, ADAMW, ADAMW_STEPS,
                                 frozen)

    ref = run(torch.float64)
    dit.report(P32, ref, run(torch.float32))
    Lc = cfg["caption_tokens"]
    slots = torch.tensor([ids + [-1] * (Lc - len(ids)) for ids in CAPTIONS], dtype=torch.int64)
    dit.write_golden(out, tensor_specs(cfg), P32, ref,
                     {"images": images, "noise": noise, "t": t, "counted": counted,
                      "captions": slots}, metadata)


def check(path):
    """Exit status 0 when the stored header is what this script would write (no torch)."""
    g.CONFIG, g.tensor_specs, g.metadata = CONFIG, tensor_specs, metadata
    return g.check(path)


def use_llama_text_encoder():
    CONFIG.update(LLAMA_TEXT)
    CONFIG["padded_vocab_size"] = padded_vocab(CONFIG)


def main():
    llama = "--llama-text-encoder" in sys.argv
    if llama:
        sys.argv.remove("--llama-text-encoder")
        use_llama_text_encoder()
    return g.cli(__doc__, LLAMA_OUT if llama else DEFAULT_OUT, generate, check)


if __name__ == "__main__":
    sys.exit(main())
