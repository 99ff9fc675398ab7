#!/usr/bin/env bash
# Checkpoint soak (not in the test suite; docs/reliability.md reports its figures):
# a 2-rank `kiln train` that saves every update is SIGKILLed (one rank, chosen at random)
# after a random delay, again and again; after each kill `--resume auto` must continue
# from the newest complete checkpoint. At the end the run must equal an uninterrupted one
# bitwise: the same loss at every step and the same final checkpoint, byte for byte.
# Usage: scripts/soak_checkpoints.sh KILN_BINARY [KILLS=200] [WORK_DIR]
set -euo pipefail
kiln=$(readlink -f "$1")
kills_wanted=${2:-200}
work=${3:-$(mktemp -d /tmp/kiln-soak.XXXXXX)}
mkdir -p "$work"
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
steps=${SOAK_STEPS:-4000}
head -c 40000 /dev/urandom | base64 > "$work/corpus.txt"
rm -rf "$work/data" && "$kiln" prepare --input "$work/corpus.txt" --out "$work/data" --tokenizer byte >/dev/null
cat > "$work/soak.toml" <<EOT
[model]
n_layer = 1
n_head = 2
n_embd = 16
block_size = 8
[data]
dir = "$work/data"
[train]
steps = $steps
micro_batch = 1
global_batch = 2
seq_len = 8
[eval]
every = 0
[log]
every = 1
peak_tflops = 1.0
[checkpoint]
every = 1
keep = 2
[parallel]
timeout_s = 30
zero_stage = 1
EOT
mpirun_() { mpirun --oversubscribe --bind-to none --mca odls_base_sigkill_timeout 0 -np 2 "$@"; }
rm -rf "$work/ref" "$work/run"
mpirun_ "$kiln" train "$work/soak.toml" --set "run.dir=$work/ref" > "$work/ref.log" 2>&1
kills=0 restarts=0
while [ "$kills" -lt "$kills_wanted" ]; do
  resume=()
  [ -d "$work/run/ckpt" ] && resume=(--resume auto)
  mpirun_ "$kiln" train "$work/soak.toml" --set "run.dir=$work/run" "${resume[@]}" > "$work/run.log" 2>&1 &
  launcher=$!
  restarts=$((restarts + 1))
  sleep "$(awk -v r=$RANDOM 'BEGIN { printf "%.3f", 0.2 + 0.8 * r / 32768 }')"
  # The ranks are mpirun's children (named "exe" by Open MPI); $launcher is the subshell
  # running mpirun.
  # Under load the ranks may start after the delay: wait for them while mpirun runs.
  ranks=""
  for _ in $(seq 100); do
    for p in $(pgrep -P "$launcher" || true); do ranks="$ranks $(pgrep -P "$p" || true)"; done
    ranks=$(echo $ranks)
    { [ -n "$ranks" ] || ! kill -0 "$launcher" 2>/dev/null; } && break
    sleep 0.1
  done
  if [ -z "$ranks" ]; then  # finished before the kill: start over for more kills
    wait "$launcher" || { echo "FAILED: run ended non-zero without a kill"; cat "$work/run.log"; exit 1; }
    grep -q "done:\|nothing to do" "$work/run.log" || { cat "$work/run.log"; exit 1; }
    break
  fi
  victim=$(echo $ranks | tr ' ' '\n' | shuf -n 1)
  kill -KILL "$victim" 2>/dev/null || true
  wait "$launcher" || true
  kills=$((kills + 1))
  # The newest complete checkpoint must never lie behind the one resumed last.
  step=$(grep -o "resuming from .*step_[0-9]*" "$work/run.log" | grep -o "[0-9]*$" | sed 's/^0*//' || true)
  step=${step:-0}
  if grep -q "skipping checkpoint" "$work/run.log"; then
    echo "FAILED: a damaged checkpoint under a final name after kill $kills"; cat "$work/run.log"; exit 1
  fi
  [ $((kills % 20)) = 0 ] && echo "soak: $kills kills, last resumed at step $step"
done
# Finish the run and compare with the uninterrupted one.
mpirun_ "$kiln" train "$work/soak.toml" --set "run.dir=$work/run" --resume auto > "$work/final.log" 2>&1 ||
  { echo "FAILED: final resume"; cat "$work/final.log"; exit 1; }
/usr/bin/python3 - "$work/ref/metrics.jsonl" "$work/run/metrics.jsonl" <<'PY'
import json, sys
def load(p):
    return {r["step"]: r["loss"] for r in map(json.loads, open(p)) if "loss" in r and "event" not in r}
a, b = load(sys.argv[1]), load(sys.argv[2])
assert sorted(a) == sorted(b), f"steps differ: {len(a)} vs {len(b)}"
bad = [s for s in a if a[s] != b[s]]
assert not bad, f"losses differ at steps {bad[:5]}"
print(f"{len(a)} steps: every loss bitwise equal to the uninterrupted run")
PY
d=$(printf "step_%08d" "$steps")
for f in "$work/ref/ckpt/$d"/rank_*.safetensors; do  # (manifest.json names run.dir)
  cmp -s "$f" "$work/run/ckpt/$d/$(basename "$f")" || { echo "FAILED: $(basename "$f") differs"; exit 1; }
done
echo "soak: survived $kills SIGKILLs at random delays ($restarts starts); the final checkpoint is byte for byte the uninterrupted run's"
