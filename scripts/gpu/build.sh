# Sourced by scripts/gpu-check.sh (needs root, build, out, nvcc_bin): the deps, configure
# and build phases on the GPU machine, which has the CUDA toolkit, cmake, ninja and gcc
# but none of kiln's Debian libraries and no apt. (Each phase runs as `bash -c`, without
# the caller's `set -e`: every step checks its own status.)

prefix="$root/.deps/prefix"
export root build out prefix nvcc_bin

# The .debs of scripts/gpu/fetch-debs.sh unpacked with `dpkg -x` into .deps/prefix
# (never /), once per machine; their pkg-config files pointed at the prefix.
unpack_debs() {
  [ -f "$prefix/.unpacked" ] && { echo "deps: $prefix already unpacked"; return 0; }
  rm -rf "$prefix" && mkdir -p "$prefix"
  local f
  for f in "$root"/.deps/debs/*.deb; do dpkg -x "$f" "$prefix" || return 1; done
  find "$prefix" -name '*.pc' -exec sed -i "s|^prefix=/usr|prefix=$prefix/usr|" {} +
  touch "$prefix/.unpacked"
  echo "deps: $(ls "$root"/.deps/debs/*.deb | wc -l) .debs unpacked into $prefix"
}

# CMake, pkg-config, the compiler and the loader look in the prefix.
use_prefix() {
  local multi="$prefix/usr/lib/x86_64-linux-gnu"
  export CMAKE_PREFIX_PATH="$prefix/usr:$multi/cmake${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  export PKG_CONFIG_PATH="$multi/pkgconfig:$prefix/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
  export LD_LIBRARY_PATH="$multi${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export LIBRARY_PATH="$multi${LIBRARY_PATH:+:$LIBRARY_PATH}"
  export CPATH="$prefix/usr/include${CPATH:+:$CPATH}"
  # NCCL: the toolkit's when present, else the one inside PyTorch's nvidia-nccl wheel.
  nccl_flags=()
  if [ ! -e "$(dirname "$nvcc_bin")/../include/nccl.h" ]; then
    local home
    home="$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null || true)"
    if [ -n "$home" ] && [ -f "$home/include/nccl.h" ] && ls "$home"/lib/libnccl.so* >/dev/null 2>&1; then
      nccl_flags=("-DKILN_NCCL_INCLUDE_DIR=$home/include" "-DKILN_NCCL_LIBRARY=$(ls "$home"/lib/libnccl.so* | head -n 1)")
      export LD_LIBRARY_PATH="$home/lib:$LD_LIBRARY_PATH"
    fi
  fi
  export KILN_GPU_NCCL_FLAGS="${nccl_flags[*]}"  # (no spaces inside: paths of the wheel)
}

# kiln itself, with the CUDA backend and without Google Benchmark (bench/gpu's programs
# build whenever the CUDA backend does).
configure_kiln() {
  # shellcheck disable=SC2086  # KILN_GPU_NCCL_FLAGS: words on purpose
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_BUILD_BENCH=OFF \
    -DKILN_CUDA=ON "-DKILN_CUDA_ARCHS=${GPU_CHECK_ARCHS:-90}" "-DCMAKE_CUDA_COMPILER=$nvcc_bin" \
    -DICU_ROOT="$prefix/usr" -DZLIB_ROOT="$prefix/usr" $KILN_GPU_NCCL_FLAGS
}

# What the later phases run; the NCCL test when NCCL was found.
build_kiln() {
  local targets=(kiln backend_op_test backend_op_support_test kiln_gpu_step kiln_gpu_bf16)
  # (Not `ninja -t targets | grep -q`: grep exits at the first match, ninja gets SIGPIPE,
  # and pipefail turns the match into a failure.)
  local all
  all="$(ninja -C "$build" -t targets all 2>/dev/null || true)"
  grep -q '^nccl_communicator_test:' <<<"$all" && targets+=(nccl_communicator_test)
  ninja -C "$build" -j "${GPU_CHECK_JOBS:-$(nproc)}" "${targets[@]}"
}
export -f unpack_debs configure_kiln build_kiln
