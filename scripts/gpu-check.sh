#!/usr/bin/env bash
# gpu-check.sh: everything kiln checks on a GPU, as one prepared run that fits the device
# lease (15 minutes of device time per session, the machine's start included): the full
# run within 5 minutes on an H200 including its build, --quick within 2.5. For a machine
# with one NVIDIA GPU, the CUDA toolkit, cmake, ninja, gcc and python3 with PyTorch, but
# no apt, no MPI and no network.
#
#   scripts/gpu-check.sh [--quick] [--moe] [--mmdit] [--sanitize] [--plan] [--fp32]
#                        [--no-torch] [--require-gpu] [--cap SECONDS] [--prebuilt BUILD_DIR]
#
# Phases, with the seconds each is given on the H200 (docs/cuda.md, "Running the GPU
# check", says where the figures come from):
#   machine    nvidia-smi, nvcc, cmake, ninja; is a GPU visible?
#   deps       the .debs of scripts/gpu/fetch-debs.sh (carried as .deps/debs), unpacked
#              with `dpkg -x` into .deps/prefix (never /)                             5
#   configure  kiln itself (KILN_CUDA=ON, KILN_BUILD_BENCH=OFF) in build-gpu/          10
#   build      kiln, the op harness, kiln_gpu_step, kiln_gpu_bf16, the NCCL test       85
#   -- without a GPU the run ends here, with one line "gpu-check: skipped: ..." (exit 0;
#      --require-gpu: exit 1)
#   ops        the op harness: backend_op_test (every op's cases on cpu and cuda, fp32
#              and bf16), backend_op_support_test, nccl_communicator_test, and
#              kiln_gpu_bf16 (the bf16 paths against fp32)                             15
#   trainer    scripts/gpu/train-check.sh: `kiln train` on cuda and on the CPU, losses
#              side by side, each checkpoint resumed on both devices (100 updates;
#              --quick: 30)                                                         45/20
#   bench      kiln_gpu_step, GPT-2 124M at T=1024, B=16 (full: 30 steps, --repeat,
#              --profile 2 with the per-kind table; --quick: one line of 10 steps)  25/10
#   torch      bench/gpu/torch_gpt2.py side by side: torch.compile, bf16 autocast
#              (full only; --no-torch skips it)                                        50
#   variants   every switch alone, a short kiln_gpu_step run each, fp8 (tensorwise and
#              delayed) among them (full only; scripts/gpu/variants.sh)               54
#   moe        --moe: scripts/gpu/moe-check.sh (the mixture-of-experts trainer)        70
#   mmdit      --mmdit: scripts/gpu/mmdit-check.sh (the text-to-image trainer, its
#              frozen Llama encoder, sample-images; generated data, none carried)     40
#   sanitize   --sanitize: compute-sanitizer over the op harness (scripts/gpu/sanitize.sh) 120
#   plan       --plan: kiln plan's single-GPU choices for GPT-2 XL (micro batch 2/4/8 x
#              checkpointing none/full) against measured steps, after calibrating the GPU
#              (scripts/gpu/plan-check.sh; docs/plan.md)                                90
# A phase after the build starts only if its figure fits in what is left of the cap
# (300 s, --quick 150, plus 70 for --moe, 40 for --mmdit, 120 for --sanitize, 90 for --plan;
# --cap sets it), and runs
# under a timeout of what is left, so the run outlasts the cap by at most the 10 s grace
# of a killed phase and the summary; a phase that does not fit is reported as skipped.
# MFU of every run is against one measured peak: the bf16 GEMM rate that the bench
# phase's kiln_gpu_step measures (8192^3 through the backend's linear_forward), given to
# the variants and to PyTorch with --peak-tflops.
#
# --fp32: kiln's fp32 model (TF32 GEMMs) instead of bf16. --prebuilt DIR: an existing
# kiln build with CUDA (no deps, configure or build phases; what tests/gpu does here; a
# rerun on the GPU machine may pass build-gpu). --require-gpu: no visible GPU is a
# failure (exit 1), not a skip: what the device tool's runs pass.
# Env: GPU_CHECK_JOBS (build jobs, default nproc), GPU_CHECK_ARCHS (default 90),
#      GPU_CHECK_VARIANTS (scripts/gpu/variants.sh's list).
# On the device tool: run(command="bash scripts/gpu-check.sh --require-gpu",
# carry=[".deps/debs", "data/kjv"], timeout_s=380) (--quick: timeout_s=230; with
# --moe/--mmdit/--sanitize: the cap + 80). data/kjv: the demo's prepared shards (scripts/demo.sh
# here; about 3 MB), for the trainer phases.
# Output in $OUT (or build-gpu/gpu-check/): gpu-check.log (each phase's end and the
# tables), gpu-check.json (the summary: scripts/gpu/summary.py) and the phase logs
# build.log, ops.log (+ sanitize), trainer.log (+ moe, mmdit), bench.log (+ variants) and
# torch.log: at most 7 files (the device tool returns 8).
# Exit status: 0 when every phase ran and passed, or when no GPU is visible (skipped);
# 1 when a phase failed, timed out or was skipped (result "incomplete": the cap, or no
# data/kjv); 2 for bad arguments or a machine that lacks a tool.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
usage_error() {  # one line: what is wrong, then the usage
  echo "gpu-check: $1 (usage: scripts/gpu-check.sh [--quick] [--moe] [--mmdit] [--sanitize] [--plan] [--fp32] [--no-torch] [--require-gpu] [--cap SECONDS] [--prebuilt BUILD_DIR])" >&2
  exit 2
}
mode=full moe=0 mmdit=0 sanitize=0 plan=0 fp32=0 torch=1 require_gpu=0 cap="" prebuilt=""
while [ $# -gt 0 ]; do
  case $1 in
    --quick) mode=quick ;;
    --moe) moe=1 ;;
    --mmdit) mmdit=1 ;;
    --sanitize) sanitize=1 ;;
    --plan) plan=1 ;;
    --fp32) fp32=1 ;;
    --no-torch) torch=0 ;;
    --require-gpu) require_gpu=1 ;;
    --cap) [ $# -ge 2 ] || usage_error "--cap needs a value"; cap=$2; shift ;;
    --prebuilt)
      [ $# -ge 2 ] || usage_error "--prebuilt needs a value"
      prebuilt=$(cd "$2" 2>/dev/null && pwd) || { echo "gpu-check: --prebuilt '$2': no such folder" >&2; exit 2; }
      shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) usage_error "unknown argument '$1'" ;;
  esac
  shift
done
if [ -z "$cap" ]; then
  cap=$([ "$mode" = quick ] && echo 150 || echo 300)
  cap=$((cap + 70 * moe + 40 * mmdit + 120 * sanitize + 90 * plan))
fi
[[ "$cap" =~ ^[0-9]+$ ]] || { echo "gpu-check: --cap '$cap': expected whole seconds" >&2; exit 2; }
for f in apps/kiln/kiln tests/backend/backend_op_test bench/gpu/kiln_gpu_step bench/gpu/kiln_gpu_bf16; do
  [ -z "$prebuilt" ] || [ -x "$prebuilt/$f" ] ||
    { echo "gpu-check: --prebuilt $prebuilt has no $f (a kiln build with the CUDA backend)" >&2; exit 2; }
done

build="${prebuilt:-$root/build-gpu}"
out="${OUT:-$build/gpu-check}"
mkdir -p "$out"
export root build out
log="$out/gpu-check.log"
rm -f "$out"/{build,ops,trainer,bench,torch}.log "$out/gpu-check.json"
: >"$log"
t_start=$(date +%s)
deadline=$((t_start + cap))
records=()  # "name:status:seconds" for the summary (status ok, FAILED, TIMEOUT, skipped, prebuilt)

say() { echo "[gpu-check $(($(date +%s) - t_start))s] $*" | tee -a "$log"; }
phase_pid=""
stop() {  # a signal: the running phase stops with the script
  [ -z "$phase_pid" ] || kill -TERM "$phase_pid" 2>/dev/null || true
  say "stopped by a signal"
  exit 143
}
trap stop TERM INT HUP
fail_machine() { say "FAILED: $*"; exit 2; }

# phase NAME SECONDS LOG CMD...: runs CMD if SECONDS (its figure above) fit in what is
# left of the cap, under a timeout of what is left; its output is appended to $out/LOG
# and its end to gpu-check.log. CMD may be an exported function. Returns 0 if it passed,
# 1 if it failed or timed out, 3 if it was skipped.
phase() {
  local name=$1 need=$2 logf=$out/$3
  shift 3
  local left=$((deadline - $(date +%s)))
  if [ "$left" -lt "$need" ] || [ "$left" -le 0 ]; then
    say "phase $name skipped: it needs about ${need}s, ${left}s are left of the ${cap}s cap"
    records+=("$name:skipped:0")
    return 3
  fi
  say "phase $name (${left}s left): $*"
  echo "=== $name: $*" >>"$logf"
  local t0 rc=0 status=ok
  t0=$(date +%s)
  # In the background and waited for, so that a signal to this script (Ctrl-C, the
  # device tool's time limit) reaches the trap below, which stops the phase too: timeout
  # passes the signal on to the phase's whole process group.
  timeout --kill-after=10 "$left" bash -c '"$@"' _ "$@" >>"$logf" 2>&1 &
  phase_pid=$!
  wait "$phase_pid" || rc=$?
  phase_pid=""
  [ "$rc" = 0 ] || status=FAILED
  { [ "$rc" = 124 ] || [ "$rc" = 137 ]; } && status=TIMEOUT
  tail -n 12 "$logf" | sed "s/^/  [$name] /" >>"$log"
  records+=("$name:$status:$(($(date +%s) - t0))")
  say "phase $name: $status in $(($(date +%s) - t0))s"
  [ "$status" = ok ]
}

# finish RESULT: the summary (tables on stdout and in gpu-check.log, gpu-check.json).
finish() {
  local args=(--out "$out" --mode "$mode" --cap "$cap" --result "$1" --seconds "$(($(date +%s) - t_start))"
              --device "$device")
  for r in "${records[@]}"; do args+=(--phase "$r"); done
  python3 "$root/scripts/gpu/summary.py" "${args[@]}" | tee -a "$log"
}

# ---- the machine -------------------------------------------------------------------------
device="none"
# (The listing first, then grep: `nvidia-smi -L | grep -q` under pipefail fails when grep
# exits at its first match and nvidia-smi gets SIGPIPE.)
gpus="$(nvidia-smi -L 2>/dev/null || true)"
if grep -q '^GPU ' <<<"$gpus"; then
  device="$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true)"
  device="${device%%$'\n'*}"
  [ -n "$device" ] || device="$(grep -m 1 '^GPU ' <<<"$gpus")"
fi
say "device: $device; mode $mode, cap ${cap}s"
command -v python3 >/dev/null || fail_machine "python3 not found"
if [ -n "$prebuilt" ]; then
  records+=("deps:prebuilt:0" "configure:prebuilt:0" "build:prebuilt:0")
  # A rerun on the GPU machine: the libraries unpacked by the first run, on the loader's path.
  if [ -f "$root/.deps/prefix/.unpacked" ]; then
    nvcc_bin="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
    source "$root/scripts/gpu/build.sh"
    use_prefix
  fi
else
  nvcc_bin="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
  [ -x "$nvcc_bin" ] || fail_machine "nvcc not found (PATH or /usr/local/cuda/bin)"
  command -v cmake >/dev/null || fail_machine "cmake not found"
  command -v ninja >/dev/null || fail_machine "ninja not found"
  ls "$root"/.deps/debs/*.deb >/dev/null 2>&1 ||
    fail_machine "no .debs in .deps/debs: run scripts/gpu/fetch-debs.sh on the build machine and carry .deps/debs"
  say "$("$nvcc_bin" --version | tail -n 1)"
  # ---- deps, configure, build ------------------------------------------------------------
  source "$root/scripts/gpu/build.sh"
  phase deps 0 build.log unpack_debs || { finish FAILED; exit 1; }
  use_prefix
  phase configure 0 build.log configure_kiln || { finish FAILED; exit 1; }
  phase build 0 build.log build_kiln || { finish FAILED; exit 1; }
fi
kiln="$build/apps/kiln/kiln"
step="$build/bench/gpu/kiln_gpu_step"
if [ "$device" = none ] && [ "$require_gpu" = 1 ]; then
  say "FAILED: no GPU visible (nvidia-smi -L lists none) and --require-gpu was given"
  finish FAILED >/dev/null
  exit 1
fi
if [ "$device" = none ]; then
  finish skipped >/dev/null
  echo "gpu-check: skipped: no GPU visible (nvidia-smi -L lists none); ran up to the first device step in $(($(date +%s) - t_start))s, summary in $out/gpu-check.json" | tee -a "$log"
  exit 0
fi

# ---- the op harness ------------------------------------------------------------------------
ops() {
  local rc=0 t
  for t in tests/backend/backend_op_test tests/backend/backend_op_support_test src/comm/nccl/nccl_communicator_test; do
    [ -x "$build/$t" ] || continue
    echo "=== $(basename "$t")"
    "$build/$t" || rc=1
  done
  echo "=== kiln_gpu_bf16"
  "$build/bench/gpu/kiln_gpu_bf16" || rc=1
  return "$rc"
}
export -f ops
phase ops 15 ops.log ops || true

# ---- the trainer -----------------------------------------------------------------------------
if [ -f "$root/data/kjv/meta.json" ]; then
  train_steps=$([ "$mode" = quick ] && echo 30 || echo 100)
  phase trainer "$([ "$mode" = quick ] && echo 20 || echo 45)" trainer.log \
    bash "$root/scripts/gpu/train-check.sh" "$kiln" "$build/train-check" "$train_steps" || true
else
  say "phase trainer skipped: data/kjv was not carried (scripts/demo.sh prepares it)"
  records+=("trainer:skipped:0")
fi

# ---- the benchmark ---------------------------------------------------------------------------
dtype_flags=()
[ "$fp32" = 1 ] && dtype_flags=(--fp32 --set backend.tf32=true)
bench_ok=0
if [ "$mode" = quick ]; then
  phase bench 10 bench.log "$step" --B 16 --T 1024 --steps 10 --warmup 2 "${dtype_flags[@]}" && bench_ok=1
else
  phase bench 25 bench.log "$step" --B 16 --T 1024 --steps 30 --warmup 3 --profile 2 --repeat \
    "${dtype_flags[@]}" && bench_ok=1
fi
# The one common peak (TFLOP/s, whole) and the B that fitted, from the bench's JSON line.
read -r peak B < <(python3 -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{\"impl\": \"kiln\"")]
print(round(rows[-1]["peak_bf16_tflops"]), rows[-1]["B"]) if rows else print(0, 16)' "$out/bench.log" 2>/dev/null || echo "0 16")
peak_flags=()
[ "$peak" -gt 0 ] && peak_flags=(--peak-tflops "$peak")
if [ "$mode" = full ]; then
  if [ "$torch" = 1 ]; then
    phase torch 50 torch.log env PYTHONUNBUFFERED=1 python3 "$root/bench/gpu/torch_gpt2.py" \
      --B "$B" --T 1024 --steps 30 --warmup 3 --profile 2 "${peak_flags[@]}" || true
  fi
  if [ "$bench_ok" = 1 ]; then
    phase variants 54 bench.log bash "$root/scripts/gpu/variants.sh" "$step" "$build/gemm-cache.txt" \
      --B "$B" --T 1024 --steps 15 --warmup 3 "${peak_flags[@]}" "${dtype_flags[@]}" || true
  else
    say "phase variants skipped: the bench phase did not pass"
    records+=("variants:skipped:0")
  fi
fi

# ---- behind flags ------------------------------------------------------------------------------
if [ "$moe" = 1 ]; then
  if [ -f "$root/data/kjv/meta.json" ]; then
    phase moe 70 trainer.log bash "$root/scripts/gpu/moe-check.sh" "$kiln" "$build/moe-check" 30 || true
  else
    say "phase moe skipped: data/kjv was not carried (scripts/demo.sh prepares it)"
    records+=("moe:skipped:0")
  fi
fi
if [ "$mmdit" = 1 ]; then
  phase mmdit 40 trainer.log bash "$root/scripts/gpu/mmdit-check.sh" "$kiln" "$build/mmdit-check" 40 || true
fi
if [ "$plan" = 1 ]; then
  phase plan 90 bench.log bash "$root/scripts/gpu/plan-check.sh" "$kiln" "$step" "$build/plan-check" \
    "${peak_flags[@]}" || true
fi
if [ "$sanitize" = 1 ]; then
  phase sanitize 120 ops.log bash "$root/scripts/gpu/sanitize.sh" "$build" || true
fi

result=ok
for r in "${records[@]}"; do
  case $r in
    *:FAILED:*|*:TIMEOUT:*) result=FAILED ;;
    *:skipped:*) [ "$result" = ok ] && result=incomplete ;;
  esac
done
finish "$result"
say "done: $result in $(($(date +%s) - t_start))s of the ${cap}s cap"
[ "$result" = ok ]
