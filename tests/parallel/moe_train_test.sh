#!/usr/bin/env bash
# A mixture-of-experts Llama (issue 38, part 1) through `kiln train`, every data-parallel
# layout against the single process:
#   0. compare_moe (common.sh), which compares the runs below, fails a loss mismatch without
#      an expert-selection flip and logs a flip;
#   1. a tiny MoE decoder (3 blocks, the first dense; 4 experts, top-2, one shared expert;
#      aux loss and z-loss on), 10 updates of global batch 4 in micro-batches of 1: its
#      per-step LM losses (and the aux and z losses, compared as losses) on 2 ranks at
#      ZeRO 1 and at ZeRO 3 with full activation checkpointing; with --long (ctest label
#      long) also 1 and 2 ranks at every ZeRO stage, selective checkpointing, the "hf" aux
#      loss and sigmoid scoring: within 1e-5 relative of the single process;
#   2. a ZeRO-3 checkpoint of 2 ranks resumes on 1 process with the same losses;
#   3. bf16 trains (finite losses; the metrics carry the routing figures);
#   2b. aux_loss_scope "global": 1 process bitwise the micro_batch scope; 2 ranks at ZeRO
#      1 and ZeRO 3 (full checkpointing) within 1e-5 (with --long also the "hf" form);
#   2c. the auxiliary-loss-free bias (moe.expert_bias): it moves both ways; 2 ranks at
#      ZeRO 1 reproduce the single process (loss, tokens per expert and bias range); a
#      1-process resume is bitwise the uninterrupted run; a 2-rank ZeRO-3 checkpoint
#      resumes on 1 process with the same bias and losses; a resume may change the
#      balancing keys (a note names them) but not moe.top_k; an init_from of a checkpoint
#      without a bias starts it at zero (a note);
#   2d. token dropping (moe.capacity_factor 0.75: 6 of a micro-batch's 32 slots per
#      expert, so some are always dropped): 2 ranks at ZeRO 1 (dp keeps each micro-batch
#      whole) within 1e-5 of the single process, the same dropped fraction, in (0, 1),
#      every step; the console shows it; a resume may change the factor (a note);
#   4. bad MoE keys are one-line errors naming the key; `kiln memplan`'s layout search
#      lists the layouts a MoE model runs on (tensor parallelism: moe_tp_train_test.sh;
#      pipeline and context parallelism: moe_pp_cp_train_test.sh).
# Usage: moe_train_test.sh KILN_BINARY WORK_DIR [--long]
set -euo pipefail
kiln="$1"
work="$2"
long="${3:-}"
rm -rf "$work" && mkdir -p "$work"
. "$(dirname "$0")/common.sh"

. "$(dirname "$0")/moe_tiny.sh"  # $work/tiny.toml, $work/data, train, check

train ref 1 --set parallel.zero_stage=0

# compare_moe itself: a loss that moves with the choices unchanged fails; one after a flip
# (step 5's counts differ) is logged and passes; a flip before 3 matching steps fails.
doctor() {  # doctor OUT FLIP_STEP LOSS_STEP: ref's metrics, a count and a loss changed
  "$py" - "$work/ref/metrics.jsonl" "$work/$1.jsonl" "$2" "$3" <<'PY'
import json, sys
src, out, flip, bump = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
with open(out, "w") as f:
    for r in map(json.loads, open(src)):
        if r.get("step") == flip and "loss" in r:
            r["moe_expert_counts"][0][0] += 1
            r["moe_expert_counts"][0][1] -= 1
        if r.get("step") == bump and "loss" in r:
            r["loss"] *= 1 + 1e-4
        f.write(json.dumps(r) + "\n")
PY
}
doctor no_flip 0 2
fails compare_moe_no_flip "a mismatch without a flip" \
  compare_moe "$work/ref/metrics.jsonl" "$work/no_flip.jsonl"
doctor late_flip 5 6
echo -n "compare_moe_late_flip: "
compare_moe "$work/ref/metrics.jsonl" "$work/late_flip.jsonl" | tr '\n' ' '
echo
doctor early_flip 2 3
fails compare_moe_early_flip "fewer than 3" \
  compare_moe "$work/ref/metrics.jsonl" "$work/early_flip.jsonl"

train np2_z1 2 --set parallel.zero_stage=1
check ref np2_z1 "np=2 zero_stage=1"
train np2_z3_full 2 --set parallel.zero_stage=3 --set train.activation_checkpointing=full
check ref np2_z3_full "np=2 zero_stage=3 activation_checkpointing=full"

# aux_loss_scope "global" (the counts summed over the dp ranks' micro-batches of a
# micro-step): one process is the micro_batch scope bit for bit; 2 ranks give the same run
# at ZeRO 1 and ZeRO 3 with full checkpointing (the layout does not change the balance),
# and their aux losses are not the micro_batch scope's (the sum did happen). The value's
# formula is tests/models/moe_balance_test.cpp's.
same_moe() {  # same_moe RUN_A RUN_B BOUND: loss and balancing figures of every step
  "$py" - "$work/$1/metrics.jsonl" "$work/$2/metrics.jsonl" "$3" <<'PY'
import json, sys
def load(p):
    return {r["step"]: r for r in map(json.loads, open(p)) if "loss" in r}
a, b, bound = load(sys.argv[1]), load(sys.argv[2]), float(sys.argv[3])
assert sorted(a) == sorted(b) and a, (sorted(a), sorted(b))
worst = 0.0
for s in a:
    for key in ("loss", "moe_aux_loss", "moe_z_loss"):
        x, y = a[s][key], b[s][key]
        rel = abs(x - y) / abs(x) if x else abs(y)
        worst = max(worst, rel)
        assert rel <= bound, f"step {s} {key}: {y} vs {x} (relative {rel:.2e} > {bound})"
    if bound == 0:
        assert a[s]["moe_tokens_per_expert"] == b[s]["moe_tokens_per_expert"], s
print(f"{len(a)} steps match, worst relative difference {worst:.2e}")
PY
}
train global1 1 --set parallel.zero_stage=0 --set model.moe.aux_loss_scope=global
echo -n "global scope, 1 process == micro_batch scope (bitwise): "
same_moe ref global1 0
train global_np2_z1 2 --set parallel.zero_stage=1 --set model.moe.aux_loss_scope=global
train global_np2_z3 2 --set parallel.zero_stage=3 --set train.activation_checkpointing=full \
  --set model.moe.aux_loss_scope=global
echo -n "global scope, np=2 zero_stage=1 == zero_stage=3 full: "
same_moe global_np2_z1 global_np2_z3 1e-5
"$py" - "$work/np2_z1/metrics.jsonl" "$work/global_np2_z1/metrics.jsonl" <<'PY'
import json, sys
aux = [[r["moe_aux_loss"] for r in map(json.loads, open(p)) if "loss" in r] for p in sys.argv[1:]]
assert aux[0][0] != aux[1][0], f"np=2: the global scope's first aux {aux[1][0]} is the micro_batch scope's"
print(f"np=2 first-step aux: micro_batch {aux[0][0]:.6g}, global {aux[1][0]:.6g}")
PY

# Resharding: 2 ranks at ZeRO 3 stop after 5 updates, 1 process continues.
train reshard 2 --set parallel.zero_stage=3 --set checkpoint.every=5 --exit-interval 5
train reshard 1 --set parallel.zero_stage=0 --set checkpoint.every=5 --resume auto
echo -n "2 ranks zero 3 -> 1 process: "
compare "$work/ref/metrics.jsonl" "$work/reshard/metrics.jsonl" 6

# The auxiliary-loss-free bias (DeepSeek-V3), sigmoid scoring, no aux loss: a rate large
# enough to change choices within the run. Every step's bias range and loads must agree.
bias_args=(--set model.moe.expert_bias=true --set model.moe.bias_update_rate=0.01
           --set model.moe.aux_loss_coef=0
           --set model.moe.scoring=sigmoid)
same_bias() {  # same_bias RUN_A RUN_B FIRST_STEP: losses within 1e-5, routing figures equal
  "$py" - "$work/$1/metrics.jsonl" "$work/$2/metrics.jsonl" "$3" <<'PY'
import json, sys
def load(p):
    return {r["step"]: r for r in map(json.loads, open(p)) if "loss" in r}
a, b, first = load(sys.argv[1]), load(sys.argv[2]), int(sys.argv[3])
steps = [s for s in sorted(b) if s >= first]
assert steps and all(s in a for s in steps), (sorted(a), sorted(b))
worst = 0.0
for s in steps:
    rel = abs(a[s]["loss"] - b[s]["loss"]) / abs(a[s]["loss"])
    worst = max(worst, rel)
    assert rel <= 1e-5, f"step {s} loss: {b[s]['loss']} vs {a[s]['loss']}"
    for key in ("moe_tokens_per_expert", "moe_expert_bias"):
        assert a[s][key] == b[s][key], f"step {s} {key}: {b[s][key]} vs {a[s][key]}"
print(f"steps {steps[0]}..{steps[-1]} match, worst loss difference {worst:.2e}")
PY
}
train bias_ref 1 --set parallel.zero_stage=0 "${bias_args[@]}"
"$py" - "$work/bias_ref/metrics.jsonl" <<'PY'
import json, sys
recs = [r for r in map(json.loads, open(sys.argv[1])) if "loss" in r]
b = [r["moe_expert_bias"] for r in recs]
assert abs(b[0]["max"] - 0.01) < 1e-6 and abs(b[0]["min"] + 0.01) < 1e-6, b[0]
assert b[-1]["max"] > 0.01 and b[-1]["min"] < -0.01, f"the bias did not keep moving: {b[-1]}"
print(f"bias: after step 1 {b[0]}, after step {recs[-1]['step']} {b[-1]}")
PY
train bias_np2_z1 2 --set parallel.zero_stage=1 "${bias_args[@]}"
echo -n "bias, np=2 zero_stage=1: "
same_bias bias_ref bias_np2_z1 1
train bias_exact 1 --set parallel.zero_stage=0 --set checkpoint.every=5 --exit-interval 5 "${bias_args[@]}"
train bias_exact 1 --set parallel.zero_stage=0 --set checkpoint.every=5 --resume auto "${bias_args[@]}"
echo -n "bias, 1 process resumed at step 5 (bitwise): "
same_moe bias_ref bias_exact 0
same_bias bias_ref bias_exact 1 >/dev/null
# A resume may change the training-only balancing keys, not the model; an init_from of a
# checkpoint without a bias starts it at zero.
ckpt5="$work/bias_exact/ckpt/step_00000005"
train keys_changed 1 --set parallel.zero_stage=0 --resume "$ckpt5" "${bias_args[@]}" \
  --set model.moe.bias_update_rate=0.02 --set model.moe.aux_loss_coef=0.01 \
  --set model.moe.capacity_factor=1.5
grep -q "differs from the checkpoint's in .*model.moe.aux_loss_coef" "$work/keys_changed.log" ||
  { echo "FAILED: no note of the changed balancing keys"; cat "$work/keys_changed.log"; exit 1; }
grep -q "differs from the checkpoint's in .*model.moe.capacity_factor" "$work/keys_changed.log" ||
  { echo "FAILED: no note of the changed capacity factor"; cat "$work/keys_changed.log"; exit 1; }
echo "resume with changed balancing keys: $(grep -m1 -o "differs from the checkpoint's in [^(]*" "$work/keys_changed.log")"
fails resume_top_k "saved with model.moe.top_k = 2, this run has 3" "$kiln" train "$work/tiny.toml" \
  --set "run.dir=$work/bad_resume" --resume "$ckpt5" "${bias_args[@]}" --set model.moe.top_k=3
train init_no_bias 1 --set "model.init_from=$work/reshard/ckpt/step_00000005" --set train.steps=1 \
  "${bias_args[@]}"
grep -q "holds no model.layers.1.mlp.router.expert_bias, model.layers.2.mlp.router.expert_bias: they start from zero" \
  "$work/init_no_bias.log" || { echo "FAILED: no note of the missing bias"; cat "$work/init_no_bias.log"; exit 1; }
echo "init_from without a bias: $(grep -m1 -o 'holds no .*' "$work/init_no_bias.log")"
train bias_resume 2 --set parallel.zero_stage=3 --set checkpoint.every=5 --exit-interval 5 "${bias_args[@]}"
train bias_resume 1 --set parallel.zero_stage=0 --set checkpoint.every=5 --resume auto "${bias_args[@]}"
echo -n "bias, 2 ranks zero 3 -> 1 process: "
same_bias bias_ref bias_resume 6

# Token dropping: data parallelism keeps each micro-batch whole, so the same slots drop.
train drop_ref 1 --set parallel.zero_stage=0 --set model.moe.capacity_factor=0.75
train drop_np2_z1 2 --set parallel.zero_stage=1 --set model.moe.capacity_factor=0.75
check drop_ref drop_np2_z1 "capacity_factor=0.75 np=2 zero_stage=1"
"$py" - "$work/drop_ref/metrics.jsonl" "$work/drop_np2_z1/metrics.jsonl" "$work/ref/metrics.jsonl" <<'PY'
import json, sys
def load(p):
    return {r["step"]: r for r in map(json.loads, open(p)) if "loss" in r}
a, b, dropless = (load(p) for p in sys.argv[1:])
assert sorted(a) == sorted(b) and a, (sorted(a), sorted(b))
for s in a:
    f = a[s]["moe_dropped_fraction"]
    assert 0 < f < 1, f"step {s}: dropped fraction {f}"
    assert abs(b[s]["moe_dropped_fraction"] - f) <= 1e-12, f"step {s}: {b[s]['moe_dropped_fraction']} vs {f}"
assert all("moe_dropped_fraction" not in r for r in dropless.values()), "dropless runs log no fraction"
assert a[min(a)]["loss"] != dropless[min(a)]["loss"], "the capacity changed nothing"
fs = [a[s]["moe_dropped_fraction"] for s in sorted(a)]
print(f"dropped fraction, 1 process == np=2: steps {min(a)}..{max(a)}, {min(fs):.4f} .. {max(fs):.4f}")
PY
grep -q "dropped [0-9.]*%" "$work/drop_ref.log" ||
  { echo "FAILED: the console shows no dropped fraction"; cat "$work/drop_ref.log"; exit 1; }

# bf16: trains, with the routing figures in every step record.
train bf16 1 --set train.dtype=bf16 --set train.steps=4
"$py" - "$work/bf16/metrics.jsonl" <<'PY'
import json, math, sys
recs = [r for r in map(json.loads, open(sys.argv[1])) if "loss" in r]
assert len(recs) == 4, recs
for r in recs:
    assert math.isfinite(r["loss"]) and math.isfinite(r["moe_aux_loss"]), r
    t = r["moe_tokens_per_expert"]
    assert 0 <= t["min"] <= t["mean"] <= t["max"], t
print(f"bf16: 4 steps, last loss {recs[-1]['loss']:.4f}, tokens per expert {recs[-1]['moe_tokens_per_expert']}")
PY

# kiln memplan's layout search keeps to the layouts a MoE model runs on (dp, tp, cp, ZeRO).
"$kiln" memplan "$work/tiny.toml" --world-size 2 --device-memory 1 > "$work/memplan.log" 2>&1 ||
  { echo "FAILED: memplan"; cat "$work/memplan.log"; exit 1; }
grep -q "layouts that fit" "$work/memplan.log" || { echo "FAILED: memplan table"; cat "$work/memplan.log"; exit 1; }
echo "memplan: $(grep -c '^ *1 *1 ' "$work/memplan.log") layouts at cp = tp = 1, $(grep -c '^ *2 *1 ' "$work/memplan.log") at cp = 2"

fails top_k "model.moe.top_k" "$kiln" train "$work/tiny.toml" --set "run.dir=$work/bad" --set model.moe.top_k=5

[ "$long" = --long ] || exit 0

for np in 1 2; do
  for stage in 0 1 2 3; do
    [ "$np" = 1 ] && [ "$stage" = 0 ] && continue
    [ "$np" = 2 ] && [ "$stage" = 1 ] && continue  # quick did it
    train "np${np}_z${stage}" "$np" --set "parallel.zero_stage=$stage"
    check ref "np${np}_z${stage}" "np=$np zero_stage=$stage"
  done
done
train np2_z2_sel 2 --set parallel.zero_stage=2 --set train.activation_checkpointing=selective
check ref np2_z2_sel "np=2 zero_stage=2 activation_checkpointing=selective"

# The transformers form of the aux loss, and sigmoid scoring (per-layer aux loss).
for variant in "hf:--set model.moe.aux_loss_type=hf" \
               "sigmoid:--set model.moe.scoring=sigmoid"; do
  name=${variant%%:*}
  read -r -a args <<< "${variant#*:}"
  train "${name}_ref" 1 "${args[@]}"
  train "${name}_np2_z3" 2 --set parallel.zero_stage=3 "${args[@]}"
  check "${name}_ref" "${name}_np2_z3" "$name np=2 zero_stage=3"
done

# The global scope of the "hf" form (its totals summed over the ranks): ZeRO 1 == ZeRO 3.
train global_hf_np2_z1 2 --set parallel.zero_stage=1 --set model.moe.aux_loss_scope=global \
  --set model.moe.aux_loss_type=hf
train global_hf_np2_z3 2 --set parallel.zero_stage=3 --set model.moe.aux_loss_scope=global \
  --set model.moe.aux_loss_type=hf
echo -n "global scope hf, np=2 zero_stage=1 == zero_stage=3: "
same_moe global_hf_np2_z1 global_hf_np2_z3 1e-5
