#!/usr/bin/env bash
# The trainer on the GPU, for scripts/gpu-check.sh: `kiln train` itself with
# train.device = cuda on the demo config (bf16) and the KJV shards prepared on the build
# machine (data/kjv, by scripts/demo.sh; the GPU machine has no apt), then the same
# config and steps on the CPU, their val losses side by side (target: within 2%), and
# the GPU's last checkpoint resumed on the CPU for a few more steps (checkpoints move
# between devices).
#   scripts/gpu/train-check.sh KILN OUT_DIR [STEPS]
# Env: TRAIN_CHECK_DEVICE (default cuda; cpu runs the whole check on the CPU, to try the
# script on a machine without a GPU).
set -euo pipefail
kiln="$1"
out="$2"
steps="${3:-100}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
device="${TRAIN_CHECK_DEVICE:-cuda}"
data="$root/data/kjv"
[ -f "$data/meta.json" ] || { echo "train-check: no prepared data in $data (run scripts/demo.sh on the build machine and carry data/kjv)"; exit 1; }
common=(--set "data.dir=$data" --set "train.steps=$steps" --set train.dtype=bf16
        --set "eval.every=$steps" --set "checkpoint.every=$steps" --set log.every=10
        --set "schedule.warmup_steps=$(( steps < 20 ? steps / 2 : 20 ))")
val_of() { grep '"val_loss"' "$1/metrics.jsonl" | tail -n 1 | sed -E 's/.*"val_loss":([0-9.eE+-]+).*/\1/'; }

rm -rf "$out/gpu" "$out/cpu"
"$kiln" train "$root/configs/demo.toml" "${common[@]}" --set "train.device=$device" --set "run.dir=$out/gpu"
OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(nproc)}" \
  "$kiln" train "$root/configs/demo.toml" "${common[@]}" --set train.device=cpu --set "run.dir=$out/cpu"
gpu_val=$(val_of "$out/gpu") cpu_val=$(val_of "$out/cpu")
# The GPU's checkpoint resumed on the CPU: 5 more updates.
"$kiln" train "$root/configs/demo.toml" "${common[@]}" --set train.device=cpu \
  --set "train.steps=$((steps + 5))" --set "run.dir=$out/gpu" --resume auto
python3 - "$gpu_val" "$cpu_val" "$device" "$steps" <<'PY'
import sys
g, c, device, steps = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4]
rel = abs(g - c) / c
print(f"train-check: demo config, bf16, {steps} updates: val loss {device} {g:.4f}, cpu {c:.4f}, "
      f"difference {100 * rel:.2f}% ({'within' if rel <= 0.02 else 'NOT within'} 2%); "
      f"the {device} checkpoint resumed on the cpu")
sys.exit(0 if rel <= 0.02 else 1)
PY
