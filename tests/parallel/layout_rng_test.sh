#!/usr/bin/env bash
# Randomness that does not depend on the layout (issue 36), end to end through
# `kiln train` under mpirun:
#   1. dropout 0.1 on a tiny GPT-2, fp32, global batch 8, 10 updates: masks keyed by the
#      global sample index and the position within the sample, so one process at
#      micro_batch 4 (2 micro-steps) and at 8 (1 micro-step), pp2 at micro_batch 2 and
#      (long) dp2 x tp2 at micro_batch 2, tp2 with sequence parallelism at micro_batch 1,
#      dp2 at micro_batch 1 with ZeRO 2, dp2 x pp2 agree: every loss and validation loss
#      within 1e-5 relative of the first;
#   2. bf16 with stochastic rounding (the rounding keyed by parameter and global element,
#      tests/optim/stochastic_rounding_layout_test.cpp checks the bits): pp2 with the
#      tied wte saves checkpoints (the trainer checks the two copies are bitwise equal at
#      every save), tp2 and dp2 at ZeRO 1 (long: dp2 x tp2, tp2 x pp2) train as the single
#      process does, within bf16's bound on the last loss.
# Usage: layout_rng_test.sh KILN_BINARY WORK_DIR [--long]
set -euo pipefail
kiln="$1"
work="$2"
long="${3:-}"
rm -rf "$work" && mkdir -p "$work"
. "$(dirname "$0")/common.sh"

setup_tiny_gpt2 11
# 10 updates of global batch 8, in micro-batches of 4 unless a run says otherwise.
base=(--set train.steps=10 --set train.global_batch=8 --set train.micro_batch=4
      --set eval.every=5 --set eval.batches=1 --set parallel.timeout_s=30)
train() { run_train "$work/tiny.toml" "$1" "$2" "${base[@]}" "${@:3}"; }  # NAME NP [--set ...]
mb() { echo "--set" "train.micro_batch=$1"; }

# 1. Dropout in every layout.
train drop_mb4 1
train drop_mb8 1 $(mb 8)
train drop_pp2 2 $(mb 2) --set parallel.pp=2
runs=(drop_mb8 drop_pp2)
if [ "$long" = "--long" ]; then
  train drop_dp2_tp2 4 $(mb 2) --set parallel.dp=2 --set parallel.tp=2
  train drop_tp2_sp 2 $(mb 1) --set parallel.tp=2 --set parallel.sequence_parallel=true
  train drop_dp2_z2 2 $(mb 1) --set parallel.zero_stage=2
  train drop_dp2_pp2 4 $(mb 2) --set parallel.dp=2 --set parallel.pp=2
  runs+=(drop_dp2_tp2 drop_tp2_sp drop_dp2_z2 drop_dp2_pp2)
fi
for r in "${runs[@]}"; do
  echo -n "dropout 0.1, $r against one process at micro_batch 4: "
  compare "$work/drop_mb4/metrics.jsonl" "$work/$r/metrics.jsonl"
done

# 2. bf16 with stochastic rounding, checkpoints every 5 updates.
sr=(--set model.dropout=0 --set train.dtype=bf16 --set train.stochastic_rounding=1
    --set checkpoint.every=5)
train sr_ref 1 "${sr[@]}"
train sr_pp2 2 "${sr[@]}" --set parallel.pp=2
train sr_tp2 2 "${sr[@]}" --set parallel.tp=2
train sr_dp2_z1 2 "${sr[@]}" --set parallel.zero_stage=1
runs=(sr_pp2 sr_tp2 sr_dp2_z1)
if [ "$long" = "--long" ]; then
  train sr_dp2_tp2_z1 4 "${sr[@]}" --set parallel.dp=2 --set parallel.tp=2 --set parallel.zero_stage=1
  train sr_tp2_pp2 4 "${sr[@]}" --set parallel.tp=2 --set parallel.pp=2
  runs+=(sr_dp2_tp2_z1 sr_tp2_pp2)
fi
for r in "${runs[@]}"; do
  [ -d "$work/$r/ckpt/step_00000010" ] || { echo "FAILED: $r saved no checkpoint at step 10"; exit 1; }
  echo -n "bf16 stochastic rounding, $r against one process (last loss): "
  compare "$work/sr_ref/metrics.jsonl" "$work/$r/metrics.jsonl" 1 1e-3
done
