#!/usr/bin/env bash
# kiln plan (docs/plan.md) without timing anything: the demo config on 4 ranks of 0.09 GiB,
# 2 ranks per node, priced with the committed calibration of an AMD EPYC Zen 5 (2 ranks of
# 1 thread under mpirun: GEMM and attention rates, the all-reduce between them by message
# size; fixtures/calibration-epyc-zen5-2x1t.json), its scratch not counted (--backend
# none, so the dry run's bytes are the same on every CPU):
#   - every layout considered (dp x cp x tp x pp with virtual stages, ZeRO, checkpointing,
#     micro-batch), its peak bytes and its step time split, in order, equal the committed
#     table fixtures/plan-demo-w4.tsv (bytes exactly, seconds within 1e-9 relative of
#     their 12 digits);
#     UPDATE_PLAN_TABLE=1 rewrites the table (say why in the commit);
#   - the time model, checked independently of the table: step = compute + bubble + the
#     exposed tp/cp/pp/dp; compute (no checkpointing) = tokens x flops_per_token / (tp cp
#     pp), attention's share (12 L T C of it) at the attention rate interpolated here from
#     the calibration file at T / cp and the rest at the GEMM rate at the MLP
#     up-projection's shape; the bubble fraction is (p-1)/(m+p-1) for 1F1B and
#     (p-1)/(v m+p-1) interleaved; a dp group that spans nodes is priced on the slower
#     link (fixtures/cluster-slow-inter.json's); `fits` is peak <= usable; the first
#     layout fits; those within 2% of the fastest that fits come simplest first, the rest
#     fastest first;
#   - the winner's --set lines (the global batch among them) are written, and the config
#     loader and the step's dry run take them (kiln memplan); a mixture of experts with
#     parallel.ep = 2 is planned;
#   - one-line errors: nothing fits (the closest named), no layout for the world size, a
#     NaN flag, ranks per node that do not divide the world,
#     a calibration file changed after writing (checksum), a missing one, a CPU plan with
#     neither calibration nor --peak-tflops;
#   - kiln bench --calibrate writes a file kiln plan reads.
# Usage: plan_command_test.sh KILN WORK_DIR
set -euo pipefail
kiln="$1"
work="$2"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
rm -rf "$work" && mkdir -p "$work"
cal="$here/fixtures/calibration-epyc-zen5-2x1t.json"
fail() { echo "plan_command_test: FAILED: $*"; exit 1; }
plan=("$kiln" plan "$root/configs/demo.toml" --world-size 4 --device-memory 0.09 --backend none
      --set model.vocab_size=4096 --calibration "$cal" --cluster "$here/fixtures/cluster-slow-inter.json")

"${plan[@]}" --gpus-per-node 2 --json >"$work/plan.json"
"${plan[@]}" --json >"$work/one-node.json"
"${plan[@]}" --gpus-per-node 2 --write "$work/winner.sets" >"$work/plan.txt"
python3 - "$work/plan.json" "$work/one-node.json" "$cal" "$here/fixtures/plan-demo-w4.tsv" <<'PY'
import json, math, os, sys
plan = json.load(open(sys.argv[1]))
one_node = json.load(open(sys.argv[2]))
cal = json.load(open(sys.argv[3]))
table = sys.argv[4]
ls = plan["layouts"]
T, C = 256, 256  # configs/demo.toml

def row(l):
    layout = (f"dp{l['dp']} cp{l['cp']} tp{l['tp']} sp{int(l['sequence_parallel'])} pp{l['pp']} "
              f"v{l['virtual_stages']} z{l['zero_stage']} mb{l['micro_batch']} {l['activation_checkpointing']}")
    return "|".join([layout, str(l["peak_bytes"])] +
                    ["%.12g" % l[k] for k in ("step_s", "compute_s", "bubble_s", "tp_s", "cp_s", "pp_s", "dp_s")])

if os.environ.get("UPDATE_PLAN_TABLE") == "1":
    with open(table, "w") as f:
        f.write("# kiln plan configs/demo.toml --world-size 4 --device-memory 0.09 --backend none "
                "--set model.vocab_size=4096 --calibration calibration-epyc-zen5-2x1t.json "
                "--cluster cluster-slow-inter.json --gpus-per-node 2: "
                "layout|peak_bytes|step|compute|bubble|tp|cp|pp|dp (s)\n")
        f.writelines(row(l) + "\n" for l in ls)
want = [r.rstrip("\n").split("|") for r in open(table) if not r.startswith("#")]
assert len(want) == len(ls), f"{len(ls)} layouts, the table has {len(want)}"
for w, l in zip(want, ls):
    got = row(l).split("|")
    assert got[0] == w[0], f"order differs: {got[0]} where the table has {w[0]}"
    assert got[1] == w[1], f"{w[0]}: peak {got[1]} bytes, table {w[1]}"
    for g, e, name in zip(got[2:], w[2:], ("step", "compute", "bubble", "tp", "cp", "pp", "dp")):
        g, e = float(g), float(e)
        assert abs(g - e) <= 1e-9 * max(abs(e), 1e-12), f"{w[0]}: {name} {g} s, table {e} s"

def interpolate(pts, size):
    x = math.log(size)
    if x <= math.log(pts[0][0]): return pts[0][1]
    if x >= math.log(pts[-1][0]): return pts[-1][1]
    for (n0, f0), (n1, f1) in zip(pts, pts[1:]):
        if math.log(n0) <= x <= math.log(n1):
            w = (x - math.log(n0)) / (math.log(n1) - math.log(n0))
            return math.exp((1 - w) * math.log(f0) + w * math.log(f1))

def rate(dtype, m, n, k):
    return interpolate(cal["gemm"][dtype], (max(1, m) * max(1, n) * max(1, k)) ** (1 / 3))

usable = plan["usable_bytes"]
kinds = set()
for l in ls:
    parts = l["compute_s"] + l["bubble_s"] + l["tp_s"] + l["cp_s"] + l["pp_s"] + l["dp_s"]
    assert abs(l["step_s"] - parts) <= 1e-12 * l["step_s"], l
    assert l["fits"] == (l["peak_bytes"] <= usable), l
    split = l["tp"] * l["cp"] * l["pp"]
    tokens = l["micro_batch"] * l["grad_accum_steps"] * T
    r = rate("fp32", l["micro_batch"] * T / l["cp"], 4 * C / l["tp"], C)
    assert abs(l["gemm_rate"] / r - 1) < 1e-9, (l["gemm_rate"], r)
    ra = interpolate(cal["attention"]["fp32"], T / l["cp"])
    assert abs(l["attention_rate"] / ra - 1) < 1e-9, (l["attention_rate"], ra)
    if l["activation_checkpointing"] == "none":
        a = 12 * 4 * T * C / l["flops_per_token"]  # attention's share: 12 L T C, L = 4
        want_compute = tokens * l["flops_per_token"] / split * ((1 - a) / r + a / ra)
        assert abs(l["compute_s"] / want_compute - 1) < 1e-9, (l, want_compute)
    if l["tp"] == 1 and l["pp"] == 1 and l["dp"] * l["cp"] > 1:
        assert l["dp_s"] > 0  # CPU ranks: nothing hides under compute
    p, m, v = l["pp"], l["grad_accum_steps"], l["virtual_stages"]
    f = 0.0 if p == 1 else (p - 1) / ((v * m if l["pp_schedule"] == "interleaved" else m) + p - 1)
    assert abs(l["bubble_fraction"] - f) < 1e-12, (l, f)
    kinds.add((p, v))
assert kinds == {(1, 1), (2, 1), (2, 2), (4, 1)}, kinds
fit = [l for l in ls if l["fits"]]
# The first fits; within 2% of the fastest that fits (a tie), the simplest come first.
t0 = min(l["step_s"] for l in fit)
tied = [l for l in fit if l["step_s"] <= t0 * 1.02]
assert ls[:len(tied)] == tied, "the tied layouts do not come first"
def simplicity(l):
    return ({"none": 0, "selective": 1, "full": 2}[l["activation_checkpointing"]], l["zero_stage"],
            l["cp"] * l["tp"] * l["pp"] * l["virtual_stages"], int(l["sequence_parallel"]), -l["micro_batch"])
assert [simplicity(l) for l in tied] == sorted(simplicity(l) for l in tied)
rest = ls[len(tied):len(fit)]
assert all(a["step_s"] <= b["step_s"] + 1e-12 for a, b in zip(rest, rest[1:])), "not fastest first"
assert 0 < len(fit) < len(ls), (len(fit), len(ls))  # 0.09 GiB leaves some out
# Links: with 2 ranks per node, a dp group of 4 (tp 1) spans nodes: its collectives cost more
# than on one node; a tp group of 2 stays within a node: the same.
key = lambda l: " ".join(l["sets"])
one = {key(l): l for l in one_node["layouts"]}
dp4 = [l for l in ls if l["dp"] == 4 and l["zero_stage"] == 3]
assert dp4 and all(l["dp_s"] > one[key(l)]["dp_s"] for l in dp4)
tp2 = [l for l in ls if l["tp"] == 2 and l["dp"] == 1 and l["cp"] == 2]
assert tp2 and all(l["tp_s"] == one[key(l)]["tp_s"] and l["tp_s"] > 0 for l in tp2)
print(f"plan_command_test: {len(ls)} layouts as the table, {len(fit)} fit; time model checks pass")
PY
grep -q "the winner, predicted" "$work/plan.txt" || fail "no winner line"
# The file holds the keys given to kiln plan, then the layout's.
[ "$(head -n 1 "$work/winner.sets")" = "--set model.vocab_size=4096" ] ||
  fail "winner.sets does not start with kiln plan's own --set: $(head -n 2 "$work/winner.sets")"
grep -q "mpirun -np 4 kiln train" "$work/plan.txt" || fail "no mpirun hint for 4 ranks"
[ "$(grep -c '^--set ' "$work/winner.sets")" -ge 8 ] || fail "winner.sets: $(cat "$work/winner.sets")"
# The config loader and the dry run of the trainer's step take the winner's keys (what
# kiln train would load): kiln memplan with them on 4 ranks.
# shellcheck disable=SC2046  # the --set lines, word-split on purpose
"$kiln" memplan "$root/configs/demo.toml" --world-size 4 --backend none --set model.vocab_size=4096 \
  $(cat "$work/winner.sets") >"$work/check.txt" 2>&1 || fail "the winner's keys were refused: $(cat "$work/check.txt")"

# Expert parallelism as configured: ep = 2 carved from dp x cp (the start config resolved
# as ep ranks, not one).
"$kiln" plan "$root/configs/demo-moe.toml" --world-size 4 --device-memory 1 --backend none \
  --set model.vocab_size=4096 --set parallel.ep=2 --peak-tflops 1 --top 1 >"$work/moe.txt" 2>&1 ||
  fail "kiln plan with parallel.ep = 2: $(tail -n 1 "$work/moe.txt")"
grep -q '^--set train.global_batch=' "$work/moe.txt" || fail "the winner does not name its global batch"

expect_error() {  # expect_error PATTERN ARGS...
  local pattern=$1 rc=0
  shift
  "$@" >"$work/err.txt" 2>&1 || rc=$?
  [ "$rc" != 0 ] || fail "'$*' exited 0"
  [ "$(wc -l <"$work/err.txt")" = 1 ] || fail "'$*': not one line: $(cat "$work/err.txt")"
  grep -q "$pattern" "$work/err.txt" || fail "'$*': no '$pattern' in: $(cat "$work/err.txt")"
}
expect_error "no layout fits .* the closest needs" "${plan[@]/0.09/0.01}"
expect_error "no layout of 3 ranks" "$kiln" plan "$root/configs/demo.toml" --world-size 3 \
  --device-memory 1 --backend none --set model.vocab_size=4096 --calibration "$cal"
sed 's/"threads": [0-9]*/"threads": 7/' "$cal" >"$work/changed.json"
expect_error "checksum mismatch" "${plan[@]/$cal/$work/changed.json}"
expect_error "missing.json" "${plan[@]/$cal/$work/missing.json}"
expect_error "finite number" "${plan[@]/0.09/nan}"
expect_error "does not divide --world-size 4" "${plan[@]}" --gpus-per-node 3
expect_error "no default GEMM rate" "$kiln" plan "$root/configs/demo.toml" --world-size 2 \
  --device-memory 1 --backend cpu --set model.vocab_size=4096

OMP_NUM_THREADS=1 "$kiln" bench --calibrate "$work/mine.json" >"$work/calibrate.txt"
"$kiln" plan "$root/configs/demo.toml" --world-size 2 --device-memory 1 --backend none \
  --set model.vocab_size=4096 --calibration "$work/mine.json" --top 1 >"$work/mine.txt" ||
  fail "kiln plan did not read kiln bench --calibrate's file: $(cat "$work/mine.txt")"
echo "plan_command_test: ok"
