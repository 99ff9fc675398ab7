#!/usr/bin/env bash
# Document packing (data.packing = "document") through `kiln train` (the equality with each
# document alone is tests/parallel/packing_step_test.cpp):
#   1. a JSONL corpus of documents of mixed lengths prepared by kiln prepare; a tiny Llama
#      trained 20 updates packed on one process and at cp2 (a document spans chunks and
#      ranks): every loss and validation loss within 1e-5 relative; the packed run's
#      losses differ from the unpacked run's (the masks act); a packed blend of two data
#      sets trains;
#   2. bad packing configs are one-line errors at start-up: an unknown value, a data set
#      without a document index, an image data set.
# Usage: packing_train_test.sh KILN_BINARY WORK_DIR [--long]
set -euo pipefail
kiln="$1"
work="$2"
rm -rf "$work" && mkdir -p "$work"
. "$(dirname "$0")/common.sh"

"$py" - "$work/docs.jsonl" <<'PY'
import json, random, sys
random.seed(7)
words = "in the beginning and the earth was without form and void darkness upon the deep".split()
with open(sys.argv[1], "w") as f:
    for _ in range(300):
        n = random.choice([0, 1, 3, 8, 20, 45])
        f.write(json.dumps({"text": " ".join(random.choice(words) for _ in range(n))}) + "\n")
PY
"$kiln" prepare --input "$work/docs.jsonl" --format jsonl --out "$work/data" --tokenizer byte \
  --val-fraction 0.1 >/dev/null

cat > "$work/tiny.toml" <<EOF2
[model]
arch = "llama"
n_layer = 2
n_head = 4
n_kv_head = 2
n_embd = 32
ffn_hidden_size = 48
block_size = 32
[data]
dir = "$work/data"
packing = "document"
[train]
steps = 20
micro_batch = 2
global_batch = 4
seq_len = 32
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
[parallel]
timeout_s = 20
EOF2

run_train "$work/tiny.toml" one 1
run_train "$work/tiny.toml" cp2 2 --set parallel.cp=2
echo -n "packed cp2 vs one process: "; compare "$work/one/metrics.jsonl" "$work/cp2/metrics.jsonl"
run_train "$work/tiny.toml" unpacked 1 --set data.packing=none
"$py" - "$work/one/metrics.jsonl" "$work/unpacked/metrics.jsonl" <<'PY'
import json, sys
a, b = ([r["loss"] for r in map(json.loads, open(p)) if "loss" in r] for p in sys.argv[1:])
assert a[0] != b[0], "packed and unpacked runs have the same first loss: the masks do nothing"
print(f"packed vs unpacked first loss: {a[0]:.6f} vs {b[0]:.6f}")
PY

# A blend packs each sample by its own data set's documents.
"$kiln" prepare --input "$work/docs.jsonl" --format jsonl --out "$work/data2" --tokenizer byte \
  --val-fraction 0.2 >/dev/null
run_train "$work/tiny.toml" blend 1 --set data.dir= --set "data.blend=[\"0.5\", \"$work/data\", \"0.5\", \"$work/data2\"]" \
  --set train.steps=5
grep -q '"val_loss_by_data"' "$work/blend/metrics.jsonl" && echo "packed blend: ok"

cp -r "$work/data" "$work/old"
"$py" - "$work/old/meta.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); del j["doc_index"]; json.dump(j, open(sys.argv[1], "w"))
PY
fails bad_value 'data.packing' "$kiln" train "$work/tiny.toml" --set "run.dir=$work/x" --set data.packing=documents
fails no_index 'has no document index' "$kiln" train "$work/tiny.toml" --set "run.dir=$work/x" --set "data.dir=$work/old"
make_images 3 "$work/idx"
"$kiln" prepare --format idx --input "$work/idx" --out "$work/images" >/dev/null
fails images 'holds images' "$kiln" train "$work/tiny.toml" --set "run.dir=$work/x" --set "data.dir=$work/images" \
  --set model.arch=vit --set model.n_kv_head=0 --set model.ffn_hidden_size=0
echo "packing_train_test: ok"
