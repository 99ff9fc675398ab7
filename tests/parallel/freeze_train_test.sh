#!/usr/bin/env bash
# Parameter freezing (train.freeze) through `kiln train`, every layout against the single
# process (the one-process properties, memory and the learning-rate-0 reference:
# tests/train/freeze_test.cpp):
#   1. a tiny GPT-2 with wpe, block 0, block 2's attention and ln_f's bias frozen: the
#      frozen tensors are bitwise the same at steps 4 and 8 (and in every layout), the
#      trainable ones change; the checkpoint holds the frozen weights but no optimizer
#      state for them; the start-up line counts trainable and all parameters;
#   2. dp2 with ZeRO 3 and tp2 with sequence parallelism ("quick", in plain ctest); ZeRO
#      0, 1 and 2, tp2, pp2, dp2 x pp2 ("full", label long): losses within 1e-5 relative
#      of the single process, the trained tensors within 1e-5;
#   3. the tied wte frozen (embedding and output head) with block 1's MLP: pp2, where the
#      first and the last stage each hold wte (full: dp2 ZeRO 3, tp2, dp2 x pp2 ZeRO 1);
#      Llama (full): embedding, an attention, the final norm and the untied head frozen at
#      tp2 + sp and ZeRO 3;
#   4. resuming with another set of frozen parameters, and a pattern matching nothing, are
#      one-line errors naming train.freeze.
# Usage: freeze_train_test.sh KILN_BINARY WORK_DIR quick|full
set -euo pipefail
kiln="$1"
work="$2"
mode="${3:-quick}"
rm -rf "$work" && mkdir -p "$work"
. "$(dirname "$0")/common.sh"

make_corpus 11 "$work/corpus.txt"
"$kiln" prepare --input "$work/corpus.txt" --out "$work/data" --tokenizer byte --val-fraction 0.1 >/dev/null

cat > "$work/tiny.toml" <<EOF2
[model]
n_layer = 4
n_head = 4
n_embd = 32
block_size = 16
[data]
dir = "$work/data"
[train]
steps = 8
micro_batch = 1
global_batch = 4
seq_len = 16
[optim]
lr = 3e-3
[eval]
every = 4
batches = 1
[log]
every = 1
peak_tflops = 1.0
[checkpoint]
every = 4
[parallel]
timeout_s = 20
bucket_mb = 0.004
EOF2

train() { run_train "$work/tiny.toml" "$@"; }  # train RUN_NAME NP [--set ...]
ckpt() { echo "$work/$1/ckpt/step_0000000$2"; }
check() {  # check REF RUN LABEL [PREFIX]: losses, then the tensors PREFIX* (default
           # transformer.) at the last step
  echo -n "$3: "; compare "$work/$1/metrics.jsonl" "$work/$2/metrics.jsonl"
  echo -n "  "; compare_tensors "$(ckpt "$1" 8)" "$(ckpt "$2" 8)" "${4:-transformer.}"
}
frozen_a=(--set "train.freeze=wpe,h.0.*,h.2.attn.*,ln_f.bias")
frozen_b=(--set "train.freeze=wte,h.1.mlp.*")

# 1. One process.
train ref_a 1 "${frozen_a[@]}"
for prefix in transformer.wpe. transformer.h.0. transformer.h.2.attn. transformer.ln_f.bias; do
  echo -n "frozen, steps 4 and 8: "; compare_tensors "$(ckpt ref_a 4)" "$(ckpt ref_a 8)" "$prefix" 0
done
for prefix in transformer.wte. transformer.h.1. transformer.h.2.mlp. transformer.ln_f.weight; do
  if compare_tensors "$(ckpt ref_a 4)" "$(ckpt ref_a 8)" "$prefix" 0 >/dev/null 2>&1; then
    echo "FAILED: $prefix trains but did not change"; exit 1
  fi
done
"$py" - "$(ckpt ref_a 8)/manifest.json" <<'PY'
import json, sys
names = json.load(open(sys.argv[1]))["tensors"]
for frozen in ("transformer.wpe.weight", "transformer.h.0.attn.c_attn.weight", "transformer.ln_f.bias"):
    assert frozen in names, f"{frozen} not saved"
    stale = [n for n in names if n != frozen and n.endswith(frozen)]
    assert not stale, f"optimizer state saved for frozen {frozen}: {stale}"
assert "optimizer.exp_avg.transformer.h.1.attn.c_attn.weight" in names
print("checkpoint: frozen weights saved, no optimizer state for them")
PY
grep -m1 "trainable params:" "$work/ref_a.log"
grep -q "trainable params: [0-9]* || all params: [0-9]* || trainable%: [0-9.]* (18 tensors frozen" \
  "$work/ref_a.log" || { echo "FAILED: start-up line"; exit 1; }

# 2. Layouts.
train dp2_z3 2 "${frozen_a[@]}" --set parallel.zero_stage=3
check ref_a dp2_z3 "frozen dp=2 zero 3"
train tp2_sp 2 "${frozen_a[@]}" --set parallel.tp=2 --set parallel.sequence_parallel=true
check ref_a tp2_sp "frozen tp=2 sequence parallel"
if [ "$mode" = full ]; then
  train dp2_z1 2 "${frozen_a[@]}" --set parallel.zero_stage=1
  check ref_a dp2_z1 "frozen dp=2 zero 1"
  train dp2_z0 2 "${frozen_a[@]}"
  check ref_a dp2_z0 "frozen dp=2 zero 0"
  train dp2_z2 2 "${frozen_a[@]}" --set parallel.zero_stage=2
  check ref_a dp2_z2 "frozen dp=2 zero 2"
  train tp2 2 "${frozen_a[@]}" --set parallel.tp=2
  check ref_a tp2 "frozen tp=2"
  train pp2_a 2 "${frozen_a[@]}" --set parallel.pp=2
  check ref_a pp2_a "frozen pp=2"
  train dp2_pp2_z2 4 "${frozen_a[@]}" --set parallel.pp=2 --set parallel.zero_stage=2
  check ref_a dp2_pp2_z2 "frozen dp=2 x pp=2 zero 2"
fi

# A pipeline stage with nothing to train (all but ln_f frozen): the first stage holds only
# frozen parameters and still passes the gradients on; the run trains like one process.
frozen_c=(--set "train.freeze=wte,wpe,h.*")
train ref_c 1 "${frozen_c[@]}"
train pp2_c 2 "${frozen_c[@]}" --set parallel.pp=2
check ref_c pp2_c "all but ln_f frozen pp=2 (a stage with nothing to train)"

# 3. The tied wte frozen.
train ref_b 1 "${frozen_b[@]}"
echo -n "tied wte frozen, steps 4 and 8: "
compare_tensors "$(ckpt ref_b 4)" "$(ckpt ref_b 8)" transformer.wte. 0
train pp2_b 2 "${frozen_b[@]}" --set parallel.pp=2
check ref_b pp2_b "tied wte frozen pp=2"
if [ "$mode" = full ]; then
  train dp2_z3_b 2 "${frozen_b[@]}" --set parallel.zero_stage=3
  check ref_b dp2_z3_b "tied wte frozen dp=2 zero 3"
  train tp2_b 2 "${frozen_b[@]}" --set parallel.tp=2
  check ref_b tp2_b "tied wte frozen tp=2"
  train dp2_pp2_b 4 "${frozen_b[@]}" --set parallel.pp=2 --set parallel.zero_stage=1
  check ref_b dp2_pp2_b "tied wte frozen dp=2 x pp=2 zero 1"
fi

# 3b. Llama (RMSNorm gains, no biases, untied head): the embedding, block 1's attention,
# the final norm and the head frozen.
if [ "$mode" = full ]; then
  llama=(--set model.arch=llama --set model.n_kv_head=2 --set model.ffn_hidden_size=48
         --set "train.freeze=embed_tokens,layers.1.self_attn.*,model.norm,lm_head")
  train ref_l 1 "${llama[@]}"
  echo -n "llama frozen, steps 4 and 8: "
  compare_tensors "$(ckpt ref_l 4)" "$(ckpt ref_l 8)" lm_head. 0
  train tp2_l 2 "${llama[@]}" --set parallel.tp=2 --set parallel.sequence_parallel=true
  check ref_l tp2_l "llama frozen tp=2 sequence parallel" model.
  train dp2_z3_l 2 "${llama[@]}" --set parallel.zero_stage=3
  check ref_l dp2_z3_l "llama frozen dp=2 zero 3" model.
fi

# 4. Errors.
mkdir -p "$work/refreeze/ckpt"
cp -r "$(ckpt ref_a 4)" "$work/refreeze/ckpt/"
fails refreeze "train.freeze differs from the checkpoint's: frozen now but trained there \[transformer.wte.weight" \
  "$kiln" train "$work/tiny.toml" --set "run.dir=$work/refreeze" "${frozen_b[@]}" --resume auto
fails no_match 'train.freeze: the pattern "h.9.*" matches no parameter' \
  "$kiln" train "$work/tiny.toml" --set "run.dir=$work/no_match" --set "train.freeze=h.0.*,h.9.*"
echo "freezing tests passed ($mode)"
