#!/usr/bin/env bash
# A straggler under mpirun -np 2 (docs/reliability.md, "Stragglers"): with KILN_SLOW_RANK=1:20
# (rank 1 sleeps 20 ms in every update) rank 0 warns once, naming rank 1, after
# log.straggler_windows logged updates, and metrics.jsonl names rank 1 the slowest from then
# on; with log.straggler_factor = 0, no warning. (Two even ranks of this tiny model differ
# by up to 1.6x per window when other processes load the cores, so the test does not
# assert that they never warn.)
# Usage: straggler_test.sh KILN_BINARY WORK_DIR
set -euo pipefail
kiln="$1"
work="$2"
source "$(dirname "${BASH_SOURCE[0]}")/tiny_run.sh"
cat >> "$work/tiny.toml" <<EOT
[train]
steps = 40
micro_batch = 1
seq_len = 8
[eval]
every = 0
[log]
every = 5
peak_tflops = 1.0
EOT
run() {  # run NAME SLOW_RANK_SPEC [kiln train options...]: the spec "" for none
  local name=$1 slow=$2
  shift 2
  KILN_SLOW_RANK="$slow" mpirun --oversubscribe --bind-to none -np 2 -x KILN_SLOW_RANK \
    "$kiln" train "$work/tiny.toml" --set "run.dir=$work/$name" "$@" > "$work/$name.log" 2>&1 ||
    { echo "FAILED: $name"; cat "$work/$name.log"; exit 1; }
}
run slow 1:20
[ "$(grep -c "is a straggler" "$work/slow.log")" = 1 ] && grep -q "warning: rank 1 is a straggler" "$work/slow.log" ||
  { echo "FAILED: no single straggler warning naming rank 1"; cat "$work/slow.log"; exit 1; }
echo "slow rank 1: $(grep "is a straggler" "$work/slow.log")"
/usr/bin/python3 - "$work/slow/metrics.jsonl" <<'PY'
import json, sys
recs = [r for r in map(json.loads, open(sys.argv[1])) if "slowest_rank" in r and r["step"] >= 10]
assert len(recs) >= 6, recs
bad = [r["step"] for r in recs if r["slowest_rank"] != 1 or r["slowest_compute_s"] < 1.5 * r["median_compute_s"]]
assert not bad, f"rank 1 not the clear slowest at steps {bad}"
print(f"metrics: rank 1 the slowest at all {len(recs)} logged updates from step 10, compute "
      f"{min(r['slowest_compute_s'] / r['median_compute_s'] for r in recs):.2f}x the median or more")
PY
run off 1:20 --set log.straggler_factor=0
! grep -q "is a straggler" "$work/off.log" || { echo "FAILED: a warning with log.straggler_factor = 0"; cat "$work/off.log"; exit 1; }
echo "no warning with log.straggler_factor = 0"
echo "straggler tests passed"
