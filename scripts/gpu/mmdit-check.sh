#!/usr/bin/env bash
# The text-to-image MMDiT on the GPU, for scripts/gpu-check.sh --mmdit (about 40 s): the
# tiny image-text pairs of tests/parallel/common.sh (make_pairs: 12x12 gray patterns, each
# captioned "A cross." etc.), prepared here with the byte tokenizer, and `kiln train` of a
# small MMDiT (2 joint blocks of width 64) with train.device = cuda for STEPS updates, then
# the same runs on the CPU:
#   joint text encoder, fp32: val losses within 1% (cuBLASLt against oneDNN rounding);
#   joint text encoder, bf16: within 2%, as scripts/gpu/train-check.sh's bf16 demo;
#   a frozen Llama text encoder (a tiny Llama trained on the captions on the CPU first,
#   loaded by model.init_parts), fp32: within 1%;
# and kiln sample-images of the cuda fp32 run's checkpoint on each device (4 prompts, 8
# Euler steps at guidance 3) must succeed; whether the two grids are the same PNG is
# printed (rounding may move a pixel; kiln classify reads the samples, not this script).
#   scripts/gpu/mmdit-check.sh KILN OUT_DIR [STEPS]
# Env: MMDIT_CHECK_DEVICE (default cuda; cpu runs both sides on the CPU, to try the script
# on a machine without a GPU).
set -euo pipefail
kiln="$1"
out="$2"
steps="${3:-40}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
device="${MMDIT_CHECK_DEVICE:-cuda}"
rm -rf "$out"
mkdir -p "$out"
work="$out"
. "$root/tests/parallel/common.sh"  # make_pairs
py=python3
export OMP_NUM_THREADS="$(nproc)"

make_pairs "$out/pairs"
"$kiln" prepare --format llava --input "$out/pairs/train.jsonl" --val-input "$out/pairs/val.jsonl" \
  --out "$out/data" --tokenizer byte --caption-tokens 224 > "$out/prepare.log"
printf ' A cross. A ring. A bar. A dot. A ring. A dot. A cross. A bar.' > "$out/captions.txt"
"$kiln" prepare --input "$out/captions.txt" --out "$out/tokens" --tokenizer byte >> "$out/prepare.log"
cat > "$out/llama.toml" <<EOF
[model]
arch = "llama"
n_layer = 2
n_head = 2
n_kv_head = 1
n_embd = 32
ffn_hidden_size = 64
block_size = 16
[data]
dir = "$out/tokens"
[train]
steps = 20
micro_batch = 4
[eval]
every = 0
[checkpoint]
every = 20
[run]
dir = "$out/llama"
EOF
"$kiln" train "$out/llama.toml" > "$out/llama.log"
cat > "$out/mmdit.toml" <<EOF
[model]
arch = "mmdit"
n_layer = 2
n_head = 4
n_embd = 64
block_size = 9
patch_size = 4
caption_tokens = 12
[data]
dir = "$out/data"
[train]
steps = $steps
micro_batch = 16
[optim]
lr = 2e-3
[schedule]
warmup_steps = $(( steps / 4 ))
[eval]
every = $steps
batches = 4
[log]
every = 1
[checkpoint]
every = $steps
EOF
llama=(--set model.text.encoder=llama --set model.text.n_embd=32 --set model.text.n_head=2
       --set model.text.n_kv_head=1 --set model.text.ffn_hidden_size=64
       --set "model.init_parts=[\"text_encoder=$out/llama/ckpt/step_00000020\"]")
train() {  # train DEVICE RUN [--set KEY=VALUE ...]
  local dev="$1" run="$2"
  shift 2
  "$kiln" train "$out/mmdit.toml" --set "train.device=$dev" --set "run.dir=$out/$run" "$@" \
    > "$out/$run.log" 2>&1 || { echo "mmdit-check: $run failed:"; tail -5 "$out/$run.log"; exit 1; }
}
for side in dev cpu; do
  dev=$device
  [ "$side" = cpu ] && dev=cpu
  train "$dev" "fp32-$side" --set train.dtype=fp32
  train "$dev" "bf16-$side" --set train.dtype=bf16
  train "$dev" "llama-$side" --set train.dtype=fp32 "${llama[@]}"
done
ckpt="$out/fp32-dev/ckpt/step_$(printf '%08d' "$steps")"
for side in dev cpu; do
  dev=$device
  [ "$side" = cpu ] && dev=cpu
  "$kiln" sample-images --checkpoint "$ckpt" --device "$dev" --out "$out/grid-$side.png" \
    --prompt "A cross." --prompt "A ring." --prompt "A bar." --prompt "" --per-row 4 \
    --steps 8 --cfg-scale 3 > "$out/sample-$side.log" 2>&1 ||
    { echo "mmdit-check: sample-images on $dev failed:"; tail -5 "$out/sample-$side.log"; exit 1; }
done
PYTHONPATH="$root/scripts/gpu" python3 - "$out" "$device" "$steps" <<'PY'
import os, sys
from run_metrics import last_val_loss
out, device, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
ok = True
for run, what, tol in (("fp32", "fp32", 0.01), ("bf16", "bf16", 0.02),
                       ("llama", "frozen Llama text encoder, fp32", 0.01)):
    g, c = last_val_loss(out, f"{run}-dev"), last_val_loss(out, f"{run}-cpu")
    rel = abs(g - c) / c
    ok &= rel <= tol
    print(f"mmdit-check: {what}, {steps} updates: val loss {device} {g:.4f}, cpu {c:.4f}, "
          f"difference {100 * rel:.2f}% ({'within' if rel <= tol else 'NOT within'} {100 * tol:.0f}%)")
a, b = (open(os.path.join(out, f"grid-{s}.png"), "rb").read() for s in ("dev", "cpu"))
print(f"mmdit-check: sample-images of the {device} checkpoint: grids of {len(a)} and {len(b)} "
      f"bytes ({'identical' if a == b else 'different'} PNGs; {device} against cpu)")
sys.exit(0 if ok else 1)
PY
