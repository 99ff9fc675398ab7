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
#      frozen base sharded; also in bf16 with fp32 adapters, train.lora.dtype's default, the
#      two buffers sharded apart), tp2 with sequence parallelism, pp2, and pp2 of a GPT-2 whose
#      frozen embedding is tied to the head on both stages (--long: ZeRO 1 and 2,
#      cp2, tp2 without sp, full activation checkpointing, dropout at dp2);
#   4. a run stopped after 10 updates resumes to the same losses, also on 2 ranks at ZeRO 3
#      (resharding the adapters and their optimizer state);
#   5. files: `kiln export --format peft` writes a PEFT folder (adapter_config.json with
#      PEFT's keys, adapter_model.safetensors with PEFT's names, the checkpoint's adapters
#      bit for bit); train.lora.init_from reads it back, and exporting again after an
#      update too small to change a bit gives the same file byte for byte; `--format hf
#      --merge-lora` gives a folder whose val loss (kiln eval) is the LoRA checkpoint's
#      within 1e-5; `kiln sample` runs on base plus adapters;
#   6. a moved base: sample, eval and --merge-lora find it with --lora-base (the same merge
#      and loss; without it, or pointing at another base, one line says so);
#   7. kiln bench runs a LoRA config on its base as kiln train starts it; the start-up line
#      names the adapters' storage; a bf16 run's merged folder is bf16 (fp32 adapters);
#   8. one-line errors: resuming on another base or without train.lora, a target that
#      matches nothing, LoRA keys
#      without a rank, train.freeze with LoRA, exporting a LoRA checkpoint as a plain
#      folder, PEFT from a checkpoint without adapters.
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
# bf16 with fp32 adapters (train.lora.dtype's default): the adapters' buffer fp32 beside
# the base's bf16, each sharded and gathered in its own dtype at ZeRO 3.
train bf16 1 --set train.dtype=bf16
train bf16_dp2_z3 2 --set train.dtype=bf16 --set parallel.zero_stage=3
echo -n "LoRA bf16, fp32 adapters, dp2 ZeRO 3: "
compare "$work/bf16/metrics.jsonl" "$work/bf16_dp2_z3/metrics.jsonl" 1 1e-5
grep -q ") in fp32; the base frozen" "$work/bf16.log" ||
  { echo "FAILED: the start-up line does not name the adapters' fp32"; grep -i lora "$work/bf16.log"; exit 1; }
train bf16_masters 1 --set train.dtype=bf16 --set train.lora.dtype=bf16 --set train.steps=1
grep -q ") in bf16 with fp32 masters; the base frozen" "$work/bf16_masters.log" ||
  { echo "FAILED: the start-up line does not name bf16 adapters"; grep -i lora "$work/bf16_masters.log"; exit 1; }
# kiln bench starts as kiln train does: the base from model.init_from, fresh adapters.
"$kiln" bench "$work/tiny.toml" "${lora[@]}" --set train.dtype=bf16 --steps 2 --warmup 1 \
  > "$work/bench.log" 2>&1 || { echo "FAILED: kiln bench on a LoRA config"; cat "$work/bench.log"; exit 1; }
echo "LoRA bench: $(grep -m1 "^tokens/s" "$work/bench.log")"
# Merged, the fp32 adapters' run is a bf16 folder (the run's dtype), as a PEFT user expects.
"$kiln" export --checkpoint "$work/bf16/ckpt/step_00000020" --format hf --merge-lora \
  --out "$work/bf16_merged" > "$work/bf16_merged.log" 2>&1 ||
  { echo "FAILED: bf16 merge"; cat "$work/bf16_merged.log"; exit 1; }
"$py" - "$work/bf16_merged/model.safetensors" <<'PY'
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
dtypes = {v["dtype"] for k, v in header.items() if k != "__metadata__"}
assert dtypes == {"BF16"}, f"merged folder of a bf16 run with fp32 adapters: {dtypes}"
print("LoRA bf16 merge: a BF16 folder")
PY
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

# GPT-2 (its embedding tied to the head, on both pipeline stages) from a random base, pp2.
gpt2=(--set train.lora.rank=4 --set 'train.lora.targets=["qkv","fc"]' --set model.dropout=0)
run_train "$work/tiny.toml" gpt2_ref 1 "${gpt2[@]}" --set checkpoint.every=20
run_train "$work/tiny.toml" gpt2_pp2 2 "${gpt2[@]}" --set parallel.pp=2
echo -n "LoRA GPT-2 (tied embedding) pp2: "
compare "$work/gpt2_ref/metrics.jsonl" "$work/gpt2_pp2/metrics.jsonl"
# Its PEFT folder: GPT-2's Conv1D modules store [in, out], so fan_in_fan_out is true.
succeeds gpt2_peft "$kiln" export --checkpoint "$work/gpt2_ref/ckpt/step_00000020" --format peft \
  --out "$work/gpt2_peft"
"$py" - "$work/gpt2_peft" <<'PY'
import json, os, sys
from safetensors_file import tensors
c = json.load(open(os.path.join(sys.argv[1], "adapter_config.json")))
assert c["fan_in_fan_out"] is True and c["target_modules"] == ["c_attn", "c_fc"], c
got = tensors(os.path.join(sys.argv[1], "adapter_model.safetensors"))
assert got["base_model.model.transformer.h.1.mlp.c_fc.lora_B.weight"][0] == [128, 4], got.keys()
print("LoRA GPT-2 PEFT export: c_attn, c_fc, fan_in_fan_out true")
PY

train resume 1 --exit-interval 10
train resume 1 --resume auto
echo -n "LoRA resume after 10 updates: "
compare "$work/ref/metrics.jsonl" "$work/resume/metrics.jsonl" 11
train reshard 2 --set parallel.zero_stage=3 --exit-interval 10
train reshard 1 --resume auto
echo -n "LoRA 2 ranks at ZeRO 3 -> 1 process: "
compare "$work/ref/metrics.jsonl" "$work/reshard/metrics.jsonl" 11

# Files: a PEFT folder out and in, the merged model, sampling.
ck="$work/ref/ckpt/step_00000020"
succeeds peft "$kiln" export --checkpoint "$ck" --format peft --out "$work/peft"
"$py" - "$work/peft" "$ck" <<'PY'
import json, os, sys
from safetensors_file import tensors
peft, ck = sys.argv[1:]
c = json.load(open(os.path.join(peft, "adapter_config.json")))
assert (c["peft_type"], c["r"], c["lora_alpha"], c["use_rslora"], c["task_type"]) == ("LORA", 4, 8.0, False, "CAUSAL_LM"), c
assert c["target_modules"] == ["down_proj", "gate_proj", "q_proj", "up_proj", "v_proj"], c["target_modules"]
got = tensors(os.path.join(peft, "adapter_model.safetensors"))
m = json.load(open(os.path.join(ck, "manifest.json")))
kiln = {}
for name, t in m["tensors"].items():
    if ".lora_" in name and not name.startswith(("optimizer.", "lowp.")):
        (sl,) = t["slices"]
        kiln[name] = tensors(os.path.join(ck, sl["file"]))[sl["key"]][1]
hf = {"qkv_proj.q": "q_proj", "qkv_proj.v": "v_proj", "gate_up_proj.gate": "gate_proj",
      "gate_up_proj.up": "up_proj", "down_proj": "down_proj"}
assert len(got) == len(kiln) == 20, (len(got), len(kiln))
for name, data in kiln.items():
    for k, v in hf.items():
        name2 = name.replace("." + k + ".", "." + v + ".")
        if name2 != name: break
    shape, peft_data = got["base_model.model." + name2]
    assert peft_data == data, f"{name2}: not the checkpoint's bits"
print(f"LoRA PEFT export: {len(got)} tensors with PEFT's names, the checkpoint's bits; "
      f"target_modules {c['target_modules']}")
PY
peft_round_trip "$work/peft"
echo "LoRA PEFT round trip (train.lora.init_from, export again): byte for byte"
succeeds merged "$kiln" export --checkpoint "$ck" --format hf --merge-lora --out "$work/merged"
for m in "$ck" "$work/merged" "$work/base_hf"; do
  succeeds eval "$kiln" eval --model "$m" --data "$work/ft_data" --json "$work/eval_$(basename "$m").json"
done
"$py" - "$work/eval_step_00000020.json" "$work/eval_merged.json" "$work/eval_base_hf.json" <<'PY'
import json, sys
loss = lambda p: json.load(open(p))["perplexity"][0]["loss"]
a, b, base = map(loss, sys.argv[1:])
assert abs(a - b) <= 1e-5 * abs(a), f"merged {b} vs base + adapters {a}"
assert a < base - 0.1, f"base + adapters {a}, the base alone {base}"
print(f"LoRA merged folder: val loss {b:.6f}, base + adapters {a:.6f} (the base alone {base:.4f})")
PY
"$kiln" sample --checkpoint "$ck" --max-new-tokens 8 --seed 1 > "$work/sample.log" 2>&1 ||
  { echo "FAILED: sample"; cat "$work/sample.log"; exit 1; }
echo "LoRA: kiln sample on base + adapters ran"
fails sample_hf "a Hugging Face folder without tokenizer.json" \
  "$kiln" sample --checkpoint "$work/merged" --max-new-tokens 2
fails plain_export "--format peft" "$kiln" export --checkpoint "$ck" --format hf --out "$work/plain_hf"
fails no_adapters "holds no LoRA adapters" \
  "$kiln" export --checkpoint "$work/base/ckpt/step_00000060" --format peft --out "$work/none"

# A moved base: the commands find it through --lora-base (its crc32 still checked).
mv "$work/base_hf" "$work/base_moved"
fails moved "point --lora-base at them" "$kiln" sample --checkpoint "$ck" --max-new-tokens 2
succeeds sample_moved "$kiln" sample --checkpoint "$ck" --max-new-tokens 2 --lora-base "$work/base_moved"
succeeds eval_moved "$kiln" eval --model "$ck" --data "$work/ft_data" --json "$work/eval_moved.json" \
  --lora-base "$work/base_moved"
succeeds merged_moved "$kiln" export --checkpoint "$ck" --format hf --merge-lora \
  --out "$work/merged_moved" --lora-base "$work/base_moved"
cmp "$work/merged/model.safetensors" "$work/merged_moved/model.safetensors" ||
  { echo "FAILED: the merge from the moved base differs"; exit 1; }
"$py" - "$work/eval_step_00000020.json" "$work/eval_moved.json" <<'PY'
import json, sys
a, b = (json.load(open(p))["perplexity"][0]["loss"] for p in sys.argv[1:])
assert a == b, f"eval from the moved base {b}, from where it was {a}"
PY
mv "$work/base_moved" "$work/base_hf"
echo "LoRA moved base: sample, eval and --merge-lora with --lora-base (the same merge and loss)"

# Another base: the base run trained one update more.
run_train "$work/tiny.toml" base2 1 "${llama[@]}" --set train.steps=61 --set optim.lr=1e-2 \
  --set checkpoint.every=61
"$kiln" export --checkpoint "$work/base2/ckpt/step_00000061" --format hf --out "$work/base2_hf" \
  > "$work/base2_export.log" 2>&1 || { echo "FAILED: export"; cat "$work/base2_export.log"; exit 1; }
fails other_moved "holds other weights" "$kiln" sample --checkpoint "$ck" --max-new-tokens 2 \
  --lora-base "$work/base2_hf"
cp -r "$work/resume" "$work/other_base"
fails other_base "its adapters were trained on" \
  "$kiln" train "$work/tiny.toml" --set "run.dir=$work/other_base" "${lora[@]}" \
  --set "model.init_from=$work/base2_hf" --resume auto
cp -r "$work/resume" "$work/no_lora"
fails no_lora "holds LoRA adapters (train.lora.rank = 4) but this run sets no train.lora" \
  "$kiln" train "$work/tiny.toml" --set "run.dir=$work/no_lora" "${llama[@]}" \
  --set "data.dir=$work/ft_data" --set "model.init_from=$work/base_hf" --set eval.every=5 \
  --set checkpoint.every=10 --set optim.lr=1e-2 --resume auto
fails no_match "train.lora.targets 'q_proj' matches no Linear" \
  "$kiln" train "$work/tiny.toml" --set "run.dir=$work/no_match" "${lora[@]}" \
  --set 'train.lora.targets=["q_proj"]'
fails no_rank "train.lora keys are set but train.lora.rank = 0" \
  "$kiln" train "$work/tiny.toml" --set "run.dir=$work/no_rank" "${llama[@]}" \
  --set train.lora.alpha=4
fails freeze "train.freeze with train.lora" \
  "$kiln" train "$work/tiny.toml" --set "run.dir=$work/freeze" "${lora[@]}" \
  --set 'train.freeze=["embed_tokens"]'
grep -q "kiln: LoRA rank 4, alpha 8 (scale 2), 10 adapters (model.layers.0.self_attn.qkv_proj.q ... model.layers.1.mlp.down_proj) in fp32;" \
  "$work/ref.log" || { echo "FAILED: no LoRA start-up line in ref.log"; grep -i lora "$work/ref.log"; exit 1; }
echo "LoRA train test: all passed"
