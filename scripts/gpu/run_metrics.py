"""The metrics of `kiln train` run directories, for the GPU check scripts
(scripts/gpu/train-check.sh, scripts/gpu/moe-check.sh, which put this folder on
PYTHONPATH): a run's metrics.jsonl records and its last val loss."""
import json
import os


def records(out, run):
    """The records of OUT/RUN/metrics.jsonl, in order."""
    with open(os.path.join(out, run, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def last_val_loss(out, run):
    """The last val_loss the run logged."""
    return [r["val_loss"] for r in records(out, run) if "val_loss" in r][-1]
