#!/usr/bin/env bash
# TinyEncoder, a model from the layer library that only the test knows, trained by kiln's
# Trainer on 1 process and on 2 ranks (ZeRO 3; ZeRO 2 with full activation
# checkpointing; tensor parallel at tp2 from its own plan table and registry entry; context
# parallel at cp2, which its registry entry accepts): the per-step losses agree within
# 1e-5 relative and the loss falls. Sequence parallelism, which its table cannot take (it
# keeps the norms replicated), and document packing, for which it declares no inputs, are
# one-line errors.
# Usage: tiny_encoder_train_test.sh KILN TINY_LM_TRAIN WORK_DIR
set -euo pipefail
kiln="$1"
prog="$2"
work="$3"
rm -rf "$work" && mkdir -p "$work"
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
py=/usr/bin/python3
"$py" - "$work/corpus.txt" <<'PY'
import sys
words = ["in the beginning ", "and the earth ", "was without form ", "and void; ", "of the deep. "]
x, out = 7, []
for _ in range(800):
    x = (1103515245 * x + 12345) % 2**31
    out.append(words[(x >> 16) % len(words)])
open(sys.argv[1], "w").write("".join(out))
PY
"$kiln" prepare --input "$work/corpus.txt" --out "$work/data" --tokenizer byte >/dev/null
cat > "$work/tiny.toml" <<TOML
[model]
arch = "tiny_encoder"
n_layer = 2
n_head = 2
n_embd = 24
block_size = 16
[data]
dir = "$work/data"
[train]
steps = 15
micro_batch = 2
global_batch = 4
seq_len = 16
[optim]
lr = 3e-3
[log]
every = 1
peak_tflops = 1.0
[parallel]
timeout_s = 30
bucket_mb = 0.004
TOML
run() {  # run NAME NP [--set ...]
  local name=$1 np=$2
  shift 2
  local cmd=("$prog" "$work/tiny.toml" --set "run.dir=$work/$name" "$@")
  if [ "$np" -gt 1 ]; then cmd=(mpirun --oversubscribe --bind-to none -np "$np" "${cmd[@]}"); fi
  "${cmd[@]}" > "$work/$name.log" 2>&1 || { echo "FAILED: $name"; cat "$work/$name.log"; exit 1; }
}
run np1 1
run np2_z3 2 --set parallel.zero_stage=3
run np2_z2_full 2 --set parallel.zero_stage=2 --set train.activation_checkpointing=full
# Tensor parallel needs the key/value heads (n_head / 2) to divide over tp: 4 heads here.
h4=(--set model.n_head=4)
run np1_h4 1 "${h4[@]}"
run np2_tp2 2 "${h4[@]}" --set parallel.tp=2
run np2_cp2 2 --set parallel.cp=2
if mpirun --oversubscribe --bind-to none -np 2 "$prog" "$work/tiny.toml" --set "run.dir=$work/sp" \
     "${h4[@]}" --set parallel.tp=2 --set parallel.sequence_parallel=true > "$work/sp.log" 2>&1; then
  echo "FAILED: sequence parallelism was accepted"; exit 1
fi
grep -q "tiny_encoder's plan keeps norms replicated" "$work/sp.log" ||
  { echo "FAILED: no one-line refusal of sequence parallelism:"; cat "$work/sp.log"; exit 1; }
# A model that declares no document boundaries (cu_seqlens) cannot pack documents.
if "$prog" "$work/tiny.toml" --set "run.dir=$work/packed" --set data.packing=document \
     > "$work/packed.log" 2>&1; then
  echo "FAILED: data.packing = document was accepted"; exit 1
fi
grep -q 'data.packing = "document": model.arch = "tiny_encoder" takes no "cu_seqlens" input' \
  "$work/packed.log" || { echo "FAILED: no one-line refusal of packing:"; cat "$work/packed.log"; exit 1; }
"$py" - "$work" <<'PY'
import json, sys
work = sys.argv[1]
def losses(n):
    return [r["loss"] for r in map(json.loads, open(f"{work}/{n}/metrics.jsonl"))]
ref = losses("np1")
assert len(ref) == 15, ref
assert ref[-1] < ref[0] - 0.5, f"the loss did not fall: {ref[0]} -> {ref[-1]}"
for n, base in (("np2_z3", "np1"), ("np2_z2_full", "np1"), ("np2_tp2", "np1_h4"),
                ("np2_cp2", "np1")):
    want, got = losses(base), losses(n)
    worst = max(abs(a - b) / abs(a) for a, b in zip(want, got))
    assert len(got) == len(want) and worst <= 1e-5, f"{n}: worst relative difference {worst:.2e}"
    print(f"{n}: {len(got)} losses match 1 process, worst relative difference {worst:.2e}")
print(f"tiny_encoder trained: loss {ref[0]:.4f} -> {ref[-1]:.4f}")
PY
