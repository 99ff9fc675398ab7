#!/usr/bin/env bash
# LoRA on a mixture-of-experts Llama (train.lora on the experts, nn/expert_lora.h) through
# `kiln train`:
#   1. moe_tiny.sh's decoder (3 blocks, the first dense; 4 experts, top-2, one shared
#      expert) from its random base, frozen, with adapters of rank 4 on q, v, gate, up and
#      down: each expert its own A and B, the shared expert's and the dense block's
#      Linears theirs; the checkpoint holds the adapters only (an expert adapter [4, ...]);
#   2. layouts give the single process's losses within 1e-5 up to any expert-selection
#      flip (compare_moe): dp2 at ZeRO 1, ep2 (the frozen experts and their adapters split
#      over ranks), dp2 at ZeRO 3 with full activation checkpointing, tp2 with sequence
#      parallelism, pp2, ep2 at ZeRO 3 in bf16 with fp32 adapters (train.lora.dtype's
#      default: the two buffers sharded apart) (--long: ZeRO 2, cp2, ep2 at ZeRO 3, tp2
#      without sp, and token dropping on 1 and 2 ranks);
#   3. a run stopped after 5 updates resumes to the same losses;
#   4. a Mixtral-shaped model (every block MoE, no shared expert): `kiln export --format
#      peft` writes a module per expert (block_sparse_moe.experts.<e>.w1, w3, w2, each
#      expert's slice of the checkpoint's adapter, bit for bit) that train.lora.init_from
#      reads back (exported again: byte for byte), and `--format hf
#      --merge-lora` a Mixtral folder whose val loss (kiln eval) is the LoRA checkpoint's
#      within 1e-5;
#   5. start-up notes: adapters without a PEFT module (the experts' gate_up whole), a model
#      without a Hugging Face folder (a shared expert), a rank above min(in, out); a
#      one-line error: dropout on the experts.
# Usage: moe_lora_train_test.sh KILN_BINARY WORK_DIR [--long]
set -euo pipefail
kiln="$1"
work="$2"
long="${3:-}"
rm -rf "$work" && mkdir -p "$work"
. "$(dirname "$0")/common.sh"
. "$(dirname "$0")/moe_tiny.sh"  # $work/tiny.toml, $work/data, train, check

lora=(--set train.lora.rank=4 --set train.lora.alpha=8 --set optim.lr=1e-2
      --set 'train.lora.targets=["q","v","gate","up","down"]')
train ref 1 "${lora[@]}" --set checkpoint.every=10
"$py" - "$work/ref/ckpt/step_00000010" <<'PY'
import json, os, sys
m = json.load(open(os.path.join(sys.argv[1], "manifest.json")))
params = {n: t["shape"] for n, t in m["tensors"].items()
          if not n.startswith(("optimizer.", "lowp.", "ema."))}
assert all(".lora_A." in n or ".lora_B." in n for n in params), f"not adapters only: {sorted(params)}"
# Block 0 (dense): q, v, gate, up, down; blocks 1-2: q, v, the experts' gate, up, down and
# the shared expert's: 5 + 8 + 8 units, A and B each.
assert len(params) == 2 * (5 + 8 + 8), f"{len(params)} adapter tensors: {sorted(params)}"
e = "model.layers.1.mlp.experts."
assert params[e + "gate_up_proj.gate.lora_A.weight"] == [4, 4, 32], params[e + "gate_up_proj.gate.lora_A.weight"]
assert params[e + "gate_up_proj.up.lora_B.weight"] == [4, 16, 4]
assert params[e + "down_proj.lora_A.weight"] == [4, 4, 16]
assert params[e + "down_proj.lora_B.weight"] == [4, 32, 4]
assert "model.layers.2.mlp.shared_experts.gate_up_proj.gate.lora_A.weight" in params
# The experts' B (zero at the start) trained, every expert's: the layouts compare adapters
# that act.
import struct
from safetensors_file import tensors
def values(name):  # fp32: the run's dtype
    (sl,) = m["tensors"][name]["slices"]
    shape, raw = tensors(os.path.join(sys.argv[1], sl["file"]))[sl["key"]]
    return struct.unpack(f"<{len(raw) // 4}f", raw)
for unit in ("gate_up_proj.gate", "gate_up_proj.up", "down_proj"):
    B = values(e + unit + ".lora_B.weight")
    each = len(B) // 4
    least = min(max(abs(v) for v in B[i * each:(i + 1) * each]) for i in range(4))
    assert least > 1e-4, f"{unit}: an expert's B is still ~0 ({least})"
print(f"MoE LoRA checkpoint: {len(params)} adapter tensors, the experts' [4, r, in] and "
      f"[4, rows, r], every expert's B trained")
PY

runs=("dp2_z1 2 --set parallel.zero_stage=1" "ep2 2 --set parallel.ep=2"
      "dp2_z3_full 2 --set parallel.zero_stage=3 --set train.activation_checkpointing=full"
      "tp2_sp 2 --set parallel.tp=2 --set parallel.sequence_parallel=true"
      "pp2 2 --set parallel.pp=2")
[ "$long" = --long ] && runs+=("dp2_z2 2 --set parallel.zero_stage=2" "cp2 2 --set parallel.cp=2"
                               "ep2_z3 2 --set parallel.ep=2 --set parallel.zero_stage=3"
                               "tp2 2 --set parallel.tp=2")
for run in "${runs[@]}"; do
  set -- $run
  name=$1 np=$2
  shift 2
  train "$name" "$np" "${lora[@]}" "$@"
  check ref "$name" "MoE LoRA $name"
done
# bf16 with fp32 adapters (train.lora.dtype's default): the experts' adapters fp32 and
# their frozen experts bf16, each sharded over the expert-data-parallel group at ZeRO 3.
train bf16 1 "${lora[@]}" --set train.dtype=bf16
train bf16_ep2_z3 2 "${lora[@]}" --set train.dtype=bf16 --set parallel.ep=2 \
  --set parallel.zero_stage=3
check bf16 bf16_ep2_z3 "MoE LoRA bf16, fp32 adapters, ep2 ZeRO 3"
if [ "$long" = --long ]; then  # token dropping: the experts' ragged rows
  train drop 1 "${lora[@]}" --set model.moe.capacity_factor=0.75
  train drop_dp2 2 "${lora[@]}" --set model.moe.capacity_factor=0.75
  check drop drop_dp2 "MoE LoRA token dropping dp2"
fi

train resume 1 "${lora[@]}" --exit-interval 5
train resume 1 "${lora[@]}" --resume auto
check ref resume "MoE LoRA resume after 5 updates"

# A Mixtral-shaped model: PEFT's module per expert, the merged folder.
mixtral=("${lora[@]}" --set model.moe.shared_experts=0 --set model.moe.first_k_dense=0
         --set checkpoint.every=10)
train mixtral 1 "${mixtral[@]}"
ck="$work/mixtral/ckpt/step_00000010"
succeeds peft "$kiln" export --checkpoint "$ck" --format peft --out "$work/peft"
"$py" - "$work/peft" "$ck" <<'PY'
import json, os, sys
from safetensors_file import tensors
peft, ck = sys.argv[1:]
c = json.load(open(os.path.join(peft, "adapter_config.json")))
assert c["target_modules"] == ["q_proj", "v_proj", "w1", "w2", "w3"], c["target_modules"]
got = tensors(os.path.join(peft, "adapter_model.safetensors"))
assert len(got) == 3 * 2 * (2 + 3 * 4), f"{len(got)} tensors"  # 3 layers, A and B, q v + 3 x 4 experts
m = json.load(open(os.path.join(ck, "manifest.json")))
t = m["tensors"]["model.layers.2.mlp.experts.down_proj.lora_B.weight"]
(sl,) = t["slices"]
shape, data = tensors(os.path.join(ck, sl["file"]))[sl["key"]]
each = len(data) // 4
for e in range(4):
    name = f"base_model.model.model.layers.2.block_sparse_moe.experts.{e}.w2.lora_B.weight"
    assert got[name][0] == [32, 4], got[name][0]
    assert got[name][1] == data[e * each:(e + 1) * each], f"{name}: not expert {e}'s bits"
print(f"MoE LoRA PEFT export: {len(got)} tensors, a module per expert "
      f"(block_sparse_moe.experts.<e>.w1/w3/w2), each its expert's bits")
PY
peft_round_trip "$work/peft" "${mixtral[@]}"
echo "MoE LoRA PEFT round trip (train.lora.init_from, export again): byte for byte"
succeeds merged "$kiln" export --checkpoint "$ck" --format hf --merge-lora --out "$work/merged"
grep -q '"MixtralForCausalLM"' "$work/merged/config.json" || { echo "FAILED: not a Mixtral folder"; exit 1; }
for m in "$ck" "$work/merged"; do
  succeeds eval "$kiln" eval --model "$m" --data "$work/data" --json "$work/eval_$(basename "$m").json"
done
"$py" - "$work/eval_step_00000010.json" "$work/eval_merged.json" <<'PY'
import json, sys
loss = lambda p: json.load(open(p))["perplexity"][0]["loss"]
a, b = map(loss, sys.argv[1:])
assert abs(a - b) <= 1e-5 * abs(a), f"merged {b} vs base + adapters {a}"
print(f"MoE LoRA merged Mixtral folder: val loss {b:.6f}, base + adapters {a:.6f}")
PY

# The experts' gate_up whole has no PEFT module (Mixtral's w1 and w3 are apart): said at
# start-up, not first at export.
train fc 1 "${mixtral[@]}" --set 'train.lora.targets=["fc"]' --set train.steps=1
grep -q "kiln: note: LoRA adapter model.layers.0.mlp.experts.gate_up_proj: its rows are 2 Hugging Face modules" \
  "$work/fc.log" || { echo "FAILED: no PEFT note in fc.log"; grep -i lora "$work/fc.log"; exit 1; }
echo "fc: $(grep -m1 "kiln: note: LoRA adapter" "$work/fc.log")"
# The shared expert (moe_tiny's) has no place in a Hugging Face MoE folder: no PEFT folder
# and no merged one, said at start-up (the reference run's log).
grep -q "kiln: note: model.moe.shared_experts = 1: neither Mixtral nor Qwen3-MoE folders hold shared experts: \`kiln export\` will write neither a PEFT folder" \
  "$work/ref.log" || { echo "FAILED: no shared-expert note in ref.log"; grep -i note "$work/ref.log"; exit 1; }
echo "ref: $(grep -m1 "shared_experts = 1" "$work/ref.log")"
# A rank above the widths of v (16 rows) and of the experts (16): said at start-up.
train wide 1 "${mixtral[@]}" --set train.lora.rank=20 --set train.steps=1
grep -q "kiln: note: train.lora.rank = 20 exceeds min(in, out) of 12 adapters (model.layers.0.self_attn.qkv_proj.v (32 in, 16 out), ...)" \
  "$work/wide.log" || { echo "FAILED: no rank note in wide.log"; grep -i "note" "$work/wide.log"; exit 1; }
echo "wide: $(grep -m1 "exceeds min(in, out)" "$work/wide.log")"
fails dropout "train.lora.dropout = 0.1 on model.layers.1.mlp.experts.gate_up_proj.gate" \
  "$kiln" train "$work/tiny.toml" --set "run.dir=$work/dropout" "${lora[@]}" \
  --set train.lora.dropout=0.1
echo "MoE LoRA train test: all passed"
