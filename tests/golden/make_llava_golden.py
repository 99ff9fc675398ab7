#!/usr/bin/python3
"""Generates tests/golden/llava_golden.safetensors, the reference values of kiln's LLaVA.

A small LLaVA written here in plain PyTorch, as kiln defines it (src/models/llava/llava.h;
Liu et al. 2023): a ViT trunk over the image (make_vit_golden.py's patches, positions and
pre-LN blocks, with no class token and no final norm), read at block feature_layer (-2:
the last block does not run, as LLaVA-1.5's vision_feature_layer); a projector
linear_2(GELU_tanh(linear_1(feats))); the decoder make_llama_golden.py's Llama (rotary
without rescaling here) on each sample's sequence [embed(text[:a]); image tokens;
embed(text[a:])], a = image_at (-1, text only: the image after the text). The targets are
over the whole sequence: caption id i at position pos(i) - 1, pos(i) = i + (i >= a >= 0 ?
N : 0), where its loss flag is set (kiln's PairData does the same from a shard); the loss
is their mean. One decoder block is frozen (train.freeze), so the gradient flows through
a frozen part. Three samples: the image inside the text, first, and absent.

Weights are drawn in float32 from a fixed seed, the model runs in float64 on a copy.
Tensors (kiln's names, src/models/llava/llava.h):
  <param>, grad.<trainable param>, adamw_final.<param> (after ADAMW_STEPS AdamW steps on
  the batch; a frozen one unchanged), images F32 [B, S, S, Cin], tokens I32 [B, Lt],
  image_at I32 [B], targets I32 [B, N + Lt], loss [1], adamw_losses [ADAMW_STEPS].
The safetensors writer and --check are make_gpt2_golden.py's.

Usage: /usr/bin/python3 tests/golden/make_llava_golden.py [--check]
"""

import fnmatch
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_gpt2_golden as g  # noqa: E402  (the safetensors writer and header check)
import make_llama_golden as llama  # noqa: E402  (rms_norm, rotate_half)
import make_vit_golden as vit  # noqa: E402  (patchify)

DEFAULT_OUT = os.path.join(HERE, "llava_golden.safetensors")
FORMAT_VERSION = "1"

CONFIG = {
    "n_layer": 2,
    "n_head": 4,
    "n_kv_head": 2,
    "n_embd": 32,  # head size 8
    "ffn_hidden_size": 48,
    "vocab_size": 67,
    "padded_vocab_size": 128,
    "block_size": 16,  # 9 image tokens and 7 text slots
    "norm_eps": 1e-5,
    "rope_theta": 1000.0,
    "vision.n_layer": 3,
    "vision.n_head": 2,
    "vision.n_embd": 16,
    "vision.ffn_hidden_size": 24,
    "vision.patch_size": 4,
    "vision.norm_eps": 1e-5,
    "vision.feature_layer": -2,
    "image_size": 12,
    "num_channels": 2,
}
B = 3
IMAGE_AT = [2, 0, -1]  # inside the text, first, none
LENGTHS = [7, 5, 6]    # caption ids per sample (the rest padded with EOT)
EOT = 66
FREEZE = "language_model.model.layers.0.*"
IGNORE_INDEX = -1
SEED = 20261206
ADAMW = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1}
ADAMW_STEPS = 4


def dims(cfg):
    S, P, Cin = cfg["image_size"], cfg["vision.patch_size"], cfg["num_channels"]
    N = (S // P) ** 2
    return S, P, Cin, N, cfg["block_size"] - N


def vision_cfg(cfg):
    """make_vit_golden.py's names for the trunk's shape (its patchify)."""
    return {"image_size": cfg["image_size"], "patch_size": cfg["vision.patch_size"],
            "num_channels": cfg["num_channels"]}


def param_specs(cfg):
    """(name, shape) of every parameter in kiln's order (Llava::params())."""
    S, P, Cin, N, _ = dims(cfg)
    Cv, H = cfg["vision.n_embd"], cfg["vision.ffn_hidden_size"]
    C, nh, nkv, F = cfg["n_embd"], cfg["n_head"], cfg["n_kv_head"], cfg["ffn_hidden_size"]
    hd, Vp = C // nh, cfg["padded_vocab_size"]
    v = "vision_tower."
    specs = [(v + "patch_embed.proj.weight", [Cv, Cin * P * P]), (v + "patch_embed.proj.bias", [Cv]),
             (v + "pos_embed", [N, Cv])]
    for l in range(cfg["vision.n_layer"]):
        p = f"{v}blocks.{l}."
        specs += [(p + "norm1.weight", [Cv]), (p + "norm1.bias", [Cv]),
                  (p + "attn.qkv.weight", [3 * Cv, Cv]), (p + "attn.qkv.bias", [3 * Cv]),
                  (p + "attn.proj.weight", [Cv, Cv]), (p + "attn.proj.bias", [Cv]),
                  (p + "norm2.weight", [Cv]), (p + "norm2.bias", [Cv]),
                  (p + "mlp.fc1.weight", [H, Cv]), (p + "mlp.fc1.bias", [H]),
                  (p + "mlp.fc2.weight", [Cv, H]), (p + "mlp.fc2.bias", [Cv])]
    m = "multi_modal_projector."
    specs += [(m + "linear_1.weight", [C, Cv]), (m + "linear_1.bias", [C]),
              (m + "linear_2.weight", [C, C]), (m + "linear_2.bias", [C])]
    t = "language_model."
    specs += [(t + "model.embed_tokens.weight", [Vp, C])]
    for l in range(cfg["n_layer"]):
        p = f"{t}model.layers.{l}."
        specs += [(p + "input_layernorm.weight", [C]),
                  (p + "self_attn.qkv_proj.weight", [(nh + 2 * nkv) * hd, C]),
                  (p + "self_attn.o_proj.weight", [C, nh * hd]),
                  (p + "post_attention_layernorm.weight", [C]),
                  (p + "mlp.gate_up_proj.weight", [2 * F, C]),
                  (p + "mlp.down_proj.weight", [C, F])]
    specs += [(t + "model.norm.weight", [C]), (t + "lm_head.weight", [Vp, C])]
    return specs


def trainable(name):
    return not fnmatch.fnmatchcase(name, FREEZE)


def decays(name, shape):
    """kiln's rule: matrices decay, pos_embed (timm's no_weight_decay) and vectors do not."""
    return len(shape) == 2 and not name.endswith("pos_embed")


def tensor_specs(cfg):
    params = param_specs(cfg)
    S, _, Cin, N, Lt = dims(cfg)
    specs = [(n, "F32", s) for n, s in params]
    specs += [("images", "F32", [B, S, S, Cin]), ("tokens", "I32", [B, Lt]),
              ("image_at", "I32", [B]), ("targets", "I32", [B, N + Lt]), ("loss", "F32", [1])]
    specs += [("grad." + n, "F32", s) for n, s in params if trainable(n)]
    specs += [("adamw_final." + n, "F32", s) for n, s in params]
    specs += [("adamw_losses", "F32", [ADAMW_STEPS])]
    return specs


def metadata(torch_version=None):
    m = {
        "format": "pt",
        "kiln.golden": "llava",
        "kiln.golden.version": FORMAT_VERSION,
        "generator": "tests/golden/make_llava_golden.py",
        "generator_fnv1a64": g.fnv1a64(open(os.path.abspath(__file__), "rb").read()),
        "reference_dtype": "float64",
        "batch_size": str(B),
        "ignore_index": str(IGNORE_INDEX),
        "freeze": FREEZE,
        "seed": str(SEED),
        "adamw.steps": str(ADAMW_STEPS),
        "adamw.decay": "2-D parameters except pos_embed",
        "adamw.grad_clip": "none",
    }
    for k, v in CONFIG.items():
        m[k] = repr(v)
    for k, v in ADAMW.items():
        m["adamw." + k] = repr(v)
    if torch_version is not None:
        m["torch_version"] = torch_version
    return m


# ---- the model (torch is imported only when generating) ---------------------------------

def vision_features(P, images, cfg):
    """The trunk's output at block feature_layer: [B, N, Cv]."""
    import torch.nn.functional as F
    Cv, nh, eps = cfg["vision.n_embd"], cfg["vision.n_head"], cfg["vision.norm_eps"]
    hd = Cv // nh
    Bb = images.shape[0]
    v = "vision_tower."
    x = F.linear(vit.patchify(images, vision_cfg(cfg)), P[v + "patch_embed.proj.weight"],
                 P[v + "patch_embed.proj.bias"]) + P[v + "pos_embed"]
    Tt = x.shape[1]
    for l in range(cfg["vision.n_layer"] + 1 + cfg["vision.feature_layer"]):
        p = f"{v}blocks.{l}."
        h = F.layer_norm(x, (Cv,), P[p + "norm1.weight"], P[p + "norm1.bias"], eps)
        q, k, w = F.linear(h, P[p + "attn.qkv.weight"], P[p + "attn.qkv.bias"]).split(Cv, dim=-1)
        q, k, w = (t.view(Bb, Tt, nh, hd).transpose(1, 2) for t in (q, k, w))
        att = ((q @ k.transpose(-2, -1)) / math.sqrt(hd)).softmax(dim=-1)  # no mask
        y = (att @ w).transpose(1, 2).reshape(Bb, Tt, Cv)
        x = x + F.linear(y, P[p + "attn.proj.weight"], P[p + "attn.proj.bias"])
        h = F.layer_norm(x, (Cv,), P[p + "norm2.weight"], P[p + "norm2.bias"], eps)
        m = g.gelu_tanh(F.linear(h, P[p + "mlp.fc1.weight"], P[p + "mlp.fc1.bias"]))
        x = x + F.linear(m, P[p + "mlp.fc2.weight"], P[p + "mlp.fc2.bias"])
    return x


def spliced(P, images, tokens, image_at, cfg):
    """The decoder's input [B, N + Lt, C]: each sample's text with its image tokens."""
    import torch
    import torch.nn.functional as F
    m = "multi_modal_projector."
    feats = vision_features(P, images, cfg)
    img = F.linear(g.gelu_tanh(F.linear(feats, P[m + "linear_1.weight"], P[m + "linear_1.bias"])),
                   P[m + "linear_2.weight"], P[m + "linear_2.bias"])
    text = P["language_model.model.embed_tokens.weight"][tokens]
    Lt = tokens.shape[1]
    rows = []
    for b in range(tokens.shape[0]):
        a = image_at[b] if image_at[b] >= 0 else Lt
        rows.append(torch.cat([text[b, :a], img[b], text[b, a:]], dim=0))
    return torch.stack(rows)


def decoder_logits(P, x, cfg):
    """make_llama_golden.py's blocks, final norm and head on inputs x [B, T, C]."""
    import torch
    import torch.nn.functional as F
    Bb, Tt, C = x.shape
    nh, nkv = cfg["n_head"], cfg["n_kv_head"]
    hd, eps = C // nh, cfg["norm_eps"]
    inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hd, 2, dtype=x.dtype) / hd))
    freqs = torch.arange(Tt, dtype=x.dtype)[:, None] * inv
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    causal = g.attention_mask(Tt)
    for l in range(cfg["n_layer"]):
        p = f"language_model.model.layers.{l}."
        h = llama.rms_norm(x, P[p + "input_layernorm.weight"], eps)
        q, k, v = F.linear(h, P[p + "self_attn.qkv_proj.weight"]).split(
            [nh * hd, nkv * hd, nkv * hd], dim=-1)
        q = q.reshape(Bb, Tt, nh, hd).transpose(1, 2)
        k = k.reshape(Bb, Tt, nkv, hd).transpose(1, 2)
        v = v.reshape(Bb, Tt, nkv, hd).transpose(1, 2)
        q = q * cos + llama.rotate_half(q) * sin
        k = k * cos + llama.rotate_half(k) * sin
        k = k.repeat_interleave(nh // nkv, dim=1)  # repeat_kv
        v = v.repeat_interleave(nh // nkv, dim=1)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(Bb, Tt, nh * hd)
        x = x + F.linear(y, P[p + "self_attn.o_proj.weight"])
        h = llama.rms_norm(x, P[p + "post_attention_layernorm.weight"], eps)
        gate, up = F.linear(h, P[p + "mlp.gate_up_proj.weight"]).chunk(2, dim=-1)
        x = x + F.linear(F.silu(gate) * up, P[p + "mlp.down_proj.weight"])
    x = llama.rms_norm(x, P["language_model.model.norm.weight"], eps)
    return F.linear(x, P["language_model.lm_head.weight"])  # [B, T, Vp]


def mean_loss(P, batch, cfg):
    import torch.nn.functional as F
    images, tokens, image_at, targets = batch
    V = cfg["vocab_size"]
    logits = decoder_logits(P, spliced(P, images, tokens, image_at, cfg), cfg)[..., :V]
    return F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), reduction="mean",
                           ignore_index=IGNORE_INDEX)


def make_batch(cfg, gen):
    """Images, tokens (padded with EOT), image_at and the targets over the sequence."""
    import torch
    S, _, Cin, N, Lt = dims(cfg)
    V = cfg["vocab_size"]
    images = torch.rand(B, S, S, Cin, generator=gen, dtype=torch.float32) * 2 - 1
    tokens = torch.full((B, Lt), EOT, dtype=torch.int64)
    targets = torch.full((B, N + Lt), IGNORE_INDEX, dtype=torch.int64)
    for b in range(B):
        n, a = LENGTHS[b], IMAGE_AT[b]
        ids = torch.randint(0, V - 1, (n,), generator=gen, dtype=torch.int64)
        flags = torch.rand(n, generator=gen) < 0.6
        tokens[b, :n] = ids
        for i in range(n):
            pos = i + (N if 0 <= a <= i else 0)
            if flags[i] and pos > 0:
                targets[b, pos - 1] = ids[i]
    return images, tokens, IMAGE_AT, targets


def init_params(cfg, gen):
    """float32 weights with scales that make the test sharp (attention far from uniform,
    GELU and SiLU in their curved range, logits of order 1, every bias and gain non-zero)."""
    import torch
    V = cfg["vocab_size"]
    P = {}
    for name, shape in param_specs(cfg):
        r = torch.randn(shape, generator=gen, dtype=torch.float32)
        if name.endswith("norm1.weight") or name.endswith("norm2.weight") or \
                name.endswith("layernorm.weight") or name.endswith("model.norm.weight"):
            t = 1.0 + 0.1 * r
        elif name.endswith(".bias"):
            t = 0.1 * r
        elif name.endswith("embed_tokens.weight"):
            t = 1.0 * r
        elif name.endswith("pos_embed"):
            t = 0.5 * r
        else:
            t = 0.3 * r / math.sqrt(shape[1] / 16)
        if name.endswith("embed_tokens.weight") or name.endswith("lm_head.weight"):
            t[V:] = 0.0  # padded vocabulary rows
        P[name] = t.contiguous()
    return P


def run_reference(P32, batch32, cfg, dtype):
    """loss, the trainable gradients, the AdamW losses and the parameters after them."""
    import torch
    batch = (batch32[0].to(dtype),) + tuple(batch32[1:])

    def fresh():
        return {n: t.detach().to(dtype).clone().requires_grad_(trainable(n))
                for n, t in P32.items()}

    P = fresh()
    loss = mean_loss(P, batch, cfg)
    loss.backward()
    grads = {n: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().clone()
             for n, p in P.items() if trainable(n)}
    Q = fresh()
    train = [(n, p) for n, p in Q.items() if trainable(n)]
    opt = torch.optim.AdamW(
        [{"params": [p for n, p in train if decays(n, p.shape)], "weight_decay": ADAMW["weight_decay"]},
         {"params": [p for n, p in train if not decays(n, p.shape)], "weight_decay": 0.0}],
        lr=ADAMW["lr"], betas=(ADAMW["beta1"], ADAMW["beta2"]), eps=ADAMW["eps"])
    losses = []
    for _ in range(ADAMW_STEPS):
        opt.zero_grad(set_to_none=False)
        for _, p in train:  # an unused parameter (a vision block past feature_layer) gets 0
            p.grad = torch.zeros_like(p)
        l = mean_loss(Q, batch, cfg)
        losses.append(l.item())
        l.backward()
        opt.step()
    final = {n: p.detach().clone() for n, p in Q.items()}
    return loss.detach(), grads, losses, final


def generate(out):
    import torch
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    cfg = CONFIG
    gen = torch.Generator().manual_seed(SEED)
    P32 = init_params(cfg, gen)
    batch = make_batch(cfg, gen)
    loss, grads, losses, final = run_reference(P32, batch, cfg, torch.float64)
    loss32, g32, _, _ = run_reference(P32, batch, cfg, torch.float32)
    print(f"float32 torch vs float64: loss rel {abs(loss32.item() - loss.item()) / loss.item():.2e}, "
          f"worst grad rel "
          f"{max(g.rel(g32[n].double(), grads[n]) for n in grads if grads[n].norm() > 0):.2e}")
    print(f"loss {loss.item():.6f}; adamw losses " + " ".join(f"{x:.5f}" for x in losses))
    unused = [n for n in grads if grads[n].norm() == 0]
    print(f"zero gradients (vision blocks past feature_layer): {len(unused)}")

    def f32(t):
        return t.detach().to(torch.float32).contiguous().numpy().tobytes()

    def i32(t):
        return torch.as_tensor(t).to(torch.int32).contiguous().numpy().tobytes()

    blobs = {}
    for name, _ in param_specs(cfg):
        blobs[name] = f32(P32[name])
        blobs["adamw_final." + name] = f32(final[name])
        if trainable(name):
            blobs["grad." + name] = f32(grads[name])
    images, tokens, image_at, targets = batch
    blobs["images"] = f32(images)
    blobs["tokens"] = i32(tokens)
    blobs["image_at"] = i32(image_at)
    blobs["targets"] = i32(targets)
    blobs["loss"] = f32(loss.reshape(1))
    blobs["adamw_losses"] = f32(torch.tensor(losses, dtype=torch.float64))
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
