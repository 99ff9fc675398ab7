#!/usr/bin/env bash
# A mixture-of-experts Llama (issue 39) through `kiln train` under pipeline and context
# parallelism, against the single process. The tiny MoE decoder of moe_train_test.sh (3
# blocks, the first dense; 4 experts, top-2, one shared expert; aux loss and z-loss on),
# 10 updates of global batch 4 in micro-batches of 1 (4 micro-batches per update):
#   1. pp = 2 (1F1B) split so that a MoE block sits on each stage (parallel.pp_split = [3]:
#      stage 0 the embeddings, the dense block and MoE block 1; stage 1 MoE block 2 and the
#      head) with full activation checkpointing; cp = 2: per-step LM, aux and z losses
#      within 1e-5 relative of the single process up to the first expert-selection flip
#      (compare_moe, common.sh: logged; a mismatch without one fails);
#   2. the pp = 2 run's step-5 checkpoint resumes on 1 process with the same losses;
#   2b. token dropping (moe.capacity_factor 0.75) under pp = 2 drops the same slots as
#      the single process; with cp = 2 it is a one-line error naming both keys;
#   with --long (ctest label long) also:
#   3. pp = 2 at the balanced split with ZeRO 2, the interleaved schedule (2 virtual
#      stages), gpipe, dp 2 x pp 2 and cp 2 x pp 2 (4 ranks); cp = 2 with the "hf" aux
#      loss and with aux_loss_scope "global" (over dp x cp = the micro-batch here: the
#      single process's micro_batch figures); the global scope at dp 2 x pp 2 against dp 2;
#   4. the auxiliary-loss-free bias (moe.expert_bias) under pp = 2 and cp = 2: the same
#      losses, tokens per expert and bias range every step, the same checkpointed biases
#      (each stage writes its layers'), and a pp = 2 checkpoint resumed on 1 process;
#   5. fp16 (loss scaling) trains like fp32, and pp = 2 reproduces its single process;
#   6. the "hf" aux loss under pp is a one-line error naming both keys.
# Usage: moe_pp_cp_train_test.sh KILN_BINARY WORK_DIR [--long]
set -euo pipefail
kiln="$1"
work="$2"
long="${3:-}"
rm -rf "$work" && mkdir -p "$work"
. "$(dirname "$0")/common.sh"

. "$(dirname "$0")/moe_tiny.sh"  # $work/tiny.toml, $work/data, train, check
each_stage=(--set parallel.pp=2 --set "parallel.pp_split=[3]")  # a MoE block per stage

# The LM loss and the balancing losses up to the first expert-selection flip (compare_moe,
# common.sh), and with a selection bias its range every step before that flip.
check() {  # check REF RUN LABEL
  echo -n "$3: "
  compare_moe "$work/$1/metrics.jsonl" "$work/$2/metrics.jsonl"
  "$py" - "$work/$1/metrics.jsonl" "$work/$2/metrics.jsonl" <<'PY'
import json, sys
def load(p):
    return {r["step"]: r for r in map(json.loads, open(p)) if "loss" in r}
a, b = load(sys.argv[1]), load(sys.argv[2])
for s in sorted(a):
    if a[s]["moe_expert_counts"] != b[s]["moe_expert_counts"]:
        break
    assert a[s].get("moe_expert_bias") == b[s].get("moe_expert_bias"), \
        f"step {s} moe_expert_bias: {b[s].get('moe_expert_bias')} vs {a[s].get('moe_expert_bias')}"
PY
}
# A resumed run's steps from FIRST on: the losses within 1e-5, the tokens per expert equal.
check_resumed() {  # check_resumed REF RUN LABEL FIRST
  echo -n "$3: "
  compare "$work/$1/metrics.jsonl" "$work/$2/metrics.jsonl" "$4"
  "$py" - "$work/$1/metrics.jsonl" "$work/$2/metrics.jsonl" "$4" <<'PY'
import json, sys
def load(p):
    return {r["step"]: r for r in map(json.loads, open(p)) if "loss" in r}
a, b, first = load(sys.argv[1]), load(sys.argv[2]), int(sys.argv[3])
steps = [s for s in sorted(b) if s >= first]
assert steps and all(s in a for s in steps), (sorted(a), sorted(b))
worst = 0.0
for s in steps:
    for key in ("moe_aux_loss", "moe_z_loss"):
        x, y = a[s][key], b[s][key]
        rel = abs(x - y) / abs(x) if x else abs(y)
        worst = max(worst, rel)
        assert rel <= 1e-5, f"step {s} {key}: {y} vs {x} (relative {rel:.2e})"
    for key in ("moe_expert_counts", "moe_expert_bias"):
        assert a[s].get(key) == b[s].get(key), f"step {s} {key}: {b[s].get(key)} vs {a[s].get(key)}"
print(f"  aux and z worst {worst:.2e}, tokens per expert equal")
PY
}

train ref 1
train pp2_full 2 "${each_stage[@]}" --set train.activation_checkpointing=full \
  --set checkpoint.every=5
check ref pp2_full "pp=2 1f1b, a MoE block per stage, activation_checkpointing=full"
train cp2 2 --set parallel.cp=2
check ref cp2 "cp=2"

# Token dropping: each stage's MoE layer sees its whole micro-batch, so the same slots drop
# (compare_moe compares the dropped fraction too); under cp it is refused.
drop=(--set model.moe.capacity_factor=0.75)
train drop_ref 1 "${drop[@]}"
assert_drops "$work/drop_ref/metrics.jsonl"
train drop_pp2 2 "${each_stage[@]}" "${drop[@]}"
check drop_ref drop_pp2 "pp=2, capacity_factor=0.75"
fails drop_cp2 'parallel.cp = 2: a llama that drops tokens .*model.moe.capacity_factor > 0' \
  "$kiln" train "$work/tiny.toml" --set "run.dir=$work/bad_drop" --set parallel.cp=2 "${drop[@]}"

# The pipeline's checkpoint (each stage its parts) continues on one process.
train pp2_resumed 1 --resume "$work/pp2_full/ckpt/step_00000005"
check_resumed ref pp2_resumed "pp=2 step 5 -> 1 process" 6

[ "$long" = --long ] || exit 0

train pp2_z2 2 --set parallel.pp=2 --set parallel.zero_stage=2
check ref pp2_z2 "pp=2 balanced split, zero_stage=2"
train pp2_interleaved 2 --set parallel.pp=2 --set parallel.virtual_stages=2 \
  --set parallel.pp_schedule=interleaved
check ref pp2_interleaved "pp=2 interleaved, virtual_stages=2"
train pp2_gpipe 2 "${each_stage[@]}" --set parallel.pp_schedule=gpipe
check ref pp2_gpipe "pp=2 gpipe (every micro-batch in flight)"
train dp2_pp2 4 "${each_stage[@]}" --set parallel.zero_stage=1
check ref dp2_pp2 "dp=2 x pp=2, zero_stage=1"
# The global scope over dp = 2: each stage's layers balance over its dp group.
train global_dp2 2 --set model.moe.aux_loss_scope=global
train global_dp2_pp2 4 "${each_stage[@]}" --set model.moe.aux_loss_scope=global
check global_dp2 global_dp2_pp2 "aux_loss_scope global, dp=2 x pp=2 against dp=2"
train cp2_pp2 4 "${each_stage[@]}" --set parallel.cp=2 --set train.activation_checkpointing=selective
check ref cp2_pp2 "cp=2 x pp=2, activation_checkpointing=selective"
train cp2_global 2 --set parallel.cp=2 --set model.moe.aux_loss_scope=global
check ref cp2_global "cp=2, aux_loss_scope global (dp x cp = the micro-batch)"
train hf_ref 1 --set model.moe.aux_loss_type=hf
train hf_cp2 2 --set parallel.cp=2 --set model.moe.aux_loss_type=hf
check hf_ref hf_cp2 "cp=2, aux_loss_type hf"

# The auxiliary-loss-free bias (DeepSeek-V3): sigmoid scoring, no aux loss, a rate large
# enough to change choices within the run; each stage moves its own layers' biases.
bias_args=(--set model.moe.expert_bias=true --set model.moe.bias_update_rate=0.01
           --set model.moe.aux_loss_coef=0 --set model.moe.scoring=sigmoid
           --set checkpoint.every=5)
train bias_ref 1 "${bias_args[@]}"
train bias_pp2 2 "${each_stage[@]}" "${bias_args[@]}"
check bias_ref bias_pp2 "expert_bias, pp=2"
train bias_cp2 2 --set parallel.cp=2 "${bias_args[@]}"
check bias_ref bias_cp2 "expert_bias, cp=2"
for l in 1 2; do
  echo -n "expert_bias of layer $l, pp=2 checkpoint: "
  compare_tensors "$work/bias_ref/ckpt/step_00000010" "$work/bias_pp2/ckpt/step_00000010" \
    "model.layers.$l.mlp.router.expert_bias" 0
done
train bias_pp2_resumed 1 "${bias_args[@]}" --resume "$work/bias_pp2/ckpt/step_00000005"
check_resumed bias_ref bias_pp2_resumed "expert_bias, pp=2 step 5 -> 1 process" 6

# fp16 with loss scaling: near fp32 (the routing the same at this size), and the
# pipeline reproduces its single process.
train fp16 1 --set train.dtype=fp16
echo -n "fp16 vs fp32, last step: "
compare "$work/ref/metrics.jsonl" "$work/fp16/metrics.jsonl" 1 1e-3
train fp16_pp2 2 "${each_stage[@]}" --set train.dtype=fp16
check fp16 fp16_pp2 "fp16, pp=2"

fails hf_pp2 'parallel.pp = 2: .*model.moe.aux_loss_type = "hf", model.moe.aux_loss_coef' \
  mpirun --oversubscribe -np 2 "$kiln" train "$work/tiny.toml" --set "run.dir=$work/bad_hf" \
  --set parallel.pp=2 --set model.moe.aux_loss_type=hf
