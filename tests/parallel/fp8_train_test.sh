#!/usr/bin/env bash
# fp8 training (train.fp8 = "tensorwise", docs/fp8.md) through `kiln train`, on a tiny
# GPT-2 of 3 blocks (the default puts the middle block's Linears in fp8) and dropout off:
#   1. fp8 is on: its losses differ from the same run without it, by under 2%;
#   2. layouts that keep each micro-batch's forward bits, dp2 at ZeRO 0 and 3, pp2 and full
#      activation checkpointing (recomputation quantizes again, identically), give the
#      single fp8 process's losses within 1e-5 relative (in practice bitwise): the same
#      scales, since a scale one power of two off changes every rounding of its tensor;
#   3. tp2 with sequence parallelism and cp2 (other summation orders, which can move an
#      fp8 rounding; the amaxes are reduced over tp and cp so the scales are the single
#      process's) end within 1e-2 of it, the bound of the bf16 layout tests;
#      with --long also tp2 without sp, dp2 x tp2 at ZeRO 1, a tiny Llama at tp2, and
#      train.fp8_layers naming every block's Linears;
#   4. a run stopped after 10 updates resumes to the same losses (tensorwise fp8 keeps no
#      state between steps);
#   5. one-line errors: fp8 with train.dtype fp16, a train.fp8_layers pattern that matches
#      nothing, a model whose blocks are all left out by default (2 blocks), a model
#      without transformer-block plans (vit).
# Usage: fp8_train_test.sh KILN_BINARY WORK_DIR [--long]
set -euo pipefail
kiln="$1"
work="$2"
long="${3:-}"
rm -rf "$work" && mkdir -p "$work"
. "$(dirname "$0")/common.sh"

setup_tiny_gpt2 5
# A global batch of 2 micro-batches: the single process's gradient sum g1 + g2 is then
# bitwise the 2-rank reduction's (one addition commutes), so the dp runs differ from it
# only where the layout changes the forward, not by a rounding that an fp8 quantization
# of a later step would magnify.
base=(--set model.n_layer=3 --set model.dropout=0 --set train.global_batch=2)
fp8=(--set train.fp8=tensorwise)
train() {  # train RUN_NAME NP [extra args...]
  local name=$1 np=$2
  shift 2
  run_train "$work/tiny.toml" "$name" "$np" "${base[@]}" "$@"
}

train plain 1
train ref 1 "${fp8[@]}"
echo -n "fp8 differs from fp32 (by under 2%): "
if compare "$work/plain/metrics.jsonl" "$work/ref/metrics.jsonl" 1 1e-6 >/dev/null 2>&1; then
  echo "FAILED: the fp8 run matches the fp32 run to 1e-6: fp8 is not on"; exit 1
fi
compare "$work/plain/metrics.jsonl" "$work/ref/metrics.jsonl" 1 0.02

exact=("dp2_z0 2 --set parallel.zero_stage=0" "dp2_z3 2 --set parallel.zero_stage=3"
       "pp2 2 --set parallel.pp=2" "full 1 --set train.activation_checkpointing=full")
for run in "${exact[@]}"; do
  set -- $run
  name=$1 np=$2
  shift 2
  train "$name" "$np" "${fp8[@]}" "$@"
  echo -n "fp8 $name: "
  compare "$work/ref/metrics.jsonl" "$work/$name/metrics.jsonl"
done

sp=(--set parallel.tp=2 --set parallel.sequence_parallel=true)
near=("tp2_sp 2 ${sp[*]}" "cp2 2 --set parallel.cp=2")
[ "$long" = --long ] && near+=("tp2 2 --set parallel.tp=2"
                               "dp2_tp2_z1 4 --set parallel.tp=2 --set parallel.zero_stage=1"
                               "all 1 --set train.fp8_layers=[\"h.*\"]")
for run in "${near[@]}"; do
  set -- $run
  name=$1 np=$2
  shift 2
  train "$name" "$np" "${fp8[@]}" "$@"
  echo -n "fp8 $name (last loss): "
  if [ "$name" = all ]; then  # every block in fp8: near the default run, not equal
    compare "$work/ref/metrics.jsonl" "$work/$name/metrics.jsonl" 1 0.02
  else
    compare "$work/ref/metrics.jsonl" "$work/$name/metrics.jsonl" 1 1e-2
  fi
done
if [ "$long" = --long ]; then
  llama=(--set model.arch=llama --set model.n_kv_head=2 --set model.ffn_hidden_size=48)
  train llama_ref 1 "${fp8[@]}" "${llama[@]}"
  train llama_tp2 2 "${fp8[@]}" "${llama[@]}" --set parallel.tp=2
  echo -n "fp8 llama tp2 (last loss): "
  compare "$work/llama_ref/metrics.jsonl" "$work/llama_tp2/metrics.jsonl" 1 1e-2
fi

train resume 1 "${fp8[@]}" --set checkpoint.every=10 --exit-interval 10
train resume 1 "${fp8[@]}" --set checkpoint.every=10 --resume auto
echo -n "fp8 resume after 10 updates: "
compare "$work/ref/metrics.jsonl" "$work/resume/metrics.jsonl" 11

fails fp16 "train.fp8 = \"tensorwise\" with train.dtype = \"fp16\"" \
  "$kiln" train "$work/tiny.toml" --set "run.dir=$work/fp16" "${base[@]}" "${fp8[@]}" \
  --set train.dtype=fp16
fails pattern "train.fp8_layers pattern 'h.9.*' matches no Linear" \
  "$kiln" train "$work/tiny.toml" --set "run.dir=$work/pattern" "${base[@]}" "${fp8[@]}" \
  --set 'train.fp8_layers=["h.9.*"]'
fails two_blocks "puts no Linear in fp8" \
  "$kiln" train "$work/tiny.toml" --set "run.dir=$work/two_blocks" "${fp8[@]}"
fails no_fp8 "train.fp8_layers is set but train.fp8 = \"none\"" \
  "$kiln" train "$work/tiny.toml" --set "run.dir=$work/no_fp8" --set 'train.fp8_layers=["h.1.*"]'
echo "fp8 train test: all passed"
