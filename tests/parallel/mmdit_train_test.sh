#!/usr/bin/env bash
# The text-to-image diffusion transformer (model.arch = "mmdit") through `kiln train`, on
# tiny generated image-text pairs (common.sh make_pairs: 12x12 gray images of 4 patterns,
# captioned "A cross." etc.) prepared with `kiln prepare --format llava`, each record's last
# answer its caption:
#   1. 12 updates with gradient accumulation and an EMA of the weights on 2 ranks at ZeRO
#      1 and at ZeRO 3 with full activation checkpointing (with --long, the ctest label
#      long, also 2 ranks at ZeRO 0 and 2 and 4 ranks at ZeRO 2) give the single process's
#      per-step losses and val losses within 1e-5 relative (noise, times and caption
#      dropout are drawn by global sample index);
#   2. a checkpoint saved by 2 ranks at ZeRO 3 resumes on one process with the same next
#      losses; more caption slots than the captions need change no loss;
#   3. bf16 ends within 3% of fp32; the loss falls;
#   4. kiln sample-images --prompt writes a PNG grid with a row per prompt, the rows in a
#      JSON file and the samples as a data set, the same samples whatever the batch size,
#      from the EMA, other ones with --shift 3; kiln report shows a row per val caption;
#   5. bad inputs are one-line errors: a caption longer than model.caption_tokens (in the
#      data, and as a prompt), classes for a text-conditioned model, an empty prompts file,
#      labelled images for an mmdit, kiln sample of an mmdit checkpoint.
# Usage: mmdit_train_test.sh KILN_BINARY WORK_DIR [--long]
set -euo pipefail
kiln="$1"
work="$2"
long="${3:-}"
rm -rf "$work" && mkdir -p "$work"
. "$(dirname "$0")/common.sh"

make_pairs "$work/pairs"
"$kiln" prepare --format llava --input "$work/pairs/train.jsonl" --val-input "$work/pairs/val.jsonl" \
  --out "$work/data" --tokenizer byte --caption-tokens 224 > /dev/null

cat > "$work/mmdit.toml" <<EOF
[model]
arch = "mmdit"
n_layer = 2
n_head = 2
n_embd = 32
block_size = 9          # (12 / 4)^2 patches
patch_size = 4
norm_eps = 1e-6
caption_tokens = 12     # " A cross." and the end-of-text: 10
caption_dropout = 0.25
text.n_layer = 1
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
  run_train "$work/mmdit.toml" "$name" "$np" --set "parallel.zero_stage=$stage" "$@"
}

train ref 1 0
runs=("2 1")
[ "$long" = --long ] && runs+=("2 0" "2 2" "4 2")
for run in "${runs[@]}"; do
  set -- $run
  train "np$1_z$2" "$1" "$2"
  echo -n "mmdit np=$1 zero_stage=$2: "
  compare "$work/ref/metrics.jsonl" "$work/np$1_z$2/metrics.jsonl"
done
train np2_z3_full 2 3 --set train.activation_checkpointing=full
echo -n "mmdit np=2 zero_stage=3 activation_checkpointing=full: "
compare "$work/ref/metrics.jsonl" "$work/np2_z3_full/metrics.jsonl"

train reshard 2 3 --exit-interval 6
train reshard 1 0 --resume auto
echo -n "mmdit 2 ranks zero 3 -> 1 process: "
compare "$work/ref/metrics.jsonl" "$work/reshard/metrics.jsonl" 7

# Padding is a document of its own: 20 caption slots give the 12 slots' first loss (the
# initial values depend on global coordinates only, so only wpe's 8 new rows are new).
train slots20 1 0 --set model.caption_tokens=20 --set train.steps=1
"$py" - "$work/ref/metrics.jsonl" "$work/slots20/metrics.jsonl" <<'PY'
import json, sys
a, b = ([r["loss"] for r in map(json.loads, open(p)) if "loss" in r][0] for p in sys.argv[1:])
assert abs(a - b) <= 1e-6 * a, f"the first loss with 20 caption slots {b} is not 12 slots' {a}"
print(f"mmdit caption_tokens 20 vs 12: the same first loss ({a:.6f}, {b:.6f})")
PY

train bf16 1 0 --set train.dtype=bf16
echo -n "mmdit bf16 vs fp32 (last loss, 3%): "
compare "$work/ref/metrics.jsonl" "$work/bf16/metrics.jsonl" 1 0.03

"$py" - "$work/ref/metrics.jsonl" <<'PY'
import json, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if "loss" in r]
first, last = rows[0]["loss"], rows[-1]["loss"]
assert last < 0.9 * first, f"mmdit loss {first} -> {last} does not fall"
print(f"mmdit loss {first:.4f} -> {last:.4f} in 12 updates")
PY

ckpt=$(ls -d "$work"/ref/ckpt/step_* | tail -1)
printf 'A ring.\n\nA bar.\n' > "$work/prompts.txt"
sample() {  # sample NAME [args...]: sample-images of $ckpt, 4 rows of 3 (the last unconditional)
  local name=$1
  shift
  succeeds "$name" "$kiln" sample-images --checkpoint "$ckpt" --out "$work/$name.png" \
    --prompt "A cross." --prompts "$work/prompts.txt" --prompt "" --per-row 3 --steps 4 \
    --cfg-scale 2 "$@"
}
sample grid
sample grid_b1 --batch 5
cmp "$work/grid.png" "$work/grid_b1.png" || { echo "FAILED: samples depend on --batch"; exit 1; }
grep -q "EMA weights" "$work/grid.log" || { echo "FAILED: not sampled from the EMA"; cat "$work/grid.log"; exit 1; }
sample grid_raw --weights params
! cmp -s "$work/grid.png" "$work/grid_raw.png" || { echo "FAILED: EMA and raw samples are equal"; exit 1; }
sample grid_shift --shift 3
! cmp -s "$work/grid.png" "$work/grid_shift.png" || { echo "FAILED: --shift 3 changes nothing"; exit 1; }
grep -q '"shift": 3.0' "$work/grid_shift.json" || { echo "FAILED: no shift in grid_shift.json"; exit 1; }
fails bad_shift "shift" "$kiln" sample-images --checkpoint "$ckpt" --out "$work/x.png" --prompt "A bar." --shift 0
"$py" - "$work/grid.png" "$work/grid.json" "$work/grid.samples/meta.json" <<'PY'
import json, struct, sys
png = open(sys.argv[1], "rb").read()
assert png[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
w, h = struct.unpack(">II", png[16:24])
assert (w, h) == (3 * 14 + 2, 4 * 14 + 2), (w, h)  # 4 rows (prompts) x 3 columns of 12x12
rows = json.load(open(sys.argv[2]))["rows"]
# --prompt ones first, then the file's, in order; "" the empty caption (no tokens)
assert [r["prompt"] for r in rows] == ["A cross.", "", "A ring.", "A bar."], rows
assert [r["tokens"] for r in rows] == [10, 0, 9, 8], rows  # " A cross." and the end-of-text
m = json.load(open(sys.argv[3]))
assert m["splits"]["val"]["images"] == 12 and m["classes"] == 4, m
print(f"sample-images: {w}x{h} grid, a row per prompt, the prompts in grid.json")
PY
echo "sample-images: the EMA weights, the same whatever --batch, other than the raw ones"

succeeds report "$kiln" report "$work/ref" --out "$work/report.html"
grep -q "<tr><td>A [a-z]*.</td><td><img" "$work/report.html" ||
  { echo "FAILED: the report has no row of samples per val caption"; exit 1; }
[ ! -e "$work/ref/samples" ] || { echo "FAILED: kiln report wrote into the run directory"; exit 1; }
echo "kiln report: a row of samples per val caption, inline"

fails long_caption "longest caption (a record's last answer and its end-of-text) is 10 tokens (.* record [0-9]*) but model.caption_tokens is 8" \
  "$kiln" train "$work/mmdit.toml" --set "run.dir=$work/c_run" --set model.caption_tokens=8
# 203 slots cut the answers after "What is in the image?" (prepare keeps the others whole).
"$kiln" prepare --format llava --input "$work/pairs/train.jsonl" --val-input "$work/pairs/val.jsonl" \
  --out "$work/cut" --tokenizer byte --caption-tokens 203 > /dev/null 2>&1
fails cut_caption "record [0-9]*: no whole last answer to take as a text-to-image caption" \
  "$kiln" train "$work/mmdit.toml" --set "run.dir=$work/cut_run" --set "data.dir=$work/cut"
fails long_prompt "prompt 1 is 28 tokens, more than the model's 12" "$kiln" sample-images \
  --checkpoint "$ckpt" --out "$work/x.png" --prompt "A cross, a ring and a bar."
fails classes "conditioned on text: give prompts" "$kiln" sample-images --checkpoint "$ckpt" \
  --out "$work/x.png" --classes 0-1
printf '\n\n' > "$work/empty.txt"
fails empty_prompts "no prompt in it" "$kiln" sample-images --checkpoint "$ckpt" \
  --out "$work/x.png" --prompts "$work/empty.txt"
make_images 5 "$work/idx"
"$kiln" prepare --format idx --input "$work/idx" --out "$work/labelled" > /dev/null
fails labelled "holds images with labels" "$kiln" train "$work/mmdit.toml" --set "run.dir=$work/l_run" \
  --set "data.dir=$work/labelled"
fails sample_mmdit "kiln sample-images" "$kiln" sample --checkpoint "$ckpt"
echo "mmdit train test: all passed"
