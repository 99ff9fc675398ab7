#!/usr/bin/python3
"""Generates tests/golden/lora_golden.safetensors, the reference values of kiln's LoRA.

The Llama of make_llama_golden.py (its config, batch shape, forward and loss, reused from
that script) with low-rank adapters (Hu et al. 2021, as Hugging Face PEFT computes them)
of rank R = 4 and alpha 8 (scale s = alpha / R = 2; no rsLoRA, no dropout) on the query
and value pieces of every block's attention input projection and on the gate, up and
down projections of its MLP (train.lora.targets = q, v, gate, up, down). An adapter on a
Linear y = x W^T adds to the output rows it adapts
  y[:, rows] += s (x A^T) B^T,   A [R, in], B [rows, R];
the reference feeds F.linear the merged weight W + s B A on those rows instead, the same
in exact arithmetic (the script checks the two forms agree to 1e-12 in float64). Every
other parameter is frozen: the base tensors do not require gradients (asserted).

Weights are drawn in float32 from a fixed seed: the base as make_llama_golden.py's
init_params; A uniform in (-1/sqrt(in), 1/sqrt(in)) (PEFT's Kaiming-uniform init);
B random and nonzero (PEFT starts it at zero, which would leave A's gradient zero and a
wrong adapter unseen), about half of its projection's base scale: the adapters move the
logits by 23% (relative norm), and scale 1 instead of 2 would move them by 11%. The
model runs in float64 on a copy. Then ADAMW_STEPS
torch.optim.AdamW steps on the same batch over the adapters only (make_llama_golden.py's
hyper-parameters; weight decay on all of them: they are 2-D, and kiln decays every 2-D
parameter, adapters included).

Tensors (kiln names, as LoraPlan on Llama; a piece's adapter is
<linear>.<piece>.lora_{A,B}.weight, e.g. model.layers.0.self_attn.qkv_proj.q.lora_A.weight
[R, C] and ...q.lora_B.weight [NH HD, R]; down_proj's is model.layers.0.mlp.down_proj.lora_A
.weight [R, F] and ...lora_B.weight [C, R]), in kiln's parameter order (each Linear's
weight, then its adapters, A before B):
  <param>                   every parameter, base (as the Llama file: qkv_proj and
                            gate_up_proj fused) and adapters, F32
  input_tokens, target_tokens  I32 [B, T] (N_IGNORED targets -1)
  logits [B, T, V], loss [1]   mean cross entropy over the valid targets
  grad.<adapter>            the loss's gradient of each adapter (the base has none)
  adamw_losses [ADAMW_STEPS]  the loss before each AdamW step
  adamw_final.<adapter>     each adapter after the last step
  merged.<linear>.weight    W + s B A on each adapted piece's rows (the file's adapters),
                            for every adapted Linear: qkv_proj, gate_up_proj, down_proj
The safetensors writer, the metadata conventions and --check are make_gpt2_golden.py's.

Usage: /usr/bin/python3 tests/golden/make_lora_golden.py [--check [FILE]]
"""

import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_gpt2_golden as g  # noqa: E402  (the safetensors writer and header check)
import make_llama_golden as llama  # noqa: E402  (config, parameters, forward, loss)

DEFAULT_OUT = os.path.join(HERE, "lora_golden.safetensors")
FORMAT_VERSION = "1"

CONFIG = llama.CONFIG
B, T, N_IGNORED, IGNORE_INDEX = llama.B, llama.T, llama.N_IGNORED, llama.IGNORE_INDEX
ADAMW, ADAMW_STEPS = llama.ADAMW, llama.ADAMW_STEPS
SEED = 20261215
RANK = 4
ALPHA = 8.0
SCALE = ALPHA / RANK
TARGETS = ["q", "v", "gate", "up", "down"]
# Each target: its kiln Linear (under model.layers.<l>.), its piece ("" for the whole
# Linear), Hugging Face's separate matrix it adapts, and B's standard deviation.
ROLES = {
    "q": ("self_attn.qkv_proj", "q", "self_attn.q_proj", 0.15),
    "v": ("self_attn.qkv_proj", "v", "self_attn.v_proj", 0.1),
    "gate": ("mlp.gate_up_proj", "gate", "mlp.gate_proj", 0.15),
    "up": ("mlp.gate_up_proj", "up", "mlp.up_proj", 0.1),
    "down": ("mlp.down_proj", "", "mlp.down_proj", 0.025),
}


def adapters(cfg):
    """(unit, kiln Linear, Hugging Face matrix, [rows, in], B's std) of every adapter, in
    kiln's order: by layer, by Linear, by piece."""
    out = []
    hf = dict(llama.hf_specs(cfg))
    for l in range(cfg["n_layer"]):
        p = f"model.layers.{l}."
        for t in TARGETS:
            linear, piece, matrix, std = ROLES[t]
            unit = p + linear + ("." + piece if piece else "")
            out.append((unit, p + linear, p + matrix + ".weight", hf[p + matrix + ".weight"], std))
    return out


def adapter_specs(cfg, linear=None):
    """(name, shape) of every adapter parameter (of `linear` only, if given), A before B."""
    specs = []
    for unit, lin, _, (rows, n_in), _ in adapters(cfg):
        if linear in (None, lin):
            specs += [(unit + ".lora_A.weight", [RANK, n_in]),
                      (unit + ".lora_B.weight", [rows, RANK])]
    return specs


def adapted_linears(cfg):
    """(weight name, shape) of the kiln Linears with adapters, in model order."""
    linears = {lin for _, lin, _, _, _ in adapters(cfg)}
    return [(n, s) for n, s in llama.param_specs(cfg) if n[: -len(".weight")] in linears]


def param_specs(cfg):
    """(name, shape) of every parameter in kiln's order (Llama::params() under LoraPlan:
    each Linear's weight, then its adapters)."""
    specs = []
    for name, shape in llama.param_specs(cfg):
        specs += [(name, shape)] + adapter_specs(cfg, name[: -len(".weight")])
    return specs


def tensor_specs(cfg):
    ad = adapter_specs(cfg)
    specs = [(n, "F32", s) for n, s in param_specs(cfg)]
    specs += [("input_tokens", "I32", [B, T]), ("target_tokens", "I32", [B, T]),
              ("logits", "F32", [B, T, cfg["vocab_size"]]), ("loss", "F32", [1])]
    specs += [("grad." + n, "F32", s) for n, s in ad]
    specs += [("adamw_losses", "F32", [ADAMW_STEPS])]
    specs += [("adamw_final." + n, "F32", s) for n, s in ad]
    specs += [("merged." + n, "F32", s) for n, s in adapted_linears(cfg)]
    return specs


def metadata(torch_version=None):
    m = {
        "format": "pt",
        "kiln.golden": "lora",
        "kiln.golden.version": FORMAT_VERSION,
        "generator": "tests/golden/make_lora_golden.py",
        "generator_fnv1a64": g.fnv1a64(open(os.path.abspath(__file__), "rb").read()),
        "reference_dtype": "float64",
        "batch_size": str(B),
        "seq_len": str(T),
        "ignore_index": str(IGNORE_INDEX),
        "n_targets": str(B * T - N_IGNORED),
        "seed": str(SEED),
        "lora.rank": str(RANK),
        "lora.alpha": repr(ALPHA),
        "lora.rslora": "False",
        "lora.dropout": "0.0",
        "lora.targets": ",".join(TARGETS),
        "lora.init": "A uniform(-1/sqrt(in), 1/sqrt(in)); B normal, nonzero",
        "adamw.steps": str(ADAMW_STEPS),
        "adamw.params": "the adapters only (the base frozen)",
        "adamw.decay": "every adapter matrix (2-D)",
        "adamw.grad_clip": "none",
    }
    for k, v in CONFIG.items():
        m[k] = repr(v)
    for k, v in ADAMW.items():
        m["adamw." + k] = repr(v)
    if torch_version is not None:
        m["torch_version"] = torch_version
    return m


# ---- the reference (torch is imported only when generating) -----------------------------

def init_adapters(cfg, gen):
    """float32 A (PEFT's Kaiming-uniform bound 1/sqrt(in)) and B (random, nonzero)."""
    import torch
    out = {}
    for unit, _, _, (rows, n_in), std in adapters(cfg):
        bound = 1.0 / math.sqrt(n_in)
        a = (torch.rand([RANK, n_in], generator=gen, dtype=torch.float32) * 2 - 1) * bound
        b = std * torch.randn([rows, RANK], generator=gen, dtype=torch.float32)
        out[unit + ".lora_A.weight"] = a.contiguous()
        out[unit + ".lora_B.weight"] = b.contiguous()
    return out


def merged(base, ad, cfg):
    """Hugging Face's matrices with each adapted one replaced by W + s B A (torch-tracked)."""
    P = dict(base)
    for unit, _, matrix, _, _ in adapters(cfg):
        P[matrix] = base[matrix] + SCALE * (ad[unit + ".lora_B.weight"] @ ad[unit + ".lora_A.weight"])
    return P


def mean_loss(base, ad, idx, targets, cfg):
    return llama.mean_loss(merged(base, ad, cfg), idx, targets, cfg)


def check_adapter_form(base, ad, cfg):
    """x (W + s B A)^T against x W^T + s (x A^T) B^T in float64, every adapter."""
    import torch
    import torch.nn.functional as F
    gen = torch.Generator().manual_seed(1)
    P = merged(base, ad, cfg)
    for unit, _, matrix, (_, n_in), _ in adapters(cfg):
        x = torch.randn([7, n_in], generator=gen, dtype=torch.float64)
        a, b = ad[unit + ".lora_A.weight"], ad[unit + ".lora_B.weight"]
        peft = F.linear(x, base[matrix]) + SCALE * F.linear(F.linear(x, a), b)
        err = g.rel(F.linear(x, P[matrix]), peft)
        assert err < 1e-12, f"{unit}: merged and adapter forms differ by {err:.2e}"


def run_reference(P32, A32, idx, targets, cfg, dtype):
    """logits, loss, adapter gradients, AdamW losses and final adapters in `dtype`."""
    import torch
    base = {n: t.detach().to(dtype).clone() for n, t in P32.items()}
    assert not any(t.requires_grad for t in base.values()), "the base must be frozen"
    ad = {n: t.detach().to(dtype).clone().requires_grad_(True) for n, t in A32.items()}
    if dtype == torch.float64:
        with torch.no_grad():
            check_adapter_form(base, ad, cfg)
    logits, loss = mean_loss(base, ad, idx, targets, cfg)
    loss.backward()
    assert not any(t.requires_grad or t.grad is not None for t in base.values())
    grads = {n: p.grad.detach().clone() for n, p in ad.items()}
    assert all(gr.norm() > 0 for gr in grads.values()), "every adapter needs a gradient"
    with torch.no_grad():
        merged_w = llama.fuse(merged(base, ad, cfg), cfg)
    Q = {n: t.detach().to(dtype).clone().requires_grad_(True) for n, t in A32.items()}
    assert all(p.dim() == 2 for p in Q.values())
    opt = torch.optim.AdamW(list(Q.values()), lr=ADAMW["lr"], betas=(ADAMW["beta1"], ADAMW["beta2"]),
                            eps=ADAMW["eps"], weight_decay=ADAMW["weight_decay"])
    losses = []
    for _ in range(ADAMW_STEPS):
        opt.zero_grad(set_to_none=True)
        _, l = mean_loss(base, Q, idx, targets, cfg)
        losses.append(l.item())
        l.backward()
        opt.step()
    final = {n: p.detach().clone() for n, p in Q.items()}
    return logits.detach(), loss.detach(), grads, losses, final, merged_w


def generate(out):
    import torch
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    cfg = CONFIG
    V = cfg["vocab_size"]
    gen = torch.Generator().manual_seed(SEED)
    P32 = llama.init_params(cfg, gen)
    A32 = init_adapters(cfg, gen)
    idx = torch.randint(0, V, (B, T), generator=gen, dtype=torch.int64)
    targets = torch.randint(0, V, (B, T), generator=gen, dtype=torch.int64)
    targets.view(-1)[torch.randperm(B * T, generator=gen)[:N_IGNORED]] = IGNORE_INDEX

    logits, loss, grads, losses, final, merged_w = run_reference(
        P32, A32, idx, targets, cfg, torch.float64)
    l32, loss32, g32, losses32, final32, _ = run_reference(P32, A32, idx, targets, cfg, torch.float32)
    print(f"float32 torch vs float64: logits rel {g.rel(l32.double(), logits):.2e}, loss rel "
          f"{abs(loss32.item() - loss.item()) / loss.item():.2e}, worst grad rel "
          f"{max(g.rel(g32[n].double(), grads[n]) for n in grads):.2e}, worst adamw loss rel "
          f"{max(abs(a - b) / b for a, b in zip(losses32, losses)):.2e}, worst final adapter rel "
          f"{max(g.rel(final32[n].double(), final[n]) for n in final):.2e}")
    # How much the adapters matter: the logits without them, and with scale 1 (alpha 4).
    base64 = {n: t.to(torch.float64) for n, t in P32.items()}
    with torch.no_grad():
        plain, _ = llama.mean_loss(base64, idx, targets, cfg)
        half = {n: (0.5 if n.endswith("lora_B.weight") else 1.0) * t.to(torch.float64)
                for n, t in A32.items()}  # s B A at s = 1: B halved
        halved, _ = mean_loss(base64, half, idx, targets, cfg)
    print(f"logits moved by the adapters: rel {g.rel(plain, logits):.2e}; by scale 1 instead of "
          f"{SCALE}: rel {g.rel(halved, logits):.2e}")
    print(f"loss {loss.item():.6f}; adamw losses " + " ".join(f"{x:.5f}" for x in losses))
    print("adapter moved by the AdamW steps: rel " +
          f"{min(g.rel(final[n], A32[n].double()) for n in final):.2e} .. "
          f"{max(g.rel(final[n], A32[n].double()) for n in final):.2e}")

    def f32(t):
        return t.detach().to(torch.float32).contiguous().numpy().tobytes()

    P = {**llama.fuse(P32, cfg), **A32}
    blobs = {name: f32(P[name]) for name, _ in param_specs(cfg)}
    blobs["input_tokens"] = idx.to(torch.int32).contiguous().numpy().tobytes()
    blobs["target_tokens"] = targets.to(torch.int32).contiguous().numpy().tobytes()
    blobs["logits"] = f32(logits)
    blobs["loss"] = f32(loss.reshape(1))
    blobs["adamw_losses"] = f32(torch.tensor(losses, dtype=torch.float64))
    for name, _ in adapter_specs(cfg):
        blobs["grad." + name] = f32(grads[name])
        blobs["adamw_final." + name] = f32(final[name])
    for name, _ in adapted_linears(cfg):
        blobs["merged." + name] = f32(merged_w[name])
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
