#!/usr/bin/env bash
# Crash safety of `kiln train` on 2 ranks, measured (docs/reliability.md):
#   1. a checkpoint save at step 4 (resumed from step 3) is killed (SIGKILL, KILN_FAULT) on
#      rank 0 (which commits the save) after the first file operation of each kind (mkdir,
#      create, write, fsync, rename, ...) and after its last three (around the final rename
#      that commits the step), on rank 1 after its first and its last (every rank-1 kill
#      leaves the save uncommitted), with --long after every file operation of each rank,
#      and in the middle of each rank's data-file write; after each kill `--resume auto` picks the
#      newest complete checkpoint and continues: the step-4 checkpoint it ends with is byte
#      for byte the uninterrupted run's, and no partial checkpoint is ever chosen (every
#      operation of the save, in one process: tests/checkpoint/checkpoint_crash_test.cpp);
#   2. ENOSPC and EIO injected into a save: one-line error naming the file, non-zero exit,
#      the previous checkpoint intact and chosen by the next resume.
# Usage: crash_test.sh KILN_BINARY WORK_DIR [--long]
set -euo pipefail
kiln="$1"
work="$2"
long="${3:-}"
source "$(dirname "${BASH_SOURCE[0]}")/tiny_run.sh"
# kiln's own default, set here so that each kiln process starts once (tests/parallel/common.sh).
export OMP_WAIT_POLICY=passive
append_saving_run 6 1
train() { train_two_ranks "$@"; }
train "$work/ref" "$work/ref.log" || { cat "$work/ref.log"; exit 1; }
train "$work/base" "$work/base.log" --exit-interval 3 || { cat "$work/base.log"; exit 1; }
same_as_ref() {  # same_as_ref RUN_DIR STEP: the step's data files are the uninterrupted run's
  local d
  d=$(printf "step_%08d" "$2")
  for f in "$work/ref/ckpt/$d"/rank_*.safetensors; do
    cmp -s "$f" "$1/ckpt/$d/$(basename "$f")" || return 1
  done
}
# The file operations of the save at step 4, per rank.
rm -rf "$work/run" && cp -r "$work/base" "$work/run"
KILN_FAULT=trace train "$work/run" "$work/trace.log" --resume auto --exit-interval 4 || { cat "$work/trace.log"; exit 1; }
n0=$(grep -c "kiln: file op .* (rank 0)" "$work/trace.log")
n1=$(grep -c "kiln: file op .* (rank 1)" "$work/trace.log")
mid0=$(grep "(rank 0): write .*rank_00000.safetensors" "$work/trace.log" | sed 's/kiln: file op \([0-9]*\).*/\1/' | tail -1)
mid1=$(grep "(rank 1): write .*rank_00001.safetensors" "$work/trace.log" | sed 's/kiln: file op \([0-9]*\).*/\1/' | tail -1)
same_as_ref "$work/run" 4 || { echo "FAILED: the traced run differs from the reference"; exit 1; }
echo "save at step 4: $n0 file operations on rank 0, $n1 on rank 1"

kills=0 resumed_new=0 resumed_old=0
crash() {  # crash SPEC: a save killed as SPEC says, then resume and check
  local spec=$1
  rm -rf "$work/run" && cp -r "$work/base" "$work/run"
  if KILN_FAULT=$spec train "$work/run" "$work/kill.log" --resume auto --exit-interval 4; then
    echo "FAILED: $spec: the run was not killed"; cat "$work/kill.log"; exit 1
  fi
  kills=$((kills + 1))
  # Whatever is under a final name is complete; the resume picks the newest of them.
  train "$work/run" "$work/resume.log" --resume auto --exit-interval 4 ||
    { echo "FAILED: $spec: resume"; cat "$work/kill.log" "$work/resume.log"; exit 1; }
  if grep -q "resuming from .*step_00000004" "$work/resume.log"; then
    resumed_new=$((resumed_new + 1))
  elif grep -q "resuming from .*step_00000003" "$work/resume.log"; then
    resumed_old=$((resumed_old + 1))
  else
    echo "FAILED: $spec: resumed from neither step 3 nor 4"; cat "$work/resume.log"; exit 1
  fi
  grep -q "skipping checkpoint" "$work/resume.log" && { echo "FAILED: $spec: a damaged checkpoint under a final name"; cat "$work/resume.log"; exit 1; }
  same_as_ref "$work/run" 4 || { echo "FAILED: $spec: step 4 differs from the uninterrupted run"; exit 1; }
}
kill_points() {  # kill_points RANK N: the operations to kill RANK after (of its N)
  if [ "$long" = --long ]; then
    seq 1 "$2"
  elif [ "$1" = 0 ]; then
    { grep "kiln: file op .* (rank 0): " "$work/trace.log" |
        sed 's/kiln: file op \([0-9]*\) (rank 0): \([a-z_]*\) .*/\2 \1/' | sort -s -k1,1 -u | cut -d' ' -f2
      seq $(($2 > 2 ? $2 - 2 : 1)) "$2"; } | sort -n -u
  else
    printf '%s\n' 1 "$2" | sort -n -u
  fi
}
for r in 0 1; do
  n=$([ "$r" = 0 ] && echo "$n0" || echo "$n1")
  for k in $(kill_points "$r" "$n"); do crash "kill:$k:$r"; done
done
crash "kill_mid:$mid0:0"
crash "kill_mid:$mid1:1"
which="every file operation of each rank"
[ "$long" = --long ] || which="the first operation of each kind and the last three of rank 0, the first and the last of rank 1"
echo "killed $kills saves ($which, and mid-write on each): resumed $resumed_new times from the new step 4, $resumed_old times from step 3, every time bitwise like the uninterrupted run"

# Write errors: the data file of rank 1 (ENOSPC) and the manifest of rank 0 (EIO).
manifest=$(grep "(rank 0): write .*manifest.json" "$work/trace.log" | sed 's/kiln: file op \([0-9]*\).*/\1/' | tail -1)
for spec in "enospc:$mid1:1" "eio:$manifest:0"; do
  rm -rf "$work/run" && cp -r "$work/base" "$work/run"
  if KILN_FAULT=$spec train "$work/run" "$work/err.log" --resume auto --exit-interval 4; then
    echo "FAILED: $spec: exit 0"; cat "$work/err.log"; exit 1
  fi
  case $spec in enospc*) why="No space left on device";; *) why="Input/output error";; esac
  line=$(grep -m1 "$why" "$work/err.log") || { echo "FAILED: $spec: no '$why'"; cat "$work/err.log"; exit 1; }
  echo "$line" | grep -q "/run/ckpt/" || { echo "FAILED: $spec: no file named in: $line"; exit 1; }
  [ -d "$work/run/ckpt/step_00000004" ] && { echo "FAILED: $spec: a step 4 directory after the failed save"; exit 1; }
  train "$work/run" "$work/resume.log" --resume auto --exit-interval 4 || { cat "$work/resume.log"; exit 1; }
  grep -q "resuming from .*step_00000003" "$work/resume.log" || { echo "FAILED: $spec: not resumed from step 3"; cat "$work/resume.log"; exit 1; }
  same_as_ref "$work/run" 4 || { echo "FAILED: $spec: step 4 differs"; exit 1; }
  echo "$spec: exit non-zero with '$line'; step 3 intact and resumed"
done
echo "crash tests passed"
