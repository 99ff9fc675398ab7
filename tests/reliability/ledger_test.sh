#!/usr/bin/env bash
# Hangs that name their cause (docs/reliability.md, "The collective ledger"): faults injected
# with KILN_COMM_FAULT into tiny `kiln train` runs end every rank within the timeout, with a
# message naming the right rank and call site:
#   count  (4 ranks; with --long only) rank 3 calls the loss all_reduce with one element fewer: the ranks'
#          announcements differ, the job ends at once naming rank 3's call;
#   skip   (3 ranks) rank 2 skips the loss all_reduce of its 3rd update: the job ends at the
#          next call whose shape differs, naming the first call at which rank 2 differed;
#   sleep  (2 ranks) rank 1 sleeps past the timeout before that all_reduce: rank 0 times out
#          and prints the diagnosis from the ledgers (rank 1 missing, wrote no ledger);
#   exit   (2 ranks, 2 pipeline stages) rank 0 exits as it sends an activation: mpirun stops
#          rank 1, which says it waits in the matching receive from world rank 0.
# Usage: ledger_test.sh KILN_BINARY WORK_DIR [--long]
set -euo pipefail
kiln="$1"
work="$2"
long="${3:-}"
source "$(dirname "${BASH_SOURCE[0]}")/tiny_run.sh"
timeout_s=3
base="$work/tiny.toml"

# run NAME NP FAULT [TOML LINES...]: trains 6 updates of NP sequences; sets $log, $elapsed, $rc.
run() {
  local name=$1 np=$2 fault=$3
  shift 3
  local toml="$work/$name.toml"
  cp "$base" "$toml"
  cat >> "$toml" <<EOT
[train]
steps = 6
micro_batch = 1
global_batch = $np
seq_len = 8
[eval]
every = 0
[log]
every = 1
[parallel]
timeout_s = $timeout_s
EOT
  for line in "$@"; do echo "$line" >> "$toml"; done
  log="$work/$name.log"
  local t0
  t0=$(date +%s.%N)
  rc=0
  KILN_COMM_FAULT="$fault" mpirun --oversubscribe --bind-to none -x KILN_COMM_FAULT -np "$np" \
    "$kiln" train "$toml" --set "run.dir=$work/$name" > "$log" 2>&1 || rc=$?
  elapsed=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
  [ "$rc" != 0 ] || { echo "FAILED: $name exited 0"; cat "$log"; exit 1; }
}

# expect NAME MAX_SECONDS ERE: the log has a line matching ERE, within MAX_SECONDS.
expect() {
  local name=$1 max=$2 pattern=$3 line
  line=$(grep -m1 -E "$pattern" "$log") || { echo "FAILED: $name: no line matching: $pattern"; cat "$log"; exit 1; }
  awk -v e="$elapsed" -v m="$max" 'BEGIN { exit !(e <= m) }' ||
    { echo "FAILED: $name took $elapsed s (at most $max s)"; cat "$log"; exit 1; }
  echo "$name: exited $rc after $elapsed s: $line"
}

if [ "$long" = --long ]; then
  # Startup on 4 time-sliced ranks takes a few seconds; the mismatch ends the job at once.
  run count 4 "count:train.all_reduce loss:3:2" "zero_stage = 1"
  expect count 20 "kiln: rank [0-3]: the ranks' calls differ at collective #[0-9]+ of 'dp': rank [0-2] calls all_reduce fp64\[1\] at 'train.all_reduce loss'; rank 3 calls all_reduce fp64\[0\] at 'train.all_reduce loss'$"
fi

run skip 3 "skip:train.all_reduce loss:2:3" "zero_stage = 1"
expect skip 15 "kiln: rank [0-2]: the ranks' calls differ at .*; they first differed at collective #[0-9]+ of 'dp': rank [01] calls all_reduce fp64\[1\] at 'train.all_reduce loss'; rank 2 calls .* at 'dp\.[^']*' \(a call made by some ranks only"

run sleep 2 "sleep:train.all_reduce loss:1:3" "zero_stage = 1"
expect sleep $((timeout_s + 10)) "kiln: rank 0: timed out after $timeout_s s waiting for all_reduce\(sum, fp64\[1\]\) on 'dp' \(rank 0 of 2\): at 'train.all_reduce loss'; rank 1 did not arrive \(collective #[0-9]+ of 'dp'; its last was #[0-9]+, [a-z_]+ fp32\[[0-9]+\] at 'dp\."
expect sleep $((timeout_s + 10)) "^  rank 0 waits in all_reduce fp64\[1\] #[0-9]+ of 'dp' at 'train.all_reduce loss'; missing: rank 1$"
grep -q "^    rank 1: it wrote no ledger" "$log" || { echo "FAILED: sleep: no line for rank 1"; cat "$log"; exit 1; }
[ -s "$work/sleep/ledger/rank-0.jsonl" ] && [ -s "$work/sleep/ledger/diagnosis.txt" ] ||
  { echo "FAILED: sleep: no ledger file or diagnosis.txt in $work/sleep/ledger"; exit 1; }

run exit 2 "exit:pp.send activation stage 0 -> 1 micro-batch 0:0" "pp = 2"
expect exit 15 "kiln: rank 1: a stop signal arrived while this rank waits for recv\(from 0, tag [0-9]+, fp32\[[0-9]+\]\) on 'pp' \(rank 1 of 2\): at 'pp.recv activation stage 0 -> 1 micro-batch 0'; peer: world rank 0; ledger: .*/rank-1.jsonl$"
echo "ledger tests passed"
