#!/usr/bin/python3
"""The same GPT-2 training step as `kiln bench`, in PyTorch, for bench/compare_pytorch.sh.

Reads the file written by `kiln bench CONFIG --dump-init FILE` (safetensors): kiln's
initial weights (kiln's parameter names; every linear weight [out, in] as torch.nn.Linear
stores it; wte with the vocabulary padded to Vp rows, of which the first V are used),
the batches of every step (bench.inputs / bench.targets, int32 [steps, rows, T]) and the
learning rate of every step (bench.lr), plus the hyper-parameters as metadata. Then it
trains exactly as kiln does:

  zero_grad; for each micro-batch: loss_sum = cross_entropy(logits, targets, sum),
  (loss_sum / targets in the step).backward(); clip_grad_norm_(grad_clip); AdamW(lr of the
  step, betas, eps, weight decay on 2-D parameters); dropout 0.

and prints one line per step and, last, one JSON line (tokens_per_s, phases, losses).
Model: pre-LN GPT-2 (nanoGPT layout), tanh GELU, causal attention written out (torch
1.13 has no scaled_dot_product_attention), output projection tied to wte.

Run with Debian's PyTorch (/usr/bin/python3). Threads: --threads (torch.set_num_threads).
Settings, chosen per CPU by the wrapper script (bench/compare_pytorch.sh): OpenBLAS
installed (libopenblas0-openmp; Debian's torch otherwise uses the reference BLAS), its
kernels left to OpenBLAS except where it misdetects a CPU that has the instructions
(bench/pytorch/openblas_core.py), and OMP_WAIT_POLICY=passive (as for kiln).
"""
import argparse
import json
import math
import struct
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def read_safetensors(path):
    """A minimal safetensors reader: {name: torch tensor}, metadata dict."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    dtypes = {"F32": np.float32, "I32": np.int32, "F64": np.float64, "I64": np.int64}
    out = {}
    meta = header.pop("__metadata__", {})
    for name, info in header.items():
        b, e = info["data_offsets"]
        arr = np.frombuffer(data, dtype=dtypes[info["dtype"]], count=(e - b) // np.dtype(dtypes[info["dtype"]]).itemsize, offset=b)
        out[name] = torch.from_numpy(arr.reshape(info["shape"]).copy())
    return out, meta


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
        mask = torch.ones(block_size, block_size, dtype=torch.bool).triu(1)
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("init", help="file written by kiln bench --dump-init")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=0, help="timed steps (default: as the file)")
    ap.add_argument("--warmup", type=int, default=-1, help="warm-up steps (default: as the file)")
    ap.add_argument("--foreach", choices=["auto", "on", "off"], default="auto",
                    help="AdamW multi-tensor implementation")
    ap.add_argument("--profile", action="store_true",
                    help="run the timed steps under torch.autograd.profiler and print its per-op "
                         "table (compare with kiln bench --trace; the timings include its overhead)")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    w, meta = read_safetensors(args.init)
    m = lambda k, t=int: t(meta[k])
    L, NH, C, V, BS = m("n_layer"), m("n_head"), m("n_embd"), m("vocab_size"), m("block_size")
    accum, B, T = m("accum"), m("micro_batch"), m("seq_len")
    warmup = args.warmup if args.warmup >= 0 else m("warmup")
    steps = args.steps if args.steps > 0 else m("steps")
    inputs, targets, lrs = w["bench.inputs"].long(), w["bench.targets"].long(), w["bench.lr"]
    assert warmup + steps <= inputs.shape[0], "the file holds fewer steps than requested"

    model = GPT2(L, NH, C, V, BS, m("layernorm_eps", float))
    model.load_kiln(w, V)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    kw = {} if args.foreach == "auto" else {"foreach": args.foreach == "on"}
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": m("weight_decay", float)},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=float(lrs[0]), betas=(m("beta1", float), m("beta2", float)),
                            eps=m("eps", float), **kw)
    clip = m("grad_clip", float)
    params = list(model.parameters())
    tokens_per_step = accum * B * T
    print(f"pytorch {torch.__version__}: GPT-2 L={L} NH={NH} C={C} V={V} | {accum} micro-step(s) "
          f"of B={B} T={T} | {warmup} warm-up + {steps} timed | {torch.get_num_threads()} threads",
          flush=True)

    losses, t_data, t_fwd, t_bwd, t_opt, t_step, t_min = [], 0.0, 0.0, 0.0, 0.0, 0.0, 1e30
    prof = None
    for step in range(warmup + steps):
        if args.profile and step == warmup:
            prof = torch.autograd.profiler.profile()
            prof.__enter__()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        t = time.perf_counter()
        d_opt = t - t0
        d_data = d_fwd = d_bwd = 0.0
        y_all = targets[step]
        n_targets = int((y_all != -1).sum())
        loss_sum = 0.0
        for k in range(accum):
            t1 = time.perf_counter()
            x = inputs[step, k * B:(k + 1) * B].contiguous()
            y = targets[step, k * B:(k + 1) * B].contiguous()
            t2 = time.perf_counter()
            logits = model(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1), ignore_index=-1,
                                   reduction="sum")
            t3 = time.perf_counter()
            (loss / n_targets).backward()
            t4 = time.perf_counter()
            loss_sum += float(loss.detach())
            d_data += t2 - t1
            d_fwd += t3 - t2
            d_bwd += t4 - t3
        t5 = time.perf_counter()
        norm = torch.nn.utils.clip_grad_norm_(params, clip) if clip > 0 else None
        for g in opt.param_groups:
            g["lr"] = float(lrs[step])
        opt.step()
        t6 = time.perf_counter()
        d_opt += t6 - t5
        dt = t6 - t0
        loss_mean = loss_sum / n_targets
        losses.append(loss_mean)
        if step >= warmup:
            t_data += d_data; t_fwd += d_fwd; t_bwd += d_bwd; t_opt += d_opt; t_step += dt
            t_min = min(t_min, dt)
        print(f"step {step:3d}{' (warm-up)' if step < warmup else ''} | loss {loss_mean:.6f} | "
              f"{dt * 1e3:.1f} ms (data {d_data * 1e3:.1f}, fwd {d_fwd * 1e3:.1f}, bwd {d_bwd * 1e3:.1f}, "
              f"opt {d_opt * 1e3:.1f}) | {tokens_per_step / dt:.0f} tok/s", flush=True)

    if prof is not None:
        prof.__exit__(None, None, None)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25), flush=True)
    n = float(steps)
    res = {
        "tokens_per_s": tokens_per_step * n / t_step,
        "step_ms": t_step / n * 1e3, "step_ms_min": t_min * 1e3,
        "data_ms": t_data / n * 1e3, "forward_ms": t_fwd / n * 1e3,
        "backward_ms": t_bwd / n * 1e3, "optimizer_ms": t_opt / n * 1e3,
        "losses": losses, "threads": torch.get_num_threads(), "torch": torch.__version__,
        "steps": steps, "warmup": warmup, "tokens_per_step": tokens_per_step,
    }
    print(json.dumps(res), flush=True)


if __name__ == "__main__":
    sys.exit(main())
