# Shared by the `kiln train` tests of this folder (source it after setting $work):
#   make_corpus SEED OUT   a small corpus with structure (byte-level tokens later)
#   make_images SEED OUT   tiny IDX files (12x12 gray, 4 classes with a class pattern)
#   make_pairs OUT         tiny LLaVA image-text pairs: OUT/{train,val}.jsonl (96 and 16
#                          records) and OUT/img/*.png, a 12x12 gray image of one of 4
#                          patterns each, one question whose answer ("A cross.") names it
#   setup_tiny_gpt2 SEED   a corpus (make_corpus SEED), its byte-level data set in $work/data
#                          and $work/tiny.toml: a tiny GPT-2 (2 layers, 4 heads, C = 32,
#                          T = 16, dropout 0.1), 20 updates of global batch 4 in
#                          micro-batches of 1, eval every 10 (2 batches), no checkpoints;
#                          runs change it with --set
#   run_train TOML NAME NP [args...]
#                          kiln train TOML (under mpirun for NP > 1) into $work/NAME,
#                          its output in $work/NAME.log, shown when it fails (then exit 1)
#   compare A B [first_step [bound]]
#                          per-step losses (and val losses, val accuracies) of metrics.jsonl B against
#                          A within bound (default 1e-5) relative, from first_step on;
#                          with a bound above 1e-5 the last step's loss only
#   fails NAME TEXT cmd... cmd must exit non-zero with TEXT in its output ($work/NAME.log)
#   succeeds NAME cmd...   cmd must exit 0; its output in $work/NAME.log, shown when it fails
#   peft_round_trip PEFT [args...]
#                          a LoRA run (the caller's `train`, with args) of one update at lr
#                          1e-12 from the adapters of PEFT folder PEFT (train.lora.init_from),
#                          exported again (as $work/peft2): the same file byte for byte
#   python checks import safetensors_file (this folder is on PYTHONPATH): tensors(path)
#   compare_tensors A B PREFIX [bound [B_PREFIX]]
#                          the tensors named PREFIX* of checkpoint dir B (B_PREFIX* there,
#                          the same names after it; B may hold the first rows of A's)
#                          against A's (assembled from their slices, whatever layout wrote them): the
#                          same names, ||b - a|| / ||a|| over all of them together within
#                          bound (default 1e-5; per tensor, one whose gradient is rounding
#                          noise, such as attention's key bias, drifts further under AdamW)
#   compare_moe A B [bound [min_steps]]
#                          a mixture-of-experts run B against A, both trained with
#                          --set log.expert_counts=true: the steps before the first whose
#                          tokens per expert differ (an expert-selection flip: a router
#                          logit that rounding moved across a tie changes the choice, and
#                          every loss after it) must match within bound (default 1e-5)
#                          relative in loss, val_loss, moe_aux_loss, moe_z_loss and
#                          (token dropping) moe_dropped_fraction, a mismatch there is a
#                          failure; a flip is logged (step, layer, expert, counts) and
#                          ends the comparison, which fails when fewer than min_steps
#                          (default 3) steps came before it
#   assert_drops METRICS   every logged step dropped a fraction of slots in (0, 1)
py=/usr/bin/python3
export PYTHONPATH="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)${PYTHONPATH:+:$PYTHONPATH}"
# OMP_WAIT_POLICY=passive is kiln's own default (apps/kiln/main.cpp): set here, each kiln
# process starts once instead of setting it and starting itself again (every start loads
# the CUDA libraries: 0.35-0.45 s of CPU, more when the cores are shared).
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

make_corpus() {
  "$py" - "$1" "$2" <<'PY'
import random, sys
random.seed(int(sys.argv[1]))
words = ["in the beginning ", "and the earth ", "was without form ", "and void; ",
         "and darkness ", "was upon the face ", "of the deep. "]
open(sys.argv[2], "w").write("".join(random.choice(words) for _ in range(800)))
PY
}

setup_tiny_gpt2() {
  make_corpus "$1" "$work/corpus.txt"
  "$kiln" prepare --input "$work/corpus.txt" --out "$work/data" --tokenizer byte --val-fraction 0.1 >/dev/null
  cat > "$work/tiny.toml" <<EOF2
[model]
n_layer = 2
n_head = 4
n_embd = 32
block_size = 16
dropout = 0.1
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
[checkpoint]
every = 0
[parallel]
timeout_s = 20
bucket_mb = 0.004
EOF2
}

run_train() {
  local toml=$1 name=$2 np=$3
  shift 3
  if [ "$np" = 1 ]; then
    "$kiln" train "$toml" --set "run.dir=$work/$name" "$@" > "$work/$name.log" 2>&1
  else
    mpirun --oversubscribe --bind-to none -np "$np" "$kiln" train "$toml" \
      --set "run.dir=$work/$name" "$@" > "$work/$name.log" 2>&1
  fi || { echo "FAILED: $name"; cat "$work/$name.log"; exit 1; }
}

make_images() {
  "$py" - "$1" "$2" <<'PY'
import gzip, os, random, struct, sys
random.seed(int(sys.argv[1]))
out = sys.argv[2]
os.makedirs(out, exist_ok=True)
def write(prefix, n):
    labels = [random.randrange(4) for _ in range(n)]
    pixels = bytearray()
    for y in labels:  # class y brightens quadrant y; noise everywhere
        for r in range(12):
            for c in range(12):
                q = (r >= 6) * 2 + (c >= 6)
                pixels.append(min(255, random.randrange(80) + (150 if q == y else 0)))
    with gzip.open(f"{out}/{prefix}-images-idx3-ubyte.gz", "wb") as f:
        f.write(struct.pack(">IIII", 0x803, n, 12, 12) + bytes(pixels))
    with gzip.open(f"{out}/{prefix}-labels-idx1-ubyte.gz", "wb") as f:
        f.write(struct.pack(">II", 0x801, n) + bytes(labels))
write("train", 256)
write("t10k", 64)
PY
}

make_pairs() {
  "$py" - "$1" <<'PY'
import json, os, random, struct, sys, zlib
out = sys.argv[1]
os.makedirs(out + "/img")
def png(path, rows):
    raw = b"".join(b"\0" + bytes(r) for r in rows)
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    head = struct.pack(">IIBBBBB", len(rows[0]), len(rows), 8, 0, 0, 0, 0)
    open(path, "wb").write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", head) +
                           chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
names = ["cross", "ring", "bar", "dot"]
def pattern(k, rng):
    img = [[rng.randrange(40) for _ in range(12)] for _ in range(12)]
    for y in range(12):
        for x in range(12):
            on = [x == 6 or y == 6, 3 <= abs(x - 6) + abs(y - 6) <= 4, 2 <= y <= 4, abs(x - 6) <= 1 and abs(y - 6) <= 1][k]
            if on: img[y][x] = 200 + rng.randrange(55)
    return img
rng = random.Random(7)
for split, n in (("train", 96), ("val", 16)):
    with open(f"{out}/{split}.jsonl", "w") as f:
        for i in range(n):
            k = rng.randrange(4)
            png(f"{out}/img/{split}{i}.png", pattern(k, rng))
            q = rng.choice(["What is in the image?", "Name the shape."])
            f.write(json.dumps({"id": f"{split}{i}", "image": f"img/{split}{i}.png",
                                "conversations": [{"from": "human", "value": "<image>\n" + q},
                                                  {"from": "gpt", "value": f"A {names[k]}."}]}) + "\n")
PY
}

compare() {
  "$py" - "$1" "$2" "${3:-1}" "${4:-1e-5}" <<'PY'
import json, sys
def load(p):
    return {r["step"]: r for r in map(json.loads, open(p)) if "loss" in r}
a, b, first, bound = load(sys.argv[1]), load(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
steps = [s for s in sorted(b) if s >= first]
assert steps, "no steps to compare"
if bound > 1e-5:
    steps = steps[-1:]
worst = 0.0
for s in steps:
    for key in ("loss", "val_loss", "val_accuracy"):
        if key not in a[s] and key not in b[s]:
            continue
        x, y = a[s][key], b[s][key]
        rel = abs(x - y) / abs(x)
        worst = max(worst, rel)
        if rel > bound:
            sys.exit(f"step {s} {key}: {y} vs single process {x} (relative {rel:.2e} > {bound})")
print(f"{len(steps)} step(s) match, worst relative difference {worst:.2e}")
PY
}

compare_tensors() {
  "$py" - "$1" "$2" "$3" "${4:-1e-5}" "${5:-$3}" <<'PY'
import json, math, os, struct, sys
from array import array
def tensors(d, prefix):
    m = json.load(open(os.path.join(d, "manifest.json")))
    headers, out = {}, {}
    def header(f):
        if f not in headers:
            raw = open(os.path.join(d, f), "rb").read()
            n = struct.unpack("<Q", raw[:8])[0]
            headers[f] = (json.loads(raw[8:8 + n]), raw[8 + n:])
        return headers[f]
    for name, t in m["tensors"].items():
        if not name.startswith(prefix):
            continue
        assert t["dtype"] == "fp32", f"{name}: {t['dtype']}"
        shape = t["shape"]
        strides = [1] * len(shape)
        for i in range(len(shape) - 2, -1, -1):
            strides[i] = strides[i + 1] * shape[i + 1]
        v = [math.nan] * math.prod(shape)
        for s in t["slices"]:
            h, data = header(s["file"])
            b, e = h[s["key"]]["data_offsets"]
            box = array("f", data[b:e])
            ext, off = s["extent"], s["offset"]
            for j, x in enumerate(box):  # row-major within the box
                flat, rem = 0, j
                for dim in range(len(ext) - 1, -1, -1):
                    flat += (off[dim] + rem % ext[dim]) * strides[dim]
                    rem //= ext[dim]
                v[flat] = x
        assert not any(map(math.isnan, v)), f"{d}: {name} not covered by its slices"
        out[name] = v
    return out
pa, pb = sys.argv[3], sys.argv[5]
a = tensors(sys.argv[1], pa)
b = {pa + n[len(pb):]: v for n, v in tensors(sys.argv[2], pb).items()}
a = {n: v[:len(b[n])] if n in b else v for n, v in a.items()}  # B may hold A's first rows
bound = float(sys.argv[4])
assert a, f"{sys.argv[1]}: no tensor named {sys.argv[3]}*"
assert sorted(a) == sorted(b), f"tensors differ: {sorted(set(a) ^ set(b))}"
diff = {n: sum((x - y) ** 2 for x, y in zip(a[n], b[n])) for n in a}
norm = {n: sum(x * x for x in a[n]) for n in a}
rel = math.sqrt(sum(diff.values()) / max(sum(norm.values()), 1e-30))
worst = max(a, key=lambda n: diff[n] / max(norm[n], 1e-30))
worst_rel = math.sqrt(diff[worst] / max(norm[worst], 1e-30))
assert rel <= bound, f"{sys.argv[3]}*: relative difference {rel:.2e} > {bound} (worst {worst}: {worst_rel:.2e})"
print(f"{len(a)} {sys.argv[3]}* tensors match, relative difference {rel:.2e} (worst tensor {worst_rel:.2e})")
PY
}

fails() {  # fails NAME EXPECTED_TEXT command...: non-zero exit, a line naming the cause
  local name=$1 want=$2
  shift 2
  if "$@" > "$work/$name.log" 2>&1; then echo "FAILED: $name succeeded"; cat "$work/$name.log"; exit 1; fi
  grep -q -- "$want" "$work/$name.log" || { echo "FAILED: $name: no '$want' in"; cat "$work/$name.log"; exit 1; }
  echo "$name: $(grep -m1 -- "$want" "$work/$name.log")"
}

succeeds() {  # succeeds NAME command...
  local name=$1
  shift
  "$@" > "$work/$name.log" 2>&1 || { echo "FAILED: $name"; cat "$work/$name.log"; exit 1; }
}

peft_round_trip() {  # peft_round_trip PEFT [train args...]
  local peft=$1
  shift
  # lr 1e-12 changes no bit of adapters of about 1e-2.
  train peft_in 1 "$@" --set "train.lora.init_from=$peft" --set train.steps=1 \
    --set optim.lr=1e-12 --set schedule.warmup_steps=0 --set checkpoint.every=1
  succeeds peft2 "$kiln" export --checkpoint "$work/peft_in/ckpt/step_00000001" --format peft \
    --out "$work/peft2"
  cmp "$peft/adapter_model.safetensors" "$work/peft2/adapter_model.safetensors" ||
    { echo "FAILED: PEFT round trip"; exit 1; }
}

compare_moe() {
  "$py" - "$1" "$2" "${3:-1e-5}" "${4:-3}" <<'PY'
import json, sys
def load(p):
    return {r["step"]: r for r in map(json.loads, open(p)) if "loss" in r}
a, b = load(sys.argv[1]), load(sys.argv[2])
bound, min_steps = float(sys.argv[3]), int(sys.argv[4])
assert sorted(a) == sorted(b) and a, f"steps differ: {sorted(a)} vs {sorted(b)}"
def flip(s):  # the first (layer, expert, a count, b count) that differs at step s, or None
    ca, cb = a[s].get("moe_expert_counts"), b[s].get("moe_expert_counts")
    assert ca is not None and cb is not None, f"step {s}: no moe_expert_counts (log.expert_counts)"
    for l, (la, lb) in enumerate(zip(ca, cb)):
        for e, (x, y) in enumerate(zip(la, lb)):
            if x != y:
                return l, e, x, y
    return None
worst, matched = 0.0, 0
for s in sorted(a):
    f = flip(s)
    if f:
        print(f"step {s}: expert-selection flip (MoE layer {f[0]} expert {f[1]}: {f[2]:g} vs "
              f"{f[3]:g} slots); the comparison stops here")
        if matched < min_steps:
            sys.exit(f"the flip came after {matched} matching step(s), fewer than {min_steps}: "
                     "the test compares too little (change the model or the data)")
        break
    for key in ("loss", "val_loss", "moe_aux_loss", "moe_z_loss", "moe_dropped_fraction"):
        if key not in a[s] and key not in b[s]:
            continue
        x, y = a[s][key], b[s][key]
        rel = abs(x - y) / abs(x) if x else abs(y)
        worst = max(worst, rel)
        if rel > bound:
            sys.exit(f"step {s} {key}: {y} vs {x} (relative {rel:.2e} > {bound}) with the same "
                     "expert choices so far: a mismatch without a flip")
    matched += 1
print(f"{matched} step(s) match, worst relative difference {worst:.2e}")
PY
}

# Token dropping took place: every logged step of METRICS drops a fraction in (0, 1).
assert_drops() {  # assert_drops METRICS
  "$py" - "$1" <<'PY'
import json, sys
fs = [r["moe_dropped_fraction"] for r in map(json.loads, open(sys.argv[1])) if "loss" in r]
assert fs and all(0 < f < 1 for f in fs), f"dropped fractions {fs}: not every step drops"
print(f"  dropped fraction {min(fs):.4f} .. {max(fs):.4f}")
PY
}
