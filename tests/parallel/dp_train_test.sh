#!/usr/bin/env bash
# Data parallel and ZeRO, end to end through `kiln train` under mpirun:
#   1. on 2 ranks at every ZeRO stage, on 1 and 4 at ZeRO 3 (with --long, the ctest label
#      long: 1 and 4 ranks at every stage), 20 updates of a tiny GPT with gradient
#      accumulation give the single process's per-step losses within 1e-5 relative (the
#      checkpoint at the end also checks that the data-parallel replicas of stages 0-2
#      are bitwise identical); so does ZeRO 3 with full (--long: and selective)
#      activation checkpointing;
#   2. a checkpoint saved by 4 ranks at stage 3 resumes on 2 ranks at stage 1 and on 1
#      process with the same losses (and the data position carries over);
#   3. a tiny Llama (untied and tied) gives the same equalities on 2 (--long: and 4) ranks,
#      resumes across layouts and samples from its checkpoint; exported as a Hugging Face
#      folder, it starts 2 ranks at ZeRO-3 (each reading its slices) as it starts 1;
#   4. with train.ema_decay, 2 ranks at ZeRO 1 and 3 (--long: and 2) save the single
#      process's moving average of the weights ("ema." tensors), and it reshards from 2
#      ranks to 1;
#   5. failures never hang: a config that differs between ranks and a rank that cannot
#      read its data both end every rank non-zero with the reason in the log.
# Usage: dp_train_test.sh KILN_BINARY WORK_DIR [--long]
set -euo pipefail
kiln="$1"
work="$2"
long="${3:-}"
rm -rf "$work" && mkdir -p "$work"
. "$(dirname "$0")/common.sh"

# A small corpus with structure, byte-level tokens.
make_corpus 3 "$work/corpus.txt"
"$kiln" prepare --input "$work/corpus.txt" --out "$work/data" --tokenizer byte --val-fraction 0.1 >/dev/null

cat > "$work/tiny.toml" <<EOF
[model]
n_layer = 2
n_head = 2
n_embd = 36
block_size = 16
[data]
dir = "$work/data"
[train]
steps = 20
micro_batch = 1
global_batch = 4
seq_len = 16
[optim]
lr = 3e-3
[schedule]
warmup_steps = 3
[eval]
every = 10
batches = 2
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
  run_train "$work/tiny.toml" "$name" "$np" --set "parallel.zero_stage=$stage" "$@"
}

train ref 1 0
runs=("1 3" "2 0" "2 1" "2 2" "2 3" "4 3")
[ "$long" = --long ] && runs+=("1 1" "1 2" "4 0" "4 1" "4 2")
for run in "${runs[@]}"; do
  set -- $run
  train "np$1_z$2" "$1" "$2"
  echo -n "np=$1 zero_stage=$2: "
  compare "$work/ref/metrics.jsonl" "$work/np$1_z$2/metrics.jsonl"
done

# Activation checkpointing with ZeRO-3 (blocks gathered again for the recompute).
modes=(full)
[ "$long" = --long ] && modes+=(selective)
for mode in "${modes[@]}"; do
  train "np2_z3_$mode" 2 3 --set "train.activation_checkpointing=$mode"
  echo -n "np=2 zero_stage=3 activation_checkpointing=$mode: "
  compare "$work/ref/metrics.jsonl" "$work/np2_z3_$mode/metrics.jsonl"
done

# Resharding: 4 ranks at stage 3 stop after 10 updates; continue on 2 ranks at stage 1
# and, separately, on 1 process.
train reshard 4 3 --exit-interval 10
cp -r "$work/reshard" "$work/reshard1"
train reshard 2 1 --resume auto
echo -n "4 ranks zero 3 -> 2 ranks zero 1: "
compare "$work/ref/metrics.jsonl" "$work/reshard/metrics.jsonl" 11
train reshard1 1 0 --resume auto
echo -n "4 ranks zero 3 -> 1 process: "
compare "$work/ref/metrics.jsonl" "$work/reshard1/metrics.jsonl" 11

# train.ema_decay: the moving average of the weights is sharded like the master weights:
# 2 ranks at ZeRO 1, 2 and 3 save the single process's "ema." tensors (each element once,
# from its shard), and a ZeRO-3 checkpoint of 2 ranks resumes on 1 process with them.
ema=(--set train.ema_decay=0.9 --set train.steps=6 --set schedule.warmup_steps=2 --set eval.every=0)
train ema_ref 1 0 "${ema[@]}"
stages=(1 3)
[ "$long" = --long ] && stages+=(2)
for stage in "${stages[@]}"; do
  train "ema_np2_z$stage" 2 "$stage" "${ema[@]}"
  echo -n "ema np=2 zero_stage=$stage: "
  compare_tensors "$work/ema_ref/ckpt/step_00000006" "$work/ema_np2_z$stage/ckpt/step_00000006" ema.
done
train ema_reshard 2 3 "${ema[@]}" --exit-interval 3
train ema_reshard 1 0 "${ema[@]}" --resume auto
echo -n "ema 2 ranks zero 3 -> 1 process: "
compare "$work/ema_ref/metrics.jsonl" "$work/ema_reshard/metrics.jsonl" 4
echo -n "ema 2 ranks zero 3 -> 1 process: "
compare_tensors "$work/ema_ref/ckpt/step_00000006" "$work/ema_reshard/ckpt/step_00000006" ema.

# Memory at stage 3 with 4 ranks (8 blocks, so that sharding shows): each rank's peak of
# parameter bytes is its 1/4 shard plus at most the embedding unit, two gathered blocks
# (current and prefetched) and the head; optimizer state is 2 fp32 moments of the shard.
train mem_z3 4 3 --set model.n_layer=8 --set train.steps=3 --set schedule.warmup_steps=1 --set eval.every=0
"$py" - "$work/mem_z3/metrics.jsonl" <<'PY'
import json, sys
rec = [json.loads(l) for l in open(sys.argv[1])][-1]
C, L, T, V = 36, 8, 16, 257
Vp = (V + 127) // 128 * 128
W = 4
pad = lambda n: (n + W - 1) // W * W
emb, block, head = pad(Vp * C + T * C), pad(12 * C * C + 13 * C), pad(2 * C)
shard = (emb + L * block + head) // W
full = Vp * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
bound = 4 * (shard + emb + 2 * block + head)
for r, m in enumerate(rec["mem_by_rank"]):
    p, o = m["peak_parameters"], m["optimizer_state"]
    print(f"rank {r}: parameter peak {p} B (shard {4*shard} B, bound {bound} B, full model {4*full} B), optimizer state {o} B")
    assert 4 * shard <= p <= bound, f"rank {r}: parameter peak {p} outside [{4*shard}, {bound}]"
    assert p < 4 * full, "stage 3 should never hold the whole model"
    assert o <= 2 * 4 * shard, f"rank {r}: optimizer state {o} above 2 x shard"
print("stage 3 memory within the formula")
PY

# The same equalities for a tiny Llama (models/llama: RMSNorm, rotary GQA with one k/v
# head and llama3 rope scaling, SwiGLU), untied and tied, few steps: 2 ranks ZeRO-0 and 3,
# 4 ranks ZeRO-1 (--long), tied 2 ranks ZeRO-2 with full checkpointing, a ZeRO-3
# checkpoint of 2 ranks resumed on 1 process, and `kiln sample` from its checkpoint.
llama=(--set model.arch=llama --set model.n_kv_head=1 --set model.ffn_hidden_size=48
       --set model.rope_theta=500000 --set model.rope_scaling.factor=8
       --set model.rope_scaling.original_max_position=8
       --set train.steps=8 --set schedule.warmup_steps=2 --set eval.every=4)
train llama_ref 1 0 "${llama[@]}"
runs=("2 0" "2 3")
[ "$long" = --long ] && runs+=("4 1")
for run in "${runs[@]}"; do
  set -- $run
  train "llama_np$1_z$2" "$1" "$2" "${llama[@]}"
  echo -n "llama np=$1 zero_stage=$2: "
  compare "$work/llama_ref/metrics.jsonl" "$work/llama_np$1_z$2/metrics.jsonl"
done
train llama_tied_ref 1 0 "${llama[@]}" --set model.tie_embeddings=true
train llama_tied_np2_z2 2 2 "${llama[@]}" --set model.tie_embeddings=true \
  --set train.activation_checkpointing=full
echo -n "llama tied np=2 zero_stage=2 activation_checkpointing=full: "
compare "$work/llama_tied_ref/metrics.jsonl" "$work/llama_tied_np2_z2/metrics.jsonl"
train llama_reshard 2 3 "${llama[@]}" --exit-interval 4
train llama_reshard 1 0 "${llama[@]}" --resume auto
echo -n "llama 2 ranks zero 3 -> 1 process: "
compare "$work/llama_ref/metrics.jsonl" "$work/llama_reshard/metrics.jsonl" 5
"$kiln" sample --checkpoint "$(ls -d "$work"/llama_ref/ckpt/step_* | tail -1)" --max-new-tokens 8 \
  --seed 1 > "$work/llama_sample.log" 2>&1 || { echo "FAILED: llama sample"; cat "$work/llama_sample.log"; exit 1; }
echo "llama: kiln sample from its checkpoint ran (KV-cache decode)"

# A Hugging Face folder (kiln export --format hf, in shards) as model.init_from: 2 ranks at
# ZeRO-3, each reading only its slices of the shards, train as 1 process does.
"$kiln" export --checkpoint "$(ls -d "$work"/llama_ref/ckpt/step_* | tail -1)" --format hf \
  --out "$work/llama_hf" --shard-size 20KB > "$work/llama_export.log" 2>&1 ||
  { echo "FAILED: llama export"; cat "$work/llama_export.log"; exit 1; }
train llama_hf_np1 1 0 "${llama[@]}" --set "model.init_from=$work/llama_hf"
train llama_hf_np2_z3 2 3 "${llama[@]}" --set "model.init_from=$work/llama_hf"
echo -n "llama from a Hugging Face folder ($(ls "$work/llama_hf" | grep -c -- -of-) shards), np=2 zero_stage=3: "
compare "$work/llama_hf_np1/metrics.jsonl" "$work/llama_hf_np2_z3/metrics.jsonl"
"$py" - "$work/llama_ref/metrics.jsonl" "$work/llama_hf_np1/metrics.jsonl" <<'PY'
import json, sys
first = lambda p: next(r["loss"] for r in map(json.loads, open(p)) if "loss" in r)
last = lambda p: [r["loss"] for r in map(json.loads, open(p)) if "loss" in r][-1]
ref, hf = sys.argv[1], sys.argv[2]
assert first(hf) < first(ref) - 0.1, f"init_from the folder starts at {first(hf)}, a random init at {first(ref)}"
print(f"the folder's weights start at loss {first(hf):.4f} (random init {first(ref):.4f}, their last {last(ref):.4f})")
PY

# Failures: a config that differs between ranks, and a rank whose data is missing.
expect_failure() {  # expect_failure NAME PATTERN cmd...
  local name=$1 pattern=$2
  shift 2
  local start=$SECONDS
  if timeout 60 "$@" > "$work/$name.log" 2>&1; then
    echo "FAILED: $name exited 0"; cat "$work/$name.log"; exit 1
  fi
  grep -q -- "$pattern" "$work/$name.log" || { echo "FAILED: $name: no '$pattern' in:"; cat "$work/$name.log"; exit 1; }
  echo "$name: every rank exited non-zero in $((SECONDS - start)) s with '$pattern'"
}
expect_failure config_mismatch "config differs between ranks: train.seed is" \
  mpirun --oversubscribe -np 1 "$kiln" train "$work/tiny.toml" --set "run.dir=$work/mm" : \
                         -np 1 "$kiln" train "$work/tiny.toml" --set "run.dir=$work/mm" --set train.seed=7
expect_failure missing_data "rank 1: error: .*nowhere" \
  mpirun --oversubscribe -np 1 "$kiln" train "$work/tiny.toml" --set "run.dir=$work/md" : \
                         -np 1 "$kiln" train "$work/tiny.toml" --set "run.dir=$work/md" --set "data.dir=$work/nowhere"
echo "data-parallel tests passed${long:+ ($long)}"
