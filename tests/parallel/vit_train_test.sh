#!/usr/bin/env bash
# The vision transformer (model.arch = "vit") through `kiln train`, on tiny generated IDX
# images prepared with `kiln prepare --format idx`:
#   1. 20 updates with gradient accumulation on 2 ranks at ZeRO 0 and at ZeRO 3 with full
#      activation checkpointing, on 4 at ZeRO 3 (with --long, the ctest label long, also 2
#      ranks at ZeRO 1-3 and 4 at ZeRO 0) give the single process's per-step losses, val
#      losses and val accuracies within 1e-5 relative;
#   2. a checkpoint saved by 4 ranks at ZeRO 3 resumes on 2 ranks at ZeRO 1 and on one
#      process with the same next losses (the image loader's position carries over);
#   3. bf16 ends within 2% of fp32; the classifier learns (val accuracy above chance);
#   4. bad inputs are one-line errors: a truncated IDX file (prepare), a corrupt image
#      shard, a token data set for a vit and images for a gpt2 (a vit config turned gpt2:
#      its vision keys), a wrong block_size.
# Usage: vit_train_test.sh KILN_BINARY WORK_DIR [--long]
set -euo pipefail
kiln="$1"
work="$2"
long="${3:-}"
rm -rf "$work" && mkdir -p "$work"
. "$(dirname "$0")/common.sh"

make_images 5 "$work/idx"
"$kiln" prepare --format idx --input "$work/idx" --out "$work/data" > /dev/null

cat > "$work/vit.toml" <<EOF
[model]
arch = "vit"
n_layer = 2
n_head = 2
n_embd = 32
block_size = 10
patch_size = 4
[data]
dir = "$work/data"
[train]
steps = 20
micro_batch = 2
global_batch = 8
[optim]
lr = 3e-3
[schedule]
warmup_steps = 3
[eval]
every = 10
batches = 4
[log]
every = 1
peak_tflops = 1.0
[parallel]
timeout_s = 20
bucket_mb = 0.004
EOF

train() {  # train RUN_NAME NP STAGE [extra args...]
  local name=$1 np=$2 stage=$3
  shift 3
  run_train "$work/vit.toml" "$name" "$np" --set "parallel.zero_stage=$stage" "$@"
}

train ref 1 0
runs=("2 0" "4 3")
[ "$long" = --long ] && runs+=("2 1" "2 2" "2 3" "4 0")
for run in "${runs[@]}"; do
  set -- $run
  train "np$1_z$2" "$1" "$2"
  echo -n "vit np=$1 zero_stage=$2: "
  compare "$work/ref/metrics.jsonl" "$work/np$1_z$2/metrics.jsonl"
done
train np2_z3_full 2 3 --set train.activation_checkpointing=full
echo -n "vit np=2 zero_stage=3 activation_checkpointing=full: "
compare "$work/ref/metrics.jsonl" "$work/np2_z3_full/metrics.jsonl"

train reshard 4 3 --exit-interval 10
cp -r "$work/reshard" "$work/reshard1"
train reshard 2 1 --resume auto
echo -n "vit 4 ranks zero 3 -> 2 ranks zero 1: "
compare "$work/ref/metrics.jsonl" "$work/reshard/metrics.jsonl" 11
train reshard1 1 0 --resume auto
echo -n "vit 4 ranks zero 3 -> 1 process: "
compare "$work/ref/metrics.jsonl" "$work/reshard1/metrics.jsonl" 11

train bf16 1 0 --set train.dtype=bf16
echo -n "vit bf16 vs fp32 (last loss, 2%): "
compare "$work/ref/metrics.jsonl" "$work/bf16/metrics.jsonl" 1 0.02

# Evaluation over the whole val split (64 images; eval.batches past its end): every image
# once, on 1 process and on 4 ranks alike (the last micro-batches' tail is ignored, not
# repeated), and the same accuracy as kiln classify of the checkpoint.
train evalall 1 0 --set eval.batches=100
train evalall4 4 3 --set eval.batches=100
echo -n "vit whole-split evaluation, 4 ranks zero 3 vs 1 process: "
compare "$work/evalall/metrics.jsonl" "$work/evalall4/metrics.jsonl"
"$kiln" classify --checkpoint "$(ls -d "$work"/evalall/ckpt/step_* | tail -1)" --data "$work/data" \
  --json "$work/classify.json" > "$work/classify.log" 2>&1 || { cat "$work/classify.log"; exit 1; }
"$py" - "$work/evalall/metrics.jsonl" "$work/classify.json" <<'PY'
import json, sys
last = [r for r in map(json.loads, open(sys.argv[1])) if "val_accuracy" in r][-1]
c = json.load(open(sys.argv[2]))
assert c["images"] == 64 and abs(c["accuracy"] - last["val_accuracy"]) < 1e-12, (c, last)
print(f"kiln classify: {c['accuracy']:.4f} over {c['images']} images = the trainer's val_accuracy")
PY

# Relative to itself every class scores a ratio of 1.
"$kiln" classify --checkpoint "$(ls -d "$work"/evalall/ckpt/step_* | tail -1)" --data "$work/data" \
  --relative-to "$work/classify.json" > "$work/relative.log" 2>&1 || { cat "$work/relative.log"; exit 1; }
grep -q "smallest ratio 1.000" "$work/relative.log" || { echo "FAILED: --relative-to"; cat "$work/relative.log"; exit 1; }

# It learns: the last val accuracy beats chance (4 classes) clearly.
"$py" - "$work/ref/metrics.jsonl" <<'PY'
import json, sys
acc = [r["val_accuracy"] for r in map(json.loads, open(sys.argv[1])) if "val_accuracy" in r]
assert acc and acc[-1] > 0.5, f"val accuracy {acc} does not beat chance (0.25) clearly"
print(f"vit val accuracy {acc[-1]:.3f} after 20 updates (chance 0.25)")
PY

mkdir -p "$work/trunc"
cp "$work/idx/t10k-"* "$work/idx/train-labels-idx1-ubyte.gz" "$work/trunc/"
gzip -dc "$work/idx/train-images-idx3-ubyte.gz" > "$work/trunc/train-images-idx3-ubyte"
truncate -s 2000 "$work/trunc/train-images-idx3-ubyte"
fails truncated_idx "train-images-idx3-ubyte" "$kiln" prepare --format idx --input "$work/trunc" --out "$work/trunc_data"
fails idx_val_fraction "--val-fraction is for text" "$kiln" prepare --format idx --input "$work/idx" --out "$work/vf_data" --val-fraction 0.1
fails empty_class_name "name 2 (label 1) is empty" "$kiln" prepare --format idx --input "$work/idx" --out "$work/cn_data" --class-names "a,,c,d"
cp -r "$work/data" "$work/corrupt"
shard=$(find "$work/corrupt" -type f ! -name meta.json | sort | head -1)
printf 'X' | dd of="$shard" bs=1 seek=100 conv=notrunc status=none
fails corrupt_shard "$(basename "$shard")" "$kiln" train "$work/vit.toml" --set "run.dir=$work/corrupt_run" --set "data.dir=$work/corrupt"
printf 'in the beginning was the word ' > "$work/words.txt"
"$kiln" prepare --input "$work/words.txt" --out "$work/tokens" --tokenizer byte > /dev/null
fails vit_on_tokens "holds tokens" "$kiln" train "$work/vit.toml" --set "run.dir=$work/tok_run" --set "data.dir=$work/tokens" --set eval.every=0
# A vit config turned gpt2 keeps the vision keys, which gpt2 does not read; a gpt2 config on
# the image data set is refused by the data check.
fails vit_keys_on_gpt2 "key 'model.patch_size' is not a key of model.arch 'gpt2' (dit, mmdit, vit have it)" \
  "$kiln" train "$work/vit.toml" --set "run.dir=$work/g_run" --set model.arch=gpt2
cat > "$work/gpt2.toml" <<EOF
[model]
n_layer = 1
n_head = 2
n_embd = 16
block_size = 16
[data]
dir = "$work/data"
[train]
steps = 1
EOF
fails gpt2_on_images "holds images" "$kiln" train "$work/gpt2.toml" --set "run.dir=$work/g_run"
fails sample_vit "an image model" "$kiln" sample --checkpoint "$(ls -d "$work"/ref/ckpt/step_* | tail -1)"
fails export_vit "has no file formats" "$kiln" export --checkpoint "$(ls -d "$work"/ref/ckpt/step_* | tail -1)" --format safetensors --out "$work/exported/a/vit.safetensors"
[ ! -e "$work/exported" ] || { echo "FAILED: a failed export left $work/exported behind"; exit 1; }
fails bad_relative "not a kiln classify --json file" "$kiln" classify --checkpoint "$(ls -d "$work"/ref/ckpt/step_* | tail -1)" --data "$work/data" --relative-to "$work/vit.toml"
fails block_size "model.block_size (17) must be 10" "$kiln" train "$work/vit.toml" --set "run.dir=$work/b_run" --set model.block_size=17
echo "vit train test: all passed"
