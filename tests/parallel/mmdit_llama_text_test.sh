#!/usr/bin/env bash
# The MMDiT with a frozen Llama text encoder (model.text.encoder = "llama") through `kiln
# train`, on common.sh's tiny image-text pairs prepared with the byte tokenizer, the Llama a
# kiln one trained on the captions' bytes:
#   1. model.init_parts = ["text_encoder=LLAMA_CHECKPOINT"]: the MMDiT's checkpoints hold the
#      Llama's weights unchanged (frozen) after 8 updates; the log counts them frozen;
#   2. 2 ranks at ZeRO 3 give the single process's losses within 1e-5; a checkpoint of 2
#      ranks at ZeRO 3 resumes on one process with the same next losses (the frozen
#      encoder is saved and resharded with the rest);
#   3. the same Llama as a Hugging Face folder (kiln export) gives the same losses; a
#      random Llama (no init_parts) other ones;
#   4. kiln sample-images --prompt reads the frozen encoder from the MMDiT's checkpoint;
#   5. bad inputs are one-line errors naming the key and both values: a width other than
#      the checkpoint's, other heads or rotary base than the Llama's (the tensors' shapes
#      the same), a Llama of another tokenizer than the data's; a Llama key with the joint
#      encoder.
# Usage: mmdit_llama_text_test.sh KILN_BINARY WORK_DIR
set -euo pipefail
kiln="$1"
work="$2"
rm -rf "$work" && mkdir -p "$work"
. "$(dirname "$0")/common.sh"

make_pairs "$work/pairs"
"$kiln" prepare --format llava --input "$work/pairs/train.jsonl" --val-input "$work/pairs/val.jsonl" \
  --out "$work/data" --tokenizer byte --caption-tokens 224 > /dev/null
printf ' A cross. A ring. A bar. A dot. A ring. A dot. A cross. A bar.' > "$work/captions.txt"
"$kiln" prepare --input "$work/captions.txt" --out "$work/tokens" --tokenizer byte > /dev/null

cat > "$work/llama.toml" <<EOF
[model]
arch = "llama"
n_layer = 2
n_head = 2
n_kv_head = 1
n_embd = 16
ffn_hidden_size = 32
block_size = 16
[data]
dir = "$work/tokens"
[train]
steps = 6
micro_batch = 2
[optim]
lr = 1e-2
[eval]
every = 0
[checkpoint]
every = 6
EOF
run_train "$work/llama.toml" llama 1
llama_ck=$(ls -d "$work"/llama/ckpt/step_* | tail -1)
succeeds export_llama "$kiln" export --checkpoint "$llama_ck" --format hf --out "$work/hf_llama"

cat > "$work/mmdit.toml" <<EOF
[model]
arch = "mmdit"
n_layer = 2
n_head = 2
n_embd = 32
block_size = 9          # (12 / 4)^2 patches
patch_size = 4
caption_tokens = 12     # " A cross." and the end-of-text: 10
text.encoder = "llama"  # the Llama above: 16 wide, 2 heads over 1 k/v head
text.n_layer = 2
text.n_embd = 16
text.n_head = 2
text.n_kv_head = 1
text.ffn_hidden_size = 32
init_parts = ["text_encoder=$llama_ck"]
[data]
dir = "$work/data"
[train]
steps = 8
micro_batch = 2
global_batch = 4
[optim]
lr = 3e-3
[eval]
every = 4
batches = 2
[log]
every = 1
[checkpoint]
every = 4
[parallel]
timeout_s = 20
EOF

train() {  # train RUN_NAME NP STAGE [extra args...]
  local name=$1 np=$2 stage=$3
  shift 3
  run_train "$work/mmdit.toml" "$name" "$np" --set "parallel.zero_stage=$stage" "$@"
}

train ref 1 0
ref_ck=$(ls -d "$work"/ref/ckpt/step_* | tail -1)
compare_tensors "$llama_ck" "$ref_ck" "model." 0 "text_encoder.model."
grep -q "tensors frozen by train.freeze, train.lora or the model" "$work/ref.log" ||
  { echo "FAILED: the log does not count the frozen encoder"; cat "$work/ref.log"; exit 1; }
grep -q "kiln: model.init_parts: text_encoder=" "$work/ref.log" ||
  { echo "FAILED: the log does not say where the encoder came from"; cat "$work/ref.log"; exit 1; }
echo "mmdit llama text encoder: its weights unchanged in the MMDiT's checkpoint after 8 updates"

train np2_z3 2 3
echo -n "mmdit llama text encoder np=2 zero_stage=3: "
compare "$work/ref/metrics.jsonl" "$work/np2_z3/metrics.jsonl"
train reshard 2 3 --exit-interval 4
train reshard 1 0 --resume auto
echo -n "mmdit llama text encoder 2 ranks zero 3 -> 1 process: "
compare "$work/ref/metrics.jsonl" "$work/reshard/metrics.jsonl" 5

train hf 1 0 --set "model.init_parts=[\"text_encoder=$work/hf_llama\"]"
echo -n "mmdit llama text encoder from a Hugging Face folder: "
compare "$work/ref/metrics.jsonl" "$work/hf/metrics.jsonl"
# (adaLN-Zero: the first loss reads no caption; the last one does.)
train random 1 0 --set "model.init_parts=[]"
"$py" - "$work/ref/metrics.jsonl" "$work/random/metrics.jsonl" <<'PY'
import json, sys
a, b = ([r["loss"] for r in map(json.loads, open(p)) if "loss" in r][-1] for p in sys.argv[1:])
assert abs(a - b) > 2e-5 * a, f"a random Llama gives the trained one's last loss {a}"
print(f"mmdit llama text encoder: a random Llama's last loss {b:.6f}, the trained one's {a:.6f}")
PY

succeeds sample "$kiln" sample-images --checkpoint "$ref_ck" --out "$work/grid.png" \
  --prompt "A cross." --prompt "" --per-row 2 --steps 2
[ -s "$work/grid.png" ] || { echo "FAILED: no grid"; cat "$work/sample.log"; exit 1; }
echo "sample-images: the frozen encoder from the MMDiT's checkpoint"

fails width "its n_embd is 16, this model's part has 24" \
  "$kiln" train "$work/mmdit.toml" --set "run.dir=$work/w_run" --set model.text.n_embd=24
# What the tensors' shapes do not show: the heads (4 over 2 of size 4 hold as many rows as 2
# over 1 of size 8) and the rotary base.
fails heads "its n_head is 2, this model's part has 4" "$kiln" train "$work/mmdit.toml" \
  --set "run.dir=$work/h_run" --set model.text.n_head=4 --set model.text.n_kv_head=2
fails rope "its rope_theta is 10000, this model's part has 500000" "$kiln" train \
  "$work/mmdit.toml" --set "run.dir=$work/r_run" --set model.text.rope_theta=500000
fails rope_hf "its rope_theta is 10000, this model's part has 500000" "$kiln" train \
  "$work/mmdit.toml" --set "run.dir=$work/r_run" --set model.text.rope_theta=500000 \
  --set "model.init_parts=[\"text_encoder=$work/hf_llama\"]"
# A Llama of another tokenizer (SentencePiece over the same captions) reads other ids.
"$kiln" prepare --input "$work/captions.txt" --out "$work/sp_tokens" --tokenizer sentencepiece \
  --vocab-size 300 > /dev/null 2>&1
run_train "$work/llama.toml" sp_llama 1 --set "data.dir=$work/sp_tokens" --set train.steps=1 \
  --set checkpoint.every=1
fails tokenizer "its tokenizer (hash [0-9a-f]*) is not the data's" "$kiln" train \
  "$work/mmdit.toml" --set "run.dir=$work/t_run" \
  --set "model.init_parts=[\"text_encoder=$work/sp_llama/ckpt/step_00000001\"]"
fails joint_key "is a Llama text encoder's key: it needs model.text.encoder = \"llama\"" \
  "$kiln" train "$work/mmdit.toml" --set "run.dir=$work/j_run" --set model.text.encoder=joint
echo "mmdit llama text encoder test: all passed"
