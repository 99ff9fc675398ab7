#!/usr/bin/env bash
# scripts/gpu/summary.py (the end of scripts/gpu-check.sh) on fixture logs in the formats
# of the phases' programs (fixtures/: gtest, kiln_gpu_bf16, compute-sanitizer, the
# train/moe checks, kiln_gpu_step's and torch_gpt2.py's JSON lines): every figure of
# gpu-check.json is read from them, MFU is recomputed against the one common peak (kiln's
# measured 888, not PyTorch's own 811), failures are named, and the tables print.
# Usage: gpu_check_summary_test.sh WORK_DIR
set -euo pipefail
work="$1"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
rm -rf "$work" && mkdir -p "$work"
cp "$here"/fixtures/*.log "$work/"
python3 "$root/scripts/gpu/summary.py" --out "$work" --mode full --cap 300 --result FAILED \
  --seconds 280 --device "NVIDIA H200, 143771 MiB, 580.159.04" \
  --phase build:ok:95 --phase ops:FAILED:18 --phase torch:skipped:0 >"$work/tables.txt"
python3 - "$work/gpu-check.json" "$work/tables.txt" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
tables = open(sys.argv[2]).read()
assert s["result"] == "FAILED" and s["seconds"] == 280 and s["cap_s"] == 300
assert s["phases"][1] == {"name": "ops", "status": "FAILED", "seconds": 18}, s["phases"]
ops = s["ops"]
op = ops["programs"]["backend_op_test"]
assert op["passed"] == 3 and op["failed"] == ["Backends/OpTest.AttentionTile/cuda"], op
assert op["finished"] is True, op
assert ops["programs"]["backend_op_support_test"] == {"passed": 4, "failed": [], "skipped": 1,
                                                      "finished": True}
assert ops["programs"]["nccl_communicator_test"]["finished"] is False  # crashed mid-test
assert "kiln_gpu_bf16" not in ops["programs"] and ops["bf16_check"] == {"passed": 96, "failed": 0}
assert ops["cuda_worst_rel"] == {"linear_forward": 2.512e-07, "linear_backward dinp": 3.1e-07,
                                 "attention_tile_forward": 9e-03}, ops["cuda_worst_rel"]
assert ops["sanitize"] == [{"tool": "memcheck", "exit_status": 0},
                           {"tool": "racecheck", "exit_status": 3}], ops["sanitize"]
assert len(s["trainer"]) == 2 and s["trainer"][0].startswith("train-check: demo config")
assert s["moe"] == ["moe-check: fp32, dropless: val loss cuda 6.0100, cpu 6.0050, difference 0.08% (within 1%)"]
assert s["mmdit"] == ["mmdit-check: fp32, 40 updates: val loss cuda 1.1000, cpu 1.1010, difference 0.09% (within 1%)"]
b = s["bench"]
assert b["common_peak_bf16_tflops"] == 888.0
kiln, torch = b["rows"]
assert kiln["impl"] == "kiln" and torch["impl"] == "pytorch"
assert abs(torch["mfu"] - 432.4 / 888.0) < 1e-4, torch["mfu"]   # against the common peak
assert abs(kiln["mfu"] - 145.4 / 888.0) < 1e-4, kiln["mfu"]
assert abs(b["kiln_over_pytorch"] - 170024.0 / 505660.0) < 1e-4
assert b["profile_kinds"]["kiln"]["gemm"] == 57.5 and b["profile_kinds"]["pytorch"]["idle"] == 0.8
v = {x["name"]: x for x in s["variants"]}
assert list(v) == ["base", "chunk256", "tune"], list(v)
assert v["chunk256"]["vs_base"] == 1.25 and v["chunk256"]["set"] == "train.classifier_chunk_mb=256"
assert v["tune"].get("failed") is True and "tokens_per_s" not in v["tune"]
assert len(s["plan"]) == 2 and s["plan"][1].startswith("plan-check: Spearman 0.943"), s["plan"]
for needle in ("kiln / PyTorch tokens/s: 0.336", "FAILED: Backends/OpTest.AttentionTile/cuda",
               "worst relative error 9.00e-03 (attention_tile_forward)", "tune               FAILED",
               "compute-sanitizer racecheck: exit status 3", "kiln_gpu_bf16: 96 passed",
               "nccl_communicator_test: 0 passed, 0 skipped (did not finish"):
    assert needle in tables, (needle, tables)
PY
echo "gpu_check_summary_test: ok"
