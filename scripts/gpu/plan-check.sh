#!/usr/bin/env bash
# kiln plan's single-GPU choices against measured steps, for scripts/gpu-check.sh --plan
# (docs/plan.md; issue 48): the GPU calibrated (`kiln bench --calibrate --device cuda`:
# bf16 GEMM and attention rates by size, copy bandwidth), then for GPT-2 XL at T = 1024 in
# bf16 and each micro batch B in 2, 4, 8 with checkpointing none and full (accumulation
# 1): kiln plan's predicted step time and peak memory against kiln_gpu_step's measured
# ones. Prints a table and the lines
#   plan-check: B=.. ckpt=..: predicted .. ms, measured .. ms (ratio ..); predicted .. GiB, measured .. GiB
#   plan-check: Spearman .. over .. choices; first choice .. measured ..x the fastest
#   scripts/gpu/plan-check.sh KILN KILN_GPU_STEP OUT_DIR [kiln_gpu_step flags, e.g. --peak-tflops N]
set -euo pipefail
kiln="$1" step="$2" out="$3"
shift 3
root="$(cd "$(dirname "$0")/../.." && pwd)"
rm -rf "$out" && mkdir -p "$out"
"$kiln" bench --calibrate "$out/calibration.json" --device cuda
mib="$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -n 1 || true)"
gib=$(( ${mib:-81920} / 1024 ))
model=(--set model.preset=gpt2-xl --set train.dtype=bf16 --set train.seq_len=1024)
for B in 2 4 8; do
  "$kiln" plan "$root/configs/gpt2-124m.toml" --world-size 1 --device-memory "$gib" --backend cuda \
    --calibration "$out/calibration.json" "${model[@]}" --set "train.micro_batch=$B" \
    --set "train.global_batch=$B" --json >"$out/plan-B$B.json"
  for ck in none full; do
    echo "=== measure B=$B ckpt=$ck"
    "$step" --model gpt2-xl --B "$B" --T 1024 --steps 5 --warmup 2 \
      --set "train.activation_checkpointing=$ck" "$@" >"$out/step-B$B-$ck.json" 2>"$out/step-B$B-$ck.log" ||
      echo "plan-check: B=$B ckpt=$ck: kiln_gpu_step failed: $(tail -n 1 "$out/step-B$B-$ck.log")"
  done
done
PYTHONPATH="$root/bench/plan" python3 - "$out" <<'PY'
import json, os, sys
from validation_table import spearman  # bench/plan/validate.sh's, ties averaged
out = sys.argv[1]
rows = []
for B in (2, 4, 8):
    plan = json.load(open(os.path.join(out, f"plan-B{B}.json")))
    for ck in ("none", "full"):
        pred = next(l for l in plan["layouts"] if l["micro_batch"] == B and l["zero_stage"] == 0
                    and l["activation_checkpointing"] == ck)
        lines = [l for l in open(os.path.join(out, f"step-B{B}-{ck}.json")) if l.startswith("{")]
        if not lines:
            continue
        m = json.loads(lines[-1])
        if m["B"] != B:  # kiln_gpu_step halved B: it did not fit
            print(f"plan-check: B={B} ckpt={ck}: did not fit (predicted {pred['peak_bytes'] / 2**30:.1f} GiB, "
                  f"fits {pred['fits']})")
            continue
        rows.append((B, ck, pred["step_s"] * 1e3, m["ms_per_step"], pred["peak_bytes"] / 2**30, m["peak_gib"]))
        print(f"plan-check: B={B} ckpt={ck}: predicted {rows[-1][2]:.1f} ms, measured {rows[-1][3]:.1f} ms "
              f"(ratio {rows[-1][2] / rows[-1][3]:.2f}); predicted {rows[-1][4]:.2f} GiB, measured {rows[-1][5]:.2f} GiB")

if len(rows) >= 3:
    # tokens per second of each choice: B x T / step
    pt = [r[0] * 1024 / r[2] for r in rows]
    mt = [r[0] * 1024 / r[3] for r in rows]
    rho = spearman(pt, mt)
    first = max(range(len(rows)), key=lambda i: pt[i])
    best = max(mt)
    print(f"plan-check: Spearman {rho:.3f} over {len(rows)} choices (tokens/s); first choice "
          f"B={rows[first][0]} ckpt={rows[first][1]} measured {best / mt[first]:.3f}x the fastest")
PY
