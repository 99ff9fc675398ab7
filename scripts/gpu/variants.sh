#!/usr/bin/env bash
# The switchable changes of the CUDA path measured one by one, for scripts/gpu-check.sh:
# a short kiln_gpu_step run per variant, each printing "=== variant NAME: WORDS" and then
# the run's output (its JSON line among it; scripts/gpu/summary.py reads them).
#   scripts/gpu/variants.sh KILN_GPU_STEP GEMM_CACHE [kiln_gpu_step flags...]
# GPU_CHECK_VARIANTS: "name:WORD WORD...;name2:..." where each WORD is a config key for
# kiln_gpu_step's --set (section.key=value) or, in capitals, an environment variable
# (NAME=value: only KILN_CUDA_GEMM_CACHE, a process-level cache); nothing = the defaults.
# The two tuned runs share GEMM_CACHE: the second reads the first's choices, and the two
# must give the same loss bits.
set -euo pipefail
step="$1" cache="$2"
shift 2
rm -f "$cache"
variants="${GPU_CHECK_VARIANTS:-base:;chunk256:train.classifier_chunk_mb=256;chunk4096:train.classifier_chunk_mb=4096;per_tensor_adamw:optim.multi_tensor=false;tune:backend.gemm_tuning=true KILN_CUDA_GEMM_CACHE=$cache;tune_again:backend.gemm_tuning=true KILN_CUDA_GEMM_CACHE=$cache;fp8:train.fp8=tensorwise;fp8_delayed:train.fp8=delayed}"
rc=0
IFS=';' read -ra list <<<"$variants"
for v in "${list[@]}"; do
  name=${v%%:*} words=${v#*:}
  vars=() sets=()
  for word in $words; do  # split on spaces on purpose
    case $word in
      [A-Z]*=*) vars+=("$word") ;;
      *) sets+=(--set "$word") ;;
    esac
  done
  echo "=== variant $name: $words"
  env "${vars[@]}" "$step" "$@" "${sets[@]}" || { echo "variant $name: FAILED"; rc=1; }
done
exit "$rc"
