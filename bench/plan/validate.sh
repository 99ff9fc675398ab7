#!/usr/bin/env bash
# kiln plan's predictions against measured runs on this machine's CPU ranks (docs/plan.md,
# "Validation"): the demo config (4 layers x 256, T = 256, global batch 16) trained for a
# few updates in each of 14 layouts at 1 and 2 ranks x 1 OpenMP thread (4 ranks on 2 cores
# would time-slice), plus 4-rank layouts for memory only. For each: the step time kiln plan
# predicts (priced with a calibration measured here first: 2 ranks of 1 thread, their
# GEMM and attention rates and the all-reduce between them) against the
# median measured step time, and the predicted peak bytes (the dry run, oneDNN's scratch
# counted) against the trainer's measured peak (the highest rank's). Prints the table, the
# memory errors, Spearman's rank correlation of predicted against measured step times,
# and whether the planner's first choice among the measured layouts is within 10% of the
# fastest measured; writes it all to OUT/validation.json.
#   bench/plan/validate.sh [OUT_DIR] [STEPS]      (about 5 minutes on 2 cores)
# Needs data/kjv (scripts/demo.sh prepares it) and mpirun.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${1:-$root/runs/plan-validation}"
steps="${2:-8}"
kiln="${KILN_BIN:-$root/build/apps/kiln/kiln}"
data="$root/data/kjv"
[ -f "$data/meta.json" ] || { echo "validate: no $data (run scripts/demo.sh first)"; exit 1; }
rm -rf "$out" && mkdir -p "$out"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
config="$root/configs/demo.toml"
common=(--set "data.dir=$data" --set train.dtype=fp32)

# Two ranks at once, as the 2-rank layouts run: their GEMM and attention rates, and the
# all-reduce between them (the plan's intra-node link).
mpirun --oversubscribe -np 2 "$kiln" bench --calibrate "$out/calibration.json" >"$out/calibrate.txt"
for w in 1 2 4; do
  "$kiln" plan "$config" "${common[@]}" --world-size "$w" --device-memory 100 --backend cpu \
    --calibration "$out/calibration.json" --json >"$out/plan-w$w.json"
done

# name|world|timed (1) or memory only (0)|--set keys of the layout (parallel.* and train.*)
layouts=(
  "mb4|1|1|train.micro_batch=4"
  "mb4-full|1|1|train.micro_batch=4 train.activation_checkpointing=full"
  "mb2-selective|1|1|train.micro_batch=2 train.activation_checkpointing=selective"
  "mb1|1|1|train.micro_batch=1"
  "dp2|2|1|train.micro_batch=4"
  "dp2-z1|2|1|train.micro_batch=4 parallel.zero_stage=1"
  "dp2-z2-mb2|2|1|train.micro_batch=2 parallel.zero_stage=2"
  "dp2-z3-full|2|1|train.micro_batch=4 parallel.zero_stage=3 train.activation_checkpointing=full"
  "tp2|2|1|train.micro_batch=4 parallel.tp=2"
  "tp2-sp-selective|2|1|train.micro_batch=4 parallel.tp=2 parallel.sequence_parallel=true train.activation_checkpointing=selective"
  "pp2|2|1|train.micro_batch=4 parallel.pp=2"
  "pp2-interleaved-z1|2|1|train.micro_batch=2 parallel.pp=2 parallel.pp_schedule=interleaved parallel.virtual_stages=2 parallel.zero_stage=1"
  "cp2|2|1|train.micro_batch=4 parallel.cp=2"
  "cp2-z1-full|2|1|train.micro_batch=2 parallel.cp=2 parallel.zero_stage=1 train.activation_checkpointing=full"
  "dp2-tp2|4|0|train.micro_batch=4 parallel.tp=2"
  "dp2-pp2-z1|4|0|train.micro_batch=4 parallel.pp=2 parallel.zero_stage=1"
  "cp2-tp2-z3|4|0|train.micro_batch=4 parallel.cp=2 parallel.tp=2 parallel.zero_stage=3"
)
for entry in "${layouts[@]}"; do
  IFS='|' read -r name world timed keys <<<"$entry"
  sets=()
  for k in $keys; do sets+=(--set "$k"); done
  n=$([ "$timed" = 1 ] && echo "$steps" || echo 3)
  run=(--set "run.dir=$out/run-$name" --set "train.steps=$n" --set log.every=1 --set eval.every=0
       --set sample.every=0 --set checkpoint.every=0 --set schedule.warmup_steps=1)
  echo "validate: $name ($world rank(s)): $keys"
  if [ "$world" = 1 ]; then
    "$kiln" train "$config" "${common[@]}" "${run[@]}" "${sets[@]}" >"$out/$name.log" 2>&1
  else
    mpirun --oversubscribe -np "$world" "$kiln" train "$config" "${common[@]}" "${run[@]}" \
      "${sets[@]}" >"$out/$name.log" 2>&1
  fi
done
printf '%s\n' "${layouts[@]}" >"$out/layouts.txt"
python3 "$root/bench/plan/validation_table.py" "$out"
