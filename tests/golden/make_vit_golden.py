#!/usr/bin/python3
"""Generates tests/golden/vit_golden.safetensors, the reference values of kiln's ViT.

A small vision transformer classifier written here in plain PyTorch, as kiln defines it
(src/models/vit/vit.h; Dosovitskiy et al. 2021): images [B, S, S, Cin] (channels last) cut
into P x P patches, each flattened in (channel, row, column) order -- the layout of a
[C, Cin, P, P] convolution weight -- and projected by patch_embed.proj; a class-token row
of zeros appended after the N patches (so its embedding is the projection's bias plus its
position row); learned position embeddings [N + 1, C]; pre-LN blocks (LayerNorm eps 1e-5,
fused q/k/v, bidirectional softmax attention scaled by 1/sqrt(HD), output projection,
residual; LayerNorm, fc1, GELU with the tanh approximation, fc2, residual); the final
LayerNorm of the class token's output and a bias-free head. No dropout. Two input
channels and a non-square patch grid would hide nothing: 12 x 12 images, patch 4, Cin 2.

Weights are drawn in float32 from a fixed seed, the model runs in float64 on a copy.
Tensors (kiln's names, src/models/vit/vit.h):
  <param>, grad.<param>, images F32 [B, S, S, Cin], labels I32 [B] (one -1, ignored),
  logits [B, K], loss [1], adamw_losses [ADAMW_STEPS].
The safetensors writer and --check are make_gpt2_golden.py's.

Usage: /usr/bin/python3 tests/golden/make_vit_golden.py [--check]
"""

import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_gpt2_golden as g  # noqa: E402  (the safetensors writer and header check)

DEFAULT_OUT = os.path.join(HERE, "vit_golden.safetensors")
FORMAT_VERSION = "1"

CONFIG = {
    "n_layer": 2,
    "n_head": 4,
    "n_embd": 32,  # head size 8
    "ffn_hidden_size": 48,
    "image_size": 12,
    "num_channels": 2,
    "patch_size": 4,  # 9 patches + the class token
    "num_classes": 5,
    "norm_eps": 1e-5,
}
B = 4
IGNORE_INDEX = -1
SEED = 20261202
ADAMW = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1}
ADAMW_STEPS = 10


def dims(cfg):
    S, P, Cin = cfg["image_size"], cfg["patch_size"], cfg["num_channels"]
    N = (S // P) ** 2
    return S, P, Cin, N, N + 1, Cin * P * P


def param_specs(cfg):
    """(name, shape) of every parameter in kiln's order (ViT::params())."""
    C, H, K = cfg["n_embd"], cfg["ffn_hidden_size"], cfg["num_classes"]
    _, _, _, _, T, D = dims(cfg)
    specs = [("patch_embed.proj.weight", [C, D]), ("patch_embed.proj.bias", [C]),
             ("pos_embed", [T, C])]
    for l in range(cfg["n_layer"]):
        p = f"blocks.{l}."
        specs += [(p + "norm1.weight", [C]), (p + "norm1.bias", [C]),
                  (p + "attn.qkv.weight", [3 * C, C]), (p + "attn.qkv.bias", [3 * C]),
                  (p + "attn.proj.weight", [C, C]), (p + "attn.proj.bias", [C]),
                  (p + "norm2.weight", [C]), (p + "norm2.bias", [C]),
                  (p + "mlp.fc1.weight", [H, C]), (p + "mlp.fc1.bias", [H]),
                  (p + "mlp.fc2.weight", [C, H]), (p + "mlp.fc2.bias", [C])]
    specs += [("norm.weight", [C]), ("norm.bias", [C]), ("head.weight", [K, C])]
    return specs


def decays(name, shape):
    """kiln's rule: matrices decay, pos_embed (timm's no_weight_decay) and vectors do not."""
    return len(shape) == 2 and name != "pos_embed"


def tensor_specs(cfg):
    params = param_specs(cfg)
    S, _, Cin, _, _, _ = dims(cfg)
    specs = [(n, "F32", s) for n, s in params]
    specs += [("images", "F32", [B, S, S, Cin]), ("labels", "I32", [B]),
              ("logits", "F32", [B, cfg["num_classes"]]), ("loss", "F32", [1])]
    specs += [("grad." + n, "F32", s) for n, s in params]
    specs += [("adamw_losses", "F32", [ADAMW_STEPS])]
    return specs


def metadata(torch_version=None):
    m = {
        "format": "pt",
        "kiln.golden": "vit",
        "kiln.golden.version": FORMAT_VERSION,
        "generator": "tests/golden/make_vit_golden.py",
        "generator_fnv1a64": g.fnv1a64(open(os.path.abspath(__file__), "rb").read()),
        "reference_dtype": "float64",
        "batch_size": str(B),
        "ignore_index": str(IGNORE_INDEX),
        "n_targets": str(B - 1),
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

def patchify(images, cfg):
    """[B, S, S, Cin] -> [B, N, Cin P P], rows in raster order, elements (c, dy, dx)."""
    S, P, Cin, N, _, D = dims(cfg)
    Bb = images.shape[0]
    x = images.reshape(Bb, S // P, P, S // P, P, Cin)  # b, py, dy, px, dx, c
    return x.permute(0, 1, 3, 5, 2, 4).reshape(Bb, N, D)


def forward_logits(P, images, cfg):
    import torch
    import torch.nn.functional as F
    C, nh, eps = cfg["n_embd"], cfg["n_head"], cfg["norm_eps"]
    hd = C // nh
    Bb = images.shape[0]
    patches = patchify(images, cfg)
    rows = torch.cat([patches, torch.zeros(Bb, 1, patches.shape[2], dtype=patches.dtype)], dim=1)
    x = F.linear(rows, P["patch_embed.proj.weight"], P["patch_embed.proj.bias"]) + P["pos_embed"]
    Tt = x.shape[1]
    for l in range(cfg["n_layer"]):
        p = f"blocks.{l}."
        h = F.layer_norm(x, (C,), P[p + "norm1.weight"], P[p + "norm1.bias"], eps)
        qkv = F.linear(h, P[p + "attn.qkv.weight"], P[p + "attn.qkv.bias"])
        q, k, v = qkv.split(C, dim=-1)
        q, k, v = (t.view(Bb, Tt, nh, hd).transpose(1, 2) for t in (q, k, v))
        att = ((q @ k.transpose(-2, -1)) / math.sqrt(hd)).softmax(dim=-1)  # no mask
        y = (att @ v).transpose(1, 2).reshape(Bb, Tt, C)
        x = x + F.linear(y, P[p + "attn.proj.weight"], P[p + "attn.proj.bias"])
        h = F.layer_norm(x, (C,), P[p + "norm2.weight"], P[p + "norm2.bias"], eps)
        m = g.gelu_tanh(F.linear(h, P[p + "mlp.fc1.weight"], P[p + "mlp.fc1.bias"]))
        x = x + F.linear(m, P[p + "mlp.fc2.weight"], P[p + "mlp.fc2.bias"])
    cls = F.layer_norm(x[:, -1], (C,), P["norm.weight"], P["norm.bias"], eps)
    return F.linear(cls, P["head.weight"])  # [B, K]


def mean_loss(P, images, labels, cfg):
    import torch.nn.functional as F
    logits = forward_logits(P, images, cfg)
    return logits, F.cross_entropy(logits, labels, reduction="mean", ignore_index=IGNORE_INDEX)


def init_params(cfg, gen):
    """float32 weights with scales that make the test sharp (attention far from uniform,
    GELU in its curved range, logits of order 1, every bias and norm parameter non-zero)."""
    import torch
    scale = {"proj.weight": 0.3, "qkv.weight": 0.4, "fc1.weight": 0.3, "fc2.weight": 0.15,
             "head.weight": 0.4, "pos_embed": 0.5}
    P = {}
    for name, shape in param_specs(cfg):
        r = torch.randn(shape, generator=gen, dtype=torch.float32)
        if name.endswith("norm1.weight") or name.endswith("norm2.weight") or name == "norm.weight":
            t = 1.0 + 0.1 * r
        elif name.endswith(".bias"):
            t = 0.1 * r
        else:
            key = "pos_embed" if name == "pos_embed" else ".".join(name.split(".")[-2:])
            t = scale[key] * r
        P[name] = t.contiguous()
    return P


def run_reference(P32, images, labels, cfg, dtype):
    """logits, loss, gradients and the AdamW losses in `dtype`."""
    import torch
    x = images.to(dtype)
    P = {n: t.detach().to(dtype).clone().requires_grad_(True) for n, t in P32.items()}
    logits, loss = mean_loss(P, x, labels, cfg)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in P.items()}
    Q = {n: t.detach().to(dtype).clone().requires_grad_(True) for n, t in P32.items()}
    opt = torch.optim.AdamW(
        [{"params": [p for n, p in Q.items() if decays(n, p.shape)],
          "weight_decay": ADAMW["weight_decay"]},
         {"params": [p for n, p in Q.items() if not decays(n, p.shape)], "weight_decay": 0.0}],
        lr=ADAMW["lr"], betas=(ADAMW["beta1"], ADAMW["beta2"]), eps=ADAMW["eps"])
    losses = []
    for _ in range(ADAMW_STEPS):
        opt.zero_grad(set_to_none=True)
        _, l = mean_loss(Q, x, labels, cfg)
        losses.append(l.item())
        l.backward()
        opt.step()
    return logits.detach(), loss.detach(), grads, losses


def generate(out):
    import torch
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    cfg = CONFIG
    S, _, Cin, _, _, _ = dims(cfg)
    gen = torch.Generator().manual_seed(SEED)
    P32 = init_params(cfg, gen)
    images = torch.rand(B, S, S, Cin, generator=gen, dtype=torch.float32) * 2 - 1
    labels = torch.randint(0, cfg["num_classes"], (B,), generator=gen, dtype=torch.int64)
    labels[1] = IGNORE_INDEX

    logits, loss, grads, losses = run_reference(P32, images, labels, cfg, torch.float64)
    l32, loss32, g32, _ = run_reference(P32, images, labels, cfg, torch.float32)
    print(f"float32 torch vs float64: logits rel {g.rel(l32.double(), logits):.2e}, loss rel "
          f"{abs(loss32.item() - loss.item()) / loss.item():.2e}, worst grad rel "
          f"{max(g.rel(g32[n].double(), grads[n]) for n in grads if grads[n].norm() > 0):.2e}")
    print(f"loss {loss.item():.6f}; adamw losses " + " ".join(f"{x:.5f}" for x in losses))

    def f32(t):
        return t.detach().to(torch.float32).contiguous().numpy().tobytes()

    blobs = {}
    for name, _ in param_specs(cfg):
        blobs[name] = f32(P32[name])
        blobs["grad." + name] = f32(grads[name])
    blobs["images"] = f32(images)
    blobs["labels"] = labels.to(torch.int32).contiguous().numpy().tobytes()
    blobs["logits"] = f32(logits)
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
