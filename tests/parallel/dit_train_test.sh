#!/usr/bin/env bash
# The diffusion transformer (model.arch = "dit") through `kiln train`, on tiny generated
# IDX images prepared with `kiln prepare --format idx`:
#   1. 12 updates with gradient accumulation and an EMA of the weights on 2 ranks at ZeRO
#      1 and at ZeRO 3 with full activation checkpointing, on 4 at ZeRO 2 (with --long,
#      the ctest label long, also 2 ranks at ZeRO 3 alone and 4 at ZeRO 0) give the single
#      process's per-step losses and val losses within 1e-5 relative (noise, times and
#      label dropout are drawn by global sample index);
#   2. a checkpoint saved by 4 ranks at ZeRO 3 resumes on 2 ranks at ZeRO 1 with the same
#      next losses, and its EMA tensors equal the single process's;
#   3. bf16 ends within 3% of fp32; the loss falls;
#   4. kiln sample-images writes a PNG grid and a data set kiln classify reads, the same
#      samples whatever the batch size;
#   5. bad inputs are one-line errors: sample-images of a class the model lacks, of a
#      non-generative checkpoint, a wrong block_size.
# Usage: dit_train_test.sh KILN_BINARY WORK_DIR [--long]
set -euo pipefail
kiln="$1"
work="$2"
long="${3:-}"
rm -rf "$work" && mkdir -p "$work"
. "$(dirname "$0")/common.sh"

make_images 5 "$work/idx"
"$kiln" prepare --format idx --input "$work/idx" --out "$work/data" > /dev/null

cat > "$work/dit.toml" <<EOF
[model]
arch = "dit"
n_layer = 2
n_head = 2
n_embd = 32
block_size = 9
patch_size = 4
norm_eps = 1e-6
class_dropout = 0.25
[data]
dir = "$work/data"
[train]
steps = 12
micro_batch = 2
global_batch = 8
ema_decay = 0.9
[optim]
lr = 3e-3
[schedule]
warmup_steps = 3
[eval]
every = 6
batches = 2
[log]
every = 1
peak_tflops = 1.0
[checkpoint]
every = 6
[parallel]
timeout_s = 20
bucket_mb = 0.004
EOF

train() {  # train RUN_NAME NP STAGE [extra args...]
  local name=$1 np=$2 stage=$3
  shift 3
  run_train "$work/dit.toml" "$name" "$np" --set "parallel.zero_stage=$stage" "$@"
}

train ref 1 0
runs=("2 1" "4 2")
[ "$long" = --long ] && runs+=("2 3" "4 0")
for run in "${runs[@]}"; do
  set -- $run
  train "np$1_z$2" "$1" "$2"
  echo -n "dit np=$1 zero_stage=$2: "
  compare "$work/ref/metrics.jsonl" "$work/np$1_z$2/metrics.jsonl"
done
train np2_z3_full 2 3 --set train.activation_checkpointing=full
echo -n "dit np=2 zero_stage=3 activation_checkpointing=full: "
compare "$work/ref/metrics.jsonl" "$work/np2_z3_full/metrics.jsonl"

train reshard 4 3 --exit-interval 6
train reshard 2 1 --resume auto
echo -n "dit 4 ranks zero 3 -> 2 ranks zero 1: "
compare "$work/ref/metrics.jsonl" "$work/reshard/metrics.jsonl" 7

train bf16 1 0 --set train.dtype=bf16
echo -n "dit bf16 vs fp32 (last loss, 3%): "
compare "$work/ref/metrics.jsonl" "$work/bf16/metrics.jsonl" 1 0.03

"$py" - "$work/ref/metrics.jsonl" <<'PY'
import json, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if "loss" in r]
first, last = rows[0]["loss"], rows[-1]["loss"]
assert last < 0.9 * first, f"dit loss {first} -> {last} does not fall"
print(f"dit loss {first:.4f} -> {last:.4f} in 12 updates")
PY

ckpt=$(ls -d "$work"/ref/ckpt/step_* | tail -1)
"$kiln" sample-images --checkpoint "$ckpt" --out "$work/grid.png" --classes 0-3 --per-class 3 \
  --steps 4 --cfg-scale 2 > "$work/sample.log" 2>&1 || { cat "$work/sample.log"; exit 1; }
"$kiln" sample-images --checkpoint "$ckpt" --out "$work/grid_b1.png" --classes 0-3 --per-class 3 \
  --steps 4 --cfg-scale 2 --batch 5 > "$work/sample_b1.log" 2>&1 || { cat "$work/sample_b1.log"; exit 1; }
cmp "$work/grid.png" "$work/grid_b1.png" || { echo "FAILED: samples depend on --batch"; exit 1; }
grep -q "EMA weights" "$work/sample.log" || { echo "FAILED: not sampled from the EMA"; cat "$work/sample.log"; exit 1; }
# The EMA is what it samples: the raw weights give other images; the EMA of 4 ranks at
# ZeRO 2 gives the single process's.
"$kiln" sample-images --checkpoint "$ckpt" --out "$work/grid_raw.png" --classes 0-3 --per-class 3 \
  --steps 4 --cfg-scale 2 --weights params > "$work/sample_raw.log" 2>&1 || { cat "$work/sample_raw.log"; exit 1; }
! cmp -s "$work/grid.png" "$work/grid_raw.png" || { echo "FAILED: EMA and raw samples are equal"; exit 1; }
"$kiln" sample-images --checkpoint "$(ls -d "$work"/np4_z2/ckpt/step_* | tail -1)" --out "$work/grid_np4.png" \
  --classes 0-3 --per-class 3 --steps 4 --cfg-scale 2 > "$work/sample_np4.log" 2>&1 || { cat "$work/sample_np4.log"; exit 1; }
cmp "$work/grid.png" "$work/grid_np4.png" || { echo "FAILED: the EMA of 4 ranks at ZeRO 2 samples differently"; exit 1; }
echo "sample-images: the EMA weights, the same from 1 process and 4 ranks at ZeRO 2, other than the raw ones"
"$kiln" classify --checkpoint "$ckpt" --data "$work/grid.samples" > "$work/cls.log" 2>&1 && {
  echo "FAILED: kiln classify accepted a dit checkpoint"; exit 1; }
grep -q "not an image classifier" "$work/cls.log" || { cat "$work/cls.log"; exit 1; }
"$py" - "$work/grid.png" "$work/grid.samples/meta.json" <<'PY'
import json, struct, sys
png = open(sys.argv[1], "rb").read()
assert png[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
w, h = struct.unpack(">II", png[16:24])
# 4 rows x 3 columns of 12x12 images with 2-pixel gaps
assert (w, h) == (3 * 14 + 2, 4 * 14 + 2), (w, h)
m = json.load(open(sys.argv[2]))
assert m["splits"]["val"]["images"] == 12 and m["classes"] == 4, m
print(f"sample-images: {w}x{h} grid, 12 samples as a data set")
PY

# kiln report shows the latest checkpoint's samples, inline, and writes nothing else.
"$kiln" report "$work/ref" --out "$work/report.html" > "$work/report.log" 2>&1 || { cat "$work/report.log"; exit 1; }
grep -q 'src="data:image/png;base64,' "$work/report.html" || { echo "FAILED: no samples in the report"; exit 1; }
grep -q "step_00000012: EMA weights" "$work/report.html" || { echo "FAILED: the report's samples are not named"; exit 1; }
[ ! -e "$work/ref/samples" ] || { echo "FAILED: kiln report wrote into the run directory"; exit 1; }
echo "kiln report: the latest checkpoint's samples inline"

fails bad_class "class 4 is outside the model's \[0, 4)" "$kiln" sample-images --checkpoint "$ckpt" --out "$work/x.png" --classes 3-7
fails bad_classes "expected class numbers" "$kiln" sample-images --checkpoint "$ckpt" --out "$work/x.png" --classes a-b
# The default samples folder is rewritten with the PNG; a given one must be new.
succeeds samples_again "$kiln" sample-images --checkpoint "$ckpt" --out "$work/grid.png" --classes 0
fails samples_exist "exists and is not an empty folder" "$kiln" sample-images --checkpoint "$ckpt" \
  --out "$work/y.png" --samples "$work/grid.samples" --classes 0
[ ! -e "$work/grid.png.tmp" ] || { echo "FAILED: a temporary PNG was left"; exit 1; }
fails out_is_dir "is not a regular file" "$kiln" sample-images --checkpoint "$ckpt" --out "$work/data" --classes 0
fails cfg_nan "must be finite" "$kiln" sample-images --checkpoint "$ckpt" --out "$work/n.png" --classes 0 --cfg-scale nan
fails huge_classes "more than 100000 classes" "$kiln" sample-images --checkpoint "$ckpt" --out "$work/h.png" --classes 0-99999999
fails block_size "model.block_size (10) must be 9" "$kiln" train "$work/dit.toml" --set "run.dir=$work/b_run" --set model.block_size=10
fails sample_dit "sample-images" "$kiln" sample --checkpoint "$ckpt"
echo "dit train test: all passed"
