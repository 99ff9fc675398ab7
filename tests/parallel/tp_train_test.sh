#!/usr/bin/env bash
# Tensor and sequence parallelism, end to end through `kiln train` under mpirun (the
# step-level rows, gradients included, are tests/parallel/tp_step_test.cpp):
#   1. 20 updates of a tiny GPT-2 with dropout and gradient accumulation at tp2 with
#      sequence parallelism, at dp2 x tp2 with ZeRO 3, and a tiny Llama (GQA, n_kv_head =
#      tp) at tp2: every loss and validation loss within 1e-5 relative of the single
#      process;
#   2. a checkpoint saved at dp2 x tp2 with ZeRO 1 resumes at tp1, at tp4 and at dp4 with
#      ZeRO 3 with the uninterrupted run's next losses within 1e-5 (optimizer state
#      included; the save also checks the tp replicas are bitwise identical); `kiln
#      sample` and `kiln export` read that checkpoint, and the export initialises
#      dp2 x tp2 ZeRO 3 as it does one process;
#   3. memory per rank about 1/tp; `kiln bench`'s tp traffic per update = the formula;
#   4. bf16 at tp2 with sequence parallelism ends within 2% of the fp32 single process;
#   5. bad layouts are one-line errors at start-up on every rank.
# Usage: tp_train_test.sh KILN_BINARY WORK_DIR
set -euo pipefail
kiln="$1"
work="$2"
rm -rf "$work" && mkdir -p "$work"
. "$(dirname "$0")/common.sh"

setup_tiny_gpt2 5

train() { run_train "$work/tiny.toml" "$@"; }  # train RUN_NAME NP [--set ...]
sp=(--set parallel.sequence_parallel=true)
llama=(--set model.arch=llama --set model.n_kv_head=2 --set model.ffn_hidden_size=48
       --set model.dropout=0)

train ref 1
train tp2_sp 2 --set parallel.tp=2 "${sp[@]}"
echo -n "tp=2 sequence_parallel: "; compare "$work/ref/metrics.jsonl" "$work/tp2_sp/metrics.jsonl"
train dp2_tp2_sp_z3 4 --set parallel.tp=2 "${sp[@]}" --set parallel.zero_stage=3
echo -n "dp=2 tp=2 sequence_parallel zero_stage=3: "; compare "$work/ref/metrics.jsonl" "$work/dp2_tp2_sp_z3/metrics.jsonl"
train llama_ref 1 "${llama[@]}"
train llama_tp2 2 "${llama[@]}" --set parallel.tp=2
echo -n "llama (GQA, n_kv_head = tp) tp=2: "; compare "$work/llama_ref/metrics.jsonl" "$work/llama_tp2/metrics.jsonl"

# Memory per rank: parameters, gradients and optimizer state about 1/tp of the single
# process's (replicated norms, biases and positions aside: within 1/tp + 10%); sequence
# parallelism shrinks the activations' peak against tp2 without it.
train tp2 2 --set parallel.tp=2 --set train.steps=2 --set schedule.warmup_steps=1 --set eval.every=0
train tp4_sp 4 --set parallel.tp=4 "${sp[@]}" --set train.steps=2 --set schedule.warmup_steps=1 --set eval.every=0
"$py" - "$work" <<'PY'
import json, sys
last = lambda run: [json.loads(l) for l in open(f"{sys.argv[1]}/{run}/metrics.jsonl")][-1]
ref = last("ref")
full = {k: ref[f"mem_peak_{k}_bytes"] for k in ("parameters", "gradients", "optimizer_state", "activations")}
peak_act = {}
for run, tp in (("tp2", 2), ("tp2_sp", 2), ("tp4_sp", 4)):
    for r, m in enumerate(last(run)["mem_by_rank"]):
        for k in ("parameters", "gradients", "optimizer_state"):
            share = m[f"peak_{k}"] / full[k]
            assert share <= 1 / tp + 0.1, f"{run} rank {r}: {k} {m[f'peak_{k}']} B is {share:.2f} of the single process's"
        peak_act[run] = max(peak_act.get(run, 0), m["peak_activations"])
    print(f"{run}: parameters {last(run)['mem_by_rank'][0]['peak_parameters'] / full['parameters']:.3f} of the single process, "
          f"activations peak {peak_act[run] / full['activations']:.3f}")
assert peak_act["tp2_sp"] < peak_act["tp2"], f"sequence parallel activations {peak_act['tp2_sp']} B >= {peak_act['tp2']} B without"
PY

# Resharding: dp2 x tp2 at ZeRO 1 stops after 10 updates; continue at tp1 (1 process),
# at tp4 and at dp4 with ZeRO 3.
train reshard 4 --set parallel.tp=2 "${sp[@]}" --set parallel.zero_stage=1 --exit-interval 10
"$py" -c 'import json, sys; l = json.load(open(sys.argv[1]))["state"]["layout"]; assert (l["dp"], l["tp"], l["zero_stage"]) == (2, 2, 1), l' \
  "$work/reshard/ckpt/step_00000010/manifest.json"
for to in tp1 tp4 dp4_z3; do cp -r "$work/reshard" "$work/reshard_$to"; done
train reshard_tp1 1 --resume auto
train reshard_tp4 4 --set parallel.tp=4 "${sp[@]}" --resume auto
train reshard_dp4_z3 4 --set parallel.zero_stage=3 --resume auto
for to in tp1 tp4 dp4_z3; do
  echo -n "dp2 x tp2 zero 1 -> $to: "; compare "$work/ref/metrics.jsonl" "$work/reshard_$to/metrics.jsonl" 11
done

# The split never reaches files: `kiln sample` reads the dp2 x tp2 checkpoint as one
# model, and its Hugging Face export starts dp2 x tp2 at ZeRO 3 (each rank reading the
# global runs of its slices) as it starts one process.
"$kiln" sample --checkpoint "$work/reshard/ckpt/step_00000010" --max-new-tokens 8 --seed 1 \
  > "$work/sample.log" 2>&1 || { echo "FAILED: sample"; cat "$work/sample.log"; exit 1; }
"$kiln" export --checkpoint "$work/reshard/ckpt/step_00000010" --format hf --out "$work/hf" \
  > "$work/export.log" 2>&1 || { echo "FAILED: export"; cat "$work/export.log"; exit 1; }
train init_tp1 1 --set "model.init_from=$work/hf" --set train.steps=5 --set eval.every=5
train init_dp2_tp2_z3 4 --set "model.init_from=$work/hf" --set train.steps=5 --set eval.every=5 \
  --set parallel.tp=2 "${sp[@]}" --set parallel.zero_stage=3
echo -n "kiln sample and export of a tp checkpoint; init_from its export at dp2 x tp2 zero 3: "
compare "$work/init_tp1/metrics.jsonl" "$work/init_dp2_tp2_z3/metrics.jsonl"

# bf16 with tp2 and sequence parallelism against the fp32 single process.
train tp2_sp_bf16 2 --set parallel.tp=2 "${sp[@]}" --set train.dtype=bf16
echo -n "bf16 tp=2 sequence_parallel after 20 updates, against fp32: "
compare "$work/ref/metrics.jsonl" "$work/tp2_sp_bf16/metrics.jsonl" 20 0.02

# kiln bench: the tp communicator's traffic per update equals the formula (calls and
# bytes of every collective), with sequence parallelism, full recomputation, ZeRO 1.
mpirun --oversubscribe --bind-to none -np 4 "$kiln" bench "$work/tiny.toml" --steps 2 --warmup 1 \
  --set parallel.tp=2 "${sp[@]}" --set train.activation_checkpointing=full --set parallel.zero_stage=1 \
  > "$work/bench.log" 2>&1 || { echo "FAILED: bench"; cat "$work/bench.log"; exit 1; }
"$py" - "$work/bench.log" <<'PY'
import json, sys
j = json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])
t = j["tp_traffic_per_update"]
for name, c in t.items():
    assert (c["calls"], c["bytes"]) == (c["formula_calls"], c["formula_bytes"]), f"{name}: {c}"
print("kiln bench tp traffic per update = formula:", ", ".join(f"{k} {v['calls']} calls {v['bytes']} B" for k, v in t.items()))
PY

# Bad layouts: one line naming the cause, every rank non-zero, no hang.
expect_failure() {  # expect_failure NAME PATTERN NP [--set ...]
  local name=$1 pattern=$2 np=$3
  shift 3
  if timeout 60 mpirun --oversubscribe --bind-to none -np "$np" "$kiln" train "$work/tiny.toml" \
       --set "run.dir=$work/$name" "$@" > "$work/$name.log" 2>&1; then
    echo "FAILED: $name exited 0"; cat "$work/$name.log"; exit 1
  fi
  grep -q -- "$pattern" "$work/$name.log" || { echo "FAILED: $name: no '$pattern' in:"; cat "$work/$name.log"; exit 1; }
  echo "$name: $(grep -m1 -- "$pattern" "$work/$name.log")"
}
# A layout that differs between ranks is named before any mesh is built from it.
if timeout 60 mpirun --oversubscribe --bind-to none -np 1 "$kiln" train "$work/tiny.toml" --set "run.dir=$work/mm" --set parallel.tp=2 : \
     -np 1 "$kiln" train "$work/tiny.toml" --set "run.dir=$work/mm" > "$work/mismatch.log" 2>&1; then
  echo "FAILED: a tp mismatch between ranks exited 0"; exit 1
fi
grep -q "config differs between ranks: parallel.tp is" "$work/mismatch.log" ||
  { echo "FAILED: the tp mismatch does not name parallel.tp:"; cat "$work/mismatch.log"; exit 1; }
echo "mismatch: $(grep -m1 "config differs" "$work/mismatch.log")"
expect_failure heads "4 query heads and 4 key/value heads do not divide over tp = 8" 8 --set parallel.tp=8 --set parallel.dp=1
expect_failure kv_heads "key/value heads do not divide over tp = 4" 4 "${llama[@]}" --set parallel.tp=4
expect_failure world "dp (3) \* tp (2) \* pp (1) = 6 must equal the world size 4" 4 --set parallel.tp=2 --set parallel.dp=3
expect_failure rows "does not divide them" 4 --set parallel.tp=4 "${sp[@]}" --set train.seq_len=15
echo "tensor-parallel tests passed"
