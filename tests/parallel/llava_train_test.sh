#!/usr/bin/env bash
# The vision-language model (model.arch = "llava") through `kiln train`, on tiny generated
# image-text pairs (12x12 gray PNGs of 4 patterns, one question each) prepared with
# `kiln prepare --format llava`:
#   1. 20 updates with gradient accumulation on 2 ranks at ZeRO 0 and at ZeRO 3 with full
#      activation checkpointing (with --long, the ctest label long, also ZeRO 1 and 2) give
#      the single process's per-step losses and val losses within 1e-5 relative; so does
#      the first training stage (only the projector trains: train.freeze) at ZeRO 2;
#   2. a checkpoint saved by 2 ranks at ZeRO 3 resumes on one process with the same next
#      losses (the pair loader's position carries over);
#   3. bf16 ends within 2% of fp32; the model learns (the last loss well below the first);
#   4. kiln sample --image answers a question about an image, kiln eval --llava every
#      question of a pair file, the same greedy answer for the same question;
#   5. bad inputs are one-line errors: labelled images for a llava, pairs for a vit, a
#      block_size that is not the image's tokens plus the caption's slots, --vocab-size with
#      a tokenizer prepare does not train, a feature_layer
#      out of range, a missing or empty --image, sample --image of a vit, eval --json into
#      a missing folder, a "kinds" list of the wrong length.
# Usage: llava_train_test.sh KILN_BINARY WORK_DIR [--long]
set -euo pipefail
kiln="$1"
work="$2"
long="${3:-}"
rm -rf "$work" && mkdir -p "$work"
. "$(dirname "$0")/common.sh"

make_pairs "$work/pairs"
"$kiln" prepare --format llava --input "$work/pairs/train.jsonl" --val-input "$work/pairs/val.jsonl" \
  --out "$work/data" --tokenizer byte --caption-tokens 224 > /dev/null

cat > "$work/llava.toml" <<EOF
[model]
arch = "llava"
n_layer = 2
n_head = 4
n_kv_head = 2
n_embd = 32
block_size = 233        # 9 image tokens and 224 caption slots
vision.n_layer = 2
vision.n_head = 2
vision.n_embd = 16
vision.patch_size = 4
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
  run_train "$work/llava.toml" "$name" "$np" --set "parallel.zero_stage=$stage" "$@"
}

train ref 1 0
runs=("2 0")
[ "$long" = --long ] && runs+=("2 1" "2 2")
for run in "${runs[@]}"; do
  set -- $run
  train "np$1_z$2" "$1" "$2"
  echo -n "llava np=$1 zero_stage=$2: "
  compare "$work/ref/metrics.jsonl" "$work/np$1_z$2/metrics.jsonl"
done
train np2_z3_full 2 3 --set train.activation_checkpointing=full
echo -n "llava np=2 zero_stage=3 activation_checkpointing=full: "
compare "$work/ref/metrics.jsonl" "$work/np2_z3_full/metrics.jsonl"

# The first training stage: the vision tower and the decoder frozen, the projector trains.
stage1=(--set 'train.freeze=["vision_tower.*", "language_model.*"]')
train stage1 1 0 "${stage1[@]}"
train stage1_np2 2 2 "${stage1[@]}"
echo -n "llava projector only, np=2 zero_stage=2: "
compare "$work/stage1/metrics.jsonl" "$work/stage1_np2/metrics.jsonl"
grep -q "trainable params: 1600 " "$work/stage1.log" ||
  { echo "FAILED: stage 1 should train the projector's 1600 parameters"; grep "trainable" "$work/stage1.log"; exit 1; }

train reshard 2 3 --exit-interval 10
train reshard 1 0 --resume auto
echo -n "llava 2 ranks zero 3 -> 1 process: "
compare "$work/ref/metrics.jsonl" "$work/reshard/metrics.jsonl" 11

train bf16 1 0 --set train.dtype=bf16
echo -n "llava bf16 vs fp32 (last loss, 2%): "
compare "$work/ref/metrics.jsonl" "$work/bf16/metrics.jsonl" 1 0.02

"$py" - "$work/ref/metrics.jsonl" <<'PY'
import json, sys
loss = [r["loss"] for r in map(json.loads, open(sys.argv[1])) if "loss" in r]
assert loss[-1] < 0.75 * loss[0], f"llava losses {loss[0]:.3f} -> {loss[-1]:.3f}: no learning"
print(f"llava loss {loss[0]:.3f} -> {loss[-1]:.3f} in 20 updates")
PY

# Answers: kiln sample --image answers one question; kiln eval --llava every question of
# the val file (16 records, no kinds: "turn 1"), greedily, the same answers as sample's.
ck=$(ls -d "$work"/ref/ckpt/step_* | tail -1)
succeeds sample_image "$kiln" sample --checkpoint "$ck" --image "$work/pairs/img/val0.png" \
  --prompt "$("$py" -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["conversations"][0]["value"][8:])' "$work/pairs/val.jsonl")" \
  --temperature 0 --max-new-tokens 16  # eval --llava's cap here: the answer's 8 tokens + 8
succeeds eval_llava "$kiln" eval --model "$ck" --llava "$work/pairs/val.jsonl" --examples 1 --json "$work/answers.json"
"$py" - "$work/answers.json" "$work/sample_image.log" <<'PY'
import json, sys
a = json.load(open(sys.argv[1]))["answers"][0]
assert a["records"] == 16 and a["questions"] == 16 and list(a["by_kind"]) == ["turn 1"], a
sampled = open(sys.argv[2]).read().splitlines()[-1]
assert a["examples"][0]["answer"] == sampled, (a["examples"][0], sampled)
# Each example says whether its answer was cut at the cap.
assert isinstance(a["examples"][0]["cut"], bool), a["examples"][0]
print(f"llava answers: {a['accuracy']:.3f} exact over 16 questions; sample --image says {sampled!r} as eval does")
PY
fails sample_image_missing "no such image file" "$kiln" sample --checkpoint "$ck" --image "$work/none.png" --prompt "Hi"
fails sample_image_empty "--image is an empty path" "$kiln" sample --checkpoint "$ck" --image "" --prompt "Hi"
fails eval_json_folder "the folder $work/none does not exist" "$kiln" eval --model "$ck" --llava "$work/pairs/val.jsonl" --json "$work/none/a.json"
"$py" -c 'import json,sys; r=json.loads(open(sys.argv[1]).readline()); r["kinds"]=["a","b"]; print(json.dumps(r))' \
  "$work/pairs/val.jsonl" > "$work/pairs/kinds.jsonl"
fails eval_kinds_length '"kinds" has 2 entries for its 1 gpt turns' "$kiln" eval --model "$ck" --llava "$work/pairs/kinds.jsonl"

make_images 5 "$work/idx"
"$kiln" prepare --format idx --input "$work/idx" --out "$work/images" > /dev/null
fails llava_on_images "holds images with labels" "$kiln" train "$work/llava.toml" --set "run.dir=$work/i_run" --set "data.dir=$work/images"
cat > "$work/vit.toml" <<EOF
[model]
arch = "vit"
n_layer = 1
n_head = 2
n_embd = 16
block_size = 10
patch_size = 4
[data]
dir = "$work/data"
[train]
steps = 1
EOF
fails vit_on_pairs "holds image-text pairs" "$kiln" train "$work/vit.toml" --set "run.dir=$work/v_run"
"$kiln" train "$work/vit.toml" --set "run.dir=$work/vit_run" --set "data.dir=$work/images" > "$work/vit_run.log" 2>&1
# model.init_parts: the vision tower from that vit (its pos_embed's first 9 of 10 rows: the
# class token's is last) and the decoder from a llama trained on bytes, unchanged by one
# update at lr 1e-12; bad entries are one-line errors.
printf 'in the beginning was the word and the word was with god ' > "$work/words.txt"
"$kiln" prepare --input "$work/words.txt" --out "$work/tokens" --tokenizer byte > /dev/null
"$py" - "$work/llava.toml" "$work/tokens" > "$work/llama.toml" <<'PY'
import sys
lines = open(sys.argv[1]).read().split("\n")
out = [l for l in lines if not l.startswith("vision.")]
out = [l.replace('arch = "llava"', 'arch = "llama"').split("#")[0] for l in out]
out = ['block_size = 32' if l.startswith("block_size") else l for l in out]
out = [f'dir = "{sys.argv[2]}"' if l.startswith("dir =") else l for l in out]
print("\n".join(out))
PY
run_train "$work/llama.toml" llama_base 1 --set train.steps=2 --set eval.every=0 --set train.global_batch=2
vit_ck=$(ls -d "$work"/vit_run/ckpt/step_* | tail -1)
llama_ck=$(ls -d "$work"/llama_base/ckpt/step_* | tail -1)
parts=(--set model.vision.n_layer=1 --set train.steps=1 --set optim.lr=1e-12 --set eval.every=0
       --set "model.init_parts=[\"vision_tower=$vit_ck\", \"language_model=$llama_ck\"]")
train init_parts 1 0 "${parts[@]}"
parts_ck=$(ls -d "$work"/init_parts/ckpt/step_* | tail -1)
compare_tensors "$vit_ck" "$parts_ck" "blocks." 1e-9 "vision_tower.blocks."
compare_tensors "$vit_ck" "$parts_ck" "pos_embed" 1e-9 "vision_tower.pos_embed"
compare_tensors "$vit_ck" "$parts_ck" "patch_embed." 1e-9 "vision_tower.patch_embed."
compare_tensors "$llama_ck" "$parts_ck" "model." 1e-9 "language_model.model."
# The decoder from the same llama as a Hugging Face folder (q, k, v and gate, up apart there).
succeeds export_llama "$kiln" export --checkpoint "$llama_ck" --format hf --out "$work/hf_llama"
train init_parts_hf 1 0 --set model.vision.n_layer=1 --set train.steps=1 --set optim.lr=1e-12 \
  --set eval.every=0 --set "model.init_parts=[\"language_model=$work/hf_llama\"]"
compare_tensors "$llama_ck" "$(ls -d "$work"/init_parts_hf/ckpt/step_* | tail -1)" "model." 1e-9 \
  "language_model.model."
fails init_parts_entry "model.init_parts entry 'vision_tower' is not PREFIX=PATH" \
  "$kiln" train "$work/llava.toml" --set "run.dir=$work/p_run" --set 'model.init_parts=["vision_tower"]'
fails init_parts_prefix "no parameter of this llava is named vision.*" \
  "$kiln" train "$work/llava.toml" --set "run.dir=$work/p_run" --set "model.init_parts=[\"vision=$vit_ck\"]"
fails init_parts_shape "tensor 'patch_embed.proj.weight' there has shape" \
  "$kiln" train "$work/llava.toml" --set "run.dir=$work/p_run" --set model.vision.n_layer=1 \
  --set model.vision.n_embd=32 --set "model.init_parts=[\"vision_tower=$vit_ck\"]"
fails init_parts_rope "its rope_theta is 10000, this model's part has 500000" \
  "$kiln" train "$work/llava.toml" --set "run.dir=$work/p_run" --set model.rope_theta=500000 \
  --set "model.init_parts=[\"language_model=$llama_ck\"]"
fails init_parts_missing "no tensor 'blocks.1.norm1.weight'" \
  "$kiln" train "$work/llava.toml" --set "run.dir=$work/p_run" --set "model.init_parts=[\"vision_tower=$vit_ck\"]"
fails sample_image_vit "an image model" "$kiln" sample --checkpoint "$(ls -d "$work"/vit_run/ckpt/step_* | tail -1)" --image "$work/pairs/img/val0.png"
fails prepare_byte_vocab "--vocab-size sizes a sentencepiece tokenizer trained on the pairs; the byte tokenizer has its own" \
  "$kiln" prepare --format llava --input "$work/pairs/train.jsonl" --out "$work/byte_vocab" --tokenizer byte --vocab-size 300
fails feature_layer_range "model.vision.feature_layer' must be <= -1, got 3" "$kiln" train "$work/llava.toml" --set "run.dir=$work/b_run" --set model.vision.feature_layer=3
fails block_size "the image's 9 tokens and the caption's 224 slots" "$kiln" train "$work/llava.toml" --set "run.dir=$work/b_run" --set model.block_size=240
echo "llava train test: all passed"
