#!/usr/bin/env bash
# Configure, build and run every test with ctest. Installs missing Debian packages.
# Idempotent; works from any directory. The build goes to $KILN_BUILD_DIR (default build/).
#   scripts/test.sh                 everything
#   scripts/test.sh -R golden       only tests matching a regex (extra args go to ctest)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"

kiln_apt_install "${KILN_BUILD_PACKAGES[@]}" "${KILN_TEST_PACKAGES[@]}"
kiln_ensure_node
kiln_build
cd "$KILN_BUILD"
# One test at a time: each uses both cores (OMP_NUM_THREADS=2, or 2 MPI ranks).
ctest --output-on-failure --no-tests=error "$@"
