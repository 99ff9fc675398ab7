#!/usr/bin/env bash
# The architecture, checked: model and layer code include only core/, backend/backend.h
# and their own layer; only src/comm/ includes MPI or NCCL; only src/backend/cuda/ (and
# the NCCL communicator in src/comm/nccl/, whose buffers live on the GPU) includes CUDA
# headers. Fails listing each offending include.
set -u
src="$1/src"
bad=0
report() { echo "layer violation: $1"; bad=1; }
while IFS= read -r line; do report "$line"; done < <(
  grep -rnE '#include\s+"(backend/(cpu|cuda)/|comm/|parallel/|train/|data/|checkpoint/)' \
    "$src/models" "$src/nn" 2>/dev/null)
while IFS= read -r line; do report "$line"; done < <(
  grep -rnE '#include\s+[<"](mpi\.h|nccl\.h)' "$src" 2>/dev/null | grep -v "^$src/comm/")
while IFS= read -r line; do report "$line"; done < <(
  grep -rnE '#include\s+[<"](cuda_runtime|cuda\.h|cublas|cudnn|cuda_bf16)' "$src" 2>/dev/null |
    grep -v -e "^$src/backend/cuda/" -e "^$src/comm/nccl/")
while IFS= read -r line; do report "$line"; done < <(
  grep -rnE '#\s*if(def)?\s.*(KILN_CUDA|__CUDACC__|KILN_MPI)' "$src/models" "$src/nn" 2>/dev/null)
[ $bad -eq 0 ] && echo "layers ok: models/ and nn/ see only core/ and the backend interface"
exit $bad
