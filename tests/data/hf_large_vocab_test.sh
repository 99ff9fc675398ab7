#!/usr/bin/env bash
# A 128K-vocabulary data set prepares, trains and samples: a generated Hugging Face
# tokenizer.json in Llama 3's shape (128,256 ids, Llama 3's Split regex + ByteLevel,
# ignore_merges, <|begin_of_text|> at 128000) whose byte tokens and merges all have ids
# above 65,535; `kiln prepare --tokenizer hf --shard-format llmc` writes llm.c's uint32
# shards (magic 20240801, version 7), `kiln train` trains a tiny Llama on them (the loss
# falls from ln 128256) and
# `kiln sample` continues a prompt through the hf tokenizer saved in the checkpoint.
# Usage: hf_large_vocab_test.sh KILN WORK_DIR TEXT_FILE
set -euo pipefail
kiln="$1"
work="$2"
text="$3"
rm -rf "$work" && mkdir -p "$work/tok"
export OMP_NUM_THREADS=2
py=/usr/bin/python3
"$py" - "$work" "$text" <<'PY'
import sys
work, text_file = sys.argv[1], sys.argv[2]
words = ["In the beginning ", "God created ", "the heaven ", "and the earth.\n", "And the earth ",
         "was without form, ", "and void; ", "and darkness was upon ", "the face of the deep.\n\n"]
x, out = 11, []
for _ in range(1500):
    x = (1103515245 * x + 12345) % 2**31
    out.append(words[(x >> 16) % len(words)])
corpus = "".join(out)
open(f"{work}/corpus.txt", "w").write(corpus)
PY
# Every byte token and merge above 65535; 128,000 ids, then <|begin_of_text|> (128000),
# <|end_of_text|> and 254 reserved specials.
specials="<|begin_of_text|>,<|end_of_text|>$(for i in $(seq 0 253); do printf ',<|reserved_special_token_%d|>' "$i"; done)"
"$py" "$(dirname "$0")/make_hf_tokenizer.py" "$work/tok" "$work/corpus.txt" "$text" --first-id 70000 \
  --vocab-size 128256 --specials "$specials"
"$kiln" prepare --input "$work/corpus.txt" "$text" --out "$work/data" --tokenizer hf \
  --tokenizer-files "$work/tok" --shard-format llmc --val-fraction 0.1 --shard-tokens 4000
"$py" - "$work/data" <<'PY'
import json, struct, sys
d = sys.argv[1]
m = json.load(open(f"{d}/meta.json"))
assert m["tokenizer"]["kind"] == "hf" and m["vocab_size"] == 128256, m
assert m["eot_id"] == 128000 and m["token_dtype"] == "uint32" and m["shard_version"] == 7, m
assert m["documents"] == 2, m
ids = []
for split in ("train", "val"):
    for s in m["shards"][split]:
        raw = open(f"{d}/{s['file']}", "rb").read()
        magic, version, count = struct.unpack("<3i", raw[:12])
        assert (magic, version) == (20240801, 7) and len(raw) == 1024 + 4 * count, (s, magic, version)
        ids += struct.unpack(f"<{count}I", raw[1024:])
assert ids[0] == 128000 and ids.count(128000) == 2, ids[:5]
text_ids = [i for i in ids if i != 128000]
assert min(text_ids) >= 70000 and max(text_ids) < 128256, (min(text_ids), max(text_ids))
assert len(ids) < 0.5 * sum(1 for _ in open(f"{d}/../corpus.txt", "rb").read()), "the merges did not apply"
print(f"prepared {len(ids)} tokens, ids {min(text_ids)}..{max(text_ids)}, llm.c v7 shards")
PY
cat > "$work/tiny.toml" <<TOML
[model]
arch = "llama"
n_layer = 1
n_head = 2
n_kv_head = 1
n_embd = 32
block_size = 32
rope_theta = 500000.0
[data]
dir = "$work/data"
[train]
steps = 20
micro_batch = 2
global_batch = 2
seq_len = 32
[optim]
lr = 1e-2
[checkpoint]
every = 20
[log]
every = 1
peak_tflops = 1.0
[run]
dir = "$work/run"
TOML
"$kiln" train "$work/tiny.toml" > "$work/train.log" 2>&1 || { cat "$work/train.log"; exit 1; }
"$py" - "$work/run/metrics.jsonl" <<'PY'
import json, math, sys
loss = [r["loss"] for r in map(json.loads, open(sys.argv[1])) if "loss" in r]
assert len(loss) == 20 and abs(loss[0] - math.log(128256)) < 0.5, loss[:2]
assert loss[-1] < loss[0] - 1.0, f"the loss did not fall: {loss[0]} -> {loss[-1]}"
print(f"trained: loss {loss[0]:.3f} (ln 128256 = {math.log(128256):.3f}) -> {loss[-1]:.3f}")
PY
out=$("$kiln" sample --checkpoint "$work/run/ckpt/step_00000020" --prompt "In the beginning" \
  --max-new-tokens 12 --top-k 5 --seed 3)
echo "sample: $out"
case "$out" in
  *"<filler_"*) echo "FAILED: the top-5 sample holds never-seen tokens"; exit 1 ;;
  "In the beginning "[a-zA-Z]*) ;;
  *) echo "FAILED: the sample does not continue the prompt with words"; exit 1 ;;
esac
# The checkpoint as a Hugging Face folder: the tokenizer's own file, its config, and
# Llama 3's bos/eos ids in config.json.
"$kiln" export --checkpoint "$work/run/ckpt/step_00000020" --format hf --out "$work/hf" > /dev/null
cmp "$work/tok/tokenizer.json" "$work/hf/tokenizer.json" || { echo "FAILED: tokenizer.json differs"; exit 1; }
"$py" - "$work/hf" <<'PY'
import json, sys
d = sys.argv[1]
cfg, tcfg = json.load(open(f"{d}/config.json")), json.load(open(f"{d}/tokenizer_config.json"))
assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (128000, 128001), cfg
assert (tcfg["bos_token"], tcfg["eos_token"]) == ("<|begin_of_text|>", "<|end_of_text|>"), tcfg
assert cfg["vocab_size"] == 128256, cfg["vocab_size"]
print("exported: tokenizer.json byte for byte, bos 128000, eos 128001")
PY
# kiln sample reads the folder as the checkpoint: the same text.
out_hf=$("$kiln" sample --checkpoint "$work/hf" --prompt "In the beginning" --max-new-tokens 12 \
  --top-k 5 --seed 3)
[ "$out_hf" = "$out" ] || { echo "FAILED: sample from the folder: '$out_hf', not '$out'"; exit 1; }
echo "sample from the Hugging Face folder: the checkpoint's text"
echo "hf_large_vocab_test: passed"
