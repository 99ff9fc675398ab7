#!/usr/bin/env bash
# Downloads (here, on a Debian bookworm machine with apt) the .deb files that building
# kiln needs beyond what the GPU machine has (CUDA toolkit, cmake, ninja, gcc, python3
# with PyTorch): oneDNN, fmt, toml++, nlohmann-json, CLI11, sentencepiece, ICU, zlib,
# zstd, libpng, GoogleTest and their runtime libraries. They land in .deps/debs (ignored by git);
# scripts/gpu-check.sh unpacks them with `dpkg -x` into .deps/prefix on the GPU machine,
# never into /.
#
# Run this BEFORE a device session, then pass `.deps/debs` in the run's carry list.
# Usage: scripts/gpu/fetch-debs.sh            (idempotent; about 25 MB)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
dest="$root/.deps/debs"
mkdir -p "$dest"

packages=(
  libdnnl-dev libdnnl2 ocl-icd-libopencl1 ocl-icd-opencl-dev opencl-c-headers
  libfmt-dev libfmt9
  libtomlplusplus-dev libtomlplusplus3
  nlohmann-json3-dev
  libcli11-dev
  libsentencepiece-dev libsentencepiece0
  libicu-dev libicu72
  zlib1g-dev zlib1g
  libzstd-dev libzstd1
  libpng-dev libpng16-16
  libgtest-dev
)

cd "$dest"
missing=()
for p in "${packages[@]}"; do
  if ! ls "${p}"_*.deb >/dev/null 2>&1; then missing+=("$p"); fi
done
if ((${#missing[@]})); then
  echo "fetch-debs: downloading ${missing[*]}"
  apt-get download "${missing[@]}"
fi
echo "fetch-debs: $(ls "$dest"/*.deb | wc -l) packages, $(du -sh "$dest" | cut -f1) in $dest"
