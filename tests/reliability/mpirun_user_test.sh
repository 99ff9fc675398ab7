#!/usr/bin/env bash
# What a user meets under mpirun -np 2 (docs/distributed.md): a config error said once, and
# Ctrl-C (SIGINT) and SIGTERM to `mpirun -np 2 kiln train` save the run as in one process
# when Open MPI gives the ranks time (docs/distributed.md, "Stopping a run"): mpirun sends
# the ranks SIGCONT at once, SIGTERM odls_base_sigkill_timeout seconds later and SIGKILL as
# many seconds after that. With the timeout raised, the ranks finish the update, save a
# checkpoint and exit 0, and `--resume auto` continues from it (after SIGTERM). Meanwhile a second
# `kiln train` into the same run.dir fails at once, naming the directory and the pid.
# Usage: mpirun_user_test.sh KILN_BINARY WORK_DIR
set -euo pipefail
kiln="$1"
work="$2"
source "$(dirname "${BASH_SOURCE[0]}")/tiny_run.sh"
export OMPI_MCA_odls_base_sigkill_timeout=2  # enough for this tiny model
# Logging rarely: a rank printing every millisecond can block on mpirun's output pipe.
append_endless_run 1000
# A config error, the same on every rank: one line (rank 0's) and mpirun's short notice.
rc=0
out=$(mpirun --oversubscribe --bind-to none -np 3 "$kiln" train "$work/tiny.toml" --set optim.lrr=1 2>&1) || rc=$?
[ "$rc" != 0 ] && [ "$(grep -c "unknown key 'optim.lrr'" <<<"$out")" = 1 ] && ! grep -q "MPI_ABORT" <<<"$out" ||
  { echo "FAILED: a config error at -np 3: exit $rc, not said once:"; echo "$out"; exit 1; }
echo "a config error at -np 3: said once, in $(wc -l <<<"$out") lines with mpirun's"
for sig in INT TERM; do
  run="$work/run_$sig"
  mpirun --oversubscribe --bind-to none -np 2 "$kiln" train "$work/tiny.toml" --set "run.dir=$run" > "$run.log" 2>&1 &
  launcher=$!
  for _ in $(seq 200); do [ -s "$run/metrics.jsonl" ] && break; sleep 0.1; done
  [ -s "$run/metrics.jsonl" ] || { echo "FAILED: $sig: the run did not start"; cat "$run.log"; kill "$launcher"; exit 1; }
  # One run per directory: a second one stops before touching it (checked once).
  if [ "$sig" = INT ]; then
    rc=0
    second=$("$kiln" train "$work/tiny.toml" --set "run.dir=$run" 2>&1) || rc=$?
    [ "$rc" != 0 ] && grep -q "run directory $run is in use by another kiln train (pid [0-9]* on host" <<<"$second" ||
      { echo "FAILED: a second run into $run: exit $rc: $second"; kill "$launcher"; exit 1; }
  fi
  t0=$(date +%s.%N)
  kill "-$sig" "$launcher"
  rc=0
  wait "$launcher" || rc=$?
  elapsed=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  grep -q "stopping at step [0-9]* (signal); continue with --resume auto" "$run.log" ||
    { echo "FAILED: $sig: the ranks did not stop on the signal (mpirun exit $rc)"; cat "$run.log"; exit 1; }
  ckpt=$(ls -d "$run"/ckpt/step_* 2>/dev/null | tail -1)
  [ -n "$ckpt" ] || { echo "FAILED: $sig: no checkpoint"; cat "$run.log"; exit 1; }
  saved=$((10#${ckpt##*step_}))
  echo "$sig to mpirun: the ranks saved $ckpt and ended in $elapsed s (mpirun exit $rc)"
  # Resume on 2 ranks for two more updates (checked once: resuming is tested elsewhere).
  [ "$sig" = TERM ] || continue
  mpirun --oversubscribe --bind-to none -np 2 "$kiln" train "$work/tiny.toml" --set "run.dir=$run" \
    --set "train.steps=$((saved + 2))" --resume auto > "$run.resume.log" 2>&1 ||
    { echo "FAILED: $sig: resume"; cat "$run.resume.log"; exit 1; }
  grep -q "resuming from $ckpt (step $saved)" "$run.resume.log" ||
    { echo "FAILED: $sig: did not resume from $ckpt"; cat "$run.resume.log"; exit 1; }
done
echo "mpirun user tests passed"
