#!/usr/bin/env bash
# The mixture-of-experts model on the GPU, for scripts/gpu-check.sh (about a minute):
# `kiln train` of configs/demo-moe.toml (4 MoE blocks of 8 experts, top 2, renormalised,
# with the balancing and z losses) with train.device = cuda for STEPS updates on the KJV
# shards prepared on the build machine (data/kjv), then the same runs on the CPU:
#   fp32, dropless: val losses within 1% (cuBLASLt against oneDNN rounding; a near tie
#     in the router may pick another expert on each device, so not bitwise);
#   bf16 with token dropping (model.moe.capacity_factor = 1.0: the plan's capacity
#     rule, the dropped rows skipped by the permutations and the grouped linears): val
#     losses within 2%, as scripts/gpu/train-check.sh's bf16 demo.
# Each pair's last update's dropped fraction and tokens per expert (min / max over the
# layers) are printed side by side.
#   scripts/gpu/moe-check.sh KILN OUT_DIR [STEPS]
# Env: MOE_CHECK_DEVICE (default cuda; cpu runs both sides on the CPU, to try the script
# on a machine without a GPU).
set -euo pipefail
kiln="$1"
out="$2"
steps="${3:-30}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
device="${MOE_CHECK_DEVICE:-cuda}"
data="$root/data/kjv"
[ -f "$data/meta.json" ] || { echo "moe-check: no prepared data in $data (run scripts/demo.sh on the build machine and carry data/kjv)"; exit 1; }
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(nproc)}"
common=(--set "data.dir=$data" --set log.every=1 --set "train.steps=$steps"
        --set "eval.every=$steps" --set eval.batches=4 --set checkpoint.every=0
        --set "schedule.warmup_steps=$(( steps / 3 ))")
train() {  # train DEVICE RUN_DIR [--set KEY=VALUE ...]
  local dev="$1" dir="$2"
  shift 2
  "$kiln" train "$root/configs/demo-moe.toml" "${common[@]}" --set "train.device=$dev" \
    --set "run.dir=$dir" "$@"
}

rm -rf "$out"
mkdir -p "$out"
for side in dev cpu; do
  dev=$device
  [ "$side" = cpu ] && dev=cpu
  train "$dev" "$out/fp32-$side" --set train.dtype=fp32
  train "$dev" "$out/bf16-drop-$side" --set train.dtype=bf16 --set model.moe.capacity_factor=1.0
done
PYTHONPATH="$root/scripts/gpu" python3 - "$out" "$device" "$steps" <<'PY'
import sys
from run_metrics import last_val_loss, records
out, device, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])

def val(run):
    return last_val_loss(out, run)

def routing(run):
    last = [r for r in records(out, run) if "moe_tokens_per_expert" in r][-1]
    t = last["moe_tokens_per_expert"]
    drop = last.get("moe_dropped_fraction")
    return (f"tokens per expert {t['min']:.0f}..{t['max']:.0f}"
            + ("" if drop is None else f", dropped {100 * drop:.2f}%"))

ok = True
for run, what, tol in (("fp32", "fp32, dropless", 0.01), ("bf16-drop", "bf16, capacity factor 1.0", 0.02)):
    g, c = val(f"{run}-dev"), val(f"{run}-cpu")
    rel = abs(g - c) / c
    ok &= rel <= tol
    print(f"moe-check: demo-moe, {what}, {steps} updates: val loss {device} {g:.4f}, cpu {c:.4f}, "
          f"difference {100 * rel:.2f}% ({'within' if rel <= tol else 'NOT within'} {100 * tol:.0f}%)")
    print(f"moe-check:   last update, {device}: {routing(f'{run}-dev')}; cpu: {routing(f'{run}-cpu')}")
sys.exit(0 if ok else 1)
PY
