#!/usr/bin/env python3
"""The end of scripts/gpu-check.sh: one JSON summary and the tables, from the phase logs.

Reads OUT/ops.log, trainer.log, bench.log and torch.log (whichever exist), writes
OUT/gpu-check.json (atomically) and prints the tables:
  phases      name, status (ok, FAILED, TIMEOUT, skipped, prebuilt), seconds
  ops         per test program: passed, failed (names), skipped, finished (gtest's end
              line seen); the worst relative error per cuda op output; kiln_gpu_bf16's count; compute-sanitizer's exit statuses
  trainer     the train-check:, moe-check: (--moe) and mmdit-check: (--mmdit) lines;
              plan-check: lines (--plan)
  bench       kiln and PyTorch (GPT-2 124M, T=1024): ms/step, tokens/s, model TFLOP/s and
              MFU against one common peak (the bf16 GEMM rate kiln_gpu_step measured in
              the bench phase: MFU = model TFLOP/s / that peak), the kiln/PyTorch ratio
  variants    each switch's run, its tokens/s against the base variant's
  profile     per kind (gemm, attention, norms, ...) ms per step, kiln beside PyTorch

Usage: summary.py --out DIR --mode full|quick --cap S --result ok|FAILED|incomplete|skipped
                  --seconds S --device TEXT [--phase NAME:STATUS:SECONDS]...
"""
import argparse
import datetime
import json
import os
import re


def sections(path):
    """(header, lines) for each '=== header' block of a log; lines before any header
    belong to the header ''."""
    if not os.path.exists(path):
        return []
    out = [("", [])]
    with open(path, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("=== "):
                out.append((line[4:], []))
            else:
                out[-1][1].append(line)
    return out


def json_lines(lines):
    rows = []
    for line in lines:
        if line.startswith("{"):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return rows


GTEST_COUNT = re.compile(r"^\[ +(PASSED|SKIPPED) +\] (\d+) test")
GTEST_FAILED = re.compile(r"^\[  FAILED  \] ([A-Za-z_][\w/.]*)")
OP_ERROR = re.compile(r"^\s+cuda: (.+?)\s+rel ([0-9.eE+-]+)")
BF16_COUNT = re.compile(r"^bf16 check: (\d+) passed, (\d+) failed")
SANITIZE = re.compile(r"^sanitize (\w+) exit status (\d+)")


def parse_ops(path):
    programs, cuda_ops, bf16, sanitize = {}, {}, None, []
    for header, lines in sections(path):
        name = header.split(":")[0].strip()
        m = SANITIZE.match(header)
        if m:
            sanitize.append({"tool": m.group(1), "exit_status": int(m.group(2))})
            continue
        if name in ("", "ops") or name.startswith("sanitize"):
            continue
        prog = {"passed": 0, "failed": [], "skipped": 0, "finished": False}
        for line in lines:
            if re.match(r"^\[==========\] \d+ tests? from .* ran", line):
                prog["finished"] = True  # (a crash or a timeout never prints it)
            m = GTEST_COUNT.match(line)
            if m:
                prog["passed" if m.group(1) == "PASSED" else "skipped"] = int(m.group(2))
            m = GTEST_FAILED.match(line)
            if m and m.group(1) not in prog["failed"]:
                prog["failed"].append(m.group(1))
            m = OP_ERROR.match(line)
            if m:
                cuda_ops[m.group(1)] = max(cuda_ops.get(m.group(1), 0.0), float(m.group(2)))
            m = BF16_COUNT.match(line)
            if m:
                bf16 = {"passed": int(m.group(1)), "failed": int(m.group(2))}
        if name != "kiln_gpu_bf16":  # (its count is bf16_check)
            programs[name] = prog
    return {"programs": programs, "cuda_worst_rel": cuda_ops, "bf16_check": bf16,
            "sanitize": sanitize}


def parse_trainer(path):
    lines = [l for _, ls in sections(path) for l in ls]
    return tuple([l for l in lines if l.startswith(p)]
                 for p in ("train-check:", "moe-check:", "mmdit-check:"))


def parse_bench(bench_path, torch_path):
    """The kiln run, PyTorch's, the variants; MFU recomputed against one peak."""
    kiln, variants = None, []
    for header, lines in sections(bench_path):
        rows = [r for r in json_lines(lines) if r.get("impl") == "kiln"]
        if header.startswith("variant "):
            name, _, words = header[len("variant "):].partition(":")
            variants.append({"name": name, "set": words.strip(), **(rows[-1] if rows else {"failed": True})})
        elif rows:
            kiln = rows[-1]
    torch_rows = json_lines(l for _, ls in sections(torch_path) for l in ls)
    torch = next((r for r in torch_rows if "ms_per_step" in r), None)
    torch_kinds = next((r["profile_kinds"] for r in torch_rows if "profile_kinds" in r), None)
    peak = kiln["peak_bf16_tflops"] if kiln else (torch["peak_bf16_tflops"] if torch else None)
    for r in [kiln, torch] + variants:
        if r and "model_tflops" in r and peak:
            r["mfu"] = round(r["model_tflops"] / peak, 4)
    base = next((v for v in variants if v["name"] == "base" and "tokens_per_s" in v), None)
    for v in variants:
        if base and "tokens_per_s" in v:
            v["vs_base"] = round(v["tokens_per_s"] / base["tokens_per_s"], 4)
    rows = [r for r in (kiln, torch) if r]
    return {
        "common_peak_bf16_tflops": peak,
        "peak_source": "kiln_gpu_step: the backend's linear_forward, bf16 8192^3",
        "rows": rows,
        "kiln_over_pytorch": round(kiln["tokens_per_s"] / torch["tokens_per_s"], 4)
        if kiln and torch else None,
        "profile_kinds": {"kiln": (kiln or {}).get("profile_kinds"), "pytorch": torch_kinds},
    }, variants


def print_tables(s):
    print()
    print(f"gpu-check {s['mode']} on {s['device']}: {s['result']} in {s['seconds']} s "
          f"(cap {s['cap_s']} s)")
    print(f"{'phase':10} {'status':9} {'s':>5}")
    for p in s["phases"]:
        print(f"{p['name']:10} {p['status']:9} {p['seconds']:>5}")
    ops = s["ops"]
    for name, p in ops["programs"].items():
        failed = f", FAILED: {' '.join(p['failed'])}" if p["failed"] else ""
        unfinished = "" if p["finished"] else " (did not finish: crashed or timed out)"
        print(f"ops: {name}: {p['passed']} passed, {p['skipped']} skipped{failed}{unfinished}")
    if ops["bf16_check"]:
        print(f"ops: kiln_gpu_bf16: {ops['bf16_check']['passed']} passed, "
              f"{ops['bf16_check']['failed']} failed")
    if ops["cuda_worst_rel"]:
        worst = max(ops["cuda_worst_rel"].items(), key=lambda kv: kv[1])
        print(f"ops: {len(ops['cuda_worst_rel'])} cuda ops checked, worst relative error "
              f"{worst[1]:.2e} ({worst[0]})")
    for t in ops["sanitize"]:
        print(f"ops: compute-sanitizer {t['tool']}: exit status {t['exit_status']}")
    for line in s["trainer"] + s["moe"] + s["mmdit"] + s["plan"]:
        print(line)
    b = s["bench"]
    if b["rows"]:
        print(f"\nGPT-2 124M training step, T=1024; MFU against one bf16 GEMM peak, "
              f"{b['common_peak_bf16_tflops']} TFLOP/s ({b['peak_source']})")
        print(f"{'impl':8} {'dtype':18} {'B':>3} {'ms/step':>9} {'tokens/s':>10} {'TFLOP/s':>8} "
              f"{'MFU':>6} {'loss':>7} {'GiB':>6}")
        for r in b["rows"]:
            print(f"{r['impl']:8} {r['dtype']:18} {r['B']:>3} {r['ms_per_step']:>9.1f} "
                  f"{r['tokens_per_s']:>10.0f} {r['model_tflops']:>8.1f} {100 * r['mfu']:>5.1f}% "
                  f"{r['loss']:>7.3f} {r['peak_gib']:>6.1f}")
        if b["kiln_over_pytorch"]:
            print(f"kiln / PyTorch tokens/s: {b['kiln_over_pytorch']:.3f}")
    if s["variants"]:
        print(f"\n{'variant':18} {'ms/step':>9} {'tokens/s':>10} {'MFU':>6} {'vs base':>8}  loss (exact)")
        for v in s["variants"]:
            if "tokens_per_s" not in v:
                print(f"{v['name']:18} FAILED ({v['set']})")
                continue
            print(f"{v['name']:18} {v['ms_per_step']:>9.2f} {v['tokens_per_s']:>10.0f} "
                  f"{100 * v['mfu']:>5.1f}% {v.get('vs_base', 1.0):>8.3f}  {v['loss_exact']!r}")
    kinds = b["profile_kinds"]
    if kinds["kiln"] or kinds["pytorch"]:
        names = list(dict.fromkeys(list(kinds["kiln"] or {}) + list(kinds["pytorch"] or {})))
        print(f"\n{'kind (ms/step)':18} {'kiln':>9} {'pytorch':>9}")
        for k in names:
            a = (kinds["kiln"] or {}).get(k)
            t = (kinds["pytorch"] or {}).get(k)
            print(f"{k:18} {'-' if a is None else f'{a:.2f}':>9} {'-' if t is None else f'{t:.2f}':>9}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--mode", required=True)
    ap.add_argument("--cap", type=int, required=True)
    ap.add_argument("--result", required=True)
    ap.add_argument("--seconds", type=int, required=True)
    ap.add_argument("--device", required=True)
    ap.add_argument("--phase", action="append", default=[])
    a = ap.parse_args()
    phases = []
    for p in a.phase:
        name, status, seconds = p.split(":")
        phases.append({"name": name, "status": status, "seconds": int(seconds)})
    trainer, moe, mmdit = parse_trainer(os.path.join(a.out, "trainer.log"))
    bench, variants = parse_bench(os.path.join(a.out, "bench.log"), os.path.join(a.out, "torch.log"))
    plan = [l for _, ls in sections(os.path.join(a.out, "bench.log")) for l in ls
            if l.startswith("plan-check:")]
    s = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": a.device, "mode": a.mode, "cap_s": a.cap, "seconds": a.seconds,
        "result": a.result, "phases": phases,
        "ops": parse_ops(os.path.join(a.out, "ops.log")),
        "trainer": trainer, "moe": moe, "mmdit": mmdit, "bench": bench, "variants": variants,
        "plan": plan,
    }
    path = os.path.join(a.out, "gpu-check.json")
    with open(path + ".tmp", "w") as f:
        json.dump(s, f, indent=1)
        f.write("\n")
    os.replace(path + ".tmp", path)
    print_tables(s)


if __name__ == "__main__":
    main()
