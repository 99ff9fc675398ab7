#!/usr/bin/env bash
# Checkpoints saved in the background (checkpoint.async; docs/reliability.md, "Asynchronous
# saves") on 2 ranks, ZeRO 1, a save every 4 updates:
#   1. the losses and every checkpoint's data files are byte for byte a synchronous run's
#      (the state is captured at its step, whatever training does while it is written);
#   2. a resume from the step-4 checkpoint ends as the uninterrupted run, bitwise;
#   3. rank 1 killed (SIGKILL, KILN_FAULT) in the middle of the background write of the
#      step-8 save: no step-8 checkpoint, `--resume auto` takes step 4 and ends bitwise;
#   4. a full disk (ENOSPC) in that write: with checkpoint.on_error = stop one line naming
#      the file and a non-zero exit, step 4 the newest checkpoint; with warn a warning,
#      training goes on, no step-8 checkpoint and the step-12 one as the uninterrupted run's;
#      the run's last save failing is an error even with warn.
# Usage: async_save_test.sh KILN_BINARY WORK_DIR
set -euo pipefail
kiln="$1"
work="$2"
source "$(dirname "${BASH_SOURCE[0]}")/tiny_run.sh"
export OMP_WAIT_POLICY=passive
append_saving_run 12 4
train() { train_two_ranks "$@" --set checkpoint.async=true; }
fail() { echo "FAILED: $1"; [ -f "${2:-}" ] && cat "$2"; exit 1; }
losses() { /usr/bin/python3 -c '
import json, sys
print(" ".join(repr(r["loss"]) for r in map(json.loads, open(sys.argv[1])) if "loss" in r and "event" not in r))' "$1/metrics.jsonl"; }
same_checkpoint() {  # same_checkpoint RUN_DIR STEP: its data files are the synchronous run's
  local d
  d=$(printf "step_%08d" "$2")
  [ -f "$1/ckpt/$d/manifest.json" ] || return 1
  for f in "$work/sync/ckpt/$d"/rank_*.safetensors; do cmp -s "$f" "$1/ckpt/$d/$(basename "$f")" || return 1; done
}
steps_saved() { ls "$1/ckpt" | grep '^step_' | sed 's/step_0*//' | tr '\n' ' '; }

train_two_ranks "$work/sync" "$work/sync.log" || fail "the synchronous run" "$work/sync.log"
KILN_FAULT=trace train "$work/async" "$work/async.log" || fail "the asynchronous run" "$work/async.log"
[ "$(losses "$work/async")" = "$(losses "$work/sync")" ] || fail "the losses differ from the synchronous run's"
for s in 4 8 12; do same_checkpoint "$work/async" $s || fail "checkpoint $s differs from the synchronous run's"; done
grep -q "saved checkpoint .*step_00000008 (in the background: training stalled" "$work/async.log" ||
  fail "no background save reported" "$work/async.log"
echo "1. asynchronous saves: losses and checkpoints 4, 8, 12 byte for byte the synchronous run's"

rm -rf "$work/resume" && cp -r "$work/async" "$work/resume" && rm -rf "$work/resume/ckpt/step_00000008" "$work/resume/ckpt/step_00000012"
train "$work/resume" "$work/resume.log" --resume auto || fail "the resume" "$work/resume.log"
grep -q "resuming from .*step_00000004" "$work/resume.log" && same_checkpoint "$work/resume" 12 ||
  fail "the resume from step 4 did not end as the uninterrupted run" "$work/resume.log"
echo "2. resumed from the step-4 background save: checkpoint 12 byte for byte the uninterrupted run's"

# Rank 1's file operations per save (the same for every save), and the write of its data
# file in the second one (step 8).
per_save=$(( $(grep -c "kiln: file op .* (rank 1)" "$work/async.log") / 3 ))
write8=$(grep "(rank 1): write .*step_00000008.*rank_00001.safetensors" "$work/async.log" | sed 's/kiln: file op \([0-9]*\).*/\1/' | head -1)
[ -n "$write8" ] && [ "$write8" -gt "$per_save" ] || fail "no rank-1 write found in the trace (per save: $per_save)" "$work/async.log"

rm -rf "$work/killed"
KILN_FAULT="kill_mid:$write8:1" train "$work/killed" "$work/killed.log" && fail "the run survived the kill" "$work/killed.log"
[ "$(steps_saved "$work/killed")" = "4 " ] || fail "after the kill: checkpoints $(steps_saved "$work/killed")" "$work/killed.log"
train "$work/killed" "$work/killed_resume.log" --resume auto || fail "the resume after the kill" "$work/killed_resume.log"
grep -q "resuming from .*step_00000004" "$work/killed_resume.log" && same_checkpoint "$work/killed" 12 ||
  fail "the resume after the kill did not end as the uninterrupted run" "$work/killed_resume.log"
echo "3. rank 1 killed while writing the step-8 save in the background: resumed from step 4, ended bitwise"

rm -rf "$work/full"
KILN_FAULT="enospc:$write8:1" train "$work/full" "$work/full.log" && fail "a full disk did not stop the run" "$work/full.log"
grep -q "rank 1: error: checkpoint of step 8 (written in the background) failed: .*rank_00001.safetensors.*: write failed: No space left on device" "$work/full.log" ||
  fail "no line naming the file" "$work/full.log"
[ "$(steps_saved "$work/full")" = "4 " ] || fail "after ENOSPC: checkpoints $(steps_saved "$work/full")" "$work/full.log"
echo "4a. ENOSPC, on_error = stop: $(grep -o "rank 1: error: .*" "$work/full.log" | head -1 | cut -c1-160)..."
rm -rf "$work/warn"
KILN_FAULT="enospc:$write8:1" train "$work/warn" "$work/warn.log" --set checkpoint.on_error=warn ||
  fail "on_error = warn stopped the run" "$work/warn.log"
grep -q "warning: checkpoint of step 8 (written in the background) failed" "$work/warn.log" &&
  grep -q "rank 1: warning: .*rank_00001.safetensors.*No space left on device" "$work/warn.log" ||
  fail "no warning, or none naming the file" "$work/warn.log"
# The run's last save (step 12) failing is an error even with warn.
rm -rf "$work/warn_last"
last=$(grep "(rank 1): write .*step_00000012.*rank_00001.safetensors" "$work/async.log" | sed 's/kiln: file op \([0-9]*\).*/\1/' | head -1)
KILN_FAULT="enospc:$last:1" train "$work/warn_last" "$work/warn_last.log" --set checkpoint.on_error=warn &&
  fail "a failed last save exited 0 with on_error = warn" "$work/warn_last.log"
grep -q "error: checkpoint of step 12 (written in the background) failed" "$work/warn_last.log" ||
  fail "no error for the failed last save" "$work/warn_last.log"
[ "$(steps_saved "$work/warn")" = "4 12 " ] && same_checkpoint "$work/warn" 12 &&
  [ "$(losses "$work/warn")" = "$(losses "$work/sync")" ] || fail "on_error = warn: checkpoints $(steps_saved "$work/warn")" "$work/warn.log"
echo "4b. ENOSPC, on_error = warn: warnings (rank 1's naming the file); checkpoints 4 and 12, the losses and checkpoint 12 the uninterrupted run's; the last save failing still stops"
echo "async save tests passed"
