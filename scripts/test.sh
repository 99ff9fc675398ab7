#!/usr/bin/env bash
# Configure, build and run every test with ctest, then (with no arguments) a short run of
# every fuzz harness (scripts/fuzz.sh, 5 s each, in its own clang build, build-fuzz/).
# Installs missing Debian packages. Idempotent; works from any directory. The build goes
# to $KILN_BUILD_DIR (default build/).
#   scripts/test.sh                 every test but those labelled long, then the fuzzers
#   scripts/test.sh --long          the long ones too (4-rank layouts, full layout matrices)
#   scripts/test.sh -R golden       only tests matching a regex (extra args go to ctest; no fuzzing)
# Env: KILN_SKIP_FUZZ=1 skips the fuzz runs.
set -euo pipefail
# The tests labelled long are left out unless asked for (README, "Tests").
select=(-LE long)
if [ "${1:-}" = --long ]; then
  select=()
  shift
fi
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"

kiln_apt_install "${KILN_BUILD_PACKAGES[@]}" "${KILN_TEST_PACKAGES[@]}" "${KILN_FUZZ_PACKAGES[@]}" \
  "${KILN_SLURM_PACKAGES[@]}"
kiln_ensure_node
kiln_build
kiln_link_bin
cd "$KILN_BUILD"
# One test at a time: each uses both cores (OMP_NUM_THREADS=2, or 2 MPI ranks).
ctest --output-on-failure --no-tests=error "${select[@]}" "$@"
# ctest shows no output of a skipped test: print the reason each one gave (a line
# "SKIPPED...", or one ending in ": skipped").
grep -hE "^SKIPPED|: skipped$" Testing/Temporary/LastTest.log 2>/dev/null | sed 's/^/kiln: skipped test: /' || true
if [ $# -eq 0 ] && [ "${KILN_SKIP_FUZZ:-0}" != 1 ]; then
  bash "$KILN_ROOT/scripts/fuzz.sh" 5
fi
