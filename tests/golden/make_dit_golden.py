#!/usr/bin/python3
"""Generates tests/golden/dit_golden.safetensors, the reference values of kiln's DiT.

A small class-conditional diffusion transformer (Peebles & Xie 2023, adaLN-Zero blocks)
trained as a rectified flow, written here in plain PyTorch as kiln defines it
(src/models/dit/dit.h, src/nn/adaln_block.h):
  xt = (1 - t) x0 + t noise, v = noise - x0                  images channels last [B,S,S,Cin]
  patches = patchify(xt) [B,N,D]: row n = py (S/P) + px, element c P P + dy P + dx
  x = x_embedder.proj(patches) + pos_embed [N,C]             (learned positions)
  c = t_embedder.mlp.2(silu(t_embedder.mlp.0(emb(1000 t)))) + y_embedder.embedding_table[y]
      emb(s) = [cos(s f_j), sin(s f_j)], f_j = exp(-ln(10000) j / (F/2)), F = 256 (cos first);
      y = the conditioning label, -1 -> row K (the null class)
  per block: shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp =
      adaLN_modulation.1(silu(c)) chunked [B,6,C];
      r = x + gate_msa * proj(attn(qkv(modulate(norm1(x), shift_msa, scale_msa))))
      x = r + gate_mlp * fc2(gelu_tanh(fc1(modulate(norm2(r), shift_mlp, scale_mlp))))
      LayerNorm without affine (eps norm_eps), modulate(h, s, a) = h (1 + a) + s,
      bidirectional attention, fused q/k/v (column blocks, heads contiguous), 1/sqrt(HD)
  shift, scale = final_layer.adaLN_modulation.1(silu(c)) chunked [B,2,C]
  pred = final_layer.linear(modulate(norm(x), shift, scale)) [B,N,D]
  loss_b = mean over the pixels of image b of (pred - patchify(v))^2,
  loss = the mean of loss_b over the counted images (label != -1).
kiln zero-initialises every adaLN_modulation and final_layer.linear (adaLN-Zero), which
would make most gradients vanish; here every parameter, biases included, is random
(adaLN and final weights large enough that the gates are open). Two input channels and
12 x 12 images, patch 4 (9 patches), so that the element order in a patch matters.

Weights are drawn in float32 from a fixed seed, the model runs in float64 on a copy.
Tensors (kiln's names and order, DiT::params()):
  <param>, grad.<param> (of loss), images F32 [B,S,S,Cin] (x0 in [-1, 1]), noise F32
  [B,S,S,Cin], t F32 [B] in (0, 1), labels I32 [B] (one -1: not counted), conditioning
  I32 [B] (the labels the model is conditioned on; one -1: the null class), pred F32
  [B,N,D] (every image, the uncounted one too), loss [1], adamw_losses [ADAMW_STEPS]
  (the loss before each AdamW step, the same x0, noise and t every step).
The safetensors writer and --check are make_gpt2_golden.py's.

Usage: /usr/bin/python3 tests/golden/make_dit_golden.py [--check]
"""

import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_gpt2_golden as g  # noqa: E402  (the safetensors writer and header check)

DEFAULT_OUT = os.path.join(HERE, "dit_golden.safetensors")
FORMAT_VERSION = "1"

CONFIG = {
    "n_layer": 2,
    "n_head": 4,
    "n_embd": 32,  # head size 8
    "ffn_hidden_size": 48,
    "image_size": 12,
    "num_channels": 2,
    "patch_size": 4,  # 9 patches
    "num_classes": 5,
    "frequency_dim": 256,
    "norm_eps": 1e-6,
}
B = 4
IGNORE_INDEX = -1
LABELS = [3, IGNORE_INDEX, 0, 3]        # image 1 is not counted
CONDITIONING = [3, 1, IGNORE_INDEX, 3]  # image 2 is conditioned on the null class
SEED = 20261215
ADAMW = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1}
ADAMW_STEPS = 10
NO_DECAY_MATRICES = ("pos_embed", "y_embedder.embedding_table.weight")


def dims(cfg):
    S, P, Cin = cfg["image_size"], cfg["patch_size"], cfg["num_channels"]
    return S, P, Cin, (S // P) ** 2, Cin * P * P


def param_specs(cfg):
    """(name, shape) of every parameter in kiln's order (DiT::params(): DiTLayers::parts)."""
    C, H, K, F = cfg["n_embd"], cfg["ffn_hidden_size"], cfg["num_classes"], cfg["frequency_dim"]
    _, _, _, N, D = dims(cfg)
    specs = [("x_embedder.proj.weight", [C, D]), ("x_embedder.proj.bias", [C]),
             ("pos_embed", [N, C]),
             ("t_embedder.mlp.0.weight", [C, F]), ("t_embedder.mlp.0.bias", [C]),
             ("t_embedder.mlp.2.weight", [C, C]), ("t_embedder.mlp.2.bias", [C]),
             ("y_embedder.embedding_table.weight", [K + 1, C])]
    for l in range(cfg["n_layer"]):
        p = f"blocks.{l}."
        specs += [(p + "attn.qkv.weight", [3 * C, C]), (p + "attn.qkv.bias", [3 * C]),
                  (p + "attn.proj.weight", [C, C]), (p + "attn.proj.bias", [C]),
                  (p + "mlp.fc1.weight", [H, C]), (p + "mlp.fc1.bias", [H]),
                  (p + "mlp.fc2.weight", [C, H]), (p + "mlp.fc2.bias", [C]),
                  (p + "adaLN_modulation.1.weight", [6 * C, C]),
                  (p + "adaLN_modulation.1.bias", [6 * C])]
    specs += [("final_layer.adaLN_modulation.1.weight", [2 * C, C]),
              ("final_layer.adaLN_modulation.1.bias", [2 * C]),
              ("final_layer.linear.weight", [D, C]), ("final_layer.linear.bias", [D])]
    return specs


def decays(name, shape):
    """kiln's rule: the linear weights decay; pos_embed, the label table and biases do not."""
    return len(shape) == 2 and name not in NO_DECAY_MATRICES


def tensor_specs(cfg):
    params = param_specs(cfg)
    S, _, Cin, N, D = dims(cfg)
    specs = [(n, "F32", s) for n, s in params]
    specs += [("images", "F32", [B, S, S, Cin]), ("noise", "F32", [B, S, S, Cin]),
              ("t", "F32", [B]), ("labels", "I32", [B]), ("conditioning", "I32", [B]),
              ("pred", "F32", [B, N, D]), ("loss", "F32", [1])]
    specs += [("grad." + n, "F32", s) for n, s in params]
    specs += [("adamw_losses", "F32", [ADAMW_STEPS])]
    return specs


def metadata(torch_version=None):
    m = {
        "format": "pt",
        "kiln.golden": "dit",
        "kiln.golden.version": FORMAT_VERSION,
        "generator": "tests/golden/make_dit_golden.py",
        "generator_fnv1a64": g.fnv1a64(open(os.path.abspath(__file__), "rb").read()),
        "reference_dtype": "float64",
        "batch_size": str(B),
        "ignore_index": str(IGNORE_INDEX),
        "n_targets": str(sum(y != IGNORE_INDEX for y in LABELS)),
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

def patchify(images, cfg):
    """[B, S, S, Cin] -> [B, N, Cin P P], rows in raster order, elements (c, dy, dx)."""
    S, P, Cin, N, D = dims(cfg)
    Bb = images.shape[0]
    x = images.reshape(Bb, S // P, P, S // P, P, Cin)  # b, py, dy, px, dx, c
    return x.permute(0, 1, 3, 5, 2, 4).reshape(Bb, N, D)


def timestep_embedding(t, F):
    """DiT's TimestepEmbedder.timestep_embedding of 1000 t: [cos(1000 t f), sin(1000 t f)],
    computed in float64 and rounded to t's dtype, as kiln does on the host (in float32 the
    arguments, up to 1000, would lose 3e-5 and dominate the float32 run's error)."""
    import torch
    half = F // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float64) / half)
    args = (1000.0 * t.double())[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1).to(t.dtype)


def layer_norm(x, eps):
    import torch.nn.functional as F
    return F.layer_norm(x, (x.shape[-1],), None, None, eps)  # no affine part


def modulate(h, shift, scale):
    return h * (1 + scale[:, None, :]) + shift[:, None, :]


def forward_pred(P, xt, t, conditioning, cfg):
    """pred [B, N, D] of the noisy images xt at times t, conditioned on the labels."""
    import torch
    import torch.nn.functional as F
    C, nh, eps, K = cfg["n_embd"], cfg["n_head"], cfg["norm_eps"], cfg["num_classes"]
    hd = C // nh
    Bb = xt.shape[0]
    x = F.linear(patchify(xt, cfg), P["x_embedder.proj.weight"], P["x_embedder.proj.bias"])
    x = x + P["pos_embed"]
    Tt = x.shape[1]
    temb = timestep_embedding(t, cfg["frequency_dim"])
    temb = F.linear(F.silu(F.linear(temb, P["t_embedder.mlp.0.weight"],
                                    P["t_embedder.mlp.0.bias"])),
                    P["t_embedder.mlp.2.weight"], P["t_embedder.mlp.2.bias"])
    y = torch.where(conditioning < 0, torch.full_like(conditioning, K), conditioning)
    c = temb + P["y_embedder.embedding_table.weight"][y]
    sc = F.silu(c)
    for l in range(cfg["n_layer"]):
        p = f"blocks.{l}."
        mod = F.linear(sc, P[p + "adaLN_modulation.1.weight"], P[p + "adaLN_modulation.1.bias"])
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = mod.chunk(6, dim=1)
        h = modulate(layer_norm(x, eps), shift_msa, scale_msa)
        qkv = F.linear(h, P[p + "attn.qkv.weight"], P[p + "attn.qkv.bias"])
        q, k, v = qkv.split(C, dim=-1)
        q, k, v = (u.view(Bb, Tt, nh, hd).transpose(1, 2) for u in (q, k, v))
        att = ((q @ k.transpose(-2, -1)) / math.sqrt(hd)).softmax(dim=-1)  # no mask
        a = (att @ v).transpose(1, 2).reshape(Bb, Tt, C)
        a = F.linear(a, P[p + "attn.proj.weight"], P[p + "attn.proj.bias"])
        x = x + gate_msa[:, None, :] * a
        h = modulate(layer_norm(x, eps), shift_mlp, scale_mlp)
        m = g.gelu_tanh(F.linear(h, P[p + "mlp.fc1.weight"], P[p + "mlp.fc1.bias"]))
        m = F.linear(m, P[p + "mlp.fc2.weight"], P[p + "mlp.fc2.bias"])
        x = x + gate_mlp[:, None, :] * m
    mod = F.linear(sc, P["final_layer.adaLN_modulation.1.weight"],
                   P["final_layer.adaLN_modulation.1.bias"])
    shift, scale = mod.chunk(2, dim=1)
    h = modulate(layer_norm(x, eps), shift, scale)
    return F.linear(h, P["final_layer.linear.weight"], P["final_layer.linear.bias"])


def mean_loss(P, x0, noise, t, labels, conditioning, cfg):
    tb = t[:, None, None, None]
    xt = (1 - tb) * x0 + tb * noise
    target = patchify(noise - x0, cfg)
    pred = forward_pred(P, xt, t, conditioning, cfg)
    per_image = ((pred - target) ** 2).mean(dim=(1, 2))
    counted = labels != IGNORE_INDEX
    return pred, per_image[counted].mean()


def init_params(cfg, gen):
    """float32 weights, all non-zero: attention far from uniform, GELU in its curved range,
    c of order 1, adaLN shifts/scales/gates of order 0.5 (open gates), pred of order 1."""
    import torch
    scale = {"x_embedder.proj.weight": 0.2, "pos_embed": 0.3,
             "t_embedder.mlp.0.weight": 0.07, "t_embedder.mlp.2.weight": 0.2,
             "y_embedder.embedding_table.weight": 0.5,
             "attn.qkv.weight": 0.4, "attn.proj.weight": 0.3, "mlp.fc1.weight": 0.3,
             "mlp.fc2.weight": 0.15, "adaLN_modulation.1.weight": 0.2,
             "final_layer.linear.weight": 0.3}
    P = {}
    for name, shape in param_specs(cfg):
        r = torch.randn(shape, generator=gen, dtype=torch.float32)
        if name.endswith(".bias"):
            t = 0.1 * r
        else:
            t = next(v for k, v in scale.items() if name.endswith(k)) * r
        P[name] = t.contiguous()
    return P


def run_reference(P32, inputs, cfg, dtype, loss_fn=None, decays_fn=None, adamw=None, steps=None,
                  frozen=lambda name: False):
    """pred, loss, gradients and the AdamW losses in `dtype`. inputs: x0, noise, t and the
    conditioning's tensors (this model's: labels, conditioning); loss_fn(P, x0, noise, t,
    *conditioning, cfg) -> (pred, mean loss), decays_fn(name, shape), the AdamW settings
    and steps: this model's mean_loss, decays, ADAMW and ADAMW_STEPS when None (the MMDiT
    script passes its own). Parameters `frozen` by name get no gradient (zeros here) and
    no update."""
    import torch
    loss_fn, decays_fn = loss_fn or mean_loss, decays_fn or decays
    adamw, steps = adamw or ADAMW, steps or ADAMW_STEPS
    x0, noise, t, *conditioning = inputs
    x0, noise, t = x0.to(dtype), noise.to(dtype), t.to(dtype)

    def leaves():
        return {n: u.detach().to(dtype).clone().requires_grad_(not frozen(n))
                for n, u in P32.items()}

    P = leaves()
    pred, loss = loss_fn(P, x0, noise, t, *conditioning, cfg)
    loss.backward()
    grads = {n: torch.zeros_like(p) if frozen(n) else p.grad.detach().clone()
             for n, p in P.items()}
    Q = leaves()
    trained = {n: p for n, p in Q.items() if not frozen(n)}
    opt = torch.optim.AdamW(
        [{"params": [p for n, p in trained.items() if decays_fn(n, p.shape)],
          "weight_decay": adamw["weight_decay"]},
         {"params": [p for n, p in trained.items() if not decays_fn(n, p.shape)],
          "weight_decay": 0.0}],
        lr=adamw["lr"], betas=(adamw["beta1"], adamw["beta2"]), eps=adamw["eps"])
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        _, l = loss_fn(Q, x0, noise, t, *conditioning, cfg)
        losses.append(l.item())
        l.backward()
        opt.step()
    return pred.detach(), loss.detach(), grads, losses


def report(P32, ref, f32_run):
    """Prints how far float32 PyTorch (f32_run) lands from the float64 reference (ref):
    both run_reference's (pred, loss, grads, losses)."""
    pred, loss, grads, losses = ref
    p32, loss32, g32, losses32 = f32_run
    worst = max((g.rel(g32[n].double(), grads[n]), n) for n in grads)
    print(f"float32 torch vs float64: pred rel {g.rel(p32.double(), pred):.2e}, loss rel "
          f"{abs(loss32.item() - loss.item()) / loss.item():.2e}, worst grad rel "
          f"{worst[0]:.2e} ({worst[1]}), worst adamw loss rel "
          f"{max(abs(a - b) / b for a, b in zip(losses32, losses)):.2e}")
    weakest = min((grads[n].norm().item() / max(P32[n].double().norm().item(), 1e-300), n)
                  for n in grads)
    print(f"smallest |grad| / |param|: {weakest[0]:.2e} ({weakest[1]})")
    print(f"loss {loss.item():.6f}; adamw losses " + " ".join(f"{x:.5f}" for x in losses))


def draw_batch(gen, cfg, B):
    """B images x0 [B,S,S,Cin] in [-1, 1], noise and times t in (0.05, 0.95), from `gen`."""
    import torch
    S, _, Cin, _, _ = dims(cfg)
    images = torch.rand(B, S, S, Cin, generator=gen, dtype=torch.float32) * 2 - 1
    noise = torch.randn(B, S, S, Cin, generator=gen, dtype=torch.float32)
    t = 0.05 + 0.9 * torch.rand(B, generator=gen, dtype=torch.float32)
    return images, noise, t


def write_golden(out, specs, P32, ref, inputs, meta):
    """Writes the file of `specs`: the parameters P32 and the reference's (run_reference's
    pred, loss, grads, losses) gradients and outputs, and `inputs` by name (integer tensors
    as I32, the others F32)."""
    import torch
    pred, loss, grads, losses = ref

    def blob(u):
        dtype = torch.int32 if not u.is_floating_point() else torch.float32
        return u.detach().to(dtype).contiguous().numpy().tobytes()

    blobs = {name: blob(u) for name, u in inputs.items()}
    for name, u in P32.items():
        blobs[name] = blob(u)
        blobs["grad." + name] = blob(grads[name])
    blobs["pred"] = blob(pred)
    blobs["loss"] = blob(loss.reshape(1))
    blobs["adamw_losses"] = blob(torch.tensor(losses, dtype=torch.float64))
    g.write_safetensors(out, specs, [blobs[n] for n, _, _ in specs],
                        meta(torch_version=str(torch.__version__)))
    print(f"wrote {out} ({os.path.getsize(out)} bytes)")


def generate(out):
    import torch
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    cfg = CONFIG
    gen = torch.Generator().manual_seed(SEED)
    P32 = init_params(cfg, gen)
    images, noise, t = draw_batch(gen, cfg, B)
    labels = torch.tensor(LABELS, dtype=torch.int64)
    conditioning = torch.tensor(CONDITIONING, dtype=torch.int64)
    inputs = (images, noise, t, labels, conditioning)
    ref = run_reference(P32, inputs, cfg, torch.float64)
    report(P32, ref, run_reference(P32, inputs, cfg, torch.float32))
    write_golden(out, tensor_specs(cfg), P32, ref,
                 {"images": images, "noise": noise, "t": t, "labels": labels,
                  "conditioning": conditioning}, metadata)


def check(path):
    """Exit status 0 when the stored header is what this script would write (no torch)."""
    g.CONFIG, g.tensor_specs, g.metadata = CONFIG, tensor_specs, metadata
    return g.check(path)


def main():
    return g.cli(__doc__, DEFAULT_OUT, generate, check)


if __name__ == "__main__":
    sys.exit(main())
