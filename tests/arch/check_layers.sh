#!/usr/bin/env bash
# The architecture, checked: model and layer code include only core/, backend/backend.h
# and their own layer (nn/ never models/; a model's file formats also checkpoint/'s file
# primitives); only src/comm/ includes MPI or NCCL; only
# src/backend/cuda/ (and the NCCL communicator in src/comm/nccl/, whose buffers live on
# the GPU) includes CUDA headers; outside a model's own folder (every folder of
# src/models/: gpt2/, llama/, vit/, dit/, ...) nothing in src/ or apps/ includes one of its
# headers (everything sees models/model.h and models/registry.h) but the registry, which
# registers them; src/comm/ and src/parallel/ include nothing of src/profile/ (the tracer
# is passed in as a core TraceSink). Fails listing each offending include.
set -u
src="$1/src"
bad=0
report() { echo "layer violation: $1"; bad=1; }
# A model's own file formats (src/models/gpt2/formats.cpp: llm.c, Hugging Face; the shared
# Hugging Face folders, src/models/hf_formats.cpp) may write with checkpoint/'s
# safetensors and durable-file primitives, and only those.
formats='^'"$src"'/models/(gpt2/formats|hf_formats)\.cpp:[0-9]+:#include "checkpoint/(safetensors|safetensors_folder|file_util)\.h"'
while IFS= read -r line; do report "$line"; done < <(
  grep -rnE '#include\s+"(backend/(cpu|cuda)/|comm/|parallel/|train/|config/|model_io/|sampling/|data/|checkpoint/)' \
    "$src/models" "$src/nn" 2>/dev/null | grep -vE "$formats")
while IFS= read -r line; do report "$line"; done < <(
  grep -rnE '#include\s+[<"](mpi\.h|nccl\.h)' "$src" 2>/dev/null | grep -v "^$src/comm/")
while IFS= read -r line; do report "$line"; done < <(
  grep -rnE '#include\s+[<"](cuda_runtime|cuda\.h|cublas|cudnn|cuda_bf16)' "$src" 2>/dev/null |
    grep -v -e "^$src/backend/cuda/" -e "^$src/comm/nccl/")
while IFS= read -r line; do report "$line"; done < <(
  grep -rnE '#\s*if(def)?\s.*(KILN_CUDA|__CUDACC__|KILN_MPI)' "$src/models" "$src/nn" 2>/dev/null)
while IFS= read -r line; do report "$line"; done < <(
  grep -rnE '#include\s+"models/' "$src/nn" 2>/dev/null)
# The communication and parallel layers report to a TraceSink they are given
# (core/trace_sink.h); the profiler, which implements it, sits above them.
while IFS= read -r line; do report "$line (comm/ and parallel/ take a TraceSink, see core/trace_sink.h)"; done < <(
  grep -rnE '#include\s+"profile/' "$src/comm" "$src/parallel" 2>/dev/null)
# Each built-in architecture (each folder of src/models/) is named only in its own folder
# and by the registry, which registers it.
allowed='^'"$src"'/models/registry\.cpp:'
for dir in "$src"/models/*/; do
  arch=$(basename "$dir")
  while IFS= read -r line; do report "$line (only models/$arch/ may name it)"; done < <(
    grep -rnE '#include\s+"models/'"$arch"'/' "$src" "$1/apps" 2>/dev/null |
      grep -v "^$src/models/$arch/" | grep -vE "$allowed")
done
[ $bad -eq 0 ] && echo "layers ok: models/ and nn/ see only core/ and the backend interface"
exit $bad
