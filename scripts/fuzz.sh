#!/usr/bin/env bash
# Builds the libFuzzer harnesses (fuzz/) in their own configuration (build-fuzz/, clang 14
# with -fsanitize=fuzzer,address,undefined) and runs each for SECONDS_PER_HARNESS seconds
# (default 5) on a scratch copy of its seed corpus, after replaying its committed
# regression inputs. Fails on any finding: a crash, a sanitizer report, a leak, an input
# taking over 10 s or a process above 2 GB. See docs/reliability.md, "Fuzzing".
#   scripts/fuzz.sh [SECONDS_PER_HARNESS] [HARNESS...]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"

seconds="${1:-5}"
shift || true
kiln_apt_install "${KILN_BUILD_PACKAGES[@]}" "${KILN_FUZZ_PACKAGES[@]}"

build="${KILN_FUZZ_BUILD_DIR:-$KILN_ROOT/build-fuzz}"
mkdir -p "$build"
echo "kiln: building the fuzzers in $build (log: $build/build.log)"
if ! { cmake -S "$KILN_ROOT" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKILN_FUZZ=ON \
         -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 -DKILN_CUDA=OFF -DKILN_NATIVE=OFF &&
       cmake --build "$build" -j "$(nproc)" --target kiln_fuzzers; } >"$build/build.log" 2>&1; then
  tail -n 40 "$build/build.log" >&2
  echo "kiln: the fuzzer build failed (full log: $build/build.log)" >&2
  exit 1
fi

harnesses=("$@")
if [ ${#harnesses[@]} -eq 0 ]; then
  for f in "$KILN_ROOT"/fuzz/*_fuzz.cpp; do harnesses+=("$(basename "$f" _fuzz.cpp)"); done
fi
work="$(mktemp -d "${TMPDIR:-/tmp}/kiln-fuzz.XXXXXX")"
trap 'rm -rf "$work"' EXIT
export ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=0:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"
limits=(-rss_limit_mb=2048 -malloc_limit_mb=2048 -timeout=10 -max_len=65536)
failed=()
for h in "${harnesses[@]}"; do
  bin="$build/fuzz/${h}_fuzz"
  log="$work/$h.log"
  mkdir -p "$work/$h/corpus" "$work/$h/artifacts"
  cp -r "$KILN_ROOT/fuzz/corpus/$h/." "$work/$h/corpus/" 2>/dev/null || true
  ok=1
  regressions="$KILN_ROOT/fuzz/regressions/$h"
  if [ -d "$regressions" ] && [ -n "$(ls -A "$regressions")" ]; then
    "$bin" "${limits[@]}" -artifact_prefix="$work/$h/artifacts/" "$regressions"/* >"$log.replay" 2>&1 || ok=0
  fi
  if [ $ok -eq 1 ]; then
    "$bin" "${limits[@]}" -max_total_time="$seconds" -print_final_stats=1 \
      -artifact_prefix="$work/$h/artifacts/" "$work/$h/corpus" >"$log" 2>&1 || ok=0
  fi
  if [ $ok -eq 1 ]; then
    stats="$(grep -E '^#[0-9]+.*(DONE|cov:)' "$log" | tail -n 1 || true)"
    echo "kiln: fuzz $h: ok ($seconds s): ${stats:-no stats}"
  else
    echo "kiln: fuzz $h: FINDING" >&2
    tail -n 40 "$log.replay" "$log" >&2 2>/dev/null || true
    rm -rf "$build/findings/$h" && mkdir -p "$build/findings/$h"
    cp -r "$work/$h/artifacts/." "$build/findings/$h/" 2>/dev/null || true
    if [ -n "$(ls -A "$build/findings/$h")" ]; then
      echo "kiln: the input is kept in $build/findings/$h/" >&2
    else  # a replayed regression input: libFuzzer writes no artifact, the log names it
      echo "kiln: a committed input of fuzz/regressions/$h/ fails again (its name is in the log above)" >&2
    fi
    failed+=("$h")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "kiln: fuzzing found problems in: ${failed[*]}" >&2
  exit 1
fi
echo "kiln: all ${#harnesses[@]} fuzzers ran without a finding"
