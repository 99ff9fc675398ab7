#!/usr/bin/env python3
"""The table of bench/plan/validate.sh: kiln plan's predictions against measured runs.

Reads OUT/layouts.txt (name|world|timed|keys), OUT/plan-wN.json (kiln plan --json) and
each run's OUT/run-NAME/metrics.jsonl; prints per layout the predicted and measured step
time (median of the updates after the first two) and peak bytes (the highest rank's),
then the memory errors, Spearman's rank correlation of predicted against measured step
times (all timed layouts, and per world size), and whether the planner's first choice
among the measured 2-rank layouts (its rule: within 2% of the fastest predicted, the
simplest) is within 10% of the fastest measured one. Writes
OUT/validation.json.
"""
import json
import os
import statistics
import sys

DEFAULTS = {"parallel.cp": 1, "parallel.tp": 1, "parallel.pp": 1, "parallel.sequence_parallel": False,
            "parallel.virtual_stages": 1, "parallel.pp_schedule": "1f1b", "parallel.zero_stage": 0,
            "train.activation_checkpointing": "none", "train.micro_batch": 4}
FIELDS = {"parallel.cp": "cp", "parallel.tp": "tp", "parallel.pp": "pp",
          "parallel.sequence_parallel": "sequence_parallel", "parallel.virtual_stages": "virtual_stages",
          "parallel.zero_stage": "zero_stage", "train.activation_checkpointing": "activation_checkpointing",
          "train.micro_batch": "micro_batch"}


def parse_keys(keys):
    want = dict(DEFAULTS)
    for kv in keys.split():
        k, v = kv.split("=", 1)
        want[k] = v == "true" if v in ("true", "false") else int(v) if v.isdigit() else v
    return want


def predicted(plans, world, want):
    for l in plans[world]["layouts"]:
        if all(l[f] == want[k] for k, f in FIELDS.items()) and (
                l["pp"] == 1 or l["pp_schedule"] == want["parallel.pp_schedule"]):
            return l
    raise SystemExit(f"validate: kiln plan has no layout {want} on {world} ranks")


def simplicity(row):
    k = parse_keys(row["keys"])
    recompute = {"none": 0, "selective": 1, "full": 2}[k["train.activation_checkpointing"]]
    return (recompute, k["parallel.zero_stage"],
            k["parallel.cp"] * k["parallel.tp"] * k["parallel.pp"] * k["parallel.virtual_stages"],
            int(k["parallel.sequence_parallel"]), -k["train.micro_batch"])


def measured(run_dir):
    recs = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl")) if l.startswith("{")]
    steps = [r for r in recs if "step_time_s" in r]
    times = [r["step_time_s"] for r in steps[2:]] or [r["step_time_s"] for r in steps]
    peak = 0
    for r in recs:
        if "mem_by_rank" in r:
            peak = max([peak] + [m["peak"] for m in r["mem_by_rank"]])
        elif "peak_mem_bytes" in r:
            peak = max(peak, r["peak_mem_bytes"])
    return statistics.median(times), peak


def ranks(xs):
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    r = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return r


def spearman(a, b):
    ra, rb = ranks(a), ranks(b)
    ma, mb = statistics.mean(ra), statistics.mean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va = sum((x - ma) ** 2 for x in ra) ** 0.5
    vb = sum((y - mb) ** 2 for y in rb) ** 0.5
    return cov / (va * vb) if va > 0 and vb > 0 else float("nan")


def main():
    out = sys.argv[1]
    plans = {}
    for w in (1, 2, 4):
        with open(os.path.join(out, f"plan-w{w}.json")) as f:
            plans[w] = json.load(f)
    cal = json.load(open(os.path.join(out, "calibration.json")))
    rows = []
    for line in open(os.path.join(out, "layouts.txt")):
        name, world, timed, keys = line.rstrip("\n").split("|")
        world, timed = int(world), timed == "1"
        p = predicted(plans, world, parse_keys(keys))
        step, peak = measured(os.path.join(out, f"run-{name}"))
        rows.append({"name": name, "world": world, "timed": timed, "keys": keys,
                     "predicted_step_s": p["step_s"], "measured_step_s": step if timed else None,
                     "predicted_peak_bytes": p["peak_bytes"], "measured_peak_bytes": peak,
                     "memory_error": p["peak_bytes"] / peak - 1 if peak else None,
                     "predicted_parts_s": {k: p[k + "_s"] for k in
                                           ("compute", "bubble", "tp", "cp", "pp", "dp")}})
    print(f"kiln plan against measured runs: {cal['machine']}, {cal['threads']} thread per rank, "
          f"calibrated {cal['date']}")
    print(f"{'layout':22} {'ranks':>5} {'pred ms':>9} {'meas ms':>9} {'ratio':>6} "
          f"{'pred MiB':>9} {'meas MiB':>9} {'mem err':>8}")
    for r in rows:
        ms = f"{1e3 * r['measured_step_s']:9.1f}" if r["timed"] else f"{'-':>9}"
        ratio = f"{r['predicted_step_s'] / r['measured_step_s']:6.2f}" if r["timed"] else f"{'-':>6}"
        err = f"{100 * r['memory_error']:+7.1f}%" if r["memory_error"] is not None else f"{'-':>8}"
        print(f"{r['name']:22} {r['world']:>5} {1e3 * r['predicted_step_s']:9.1f} {ms} {ratio} "
              f"{r['predicted_peak_bytes'] / 2**20:9.1f} {r['measured_peak_bytes'] / 2**20:9.1f} {err}")
    timed = [r for r in rows if r["timed"]]
    summary = {"machine": cal["machine"], "threads": cal["threads"], "layouts": len(rows),
               "timed_layouts": len(timed),
               "memory_error_max": max(abs(r["memory_error"]) for r in rows if r["memory_error"] is not None),
               "spearman_all": spearman([r["predicted_step_s"] for r in timed],
                                        [r["measured_step_s"] for r in timed])}
    for w in (1, 2):
        g = [r for r in timed if r["world"] == w]
        summary[f"spearman_w{w}"] = spearman([r["predicted_step_s"] for r in g],
                                             [r["measured_step_s"] for r in g])
    # The planner's first choice among them: within kTieFraction (2%) of the fastest
    # predicted, the simplest (plan/memplan.h, simplicity).
    g2 = [r for r in timed if r["world"] == 2]
    t0 = min(r["predicted_step_s"] for r in g2)
    first = min((r for r in g2 if r["predicted_step_s"] <= t0 * 1.02), key=simplicity)
    fastest = min(g2, key=lambda r: r["measured_step_s"])
    summary["first_choice"] = first["name"]
    summary["fastest_measured"] = fastest["name"]
    summary["first_choice_over_fastest"] = first["measured_step_s"] / fastest["measured_step_s"]
    print(f"\nmemory: worst error {100 * summary['memory_error_max']:.1f}% over {len(rows)} layouts "
          f"(goal: within 10%)")
    print(f"step time: Spearman {summary['spearman_all']:.3f} over {len(timed)} timed layouts "
          f"(1 rank: {summary['spearman_w1']:.3f}, 2 ranks: {summary['spearman_w2']:.3f}; goal >= 0.8)")
    print(f"first choice at 2 ranks: {first['name']}, measured {summary['first_choice_over_fastest']:.3f}x "
          f"the fastest measured ({fastest['name']}; goal within 1.10x)")
    with open(os.path.join(out, "validation.json"), "w") as f:
        json.dump({"summary": summary, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
