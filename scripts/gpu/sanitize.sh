#!/usr/bin/env bash
# compute-sanitizer over the op harness, for scripts/gpu-check.sh --sanitize: memcheck of
# the op test's cuda cases and of kiln_gpu_bf16, synccheck, and racecheck without the
# Linear cases (cuBLASLt's kernels: slow under racecheck, and not kiln's).
#   scripts/gpu/sanitize.sh BUILD_DIR
set -euo pipefail
build="$1"
nvcc_dir="$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")"
sanitizer="$(command -v compute-sanitizer || echo "$nvcc_dir/compute-sanitizer")"
[ -x "$sanitizer" ] || { echo "sanitize: compute-sanitizer not found"; exit 1; }
rc=0
check() {  # check TOOL PROGRAM [ARGS...]
  local tool=$1 r
  shift
  echo "=== sanitize $tool: $(basename "$1") ${*:2}"
  set +e
  "$sanitizer" --tool "$tool" --error-exitcode 3 "$@" 2>&1 | grep -vE '^\[ +(RUN|OK) +\]|^  cuda: '
  r=${PIPESTATUS[0]}
  set -e
  echo "=== sanitize $tool exit status $r"
  [ "$r" = 0 ] || rc=1
}
check memcheck "$build/tests/backend/backend_op_test" '--gtest_filter=*cuda*'
check memcheck "$build/bench/gpu/kiln_gpu_bf16"
check synccheck "$build/tests/backend/backend_op_test" '--gtest_filter=*cuda*'
check racecheck "$build/tests/backend/backend_op_test" '--gtest_filter=*cuda*:-*Linear*'
exit "$rc"
