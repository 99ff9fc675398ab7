#!/usr/bin/env bash
# Builds the `kiln` program alone (no tests, benchmarks or CUDA) and links it as bin/kiln
# in the checkout: afterwards `bin/kiln --help`, or `export PATH="$PWD/bin:$PATH"` and
# `kiln --help`. Installs missing Debian packages. Idempotent; works from any directory.
# The build goes to $KILN_BUILD_DIR (default build-app/). A first build takes about 10-15
# minutes on 2 cores without a compiler cache, a few with a warm one.
#   scripts/build.sh                    build, then link bin/kiln
#   scripts/build.sh --prefix DIR       also install it as DIR/bin/kiln (cmake --install)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
prefix=""
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) [ $# -ge 2 ] || { echo "build.sh: --prefix needs a directory" >&2; exit 2; }
              prefix="$2"; shift ;;
    --prefix=*) prefix="${1#--prefix=}" ;;
    *) echo "build.sh: unknown argument '$1' (use --prefix DIR)" >&2; exit 2 ;;
  esac
  shift
done
kiln_apt_install "${KILN_BUILD_PACKAGES[@]}"
KILN_BUILD="${KILN_BUILD_DIR:-$KILN_ROOT/build-app}"
kiln_build -DKILN_BUILD_TESTS=OFF -DKILN_BUILD_BENCH=OFF -DKILN_CUDA=OFF
kiln_link_bin
if [ -n "$prefix" ]; then
  cmake --install "$KILN_BUILD" --prefix "$prefix" >/dev/null
  echo "kiln: installed $prefix/bin/kiln"
fi
