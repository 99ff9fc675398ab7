#!/usr/bin/env bash
# gpu-check.sh: everything kiln checks on a GPU, as one prepared script for a machine
# with one NVIDIA GPU, the CUDA toolkit, cmake, ninja, gcc and python3 with PyTorch, but
# no apt, no MPI and no network. Within about 8 minutes it
#   1. unpacks the build dependencies (Debian .debs fetched beforehand, here, by
#      scripts/gpu/fetch-debs.sh into .deps/debs) with `dpkg -x` into .deps/prefix;
#   2. builds kiln (KILN_CUDA=ON) through the wrapper project bench/gpu (kiln + the
#      kiln_gpu_step benchmark) in build-gpu/;
#   3. runs every GPU test with ctest (labels backend and gpu: the cross-backend op test,
#      which now includes the cuda backend, and the NCCL communicator test);
#   3b. runs the trainer on the GPU (scripts/gpu/train-check.sh: `kiln train` with
#      train.device = cuda on the demo config in bf16 and the KJV shards carried from the
#      build machine, its val loss next to the CPU's for the same steps, each device's
#      checkpoint resumed on both devices); skipped when data/kjv was not carried;
#   3c. runs the mixture-of-experts model on the GPU (scripts/gpu/moe-check.sh, about a
#      minute: `kiln train` of configs/demo-moe.toml on cuda and on the CPU for 30
#      updates, fp32 dropless and bf16 with token dropping, val losses side by side; the
#      MoE ops' own cases run in step 3's op test); skipped without data/kjv;
#   4. benchmarks one GPT-2 124M training step (T=1024, micro batch 16 or the largest
#      that fits) in kiln (bench/gpu/kiln_gpu_step: bf16 parameters and activations,
#      fp32 gradients and master weights; GPU_CHECK_KILN_FP32=1: the fp32 model with TF32
#      GEMMs instead) and in PyTorch (bench/gpu/torch_gpt2.py: torch.compile, bf16 autocast,
#      fused AdamW), and prints tokens/s, MFU against a bf16 GEMM peak measured in the
#      same run, and the kiln/PyTorch ratio, ending with a short table.
#
# On the device tool:  run(command="bash scripts/gpu-check.sh", carry=[".deps/debs", "data/kjv"],
#                          timeout_s=540)
# (data/kjv: prepared here by scripts/demo.sh, about 3 MB.)
# Logs and the JSON results go to $OUT (or build-gpu/gpu-check/ when OUT is unset).
# Env: GPU_CHECK_JOBS (build jobs, default nproc), GPU_CHECK_SKIP_TORCH=1,
#      GPU_CHECK_ARCHS (default 90), GPU_CHECK_B (default 16), GPU_CHECK_STEPS (30: the median of that many steps),
#      GPU_CHECK_TRAIN_STEPS (the trainer check's updates, default 100),
#      GPU_CHECK_MOE_STEPS (the MoE check's updates, default 30; 0 skips it),
#      GPU_CHECK_VARIANTS / GPU_CHECK_VARIANT_STEPS (the switchable changes measured one
#      by one after the benchmark, 15 steps each; 0 steps skips them; see 4a below),
#      GPU_CHECK_KILN_FP32=1 (kiln's fp32 model instead of bf16), GPU_CHECK_DRY=1 (no GPU needed: unpack, configure and build only; for checking
#      the script on the build machine before a device session).
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
out="${OUT:-$root/build-gpu/gpu-check}"
mkdir -p "$out"
log="$out/gpu-check.log"
: >"$log"
t_start=$(date +%s)
jobs="${GPU_CHECK_JOBS:-$(nproc)}"
archs="${GPU_CHECK_ARCHS:-90}"
B="${GPU_CHECK_B:-16}"
steps="${GPU_CHECK_STEPS:-30}"
status_build=skipped status_tests=skipped status_kiln=skipped status_torch=skipped
status_trainer=skipped status_moe=skipped

say() { echo "[gpu-check $(($(date +%s) - t_start))s] $*" | tee -a "$log"; }
die() { say "FAILED: $*"; exit 1; }
# phase NAME SECONDS CMD...: runs CMD with a time limit, output to the log and a file.
phase() {
  local name=$1 limit=$2
  shift 2
  say "phase $name (limit ${limit}s): $*"
  local rc=0
  timeout --kill-after=10 "$limit" "$@" >"$out/$name.log" 2>&1 || rc=$?
  tail -n 25 "$out/$name.log" | sed "s/^/  [$name] /" | tee -a "$log"
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then say "phase $name TIMED OUT after ${limit}s"; fi
  return "$rc"
}

# ---- 0. the machine --------------------------------------------------------------------
dry="${GPU_CHECK_DRY:-0}"
if [ "$dry" != 1 ]; then
  command -v nvidia-smi >/dev/null || die "nvidia-smi not found: no GPU driver here"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$log"
fi
nvcc_bin="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
[ -x "$nvcc_bin" ] || die "nvcc not found (PATH or /usr/local/cuda/bin)"
"$nvcc_bin" --version | tail -n 2 | tee -a "$log"
command -v cmake >/dev/null || die "cmake not found"
command -v ninja >/dev/null || die "ninja not found"
debs="$root/.deps/debs"
ls "$debs"/*.deb >/dev/null 2>&1 ||
  die "no .debs in $debs: run scripts/gpu/fetch-debs.sh on the build machine first and carry .deps/debs"

# ---- 1. dependencies -------------------------------------------------------------------
prefix="$root/.deps/prefix"
if [ ! -f "$prefix/.unpacked" ]; then
  say "unpacking $(ls "$debs"/*.deb | wc -l) .debs into $prefix"
  rm -rf "$prefix" && mkdir -p "$prefix"
  for f in "$debs"/*.deb; do dpkg -x "$f" "$prefix"; done
  # pkg-config files name /usr: point them at the prefix.
  find "$prefix" -name '*.pc' -exec sed -i "s|^prefix=/usr|prefix=$prefix/usr|" {} +
  touch "$prefix/.unpacked"
fi
multi="$prefix/usr/lib/x86_64-linux-gnu"
export CMAKE_PREFIX_PATH="$prefix/usr:$multi/cmake${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
export PKG_CONFIG_PATH="$multi/pkgconfig:$prefix/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
export LD_LIBRARY_PATH="$multi${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LIBRARY_PATH="$multi${LIBRARY_PATH:+:$LIBRARY_PATH}"
export CPATH="$prefix/usr/include${CPATH:+:$CPATH}"

# ---- 2. build ----------------------------------------------------------------------------
build="$root/build-gpu"
cfg=(cmake -S "$root/bench/gpu" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
     -DKILN_BUILD_BENCH=OFF -DKILN_CUDA=ON "-DKILN_CUDA_ARCHS=$archs"
     "-DCMAKE_CUDA_COMPILER=$nvcc_bin" -DICU_ROOT="$prefix/usr" -DZLIB_ROOT="$prefix/usr")
# NCCL: the toolkit's when present, else the one inside PyTorch's nvidia-nccl wheel.
if [ ! -e "$(dirname "$nvcc_bin")/../include/nccl.h" ]; then
  nccl_home="$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null || true)"
  if [ -n "$nccl_home" ] && [ -f "$nccl_home/include/nccl.h" ] && ls "$nccl_home"/lib/libnccl.so* >/dev/null 2>&1; then
    say "NCCL from $nccl_home"
    cfg+=("-DKILN_NCCL_INCLUDE_DIR=$nccl_home/include" "-DKILN_NCCL_LIBRARY=$(ls "$nccl_home"/lib/libnccl.so* | head -n 1)")
    export LD_LIBRARY_PATH="$nccl_home/lib:$LD_LIBRARY_PATH"
  fi
fi
if phase configure 90 "${cfg[@]}"; then :; else die "configure (see $out/configure.log)"; fi
targets=(backend_op_test kiln_gpu_step kiln_gpu_bf16 kiln)
# (Not `ninja ... | grep -q`: grep exits at the first match, ninja gets SIGPIPE, and
# pipefail turns the match into a failure.)
all_targets="$(ninja -C "$build" -t targets all 2>/dev/null || true)"
if grep -q '^nccl_communicator_test:' <<<"$all_targets"; then
  targets+=(nccl_communicator_test)
fi
cat "$out/configure.log" >>"$build/configure.log" && rm -f "$out/configure.log"  # 8-file limit
if phase build 300 ninja -C "$build" -j "$jobs" "${targets[@]}"; then
  status_build=ok
else
  status_build=FAILED
  die "build (see $out/build.log)"
fi
if [ "$dry" = 1 ]; then
  say "dry run: built ${targets[*]}; stopping before the GPU phases"
  exit 0
fi

# ---- 3. GPU tests ------------------------------------------------------------------------
# -V: every test's output (the per-op lines of the cuda backend), not only failures'.
if phase tests 100 ctest --test-dir "$build" -L 'backend|gpu' -V --timeout 80; then
  status_tests=ok
else
  status_tests=FAILED
fi
grep -E "SKIPPED|FAILED|BACKEND|Worst|cuda: " "$out/tests.log" | head -n 80 >>"$log" || true
# The bf16 paths (the op test checks fp32): bf16 against fp32 on the GPU.
status_bf16=FAILED
if phase bf16 60 "$build/kiln_gpu_bf16"; then status_bf16=ok; fi

# ---- 3b. the trainer on the GPU ----------------------------------------------------------
if [ -f "$root/data/kjv/meta.json" ]; then
  if phase trainer 240 bash "$root/scripts/gpu/train-check.sh" "$build/kiln/apps/kiln/kiln" \
       "$build/train-check" "${GPU_CHECK_TRAIN_STEPS:-100}"; then
    status_trainer=ok
  else
    status_trainer=FAILED
  fi
  grep "^train-check:" "$out/trainer.log" >>"$log" || true
else
  say "trainer check skipped: data/kjv was not carried (run scripts/demo.sh here first)"
fi

# ---- 3c. the mixture-of-experts model on the GPU --------------------------------------
moe_steps="${GPU_CHECK_MOE_STEPS:-30}"
if [ -f "$root/data/kjv/meta.json" ] && [ "$moe_steps" -gt 0 ]; then
  if phase moe 90 bash "$root/scripts/gpu/moe-check.sh" "$build/kiln/apps/kiln/kiln" \
       "$build/moe-check" "$moe_steps"; then
    status_moe=ok
  else
    status_moe=FAILED
  fi
  grep "^moe-check:" "$out/moe.log" >>"$log" || true
  # (moe.log moves to build-gpu/, the device tool returning at most 8 files: its last
  # lines and the moe-check lines are in gpu-check.log.)
  cat "$out/moe.log" >>"$build/moe-check.log" && rm -f "$out/moe.log"
fi

# ---- 4. benchmarks -----------------------------------------------------------------------
kiln_json="" torch_json=""
kiln_dtype=()
if [ "${GPU_CHECK_KILN_FP32:-0}" = 1 ]; then kiln_dtype=(--fp32); fi
# (backend.tf32 only matters for fp32 GEMMs: the --fp32 model, the fp32 peak.)
if phase kiln_bench 120 "$build/kiln_gpu_step" --B "$B" --T 1024 --steps "$steps" --warmup 3 --profile 2 --repeat "${kiln_dtype[@]}" --set backend.tf32=true; then
  kiln_json="$(grep '^{' "$out/kiln_bench.log" | tail -n 1)"
  status_kiln=ok
else
  status_kiln=FAILED
fi
if [ "${GPU_CHECK_SKIP_TORCH:-0}" != 1 ]; then
  if PYTHONUNBUFFERED=1 phase torch_bench 200 python3 "$root/bench/gpu/torch_gpt2.py" --B "$B" --T 1024 --steps "$steps" --warmup 3 --profile 2; then
    torch_json="$(grep '^{' "$out/torch_bench.log" | tail -n 1)"
    status_torch=ok
  else
    status_torch=FAILED
  fi
fi
# ---- 4a. variants: each switchable change on or off, one short run each ---------------
# GPU_CHECK_VARIANTS: "name:WORD WORD...;name2:..." where each WORD is a config key for
# kiln_gpu_step's --set (section.key=value) or, in capitals, an environment variable
# (NAME=value: only KILN_CUDA_GEMM_CACHE, a process-level cache); nothing = the defaults.
# The two tuned runs share a cache file: the second reads the first's choices, and the
# two must give the same loss bits (item 5). Logs in build-gpu/ (the 8-file limit of
# $OUT), one summary line each in gpu-check.log.
gemm_cache="$build/gemm-cache.txt"
rm -f "$gemm_cache"
variants="${GPU_CHECK_VARIANTS:-base:;chunk256:train.classifier_chunk_mb=256;chunk4096:train.classifier_chunk_mb=4096;per_tensor_adamw:optim.multi_tensor=false;tune:backend.gemm_tuning=true KILN_CUDA_GEMM_CACHE=$gemm_cache;tune_again:backend.gemm_tuning=true KILN_CUDA_GEMM_CACHE=$gemm_cache}"
if [ "$status_kiln" = ok ] && [ "${GPU_CHECK_VARIANT_STEPS:-15}" -gt 0 ]; then
  IFS=';' read -ra vlist <<<"$variants"
  for v in "${vlist[@]}"; do
    vname=${v%%:*} venv=${v#*:}
    vlog="$build/variant-$vname.log"
    vvars=() vsets=()
    for word in $venv; do  # split on spaces on purpose
      case $word in
        [A-Z]*=*) vvars+=("$word") ;;
        *) vsets+=(--set "$word") ;;
      esac
    done
    if timeout --kill-after=5 60 env "${vvars[@]}" "$build/kiln_gpu_step" --B "$B" --T 1024 \
         --steps "${GPU_CHECK_VARIANT_STEPS:-15}" --warmup 3 "${kiln_dtype[@]}" "${vsets[@]}" >"$vlog" 2>&1; then
      say "variant $vname ($venv): $(grep '^{' "$vlog" | tail -n 1 | python3 -c 'import json,sys; r=json.loads(sys.stdin.read()); print("%.2f ms/step, %.0f tokens/s, MFU %.1f%%, loss %r" % (r["ms_per_step"], r["tokens_per_s"], 100*r["mfu"], r["loss_exact"]))')"
    else
      say "variant $vname ($venv): FAILED: $(tail -n 2 "$vlog" | tr '\n' ' ')"
    fi
  done
fi

# (No JSON files in $OUT: the device tool returns at most 8 files; the lines are in the logs.)
echo "$kiln_json" >"$build/kiln.json"
echo "$torch_json" >"$build/torch.json"

# ---- 4b. memcheck of the cuda op tests (last: slow, and the benchmarks come first) ------
status_sanitize=skipped
sanitizer="$(command -v compute-sanitizer || echo "$(dirname "$nvcc_bin")/compute-sanitizer")"
# memcheck of the op test (cuda cases) and of the bf16 check; racecheck and synccheck of
# the op test. One log (the device tool returns at most 8 files).
sanitize_all() {
  local rc=0 r spec tool filter
  # memcheck first (the cheapest, and the one that has found a bug); racecheck last and
  # without the Linear cases (cuBLASLt's kernels, slow under racecheck, not kiln's).
  for spec in 'memcheck:*cuda*' 'synccheck:*cuda*' 'racecheck:*cuda*:-*Linear*'; do
    tool=${spec%%:*} filter=${spec#*:}
    if [ "$tool" = synccheck ]; then  # (after memcheck, before racecheck: the bf16 check)
      echo "=== memcheck: kiln_gpu_bf16"
      r=0
      "$sanitizer" --tool memcheck --error-exitcode 3 "$build/kiln_gpu_bf16" || r=$?
      echo "=== memcheck (bf16) exit status $r"
      [ "$r" = 0 ] || rc=1
    fi
    echo "=== $tool: backend_op_test --gtest_filter=$filter"
    r=0
    "$sanitizer" --tool "$tool" --error-exitcode 3 "$build/kiln/tests/backend/backend_op_test" \
      "--gtest_filter=$filter" >"$build/san-$tool.txt" 2>&1 || r=$?
    grep -vE '^\[ +(RUN|OK) +\]|^  cuda: ' "$build/san-$tool.txt" || true
    echo "=== $tool exit status $r"
    [ "$r" = 0 ] || rc=1
  done
  return "$rc"
}
export -f sanitize_all
export sanitizer build
if [ "${GPU_CHECK_SANITIZE:-1}" = 1 ] && [ -x "$sanitizer" ]; then
  if phase sanitize 240 bash -c sanitize_all; then
    status_sanitize=ok
  else
    status_sanitize=FAILED
  fi
  grep -E "^=== |ERROR SUMMARY|RACECHECK SUMMARY|Invalid|out of bounds|hazard|PASSED|FAILED|bf16 check" "$out/sanitize.log" | head -n 40 >>"$log" || true
fi

# ---- 5. the table ------------------------------------------------------------------------
python3 - "$kiln_json" "$torch_json" <<'PY' | tee -a "$log"
import json, sys
rows = [json.loads(s) for s in sys.argv[1:] if s.strip()]
print()
print("GPT-2 124M training step, T=1024 (MFU against the bf16 GEMM peak measured in the run)")
print(f"{'impl':8} {'dtype':18} {'B':>3} {'ms/step':>9} {'tokens/s':>10} {'TFLOP/s':>8} {'MFU':>6} {'peak bf16':>9} {'loss':>7} {'GiB':>6}")
for r in rows:
    print(f"{r['impl']:8} {r['dtype']:18} {r['B']:>3} {r['ms_per_step']:>9.1f} {r['tokens_per_s']:>10.0f} "
          f"{r['model_tflops']:>8.1f} {100*r['mfu']:>5.1f}% {r['peak_bf16_tflops']:>9.0f} {r['loss']:>7.3f} {r['peak_gib']:>6.1f}")
k = [r for r in rows if r["impl"] == "kiln"]
t = [r for r in rows if r["impl"] == "pytorch"]
if k and t:
    print(f"kiln / PyTorch tokens/s: {k[0]['tokens_per_s'] / t[0]['tokens_per_s']:.3f}")
PY
say "build $status_build | tests $status_tests | bf16 $status_bf16 | trainer $status_trainer | moe $status_moe | kiln bench $status_kiln | torch bench $status_torch | memcheck $status_sanitize | total $(($(date +%s) - t_start))s"
[ "$status_tests" = ok ] && [ "$status_kiln" = ok ] || exit 1
