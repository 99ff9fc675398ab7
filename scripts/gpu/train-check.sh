#!/usr/bin/env bash
# The trainer on the GPU, for scripts/gpu-check.sh: `kiln train` itself with
# train.device = cuda on the demo config (bf16) and the KJV shards prepared on the build
# machine (data/kjv, by scripts/demo.sh; the GPU machine has no apt), then the same
# config and steps on the CPU, their val losses side by side (target: within 2%).
# Checkpoints move between devices both ways: the GPU's last checkpoint is resumed on the
# CPU and the CPU's on the GPU, each for a few more updates, and also on its own device;
# the manifests must name the same tensors with the same dtypes, and the first loss after
# each cross-device resume must match the same-device resume (within 1%: bf16 kernels
# differ between devices, the loaded values must not).
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
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(nproc)}"
common=(--set "data.dir=$data" --set train.dtype=bf16 --set log.every=1
        --set "schedule.warmup_steps=$(( steps < 20 ? steps / 2 : 20 ))")
train() {  # train DEVICE RUN_DIR STEPS [--resume auto]
  local dev="$1" dir="$2" n="$3"
  shift 3
  "$kiln" train "$root/configs/demo.toml" "${common[@]}" --set "train.steps=$n" \
    --set "eval.every=$steps" --set "checkpoint.every=$steps" --set "train.device=$dev" \
    --set "run.dir=$dir" "$@"
}

rm -rf "$out"
mkdir -p "$out"
train "$device" "$out/gpu" "$steps"
train cpu "$out/cpu" "$steps"
# Each checkpoint at step $steps, resumed for 5 updates on both devices (copies of the
# run directories, so the resumes do not see each other's checkpoints).
for from in gpu cpu; do
  for on in "$device" cpu; do
    rm -rf "$out/$from-on-$on"
    mkdir -p "$out/$from-on-$on/ckpt"
    cp -r "$out/$from/ckpt/$(ls "$out/$from/ckpt" | grep '^step_' | tail -n 1)" "$out/$from-on-$on/ckpt/"
    train "$on" "$out/$from-on-$on" "$((steps + 5))" --resume auto
  done
done
PYTHONPATH="$root/scripts/gpu" python3 - "$out" "$device" "$steps" <<'PY'
import json, os, sys
from run_metrics import last_val_loss, records
out, device, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])

def val(run):
    return last_val_loss(out, run)

def loss_at(run, step):
    return [r["loss"] for r in records(out, run) if r.get("step") == step and "loss" in r][0]

def tensors(run):
    ckpt = os.path.join(out, run, "ckpt")
    last = sorted(d for d in os.listdir(ckpt) if d.startswith("step_"))[-1]
    with open(os.path.join(ckpt, last, "manifest.json")) as f:
        m = json.load(f)
    return {name: (t["shape"], t["dtype"]) for name, t in m["tensors"].items()}

ok = True
g, c = val("gpu"), val("cpu")
rel = abs(g - c) / c
ok &= rel <= 0.02
print(f"train-check: demo config, bf16, {steps} updates: val loss {device} {g:.4f}, cpu {c:.4f}, "
      f"difference {100 * rel:.2f}% ({'within' if rel <= 0.02 else 'NOT within'} 2%)")
same = tensors("gpu") == tensors("cpu")
ok &= same
print(f"train-check: {device} and cpu checkpoints name {len(tensors('gpu'))} tensors, "
      f"{'the same' if same else 'NOT the same'} names, shapes and dtypes")
for src in ("gpu", "cpu"):
    # the checkpoint of `src` resumed on each device: first loss after the resume
    a = loss_at(f"{src}-on-{device}", steps + 1)
    b = loss_at(f"{src}-on-cpu", steps + 1)
    d = abs(a - b) / b
    ok &= d <= 0.01
    where = device if src == "gpu" else "cpu"
    print(f"train-check: the {where} checkpoint resumed: loss at update {steps + 1} on {device} "
          f"{a:.4f}, on cpu {b:.4f}, difference {100 * d:.2f}% ({'within' if d <= 0.01 else 'NOT within'} 1%)")
sys.exit(0 if ok else 1)
PY
