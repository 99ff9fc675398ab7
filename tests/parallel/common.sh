# Shared by the `kiln train` tests of this folder (source it after setting $work):
#   make_corpus SEED OUT   a small corpus with structure (byte-level tokens later)
#   make_images SEED OUT   tiny IDX files (12x12 gray, 4 classes with a class pattern)
#   run_train TOML NAME NP [args...]
#                          kiln train TOML (under mpirun for NP > 1) into $work/NAME,
#                          its output in $work/NAME.log, shown when it fails (then exit 1)
#   compare A B [first_step [bound]]
#                          per-step losses (and val losses, val accuracies) of metrics.jsonl B against
#                          A within bound (default 1e-5) relative, from first_step on;
#                          with a bound above 1e-5 the last step's loss only
py=/usr/bin/python3
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export KILN_COMM_TIMEOUT_S=20

make_corpus() {
  "$py" - "$1" "$2" <<'PY'
import random, sys
random.seed(int(sys.argv[1]))
words = ["in the beginning ", "and the earth ", "was without form ", "and void; ",
         "and darkness ", "was upon the face ", "of the deep. "]
open(sys.argv[2], "w").write("".join(random.choice(words) for _ in range(800)))
PY
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
