#!/usr/bin/env bash
# kiln vs PyTorch on the CPU: the same GPT-2 or Llama training step, same initial
# weights, same data, batch, sequence length and thread count, timed in alternating runs
# (kiln, torch, kiln, torch) so that a change in machine load hits both alike.
#
#   bench/compare_pytorch.sh [--quick] [--kiln PATH] [--out DIR] [--threads N]
#                            [--arch gpt2|llama|moe|all] [--configs "NAME ..."] [--runs N]
#
# Default: the GPT-2 configs (gpt2-124m small); --arch llama runs llama-100m and
# llama-small, --arch moe llama-moe, --arch all the four dense ones; --configs names the
# configs to run, in order. --runs N: N runs of each side (default 2), alternated.
#
# How the work is made identical: the first kiln run (`kiln bench --dump-init`) writes
# its initial weights (kiln's names and [out, in] layouts), the token batches of every
# step (synthetic: uniform ids from Philox(train.seed)) and the per-step learning rates
# to a safetensors file, with the model's arch and config in its metadata; the peer of
# that arch (bench/pytorch/gpt2_train.py or llama_train.py, their loop shared in
# peer.py) loads exactly these into a PyTorch model of the same shapes and trains with the
# same loss normalisation, gradient clipping and AdamW (weight decay on 2-D parameters).
# The first losses of both are printed side by side: they agree to ~1e-6 at step 0 and
# stay close after (fp32 rounding differs).
#
# Reported per config: each run's tokens/s (mean over its timed steps) and phases, the
# ratio kiln/torch of the means over all runs and of the medians of the runs, and the
# ratio of the fastest single steps (the least disturbed by other work on a shared
# machine). The step-0 losses must agree within 1e-4 (the same computation from the same
# weights and batch), else the script stops: a speed ratio of different work means nothing.
#
# Configs:
#   gpt2-124m  GPT-2 small (12 layers, 768 wide, vocab 50257), B=4, T=64
#   small      6 layers, 384 channels, 6 heads, vocab 8192, block 256, B=8, T=256
#   llama-100m Llama 3 block (RMSNorm, rotary GQA, SwiGLU, no biases): 12 layers, 768
#              wide, 12 query heads over 4 k/v heads, SwiGLU width 2048, vocab 32000,
#              head tied to the embedding (100.1M parameters), rope_theta 500000, B=4, T=64
#   llama-small as small, Llama-shaped: 6 layers, 384 wide, 6 heads over 2 k/v heads,
#              SwiGLU width 1024, vocab 8192, untied head, block 256, B=8, T=256
#   llama-tiny a check of the Llama peer in seconds (2 layers, 64 wide, 4 heads over 2,
#              llama3 rope scaling, untied; B=2, T=32): not a speed comparison
#   llama-moe  a Llama mixture of experts (Mixtral-shaped: 8 routed experts, top 2,
#              softmax, renormalised): 6 layers, 384 wide, 6 query heads over 2 k/v
#              heads, each expert a SwiGLU of width 1792, vocab 2048, tied: 102.3M
#              parameters, 27.9M of matmul weights active per token; B=8, T=128. The peer's MoE is the
#              usual one (router, topk, index_select per expert, per-expert matmuls,
#              index_add_: bench/pytorch/llama_train.py)
#   llama-moe-tiny a check of the MoE peer in seconds (3 layers, 64 wide, 4 experts,
#              top 2, a shared expert, the first block dense; B=2, T=32)
#
# Settings (each side's best on the CPU at hand; the CPU, kiln's oneDNN ISA and GEMM
# path and OpenBLAS's core are printed with every result):
#   both:  OMP_NUM_THREADS=N (default 2; torch also calls torch.set_num_threads(N)) and
#          OMP_WAIT_POLICY=passive: idle OpenMP threads sleep instead of spinning. Both
#          use GNU OpenMP; on a machine shared with other work (builds, tests) spinning
#          threads steal the cores the other thread of a parallel region needs, and each
#          small op then waits a scheduler time slice at its barrier. Measured on a 2-core
#          box under load ~5: kiln GPT-2 124M 40 -> 115 tokens/s, small model 624 ->
#          1205 tokens/s with passive; torch gains too.
#   torch: Debian's PyTorch (/usr/bin/python3, torch 1.13) with OpenBLAS
#          (apt-get install libopenblas0-openmp: without it torch falls back to the
#          reference BLAS and runs ~20x slower). OpenBLAS picks its kernels itself;
#          OPENBLAS_CORETYPE is set only where it misdetects a CPU that has the
#          instructions (bench/pytorch/openblas_core.py: SkylakeX for an AVX-512 CPU it
#          does not know, e.g. AMD Zen 5 or a new Xeon; Haswell for an AVX2 CPU it takes
#          for an older core). OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE from the caller's
#          environment are dropped for torch's runs.
#   kiln:  oneDNN GEMMs (which detect the ISA themselves), OpenMP kernels.
# The default run (the GPT-2 configs) takes 2 to 8 minutes on 2 cores, depending on the
# machine's load (--quick: 1 to 3); --arch llama is work of the same order (not timed yet).
# Not part of ctest.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
kiln="${KILN:-}"
out=""
quick=0
threads=2
runs=2
configs="gpt2-124m small"
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --kiln) kiln="$2"; shift ;;
    --out) out="$2"; shift ;;
    --threads) threads="$2"; shift ;;
    --configs) configs="$2"; shift ;;
    --runs) runs="$2"; shift ;;
    --arch)
      case "$2" in
        gpt2) configs="gpt2-124m small" ;;
        llama) configs="llama-100m llama-small" ;;
        moe) configs="llama-moe" ;;
        all) configs="gpt2-124m small llama-100m llama-small" ;;
        *) echo "compare_pytorch.sh: --arch gpt2, llama, moe or all, not $2" >&2; exit 2 ;;
      esac
      shift ;;
    -h|--help) sed -n '2,/^# Not part of ctest/p' "$0"; exit 0 ;;
    *) echo "compare_pytorch.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
# What a new user needs: the build packages, Debian's PyTorch and an OpenBLAS for it
# (without one, torch falls back to the reference BLAS), and a kiln binary.
source "$root/scripts/lib/common.sh"
kiln_apt_install "${KILN_BUILD_PACKAGES[@]}" python3-torch libopenblas0-openmp
if [ -z "$kiln" ]; then
  for c in "$root/build/apps/kiln/kiln" "$root"/build*/apps/kiln/kiln; do
    if [ -x "$c" ]; then kiln="$c"; break; fi
  done
fi
if [ -z "$kiln" ]; then
  KILN_BUILD="$root/build-bench-cmp"
  kiln_build -DKILN_BUILD_TESTS=OFF -DKILN_BUILD_BENCH=OFF -DKILN_CUDA=OFF >/dev/null
  kiln="$KILN_BUILD/apps/kiln/kiln"
fi
[ -n "$kiln" ] && [ -x "$kiln" ] || { echo "compare_pytorch.sh: no kiln binary (build it, or pass --kiln PATH)" >&2; exit 1; }
py=/usr/bin/python3
"$py" -c "import torch" 2>/dev/null || { echo "compare_pytorch.sh: $py has no torch (apt-get install python3-torch)" >&2; exit 1; }
# (grep without -q: with pipefail, -q's early exit would fail the pipeline on SIGPIPE)
if ! ldconfig -p | grep libopenblas > /dev/null; then
  echo "compare_pytorch.sh: warning: OpenBLAS is not installed; PyTorch will use the reference BLAS" >&2
  echo "  (apt-get install -y libopenblas0-openmp) and the comparison will be meaningless." >&2
fi
[ -n "$out" ] || out="$(mktemp -d /tmp/kiln_vs_torch.XXXXXX)"
mkdir -p "$out"

export OMP_NUM_THREADS="$threads"
export OMP_WAIT_POLICY=passive
# OpenBLAS's own choice first (without any inherited override), then ours.
blas_clean=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE)
blas_detected=$("${blas_clean[@]}" "$py" "$here/pytorch/openblas_core.py" detect)
blas_force=$("${blas_clean[@]}" "$py" "$here/pytorch/openblas_core.py" choose)
torch_env=("${blas_clean[@]}")
if [ -n "$blas_force" ]; then
  torch_env+=(OPENBLAS_CORETYPE="$blas_force")
  blas_core="$("${torch_env[@]}" "$py" "$here/pytorch/openblas_core.py" detect) (OPENBLAS_CORETYPE=$blas_force; OpenBLAS alone picks $blas_detected)"
else
  blas_core="$blas_detected (OpenBLAS's own choice)"
fi
cpu_model="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | xargs) model $(grep -m1 '^model\s' /proc/cpuinfo | cut -d: -f2 | xargs)"
kiln_isa="$("$kiln" bench --isa)"

if [ $quick -eq 1 ]; then
  warm_big=1; steps_big=2; warm_small=1; steps_small=3
else
  warm_big=2; steps_big=5; warm_small=2; steps_small=8
fi

echo "== kiln vs PyTorch, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs, $threads threads"
echo "== CPU: $cpu_model"
echo "== kiln: $kiln_isa"
echo "== torch: OpenBLAS core $blas_core"
echo "== load average at start: $(cut -d' ' -f1-3 /proc/loadavg); kiln: $kiln; logs: $out"
echo "== both: OMP_NUM_THREADS=$OMP_NUM_THREADS OMP_WAIT_POLICY=$OMP_WAIT_POLICY; torch's environment: ${torch_env[*]}"

# A Llama's [model] section: llama_model n_layer n_head n_kv_head n_embd ffn_hidden_size
# block_size vocab_size tie_embeddings [rope_theta (default 500000)].
llama_model() {
  cat <<EOF
[model]
arch = "llama"
n_layer = $1
n_head = $2
n_kv_head = $3
n_embd = $4
ffn_hidden_size = $5
block_size = $6
vocab_size = $7
tie_embeddings = $8
rope_theta = ${9:-500000.0}
EOF
}

write_config() {  # name -> $out/name.toml: its model, then the training keys all share
  local mb t lr
  case "$1" in
    gpt2-124m) mb=4 t=64 lr=6e-4; cat > "$out/$1.toml" <<EOF
[model]
preset = "gpt2"
EOF
    ;;
    small) mb=8 t=256 lr=1e-3; cat > "$out/$1.toml" <<EOF
[model]
n_layer = 6
n_head = 6
n_embd = 384
block_size = 256
vocab_size = 8192
EOF
    ;;
    llama-100m) mb=4 t=64 lr=6e-4; llama_model 12 12 4 768 2048 1024 32000 true > "$out/$1.toml" ;;
    llama-small) mb=8 t=256 lr=1e-3; llama_model 6 6 2 384 1024 256 8192 false > "$out/$1.toml" ;;
    llama-tiny) mb=2 t=32 lr=1e-3
      { llama_model 2 4 2 64 96 64 300 false 10000.0
        printf 'rope_scaling.factor = 8.0\nrope_scaling.original_max_position = 16\n'; } > "$out/$1.toml" ;;
    llama-moe) mb=8 t=128 lr=1e-3
      { llama_model 6 6 2 384 1024 128 2048 true
        printf '[model.moe]\nnum_experts = 8\ntop_k = 2\nffn_hidden_size = 1792\n'; } > "$out/$1.toml" ;;
    llama-moe-tiny) mb=2 t=32 lr=1e-3
      { llama_model 3 4 2 64 96 64 300 false 10000.0
        printf '[model.moe]\nnum_experts = 4\ntop_k = 2\nffn_hidden_size = 48\n'
        printf 'shared_experts = 1\nfirst_k_dense = 1\n'; } > "$out/$1.toml" ;;
    *) echo "compare_pytorch.sh: unknown config $1 (gpt2-124m, small, llama-100m, llama-small, llama-tiny, llama-moe, llama-moe-tiny)" >&2
       exit 2 ;;
  esac
  cat >> "$out/$1.toml" <<EOF
[train]
steps = 1000
micro_batch = $mb
seq_len = $t
seed = 1337
[optim]
lr = $lr
weight_decay = 0.1
grad_clip = 1.0
[schedule]
kind = "cosine"
warmup_steps = 10
EOF
}

# One line about a run: its JSON result line (the last line starting with '{').
describe() {
  "$py" - "$1" <<'EOF'
import json, sys
j = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")][-1]
mfu = f", MFU {100 * j['mfu']:.1f}%" if "mfu" in j else ""
print(f"{j['tokens_per_s']:.0f} tokens/s, step {j['step_ms']:.0f} ms (fwd {j['forward_ms']:.0f}, "
      f"bwd {j['backward_ms']:.0f}, opt {j['optimizer_ms']:.0f}){mfu}")
EOF
}

summary=()
for name in $configs; do
  case "$name" in
    gpt2-124m|llama-100m|llama-moe) w=$warm_big; s=$steps_big ;;
    *) w=$warm_small; s=$steps_small ;;
  esac
  case "$name" in  # the PyTorch peer of the config's arch
    llama-*) peer="$here/pytorch/llama_train.py" ;;
    *) peer="$here/pytorch/gpt2_train.py" ;;
  esac
  write_config "$name"
  init="$out/$name.init.safetensors"
  echo
  echo "== $name: $w warm-up + $s timed steps per run, $runs runs each, alternated: kiln, torch, kiln, ..."
  for run in $(seq 1 "$runs"); do
    extra=()
    [ $run -eq 1 ] && extra=(--dump-init "$init")
    "$kiln" bench "$out/$name.toml" --warmup "$w" --steps "$s" "${extra[@]}" > "$out/$name.kiln$run.log" 2>&1 ||
      { echo "kiln run failed:"; tail -20 "$out/$name.kiln$run.log"; exit 1; }
    echo "   kiln  run $run: $(describe "$out/$name.kiln$run.log")"
    "${torch_env[@]}" "$py" "$peer" "$init" --threads "$threads" > "$out/$name.torch$run.log" 2>&1 ||
      { echo "torch run failed:"; tail -20 "$out/$name.torch$run.log"; exit 1; }
    echo "   torch run $run: $(describe "$out/$name.torch$run.log")"
  done
  line="$("$py" - "$out" "$name" "$runs" <<'EOF'
import json, statistics, sys
out, name, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
def load(k):
    for l in reversed(open(f"{out}/{name}.{k}.log").read().splitlines()):
        if l.startswith("{"):
            return json.loads(l)
k = [load(f"kiln{r}") for r in range(1, runs + 1)]
t = [load(f"torch{r}") for r in range(1, runs + 1)]
kt = sum(j["tokens_per_s"] for j in k) / runs
tt = sum(j["tokens_per_s"] for j in t) / runs
km = statistics.median(j["tokens_per_s"] for j in k)
tm = statistics.median(j["tokens_per_s"] for j in t)
n = min(4, len(k[0]["losses"]))
kl = " ".join(f"{x:.6f}" for x in k[0]["losses"][:n])
tl = " ".join(f"{x:.6f}" for x in t[0]["losses"][:n])
d = max(abs(a - b) for a, b in zip(k[0]["losses"], t[0]["losses"]))
print(f"   first losses  kiln  {kl}")
print(f"                 torch {tl}   (max |diff| over {len(k[0]['losses'])} steps {d:.2e})")
# The fastest single step of all runs: the least disturbed by other work on a shared machine.
kb = max(j["tokens_per_step"] / j["step_ms_min"] * 1e3 for j in k)
tb = max(j["tokens_per_step"] / j["step_ms_min"] * 1e3 for j in t)
print(f"   mean tokens/s kiln {kt:.0f}, torch {tt:.0f}: kiln/torch = {kt / tt:.2f}")
print(f"   median of the {runs} runs' tokens/s kiln {km:.0f}, torch {tm:.0f}: kiln/torch = {km / tm:.2f}")
print(f"   fastest step  kiln {kb:.0f}, torch {tb:.0f} tokens/s: kiln/torch = {kb / tb:.2f}")
d0 = abs(k[0]["losses"][0] - t[0]["losses"][0])
if d0 > 1e-4:
    print(f"FAILED {name}: the step-0 losses differ by {d0:.2e} (> 1e-4): not the same computation")
print(f"SUMMARY {name}: mean kiln {kt:.0f} tok/s, torch {tt:.0f} tok/s, ratio {kt / tt:.2f}; "
      f"median ratio {km / tm:.2f}; fastest step ratio {kb / tb:.2f}; step-0 loss |diff| {d0:.1e}; "
      f"kiln MFU {100 * sum(j['mfu'] for j in k) / runs:.1f}% of "
      f"{max(j['peak_flops'] for j in k) / 1e9:.0f} GFLOP/s")
EOF
)"
  echo "$line" | grep -v '^SUMMARY'
  if echo "$line" | grep '^FAILED' > /dev/null; then exit 1; fi
  summary+=("$(echo "$line" | grep '^SUMMARY' | sed 's/^SUMMARY //')")
done
echo
echo "== load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== CPU: $cpu_model | kiln: $kiln_isa | torch: OpenBLAS $blas_core"
for l in "${summary[@]}"; do echo "== $l"; done
