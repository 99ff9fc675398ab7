#!/usr/bin/env bash
# Expert parallelism (issue 40) through `kiln train`: the tiny MoE Llama of moe_tiny.sh (3
# blocks, the first dense; 4 experts, top-2; aux loss and z-loss on; fp32) with its
# experts split over parallel.ep ranks of the dp x cp group, against the single process.
# Every comparison is compare_moe's (common.sh): each step's LM loss, aux loss, z-loss
# (and dropped fraction) within 1e-5 relative of the single process, up to the first
# expert-selection flip (logged; a mismatch without one fails).
#   1. ep2 on 2 ranks at ZeRO 1 (a Mixtral-like model: no shared expert) and at ZeRO 3
#      with full activation checkpointing and the shared expert;
#   2. a Qwen3-MoE-like model (QK-norm, no renormalisation of the top-k weights) at ep2;
#   3. an ep2 checkpoint after 5 updates resumed on 1 process for 5 more;
#   4. token dropping (moe.capacity_factor 0.75) at ep2: the same dropped fraction;
#   5. bad layouts are one-line errors: ep not dividing the experts, a dense model;
#   6. a rank that stops (SIGSTOP) during an ep2 run: the other exits non-zero within
#      parallel.timeout_s (3 s) + 3 s, naming the collective and the stopped rank (with
#      --long, repeated until the collective it named is a MoE layer's all_to_all);
#   with --long (ctest label long), on 4 ranks: ep4, ep2 x dp2 at ZeRO 1 and ZeRO 3 (the
#   expert weights reduced and sharded over the expert-data-parallel pairs), ep2 x tp2
#   with sequence parallelism, ep2 x pp2, ep2 over dp2 x cp2, the Qwen3-like model at ep4,
#   and an ep4 checkpoint resumed at ep2 and on 1 process; on 2 ranks, sigmoid scoring
#   with the auxiliary-loss-free bias at ep2 against the single process, the global
#   aux-loss scope at ep2 against dp2 (the scope sums over the dp ranks), and bf16 at ep2
#   (the last loss within 2% of fp32's).
# Usage: moe_ep_train_test.sh KILN_BINARY WORK_DIR [--long]
set -euo pipefail
kiln="$1"
work="$2"
long="${3:-}"
rm -rf "$work" && mkdir -p "$work"
. "$(dirname "$0")/common.sh"

. "$(dirname "$0")/moe_tiny.sh"  # $work/tiny.toml, $work/data, train, check

mixtral=(--set model.moe.shared_experts=0)
qwen3=(--set model.moe.shared_experts=0 --set model.qk_norm=true --set model.moe.norm_topk_prob=false)

train ref 1
train mixtral_ref 1 "${mixtral[@]}"
train qwen3_ref 1 "${qwen3[@]}"

train ep2_z1 2 --set parallel.ep=2 --set parallel.zero_stage=1 "${mixtral[@]}"
check mixtral_ref ep2_z1 "mixtral-like ep=2 zero_stage=1"
train ep2_z3_full 2 --set parallel.ep=2 --set parallel.zero_stage=3 \
  --set train.activation_checkpointing=full
check ref ep2_z3_full "ep=2 zero_stage=3 activation_checkpointing=full"
train qwen3_ep2 2 --set parallel.ep=2 "${qwen3[@]}"
check qwen3_ref qwen3_ep2 "qwen3-like ep=2"

# ep2 stops after 5 updates; 1 process continues from its checkpoint (the experts saved
# as the global [E, 2F, C] / [E, C, F], each ep rank its own).
train reshard 2 --set parallel.ep=2 --set checkpoint.every=5 --exit-interval 5
"$py" -c 'import json, sys; l = json.load(open(sys.argv[1]))["state"]["layout"]; assert l["ep"] == 2, l' \
  "$work/reshard/ckpt/step_00000005/manifest.json"
train reshard 1 --set checkpoint.every=5 --resume auto
check ref reshard "ep=2, 5 steps -> 1 process, 5 steps"

train drop_ref 1 --set model.moe.capacity_factor=0.75
assert_drops "$work/drop_ref/metrics.jsonl"
train drop_ep2 2 --set parallel.ep=2 --set model.moe.capacity_factor=0.75
check drop_ref drop_ep2 "ep=2 capacity_factor=0.75"

fails indivisible "parallel.ep = 2 does not divide model.moe.num_experts = 3" \
  "$kiln" train "$work/tiny.toml" --set "run.dir=$work/bad" --set parallel.ep=2 \
  --set model.moe.num_experts=3
fails dense "has no mixture-of-experts layers" \
  "$kiln" train "$work/tiny.toml" --set "run.dir=$work/bad" --set parallel.ep=2 \
  --set model.moe.num_experts=0 --set model.moe.top_k=2 --set model.moe.ffn_hidden_size=0 \
  --set model.moe.shared_experts=0 --set model.moe.first_k_dense=0 \
  --set model.moe.aux_loss_coef=0 --set model.moe.z_loss_coef=0

# A stopped rank: the job ends within the timeout, naming it (docs/reliability.md).
stop_rank() {  # stop_rank NAME: an ep2 run whose rank 1 stops; sets $line and $elapsed
  local run="$work/$1" launcher victim="" p r t0 t1 rc=0
  mpirun --oversubscribe --bind-to none -np 2 "$kiln" train "$work/tiny.toml" --set "run.dir=$run" \
    --set parallel.ep=2 --set train.steps=100000 --set eval.every=0 --set parallel.timeout_s=3 \
    > "$run.log" 2>&1 &
  launcher=$!
  for _ in $(seq 200); do [ -s "$run/metrics.jsonl" ] && break; sleep 0.1; done
  [ -s "$run/metrics.jsonl" ] || { echo "FAILED: $1 did not start"; cat "$run.log"; kill "$launcher"; exit 1; }
  for p in $(pgrep -P "$launcher"); do
    r=$(tr '\0' '\n' < "/proc/$p/environ" | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')
    [ "$r" = 1 ] && victim=$p
  done
  [ -n "$victim" ] || { echo "FAILED: $1: no rank 1"; kill "$launcher"; exit 1; }
  t0=$(date +%s.%N)
  kill -STOP "$victim"
  wait "$launcher" || rc=$?
  t1=$(date +%s.%N)
  kill -KILL "$victim" 2>/dev/null || true
  elapsed=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
  [ "$rc" != 0 ] || { echo "FAILED: $1 exited 0"; cat "$run.log"; exit 1; }
  line=$(grep -m1 -E "timed out after 3 s waiting for .*rank 1" "$run.log") ||
    { echo "FAILED: $1: no timeout naming rank 1"; cat "$run.log"; exit 1; }
  awk -v e="$elapsed" 'BEGIN { exit !(e <= 6) }' || { echo "FAILED: $1 took $elapsed s"; exit 1; }
  echo "$1: rank 1 stopped at ep=2, the job exited $rc after $elapsed s: $line"
}
stop_rank stopped
if [ "$long" = --long ]; then
  # Until rank 1 stops while rank 0 waits in a MoE layer's all_to_all (at most 6 tries).
  for try in 1 2 3 4 5 6; do
    stop_rank "stopped_a2a_$try"
    case "$line" in *"all_to_all("*) break ;; esac
    [ "$try" != 6 ] || { echo "FAILED: no stop inside an all_to_all in 6 tries"; exit 1; }
  done
  train ep4 4 --set parallel.ep=4
  check ref ep4 "ep=4"
  train ep2_dp2_z1 4 --set parallel.ep=2 --set parallel.zero_stage=1
  check ref ep2_dp2_z1 "dp=4 ep=2 zero_stage=1"
  train ep2_dp2_z3 4 --set parallel.ep=2 --set parallel.zero_stage=3 \
    --set train.activation_checkpointing=selective
  check ref ep2_dp2_z3 "dp=4 ep=2 zero_stage=3 activation_checkpointing=selective"
  train ep2_tp2_sp 4 --set parallel.ep=2 --set parallel.tp=2 \
    --set parallel.sequence_parallel=true
  check ref ep2_tp2_sp "dp=2 ep=2 tp=2 sequence_parallel"
  train ep2_pp2 4 --set parallel.ep=2 --set parallel.pp=2
  check ref ep2_pp2 "dp=2 ep=2 pp=2"
  train ep2_cp2 4 --set parallel.ep=2 --set parallel.cp=2
  check ref ep2_cp2 "dp=2 cp=2 ep=2"
  # The bias against the single process; the global aux-loss scope (the counts of a
  # micro-step's micro-batches over the dp ranks: a property of dp) against dp2 without ep.
  bias=(--set model.moe.scoring=sigmoid --set model.moe.expert_bias=true
        --set model.moe.bias_update_rate=0.01)
  train bias_ref 1 "${bias[@]}"
  train bias_ep2 2 --set parallel.ep=2 "${bias[@]}"
  check bias_ref bias_ep2 "sigmoid scoring + expert bias ep=2"
  train global_dp2 2 --set model.moe.aux_loss_scope=global
  train global_ep2 2 --set parallel.ep=2 --set model.moe.aux_loss_scope=global
  check global_dp2 global_ep2 "aux_loss_scope=global dp=2 ep=2 against dp=2"
  train bf16_ep2 2 --set parallel.ep=2 --set train.dtype=bf16
  echo -n "bf16 ep=2 after 10 updates, against fp32: "
  compare "$work/ref/metrics.jsonl" "$work/bf16_ep2/metrics.jsonl" 10 0.02
  train qwen3_ep4 4 --set parallel.ep=4 "${qwen3[@]}"
  check qwen3_ref qwen3_ep4 "qwen3-like ep=4"
  # An ep4 checkpoint after 4 updates, resumed at ep2 (2 ranks) and on 1 process.
  train ep4_save 4 --set parallel.ep=4 --set checkpoint.every=4 --exit-interval 4
  cp -r "$work/ep4_save" "$work/ep4_to_1"
  train ep4_save 2 --set parallel.ep=2 --set checkpoint.every=4 --resume auto
  check ref ep4_save "ep=4, 4 steps -> ep=2, 6 steps"
  train ep4_to_1 1 --set checkpoint.every=4 --resume auto
  check ref ep4_to_1 "ep=4, 4 steps -> 1 process, 6 steps"
fi
echo "moe_ep_train_test: all passed"
