#!/usr/bin/env bash
# LoRA fine-tuning (train.lora, docs/lora.md) through `kiln train`: a tiny Llama trained on
# one corpus and exported as a Hugging Face folder is the frozen base; adapters of rank 4
# on q, v, gate, up and down learn a second corpus, the same words spelt backwards (the
# same bytes, other sequences: what the blocks compute must change, not the embedding):
#   1. the fine-tune's val loss falls by over 10% between its first and last evaluation;
#   2. its checkpoints hold the adapters only (no base tensor; under a fifth of the base's
#      checkpoint here, where the manifest and tokenizer are much of it) and name the base
#      (its files' crc32);
#   3. layouts give the single process's losses within 1e-5: dp2 at ZeRO 0 and 3 (the
#      frozen base sharded), tp2 with sequence parallelism, pp2 (--long: ZeRO 1 and 2,
#      cp2, tp2 without sp, full activation checkpointing, dropout at dp2);
#   4. a run stopped after 10 updates resumes to the same losses, also on 2 ranks at ZeRO 3
#      (resharding the adapters and their optimizer state);
#   5. one-line errors: resuming on another base, a target that matches nothing, LoRA keys
#      without a rank, train.freeze with LoRA.
# Usage: lora_train_test.sh KILN_BINARY WORK_DIR [--long]
set -euo pipefail
kiln="$1"
work="$2"
long="${3:-}"
rm -rf "$work" && mkdir -p "$work"
. "$(dirname "$0")/common.sh"

setup_tiny_gpt2 11
llama=(--set model.arch=llama --set model.n_kv_head=2 --set model.ffn_hidden_size=48
       --set model.dropout=0)
run_train "$work/tiny.toml" base 1 "${llama[@]}" --set train.steps=60 --set optim.lr=1e-2 \
  --set checkpoint.every=60
"$kiln" export --checkpoint "$work/base/ckpt/step_00000060" --format hf --out "$work/base_hf" \
  > "$work/base_export.log" 2>&1 || { echo "FAILED: export"; cat "$work/base_export.log"; exit 1; }

# The fine-tune's corpus: make_corpus's words spelt backwards.
"$py" - "$work/ft.txt" <<'PY'
import random, sys
random.seed(5)
words = ["in the beginning ", "and the earth ", "was without form ", "and void; ",
         "and darkness ", "was upon the face ", "of the deep. "]
open(sys.argv[1], "w").write("".join(random.choice(words)[::-1] for _ in range(800)))
PY
"$kiln" prepare --input "$work/ft.txt" --out "$work/ft_data" --tokenizer byte --val-fraction 0.1 >/dev/null
lora=("${llama[@]}" --set "data.dir=$work/ft_data" --set "model.init_from=$work/base_hf"
      --set train.lora.rank=4 --set train.lora.alpha=8 --set optim.lr=1e-2
      --set 'train.lora.targets=["q","v","gate","up","down"]' --set eval.every=5
      --set checkpoint.every=10)
train() {  # train RUN_NAME NP [extra args...]
  local name=$1 np=$2
  shift 2
  run_train "$work/tiny.toml" "$name" "$np" "${lora[@]}" "$@"
}

train ref 1
"$py" - "$work/ref/metrics.jsonl" "$work/ref/ckpt/step_00000020" "$work/base/ckpt/step_00000060" <<'PY'
import json, os, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
val = [r["val_loss"] for r in recs if "val_loss" in r]
assert len(val) >= 3 and val[-1] < 0.9 * val[0], f"val loss {val}: LoRA did not learn"
m = json.load(open(os.path.join(sys.argv[2], "manifest.json")))
names = list(m["tensors"])
params = [n for n in names if not n.startswith(("optimizer.", "lowp.", "ema."))]
assert params and all(".lora_A." in n or ".lora_B." in n for n in params), f"not adapters only: {params}"
assert len(params) == 2 * 5 * 2, f"{len(params)} adapter tensors, 20 expected (2 blocks x 5 x A, B)"
base = m["state"]["lora"]["base"]
assert base["crc32"] and base["path"].endswith("base_hf"), base
size = lambda d: sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
a, b = size(sys.argv[2]), size(sys.argv[3])
assert a < b / 5, f"LoRA checkpoint {a} bytes, full {b}"
print(f"LoRA: val loss {val[0]:.4f} -> {val[-1]:.4f}; checkpoint {a} bytes (the full model's "
      f"{b}), {len(params)} adapter tensors, base crc32 {base['crc32']}")
PY

layouts() {  # layouts BOUND "NAME NP ARGS..."...: each run's losses against ref's
  local bound=$1
  shift
  for run in "$@"; do
    set -- $run
    local name=$1 np=$2
    shift 2
    train "$name" "$np" "$@"
    echo -n "LoRA $name: "
    compare "$work/ref/metrics.jsonl" "$work/$name/metrics.jsonl" 1 "$bound"
  done
}
runs=("dp2_z0 2 --set parallel.zero_stage=0" "dp2_z3 2 --set parallel.zero_stage=3"
      "tp2_sp 2 --set parallel.tp=2 --set parallel.sequence_parallel=true"
      "pp2 2 --set parallel.pp=2")
[ "$long" = --long ] && runs+=("dp2_z1 2 --set parallel.zero_stage=1"
                               "dp2_z2 2 --set parallel.zero_stage=2" "cp2 2 --set parallel.cp=2"
                               "tp2 2 --set parallel.tp=2"
                               "full 1 --set train.activation_checkpointing=full")
layouts 1e-5 "${runs[@]}"
if [ "$long" = --long ]; then  # dropout on the adapters' input: the same masks on 2 ranks
  train drop 1 --set train.lora.dropout=0.1
  train drop_dp2 2 --set train.lora.dropout=0.1
  echo -n "LoRA dropout dp2: "
  compare "$work/drop/metrics.jsonl" "$work/drop_dp2/metrics.jsonl"
  echo -n "LoRA dropout changes the losses: "
  if compare "$work/ref/metrics.jsonl" "$work/drop/metrics.jsonl" 1 1e-6 >/dev/null 2>&1; then
    echo "FAILED: dropout 0.1 gives the losses of no dropout"; exit 1
  fi
  echo ok
fi

train resume 1 --exit-interval 10
train resume 1 --resume auto
echo -n "LoRA resume after 10 updates: "
compare "$work/ref/metrics.jsonl" "$work/resume/metrics.jsonl" 11
train reshard 2 --set parallel.zero_stage=3 --exit-interval 10
train reshard 1 --resume auto
echo -n "LoRA 2 ranks at ZeRO 3 -> 1 process: "
compare "$work/ref/metrics.jsonl" "$work/reshard/metrics.jsonl" 11

# Another base: the base run trained one update more.
run_train "$work/tiny.toml" base2 1 "${llama[@]}" --set train.steps=61 --set optim.lr=1e-2 \
  --set checkpoint.every=61
"$kiln" export --checkpoint "$work/base2/ckpt/step_00000061" --format hf --out "$work/base2_hf" \
  > "$work/base2_export.log" 2>&1 || { echo "FAILED: export"; cat "$work/base2_export.log"; exit 1; }
cp -r "$work/resume" "$work/other_base"
fails other_base "its adapters were trained on" \
  "$kiln" train "$work/tiny.toml" --set "run.dir=$work/other_base" "${lora[@]}" \
  --set "model.init_from=$work/base2_hf" --resume auto
fails no_match "train.lora.targets 'q_proj' matches no Linear" \
  "$kiln" train "$work/tiny.toml" --set "run.dir=$work/no_match" "${lora[@]}" \
  --set 'train.lora.targets=["q_proj"]'
fails no_rank "train.lora keys are set but train.lora.rank = 0" \
  "$kiln" train "$work/tiny.toml" --set "run.dir=$work/no_rank" "${llama[@]}" \
  --set train.lora.alpha=4
fails freeze "train.freeze with train.lora" \
  "$kiln" train "$work/tiny.toml" --set "run.dir=$work/freeze" "${lora[@]}" \
  --set 'train.freeze=["embed_tokens"]'
grep -q "kiln: LoRA rank 4, alpha 8 (scale 2), 10 adapters (model.layers.0.self_attn.qkv_proj.q ... model.layers.1.mlp.down_proj)" \
  "$work/ref.log" || { echo "FAILED: no LoRA start-up line in ref.log"; grep -i lora "$work/ref.log"; exit 1; }
echo "LoRA train test: all passed"
