#!/usr/bin/env bash
# A rank that stops answering (SIGSTOP, not a crash) during `kiln train`: the other ranks
# exit non-zero within parallel.timeout_s, naming the collective and the rank that did not
# arrive (docs/reliability.md). On 2 and 4 ranks; prints the measured time from the stop
# to the end of the job (mpirun adds up to 1 s to end the stopped process).
# Usage: silent_rank_test.sh KILN_BINARY WORK_DIR
set -euo pipefail
kiln="$1"
work="$2"
source "$(dirname "${BASH_SOURCE[0]}")/tiny_run.sh"
timeout_s=3
append_endless_run 1
cat >> "$work/tiny.toml" <<EOT
[parallel]
zero_stage = 1
timeout_s = $timeout_s
EOT
for np in 2 4; do
  run="$work/np$np"
  mpirun --oversubscribe --bind-to none -np "$np" "$kiln" train "$work/tiny.toml" --set "run.dir=$run" > "$run.log" 2>&1 &
  launcher=$!
  for _ in $(seq 100); do [ -s "$run/metrics.jsonl" ] && break; sleep 0.1; done
  [ -s "$run/metrics.jsonl" ] || { echo "FAILED: np=$np did not start"; cat "$run.log"; kill "$launcher"; exit 1; }
  sleep 0.5
  # Stop the last rank (its rank from the environment mpirun gave it).
  victim="" want=$((np - 1))
  for p in $(pgrep -P "$launcher"); do
    r=$(tr '\0' '\n' < "/proc/$p/environ" | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')
    [ "$r" = "$want" ] && victim=$p
  done
  [ -n "$victim" ] || { echo "FAILED: no rank $want"; kill "$launcher"; exit 1; }
  t0=$(date +%s.%N)
  kill -STOP "$victim"
  rc=0
  wait "$launcher" || rc=$?
  t1=$(date +%s.%N)
  kill -KILL "$victim" 2>/dev/null || true
  elapsed=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
  [ "$rc" != 0 ] || { echo "FAILED: np=$np exited 0"; cat "$run.log"; exit 1; }
  # Stopped before the collective: "did not arrive"; inside it: silent since (heartbeat).
  # The stopped rank must be among those named. On 4 ranks the others may have moved on
  # to the next collective of another group while one still waits inside the last (the
  # stopped rank held its data), so a line may name a waiting rank beside the stopped one.
  line=$(grep -m1 -E "timed out after $timeout_s s waiting for .*((: |; )ranks? ([0-9]+, )*$want(, [0-9]+)* did not arrive \(collective #|been silent since: (rank [0-9]+ \([0-9.]+ s\), )*rank $want \()" "$run.log") ||
    { echo "FAILED: np=$np: no timeout naming rank $want"; cat "$run.log"; exit 1; }
  # Within the timeout (plus the time the others take to reach the next collective, the
  # second a timed-out rank waits for the others' ledgers, and mpirun's end of the job).
  awk -v e="$elapsed" -v t="$timeout_s" 'BEGIN { exit !(e <= t + 4) }' ||
    { echo "FAILED: np=$np took $elapsed s (timeout $timeout_s s)"; exit 1; }
  echo "np=$np: rank $want stopped; the job exited $rc after $elapsed s: $line"
done
echo "silent rank tests passed"
