"""The training loop, timing and JSON result shared by the PyTorch peers of `kiln bench`
(gpt2_train.py, llama_train.py), for bench/compare_pytorch.sh.

Reads the file written by `kiln bench CONFIG --dump-init FILE` (safetensors): kiln's
initial weights (kiln's parameter names; every linear weight [out, in] as torch.nn.Linear
stores it; embeddings and heads with the vocabulary padded to Vp rows, of which the first
V are used), the batches of every step (bench.inputs / bench.targets, int32 [steps, rows,
T]) and the learning rate of every step (bench.lr); metadata: `arch`, `model` (the
model's config_json(), as kiln's checkpoints store it) and the step's hyper-parameters.
Then it trains exactly as kiln does:

  zero_grad; for each micro-batch: loss_sum = cross_entropy(logits, targets, sum),
  (loss_sum / targets in the step).backward(); clip_grad_norm_(grad_clip); AdamW(lr of the
  step, betas, eps, weight decay on 2-D parameters); dropout 0.

and prints one line per step and, last, one JSON line (tokens_per_s, phases, losses).
A peer supplies its arch's module: built from (model config, weights), forward(idx) ->
logits [B, T, V].

Run with Debian's PyTorch (/usr/bin/python3). Threads: --threads (torch.set_num_threads).
Settings, chosen per CPU by the wrapper script (bench/compare_pytorch.sh): OpenBLAS
installed (libopenblas0-openmp; Debian's torch otherwise uses the reference BLAS), its
kernels left to OpenBLAS except where it misdetects a CPU that has the instructions
(bench/pytorch/openblas_core.py), and OMP_WAIT_POLICY=passive (as for kiln).
"""
import argparse
import json
import struct
import time

import numpy as np
import torch
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


def causal_mask(n):
    """bool [n, n], True above the diagonal (the positions a query must not see)."""
    return torch.ones(n, n, dtype=torch.bool).triu(1)


def main(arch, build, doc):
    """build(cfg, weights) -> (module, one-line description). cfg: the dump's model json."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    if "model" not in meta:
        raise SystemExit(f"{args.init}: no model config in its metadata (written by an older "
                         "kiln: write it again with kiln bench --dump-init)")
    if meta["arch"] != arch:
        raise SystemExit(f"{args.init} holds a {meta['arch']} model; this peer builds a {arch}")
    cfg = json.loads(meta["model"])
    m = lambda k, t=int: t(meta[k])
    accum, B, T = m("accum"), m("micro_batch"), m("seq_len")
    warmup = args.warmup if args.warmup >= 0 else m("warmup")
    steps = args.steps if args.steps > 0 else m("steps")
    inputs, targets, lrs = w["bench.inputs"].long(), w["bench.targets"].long(), w["bench.lr"]
    assert warmup + steps <= inputs.shape[0], "the file holds fewer steps than requested"

    model, desc = build(cfg, w)
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
    print(f"pytorch {torch.__version__}: {desc} | {accum} micro-step(s) "
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
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(params, clip)
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
