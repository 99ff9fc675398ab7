#!/usr/bin/env bash
# scripts/gpu-check.sh on a machine without a GPU (this one, CI's): with --prebuilt (this
# build's kiln, op harness and GPU programs, so no second build) it runs up to the first
# device step and stops with one line, "gpu-check: skipped: no GPU visible ...", exit 0,
# and writes gpu-check.json with result "skipped" and the phases it passed; with
# --require-gpu (the device tool's runs) the same is a failure, exit 1; bad arguments and
# a build without the GPU programs are one-line errors with exit 2.
# Exits 77 (ctest: skipped) where a GPU is visible: there the script would run the GPU phases.
# Usage: gpu_check_skip_test.sh BUILD_DIR WORK_DIR
set -euo pipefail
build="$1"
work="$2"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  echo "gpu_check_skip_test: SKIPPED: a GPU is visible here (run scripts/gpu-check.sh itself)"
  exit 77
fi
rm -rf "$work" && mkdir -p "$work"
fail() { echo "gpu_check_skip_test: FAILED: $*"; exit 1; }

rc=0
OUT="$work/out" bash "$root/scripts/gpu-check.sh" --quick --prebuilt "$build" >"$work/stdout" 2>"$work/stderr" || rc=$?
[ "$rc" = 0 ] || fail "exit status $rc without a GPU (expected 0): $(cat "$work/stdout" "$work/stderr")"
[ "$(grep -c 'skipped' "$work/stdout")" = 1 ] || fail "expected one skip line, got: $(cat "$work/stdout")"
tail -n 1 "$work/stdout" | grep -q '^gpu-check: skipped: no GPU visible' ||
  fail "the last line is not the skip: $(tail -n 1 "$work/stdout")"
[ ! -s "$work/stderr" ] || fail "stderr not empty: $(cat "$work/stderr")"
python3 - "$work/out/gpu-check.json" <<'PY' || fail "gpu-check.json"
import json, sys
s = json.load(open(sys.argv[1]))
assert s["result"] == "skipped" and s["device"] == "none" and s["mode"] == "quick", s
assert s["cap_s"] == 150, s["cap_s"]
assert [(p["name"], p["status"]) for p in s["phases"]] == [
    ("deps", "prebuilt"), ("configure", "prebuilt"), ("build", "prebuilt")], s["phases"]
assert s["bench"]["rows"] == [] and s["ops"]["programs"] == {}, s
PY
grep -q 'gpu-check: skipped' "$work/out/gpu-check.log" || fail "gpu-check.log lacks the skip line"

# One-line errors, exit 2.
expect_error() {  # expect_error PATTERN ARGS...
  local pattern=$1 rc=0
  shift
  OUT="$work/err" bash "$root/scripts/gpu-check.sh" "$@" >"$work/err.out" 2>&1 || rc=$?
  [ "$rc" = 2 ] || fail "'$*': exit $rc, expected 2: $(cat "$work/err.out")"
  [ "$(wc -l <"$work/err.out")" = 1 ] || fail "'$*': not one line: $(cat "$work/err.out")"
  grep -q "$pattern" "$work/err.out" || fail "'$*': no '$pattern' in: $(cat "$work/err.out")"
}
expect_error "unknown argument '--fast'" --fast
expect_error "expected whole seconds" --cap soon --prebuilt "$build"
mkdir -p "$work/empty-build"
expect_error "has no apps/kiln/kiln" --prebuilt "$work/empty-build"
rc=0
OUT="$work/req" bash "$root/scripts/gpu-check.sh" --quick --require-gpu --prebuilt "$build" >"$work/req.out" 2>&1 || rc=$?
[ "$rc" = 1 ] || fail "--require-gpu without a GPU: exit $rc, expected 1: $(cat "$work/req.out")"
grep -q 'FAILED: no GPU visible' "$work/req.out" || fail "--require-gpu: $(cat "$work/req.out")"
python3 -c 'import json, sys; assert json.load(open(sys.argv[1]))["result"] == "FAILED"' "$work/req/gpu-check.json" ||
  fail "--require-gpu: gpu-check.json's result is not FAILED"
echo "gpu_check_skip_test: ok (skip line, summary, --require-gpu, 3 one-line errors)"
