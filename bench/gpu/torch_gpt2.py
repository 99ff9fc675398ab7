#!/usr/bin/env python3
"""GPT-2 training steps in PyTorch: the reference side of scripts/gpu-check.sh.

The same model as kiln's GPT2 (pre-LN blocks, tanh GELU, tied output projection, vocab
padded to 50304, biases everywhere), trained the way a PyTorch user would run it fast:
torch.compile, bf16 autocast (fp32 master weights), scaled_dot_product_attention
(FlashAttention kernels), fused AdamW, TF32 allowed for the fp32 parts. Prints one JSON
line with the same fields as bench/gpu/kiln_gpu_step.cpp.

--profile N: N more steps under torch.profiler, their CUDA kernels' self time summed per
kind by kernel name (kind_of: gemm, attention, norms, elementwise, classifier, optimizer,
memory) in ms per step, and idle = the event-timed step minus the kernels' sum: the side
of kiln_gpu_step --profile's kind table. torch.compile fuses the loss into Triton
kernels ("elementwise" here) and the tied output projection is a GEMM like the others,
so "classifier" holds only what kept a loss-like name. The kinds also go to stdout as a
second JSON line, {"impl": "pytorch", "profile_kinds": {kind: ms per step, "idle": ms}}.

--peak-tflops X: MFU against X (the bf16 GEMM peak scripts/gpu-check.sh measured once, in
kiln_gpu_step, for every run) instead of measuring torch.matmul's peak here.

Usage: torch_gpt2.py [--B 16] [--T 1024] [--steps 30] [--warmup 3] [--no-compile]
                     [--profile N] [--peak-tflops X]
"""
import argparse
import json
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.NH = NH
        self.ln_1 = nn.LayerNorm(C)
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.NH, C // self.NH).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, n_layer=12, n_head=12, n_embd=768, vocab=50304, block=1024):
        super().__init__()
        self.wte = nn.Embedding(vocab, n_embd)
        self.wpe = nn.Embedding(block, n_embd)
        self.h = nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * n_layer) if "proj" in name else 0.02
                nn.init.normal_(p, 0.0, std)
            elif "ln" in name and name.endswith("weight"):
                nn.init.ones_(p)
            else:
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for blk in self.h:
            x = blk(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def gemm_peak_bf16(n=8192, reps=20):
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    best = 0.0
    for _ in range(3):
        t0 = torch.cuda.Event(enable_timing=True)
        t1 = torch.cuda.Event(enable_timing=True)
        t0.record()
        for _ in range(reps):
            a @ b
        t1.record()
        torch.cuda.synchronize()
        best = max(best, 2 * n**3 * reps / (t0.elapsed_time(t1) / 1e3))
    return best


KINDS = [  # (kind, substrings of kernel names), first match wins
    ("attention", ("flash", "fmha", "attention", "sdpa", "attn")),
    ("classifier", ("cross_entropy", "log_softmax", "nll_loss", "softmax")),
    ("norms", ("layer_norm", "layernorm", "rms_norm")),
    ("optimizer", ("adam", "multi_tensor", "foreach")),
    ("gemm", ("gemm", "cutlass", "xmma", "nvjet", "matmul", "cublas", "sm90_", "sm80_")),
    ("memory", ("memcpy", "memset", "copy_")),
]


def kind_of(name):
    n = name.lower()
    for kind, keys in KINDS:
        if any(k in n for k in keys):
            return kind
    return "elementwise"


def profile_kinds(step, steps, step_ms):
    """Per-kind kernel time (ms per step) of `steps` steps under torch.profiler."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    kinds = {}
    for a in prof.key_averages():
        us = getattr(a, "self_device_time_total", None)
        if us is None:
            us = getattr(a, "self_cuda_time_total", 0)
        if us > 0:
            kinds[kind_of(a.key)] = kinds.get(kind_of(a.key), 0.0) + us / 1e3 / steps
    total = sum(kinds.values())
    print(f"torch_gpt2: profiled {steps} steps (torch.profiler, kernels' self time):",
          file=sys.stderr)
    print(f"{'kind':24} {'ms/step':>10} {'% step':>7}", file=sys.stderr)
    for kind, ms in sorted(kinds.items(), key=lambda kv: -kv[1]):
        print(f"{kind:24} {ms:>10.2f} {100 * ms / step_ms:>6.1f}%", file=sys.stderr)
    idle = max(0.0, step_ms - total)
    print(f"{'idle':24} {idle:>10.2f} {100 * idle / step_ms:>6.1f}%", file=sys.stderr, flush=True)
    kinds["idle"] = idle
    print(json.dumps({"impl": "pytorch",
                      "profile_kinds": {k: round(v, 3) for k, v in kinds.items()}}), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--B", type=int, default=16)
    ap.add_argument("--T", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--profile", type=int, default=0)
    ap.add_argument("--peak-tflops", type=float, default=0.0)
    args = ap.parse_args()

    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(1337)
    peak = args.peak_tflops * 1e12 if args.peak_tflops > 0 else gemm_peak_bf16()
    print(f"torch_gpt2: torch {torch.__version__}, bf16 GEMM peak {peak / 1e12:.1f} TFLOP/s "
          f"({'given' if args.peak_tflops > 0 else 'measured'})", file=sys.stderr, flush=True)

    model = GPT2(block=max(1024, args.T)).cuda()
    n_params = sum(p.numel() for p in model.parameters())
    # Same count as kiln's GPT2Config::num_flop_parameters: without wpe and padded rows.
    n_flop = n_params - model.wpe.weight.numel() - (50304 - 50257) * 768
    flops_per_token = 6 * n_flop + 12 * 12 * args.T * 768
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1, fused=True)
    step_model = model if args.no_compile else torch.compile(model)

    B = args.B
    while True:
        try:
            idx = torch.randint(0, 50257, (B, args.T + 1), device="cuda")
            x, y = idx[:, :-1].contiguous(), idx[:, 1:].contiguous()

            def step():
                opt.zero_grad(set_to_none=True)
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = step_model(x, y)
                loss.backward()
                opt.step()
                return loss

            t_compile = time.time()
            for _ in range(args.warmup):
                step()
            torch.cuda.synchronize()
            print(f"torch_gpt2: warm-up (compile) {time.time() - t_compile:.1f} s",
                  file=sys.stderr, flush=True)
            break
        except torch.cuda.OutOfMemoryError:
            if B == 1:
                raise
            print(f"torch_gpt2: B={B} does not fit; trying B={B // 2}", file=sys.stderr)
            B //= 2
            torch.cuda.empty_cache()

    # Median of event-timed steps (as kiln_gpu_step's median of its steps).
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(args.steps)]
    for e0, e1 in events:
        e0.record()
        loss = step()
        e1.record()
    torch.cuda.synchronize()
    times = sorted(e0.elapsed_time(e1) for e0, e1 in events)
    ms = times[len(times) // 2]
    tps = B * args.T / (ms / 1e3)
    print(json.dumps({
        "impl": "pytorch", "B": B, "T": args.T, "dtype": "bf16 autocast",
        "ms_per_step": round(ms, 3), "tokens_per_s": round(tps, 1),
        "model_tflops": round(tps * flops_per_token / 1e12, 2),
        "peak_bf16_tflops": round(peak / 1e12, 1), "mfu": round(tps * flops_per_token / peak, 4),
        "loss": round(loss.item(), 4),
        "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
    }), flush=True)
    if args.profile > 0:
        try:
            profile_kinds(step, args.profile, ms)
        except Exception as e:  # the measurement above stands without the profile
            print(f"torch_gpt2: profile failed: {e!r}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
