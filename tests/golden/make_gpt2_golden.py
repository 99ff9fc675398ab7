#!/usr/bin/python3
"""Generates tests/golden/gpt2_golden.safetensors, the reference values of kiln's GPT-2.

A small GPT-2 written here in plain PyTorch (nanoGPT-style: torch.nn.Linear layout, weight
[out, in]; pre-LN blocks; GELU with the tanh approximation; causal softmax attention
scaled by 1/sqrt(head size); LayerNorm eps 1e-5; lm_head tied to wte; no dropout) is
initialised in float32 from a fixed seed, then evaluated in float64 on a copy of those
float32 weights; the float64 results are stored as float32.

The file holds, under kiln's parameter names (GPT2::params(), src/models/gpt2/gpt2.h):
  <param>            every parameter, float32 (wte is [Vp, C] with rows V..Vp-1 zero)
  input_tokens       int32 [B, T], random in [0, V)
  target_tokens      int32 [B, T], random in [0, V), N_IGNORED entries set to -1
  logits             float32 [B, T, V], the first V columns of the [B, T, Vp] logits
  loss               float32 [1], mean cross entropy over the non-ignored targets
  grad.<param>       float32, gradient of that mean loss
  adamw_losses       float32 [ADAMW_STEPS], the loss before each of ADAMW_STEPS
                     torch.optim.AdamW steps on the same batch
and, in __metadata__, the configuration, hyper-parameters and the FNV-1a 64 hash of
this script (generator_fnv1a64), so that a file older than the script is caught.

Usage (Debian's python, which has torch):
  /usr/bin/python3 tests/golden/make_gpt2_golden.py            # (re)writes the file
  /usr/bin/python3 tests/golden/make_gpt2_golden.py --check    # header/metadata check
`--check` needs no torch: it compares the stored header (names, dtypes, shapes, data
offsets, metadata) with what this script writes. See tests/golden/README.md.

The safetensors file is written by hand (struct + json), with no extra library.
"""

import argparse
import json
import math
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "gpt2_golden.safetensors")
FORMAT_VERSION = "1"

CONFIG = {
    "n_layer": 2,
    "n_head": 4,
    "n_embd": 68,  # head size 17: odd on purpose
    "vocab_size": 301,
    "padded_vocab_size": 384,
    "block_size": 40,
    "layernorm_eps": 1e-5,
    "dropout": 0.0,
}
B, T = 4, 32
IGNORE_INDEX = -1
N_IGNORED = 7  # targets set to IGNORE_INDEX (fixed count, random positions)
SEED = 20240611
ADAMW = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1}
ADAMW_STEPS = 10
# Metadata that depends on the machine, not on this script: not compared by --check.
PROVENANCE_KEYS = ("torch_version",)


def param_specs(cfg):
    """(name, shape) of every parameter, in kiln's order (GPT2::params())."""
    C, L = cfg["n_embd"], cfg["n_layer"]
    specs = [("transformer.wte.weight", [cfg["padded_vocab_size"], C]),
             ("transformer.wpe.weight", [cfg["block_size"], C])]
    for l in range(L):
        h = f"transformer.h.{l}."
        specs += [
            (h + "ln_1.weight", [C]), (h + "ln_1.bias", [C]),
            (h + "attn.c_attn.weight", [3 * C, C]), (h + "attn.c_attn.bias", [3 * C]),
            (h + "attn.c_proj.weight", [C, C]), (h + "attn.c_proj.bias", [C]),
            (h + "ln_2.weight", [C]), (h + "ln_2.bias", [C]),
            (h + "mlp.c_fc.weight", [4 * C, C]), (h + "mlp.c_fc.bias", [4 * C]),
            (h + "mlp.c_proj.weight", [C, 4 * C]), (h + "mlp.c_proj.bias", [C]),
        ]
    specs += [("transformer.ln_f.weight", [C]), ("transformer.ln_f.bias", [C])]
    return specs


def packed_specs(params, B, T):
    """The packed-documents case's tensors (the same batch of B x T, cut into documents)."""
    specs = [("packed.positions", "I32", [B, T]), ("packed.cu_seqlens", "I32", [B * T + 1]),
             ("packed.loss", "F32", [1])]
    return specs + [("packed.grad." + n, "F32", s) for n, s in params]


def tensor_specs(cfg):
    """(name, safetensors dtype, shape) of every tensor of the file, in file order."""
    params = param_specs(cfg)
    specs = [(n, "F32", s) for n, s in params]
    specs += [("input_tokens", "I32", [B, T]), ("target_tokens", "I32", [B, T]),
              ("logits", "F32", [B, T, cfg["vocab_size"]]), ("loss", "F32", [1])]
    specs += [("grad." + n, "F32", s) for n, s in params]
    specs += [("adamw_losses", "F32", [ADAMW_STEPS])]
    return specs + packed_specs(params, B, T)


# ---- packed documents (data.packing = "document") ----------------------------------------
# The same batch with each sequence cut into documents of these lengths (one-token
# documents among them): attention only inside a document (causal), positions restarting
# at 0 in each, the same targets. Stored: packed.positions [B,T], packed.cu_seqlens
# [B*T+1] (FlashAttention's varlen layout, padded with B*T), packed.loss and
# packed.grad.<param>.
PACKED_DOCS = [[5, 1, 10, 16], [32], [1, 1, 30], [20, 12]]


def packed_layout(documents, T):
    """positions [B,T] and document ids [B,T] (int64 tensors), cu_seqlens (a list) of the
    documents' lengths per sequence."""
    import torch
    B = len(documents)
    positions, docs, cu = [], [], [0]
    for lengths in documents:
        assert sum(lengths) == T
        positions.append([t for n in lengths for t in range(n)])
        docs.append([d for d, n in enumerate(lengths) for _ in range(n)])
        for n in lengths:
            cu.append(cu[-1] + n)
    cu += [B * T] * (B * T + 1 - len(cu))
    return torch.tensor(positions), torch.tensor(docs), cu


def attention_mask(Tt, docs=None):
    """[T,T] causal, or [B,1,T,T] causal within each document of docs [B,T]."""
    import torch
    causal = torch.tril(torch.ones(Tt, Tt, dtype=torch.bool))
    if docs is None:
        return causal
    return causal & (docs[:, None, :, None] == docs[:, None, None, :])


def packed_reference(P32, idx, targets, cfg, loss_fn, documents, to_kiln=lambda g: g):
    """The packed case in float64: positions, cu_seqlens, loss and gradients (kiln names)."""
    import torch
    positions, docs, cu = packed_layout(documents, idx.shape[1])
    P = {n: t.detach().to(torch.float64).clone().requires_grad_(True) for n, t in P32.items()}
    _, loss = loss_fn(P, idx, targets, cfg, (positions, docs))
    loss.backward()
    grads = to_kiln({n: p.grad.detach().clone() for n, p in P.items()})
    return positions, cu, loss.detach(), grads


def packed_blobs(blobs, names, positions, cu, loss, grads):
    import torch
    blobs["packed.positions"] = positions.to(torch.int32).contiguous().numpy().tobytes()
    blobs["packed.cu_seqlens"] = torch.tensor(cu, dtype=torch.int32).numpy().tobytes()
    blobs["packed.loss"] = loss.reshape(1).to(torch.float32).numpy().tobytes()
    for n in names:
        blobs["packed.grad." + n] = grads[n].to(torch.float32).contiguous().numpy().tobytes()


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def script_hash():
    with open(os.path.abspath(__file__), "rb") as f:
        return fnv1a64(f.read())


def metadata(torch_version=None):
    m = {
        "format": "pt",
        "kiln.golden": "gpt2",
        "kiln.golden.version": FORMAT_VERSION,
        "generator": "tests/golden/make_gpt2_golden.py",
        "generator_fnv1a64": script_hash(),
        "reference_dtype": "float64",
        "batch_size": str(B),
        "seq_len": str(T),
        "ignore_index": str(IGNORE_INDEX),
        "n_targets": str(B * T - N_IGNORED),
        "seed": str(SEED),
        "adamw.steps": str(ADAMW_STEPS),
        "adamw.decay": "2-D parameters (embeddings and linear weights)",
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


DTYPE_SIZE = {"F32": 4, "I32": 4}


def build_header(specs, meta):
    """The header dict (with data offsets) and the data section size."""
    header = {"__metadata__": meta}
    pos = 0
    for name, dtype, shape in specs:
        n = DTYPE_SIZE[dtype] * math.prod(shape)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [pos, pos + n]}
        pos += n
    return header, pos


def encode_header(header):
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)  # data section 8-byte aligned
    return struct.pack("<Q", len(text)) + text


def write_safetensors(path, specs, blobs, meta):
    header, _ = build_header(specs, meta)
    for (name, dtype, shape), blob in zip(specs, blobs):
        assert len(blob) == DTYPE_SIZE[dtype] * math.prod(shape), name
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(encode_header(header))
        for blob in blobs:
            f.write(blob)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)



def read_header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n).decode("utf-8"))


def check(path):
    """Exit status 0 when the stored header is what this script would write."""
    try:
        stored = read_header(path)
    except (OSError, ValueError, struct.error) as e:
        print(f"{path}: cannot read the safetensors header: {e}", file=sys.stderr)
        return 1
    expected, _ = build_header(tensor_specs(CONFIG), metadata())
    stored_meta = dict(stored.get("__metadata__", {}))
    for k in PROVENANCE_KEYS:
        stored_meta.pop(k, None)
    stored["__metadata__"] = stored_meta
    problems = []
    for k in sorted(set(stored) | set(expected)):
        if k == "__metadata__":
            continue
        if stored.get(k) != expected.get(k):
            problems.append(f"tensor {k}: stored {stored.get(k)}, expected {expected.get(k)}")
    sm, em = stored["__metadata__"], expected["__metadata__"]
    for k in sorted(set(sm) | set(em)):
        if sm.get(k) != em.get(k):
            problems.append(f"metadata {k}: stored {sm.get(k)!r}, expected {em.get(k)!r}")
    if problems:
        print(f"{path} is stale: regenerate it with /usr/bin/python3 "
              f"{em['generator']} (see tests/golden/README.md)", file=sys.stderr)
        for p in problems:
            print("  " + p, file=sys.stderr)
        return 1
    print(f"{path}: header and metadata match the generator")
    return 0


# ---- the model (torch is imported only when generating) ---------------------------------

def gelu_tanh(x):
    return 0.5 * x * (1.0 + (math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)).tanh())


def forward_logits(P, idx, cfg, packed=None):
    """packed: (positions [B,T], document ids [B,T]) of packed documents, or None."""
    import torch.nn.functional as F
    Bb, Tt = idx.shape
    C, nh = cfg["n_embd"], cfg["n_head"]
    hd = C // nh
    eps = cfg["layernorm_eps"]
    wpe = P["transformer.wpe.weight"]
    x = P["transformer.wte.weight"][idx] + (wpe[:Tt] if packed is None else wpe[packed[0]])
    causal = attention_mask(Tt, None if packed is None else packed[1])
    for l in range(cfg["n_layer"]):
        h = f"transformer.h.{l}."
        a = F.layer_norm(x, (C,), P[h + "ln_1.weight"], P[h + "ln_1.bias"], eps)
        qkv = F.linear(a, P[h + "attn.c_attn.weight"], P[h + "attn.c_attn.bias"])
        q, k, v = qkv.split(C, dim=2)
        q = q.view(Bb, Tt, nh, hd).transpose(1, 2)  # [B, NH, T, HD]
        k = k.view(Bb, Tt, nh, hd).transpose(1, 2)
        v = v.view(Bb, Tt, nh, hd).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(Bb, Tt, C)
        x = x + F.linear(y, P[h + "attn.c_proj.weight"], P[h + "attn.c_proj.bias"])
        m = F.layer_norm(x, (C,), P[h + "ln_2.weight"], P[h + "ln_2.bias"], eps)
        m = gelu_tanh(F.linear(m, P[h + "mlp.c_fc.weight"], P[h + "mlp.c_fc.bias"]))
        x = x + F.linear(m, P[h + "mlp.c_proj.weight"], P[h + "mlp.c_proj.bias"])
    x = F.layer_norm(x, (C,), P["transformer.ln_f.weight"], P["transformer.ln_f.bias"], eps)
    return F.linear(x, P["transformer.wte.weight"])  # tied lm_head: [B, T, Vp]


def mean_loss(P, idx, targets, cfg, packed=None):
    import torch.nn.functional as F
    V = cfg["vocab_size"]
    logits = forward_logits(P, idx, cfg, packed)[..., :V]
    loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), reduction="mean",
                           ignore_index=IGNORE_INDEX)
    return logits, loss


def init_params(cfg, gen):
    """float32 parameters: random weights, biases and LayerNorm gains.

    Scales are GPT-2's 0.02 except where larger values make the test more sensitive:
    with 0.02 everywhere, attention is almost uniform, the GELU inputs are so small
    that an erf GELU differs from the tanh one by under 1e-5, and so is the softmax.
    """
    import torch
    V, L = cfg["vocab_size"], cfg["n_layer"]
    P = {}
    for name, shape in param_specs(cfg):
        r = torch.randn(shape, generator=gen, dtype=torch.float32)
        if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
            t = 1.0 + 0.1 * r  # gains around 1
        elif name.endswith(("ln_1.bias", "ln_2.bias", "ln_f.bias")):
            t = 0.05 * r
        elif name.endswith(".bias"):
            t = 0.02 * r
        elif name.endswith("c_attn.weight"):
            t = 0.15 * r  # larger q.k so that attention is far from uniform
        elif name.endswith("c_fc.weight"):
            t = 0.2 * r  # GELU inputs of order 1, where tanh and erf GELU differ
        elif name.endswith("c_proj.weight"):
            t = (0.02 / math.sqrt(2 * L)) * r
        elif name == "transformer.wte.weight":
            t = 0.1 * r  # logits of order 1: a softmax far from uniform
        else:
            t = 0.02 * r
        if name == "transformer.wte.weight":
            t[V:] = 0.0  # padded vocabulary rows
        P[name] = t.contiguous()
    return P


def run_reference(P32, idx, targets, cfg, dtype):
    """logits, loss, grads and the AdamW losses, computing in `dtype`."""
    import torch
    P = {n: t.detach().to(dtype).clone().requires_grad_(True) for n, t in P32.items()}
    logits, loss = mean_loss(P, idx, targets, cfg)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in P.items()}
    logits, loss = logits.detach(), loss.detach()

    Q = {n: t.detach().to(dtype).clone().requires_grad_(True) for n, t in P32.items()}
    decay = [p for n, p in Q.items() if p.dim() == 2]
    no_decay = [p for n, p in Q.items() if p.dim() != 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": ADAMW["weight_decay"]},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=ADAMW["lr"], betas=(ADAMW["beta1"], ADAMW["beta2"]), eps=ADAMW["eps"])
    losses = []
    for _ in range(ADAMW_STEPS):
        opt.zero_grad(set_to_none=True)
        _, l = mean_loss(Q, idx, targets, cfg)
        losses.append(l.item())
        l.backward()
        opt.step()
    return logits, loss, grads, losses


def rel(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


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
    ignored = torch.randperm(B * T, generator=gen)[:N_IGNORED]
    targets.view(-1)[ignored] = IGNORE_INDEX

    logits, loss, grads, losses = run_reference(P32, idx, targets, cfg, torch.float64)

    # What plain float32 reaches against the float64 reference: a guide to the
    # tolerances of tests/golden/gpt2_golden_test.cpp (printed, not stored).
    l32, loss32, g32, losses32 = run_reference(P32, idx, targets, cfg, torch.float32)
    print(f"float32 torch vs float64 reference: logits rel {rel(l32.double(), logits):.2e}, "
          f"loss rel {abs(loss32.item() - loss.item()) / loss.item():.2e}")
    worst = max((rel(g32[n].double(), grads[n]), n) for n in grads if grads[n].norm() > 0)
    print(f"  worst gradient rel error {worst[0]:.2e} ({worst[1]})")
    print("  adamw loss rel errors " +
          " ".join(f"{abs(a - b) / b:.1e}" for a, b in zip(losses32, losses)))
    print(f"loss {loss.item():.6f}; adamw losses " + " ".join(f"{x:.5f}" for x in losses))
    packed = packed_reference(P32, idx, targets, cfg, mean_loss, PACKED_DOCS)
    print(f"packed documents {PACKED_DOCS}: loss {packed[2].item():.6f}")

    def f32(t):
        return t.detach().to(torch.float32).contiguous().numpy().tobytes()

    def i32(t):
        return t.to(torch.int32).contiguous().numpy().tobytes()

    blobs = {}
    for name, _ in param_specs(cfg):
        blobs[name] = f32(P32[name])
        blobs["grad." + name] = f32(grads[name])
    blobs["input_tokens"] = i32(idx)
    blobs["target_tokens"] = i32(targets)
    blobs["logits"] = f32(logits)
    blobs["loss"] = f32(loss.reshape(1))
    blobs["adamw_losses"] = f32(torch.tensor(losses, dtype=torch.float64))
    packed_blobs(blobs, [n for n, _ in param_specs(cfg)], *packed)
    specs = tensor_specs(cfg)
    write_safetensors(out, specs, [blobs[n] for n, _, _ in specs],
                      metadata(torch_version=str(torch.__version__)))
    print(f"wrote {out} ({os.path.getsize(out)} bytes)")


def cli(doc, default_out, generate_fn, check_fn):
    """The command line of every generator: write `--out` (default_out) then check it, or
    with --check only check a file's header and metadata. The exit status."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--out", default=default_out, help="file to write (default: %(default)s)")
    ap.add_argument("--check", nargs="?", const=default_out, metavar="FILE",
                    help="only check that FILE's header and metadata match this script")
    args = ap.parse_args()
    if args.check:
        return check_fn(args.check)
    generate_fn(args.out)
    return check_fn(args.out)


def main():
    return cli(__doc__, DEFAULT_OUT, generate, check)


if __name__ == "__main__":
    sys.exit(main())
