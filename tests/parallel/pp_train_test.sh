#!/usr/bin/env bash
# Pipeline parallelism, end to end through `kiln train` under mpirun (the schedules and
# their simulator: tests/parallel/pipeline_schedule_test.cpp):
#   1. 20 updates of a tiny GPT-2 (tied wte, dropout) over 8 micro-batches at pp2 with
#      1f1b, at pp4, at dp2 x pp2 interleaved (2 virtual stages) with ZeRO 2, at tp2 x pp2
#      with sequence parallelism, interleaved with full activation checkpointing; a tiny
#      Llama at pp2 1f1b; dp2 x tp2 x pp2 on 8 ranks (3 updates): every loss and
#      validation loss within 1e-5 relative of the single process; bf16 and fp16 (overflow
#      skips agreed by every stage) against their single process; kiln bench's tp traffic
#      per stage = the formula; with --long (ctest label long) also gpipe and interleaved
#      alone at pp2, dp2 x pp2 with ZeRO 1, and the Llama interleaved, at pp4, dp2 x pp2,
#      tp2 x pp2 and tied at pp2;
#   2. the tied wte's two copies (first and last stage) are bitwise equal at every save
#      (the trainer checks it), also after a resume; a checkpoint saved at pp2 resumes at
#      pp1 and at dp2 with the uninterrupted run's next losses;
#   3. a failing stage ends every rank with its message; bad layouts are one-line errors
#      at start-up on every rank.
# Usage: pp_train_test.sh KILN_BINARY WORK_DIR [--long]
set -euo pipefail
kiln="$1"
work="$2"
long="${3:-}"
rm -rf "$work" && mkdir -p "$work"
. "$(dirname "$0")/common.sh"

make_corpus 7 "$work/corpus.txt"
"$kiln" prepare --input "$work/corpus.txt" --out "$work/data" --tokenizer byte --val-fraction 0.1 >/dev/null

cat > "$work/tiny.toml" <<EOF2
[model]
n_layer = 4
n_head = 4
n_embd = 32
block_size = 16
dropout = 0.1
[data]
dir = "$work/data"
[train]
steps = 20
micro_batch = 1
global_batch = 8
seq_len = 16
[optim]
lr = 3e-3
[schedule]
warmup_steps = 3
[eval]
every = 10
batches = 1
[log]
every = 1
peak_tflops = 1.0
[checkpoint]
every = 10
[parallel]
timeout_s = 20
bucket_mb = 0.004
EOF2

train() { run_train "$work/tiny.toml" "$@"; }  # train RUN_NAME NP [--set ...]
pp2=(--set parallel.pp=2)
inter=(--set parallel.pp_schedule=interleaved --set parallel.virtual_stages=2)
llama=(--set model.arch=llama --set model.n_kv_head=2 --set model.ffn_hidden_size=48
       --set model.dropout=0)
check() {  # check REF RUN LABEL
  echo -n "$3: "; compare "$work/$1/metrics.jsonl" "$work/$2/metrics.jsonl"
}

train ref 1
train pp2_1f1b 2 "${pp2[@]}"
check ref pp2_1f1b "gpt2 pp=2 1f1b"
grep -m1 "pipeline over" "$work/pp2_1f1b.log" | sed 's/.*pipeline over/  start-up: pipeline over/'
if [ "$long" = --long ]; then
  train pp2_gpipe 2 "${pp2[@]}" --set parallel.pp_schedule=gpipe
  check ref pp2_gpipe "gpt2 pp=2 gpipe"
  train pp2_inter 2 "${pp2[@]}" "${inter[@]}"
  check ref pp2_inter "gpt2 pp=2 interleaved v=2"
  train dp2_pp2_z1 4 "${pp2[@]}" --set parallel.zero_stage=1
  check ref dp2_pp2_z1 "gpt2 dp=2 x pp=2 zero 1"
fi
train pp4 4 --set parallel.pp=4
check ref pp4 "gpt2 pp=4 1f1b"
train dp2_pp2_z2 4 "${pp2[@]}" "${inter[@]}" --set parallel.zero_stage=2
check ref dp2_pp2_z2 "gpt2 dp=2 x pp=2 interleaved zero 2"
train tp2_pp2 4 "${pp2[@]}" --set parallel.tp=2 --set parallel.sequence_parallel=true
check ref tp2_pp2 "gpt2 tp=2 (sequence parallel) x pp=2"
train llama_ref 1 "${llama[@]}"
train llama_pp2 2 "${llama[@]}" "${pp2[@]}"
check llama_ref llama_pp2 "llama pp=2 1f1b"
if [ "$long" = --long ]; then
  train llama_pp2_inter 2 "${llama[@]}" "${pp2[@]}" "${inter[@]}"
  check llama_ref llama_pp2_inter "llama pp=2 interleaved v=2"
  train llama_pp4 4 "${llama[@]}" --set parallel.pp=4
  check llama_ref llama_pp4 "llama pp=4 1f1b"
  train llama_dp2_pp2 4 "${llama[@]}" "${pp2[@]}" --set parallel.zero_stage=1
  check llama_ref llama_dp2_pp2 "llama dp=2 x pp=2 zero 1"
  train llama_tp2_pp2 4 "${llama[@]}" "${pp2[@]}" "${inter[@]}" --set parallel.tp=2
  check llama_ref llama_tp2_pp2 "llama tp=2 x pp=2 interleaved"
  train llama_tied_ref 1 "${llama[@]}" --set model.tie_embeddings=true
  train llama_tied_pp2 2 "${llama[@]}" --set model.tie_embeddings=true "${pp2[@]}"
  check llama_tied_ref llama_tied_pp2 "llama (tied) pp=2 1f1b"
fi

# Activation checkpointing, bf16, fp16 with overflow skips (agreed by every stage).
train pp2_full 2 "${pp2[@]}" "${inter[@]}" --set train.activation_checkpointing=full
check ref pp2_full "gpt2 pp=2 interleaved, full activation checkpointing"
train bf16_ref 1 --set train.dtype=bf16
train bf16_pp2 2 "${pp2[@]}" --set train.dtype=bf16
echo -n "gpt2 bf16 pp=2 against bf16 one process, after 20 updates: "
compare "$work/bf16_ref/metrics.jsonl" "$work/bf16_pp2/metrics.jsonl" 20 1e-3
fp16=(--set train.dtype=fp16 --set train.loss_scale=3e7)
train fp16_ref 1 "${fp16[@]}"
train fp16_pp2 2 "${pp2[@]}" "${fp16[@]}"
echo -n "gpt2 fp16 pp=2 against fp16 one process, after 20 updates: "
compare "$work/fp16_ref/metrics.jsonl" "$work/fp16_pp2/metrics.jsonl" 20 1e-3
n_ref=$(grep -c "update skipped" "$work/fp16_ref.log" || true)
n_pp=$(grep -c "update skipped" "$work/fp16_pp2.log" || true)
[ "$n_ref" -gt 0 ] && [ "$n_ref" = "$n_pp" ] ||
  { echo "FAILED: fp16 overflow skips: $n_pp at pp=2, $n_ref in one process"; exit 1; }
echo "  fp16 overflow skips: $n_pp, the same updates as one process"

# The 3-D layout: dp2 x tp2 x pp2 on 8 ranks, 3 updates.
short=(--set train.steps=3 --set schedule.warmup_steps=1 --set eval.every=0 --set checkpoint.every=0)
train ref3 1 "${short[@]}"
train dp2_tp2_pp2 8 "${short[@]}" "${pp2[@]}" --set parallel.tp=2 --set parallel.zero_stage=1
check ref3 dp2_tp2_pp2 "gpt2 dp=2 x tp=2 x pp=2 (8 ranks) zero 1"

# kiln bench at tp2 x pp2: each stage's tp traffic equals the formula for the parts it
# holds; the bubble per stage is reported beside the schedule's.
mpirun --oversubscribe --bind-to none -np 4 "$kiln" bench "$work/tiny.toml" --steps 2 --warmup 1 \
  "${pp2[@]}" "${inter[@]}" --set parallel.tp=2 --set parallel.sequence_parallel=true \
  > "$work/bench.log" 2>&1 || { echo "FAILED: bench"; cat "$work/bench.log"; exit 1; }
"$py" - "$work/bench.log" <<'PY'
import json, sys
j = json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])
for name, c in j["tp_traffic_per_update"].items():
    assert (c["calls"], c["bytes"]) == (c["formula_calls"], c["formula_bytes"]), f"{name}: {c}"
assert len(j["pp_bubble_measured"]) == 2 and abs(j["pp_bubble_simulated"] - j["pp_bubble_theory"]) < 1e-12, j
print(f"kiln bench tp2 x pp2: tp traffic of stage 0 = formula; bubble per stage {j['pp_bubble_measured']}, "
      f"theory {j['pp_bubble_theory']:.3f}")
PY

# Checkpoints: the pp2 run saved at 10 and 20 (each save compares the tied copies
# bitwise). Its step-10 checkpoint resumes at pp2 (saving again at 20), at pp1 and at dp2.
"$py" -c 'import json, sys; l = json.load(open(sys.argv[1]))["state"]["layout"]; assert (l["pp"], l["world_size"]) == (2, 2), l' \
  "$work/pp2_1f1b/ckpt/step_00000010/manifest.json"
for to in pp2 pp1 dp2; do
  mkdir -p "$work/resume_$to/ckpt"
  cp -r "$work/pp2_1f1b/ckpt/step_00000010" "$work/resume_$to/ckpt/"
  cp "$work/pp2_1f1b/config.toml" "$work/resume_$to/"
done
train resume_pp2 2 "${pp2[@]}" --resume auto
train resume_pp1 1 --resume auto
train resume_dp2 2 --resume auto
for to in pp2 pp1 dp2; do
  echo -n "pp2 checkpoint -> $to: "; compare "$work/ref/metrics.jsonl" "$work/resume_$to/metrics.jsonl" 11
done

# Bad layouts: one line naming the cause, every rank non-zero, no hang.
fails zero3 "ZeRO-3 gathers each part for every pass" \
  timeout 60 mpirun --oversubscribe --bind-to none -np 4 "$kiln" train "$work/tiny.toml" \
  --set "run.dir=$work/zero3" "${pp2[@]}" --set parallel.zero_stage=3
fails stages "6 model parts cannot fill 8 stages" \
  timeout 60 mpirun --oversubscribe --bind-to none -np 4 "$kiln" train "$work/tiny.toml" \
  --set "run.dir=$work/stages" --set parallel.pp=4 "${inter[@]}"
fails interleaved_m "grad_accum_steps = train.global_batch" \
  timeout 60 mpirun --oversubscribe --bind-to none -np 2 "$kiln" train "$work/tiny.toml" \
  --set "run.dir=$work/inter_m" "${pp2[@]}" "${inter[@]}" --set train.global_batch=7
fails sample "needs parallel.tp, parallel.pp, parallel.cp and parallel.ep = 1" \
  timeout 60 mpirun --oversubscribe --bind-to none -np 2 "$kiln" train "$work/tiny.toml" \
  --set "run.dir=$work/sample" "${pp2[@]}" --set sample.every=5
# A failing stage ends every rank non-zero with its message: the last stage's first file
# operation of a save fails (EIO) while the first stage goes on.
fails failing_stage "Input/output error" env KILN_FAULT=eio:1:1 \
  timeout 60 mpirun --oversubscribe --bind-to none -np 2 "$kiln" train "$work/tiny.toml" \
  --set "run.dir=$work/failing" "${pp2[@]}"
fails pp_split_one "parallel.pp_split is set but parallel.pp x parallel.virtual_stages = 1" \
  "$kiln" train "$work/tiny.toml" --set "run.dir=$work/split1" --set "parallel.pp_split=[2]"
echo "pipeline-parallel tests passed${long:+ ($long)}"
