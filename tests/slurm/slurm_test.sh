#!/usr/bin/env bash
# kiln under a real Slurm (docs/distributed.md, "Slurm"): a one-node cluster in WORK_DIR
# (scripts/slurm/local-cluster.sh), then
#   - srun --mpi=pmix -n 2 kiln train: the losses equal a plain mpirun -np 2 run's, bitwise,
#     and rank 0 logs who launched the ranks and where they run;
#   - srun -n 2 without a PMI (Slurm's MpiDefault=none): one line naming --mpi=pmix, exit 1;
#   - two tasks reporting the same local rank: an error naming the host and both ranks;
#   - sbatch scripts/slurm/train.sbatch (2 tasks, srun), `scontrol requeue` mid-run: every
#     rank saves and exits 0, the requeued job resumes with --resume auto, and its losses
#     equal an uninterrupted run's, bitwise; `scancel` of such a job ends it (the ranks
#     save, the job is not requeued).
# With --long: the same at 4 tasks (srun against mpirun -np 4), and the batch script with
# KILN_LAUNCHER=mpirun at 4 tasks stopped by SIGUSR1 to the batch shell alone (what
# --signal=B:USR1@120 sends before a time limit): the script passes it on, kiln saves, the
# script requeues the job, which resumes bitwise.
# Exits 77 (ctest: skipped, with the reason printed) when Slurm cannot start here.
# Usage: slurm_test.sh KILN_BINARY WORK_DIR [--long]
set -euo pipefail
kiln="$1"
work="$2"
long="${3:-}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cluster="$work/cluster"
[ -d "$cluster" ] && bash "$root/scripts/slurm/local-cluster.sh" stop "$cluster"
rm -rf "$work" && mkdir -p "$work"
source "$root/tests/parallel/common.sh"

rc=0
bash "$root/scripts/slurm/local-cluster.sh" start "$cluster" 2> "$work/cluster.err" || rc=$?
if [ "$rc" = 2 ]; then echo "SKIPPED: $(tail -n 1 "$work/cluster.err")"; exit 77; fi
[ "$rc" = 0 ] || { echo "FAILED: the test cluster did not start"; cat "$work/cluster.err"; exit 1; }
trap 'bash "$root/scripts/slurm/local-cluster.sh" stop "$cluster"' EXIT
eval "$(bash "$root/scripts/slurm/local-cluster.sh" env "$cluster")"
cd "$work"  # sbatch's jobs start in the submitting directory

setup_tiny_gpt2 11

# srun --mpi=pmix -n N against mpirun -np N: the same ranks, the same losses.
srun_matches_mpirun() {
  local n=$1
  run_train "$work/tiny.toml" "mpirun$n" "$n"
  srun --mpi=pmix -n "$n" "$kiln" train "$work/tiny.toml" --set "run.dir=$work/srun$n" \
    > "$work/srun$n.log" 2>&1 || { echo "FAILED: srun -n $n"; cat "$work/srun$n.log"; exit 1; }
  grep -q "^kiln: $n ranks launched by srun --mpi=pmix in Slurm job [0-9]* step 0; $(hostname): ranks 0-$((n - 1)), local ranks 0-$((n - 1))$" "$work/srun$n.log" ||
    { echo "FAILED: srun -n $n: no launch line"; cat "$work/srun$n.log"; exit 1; }
  echo "srun -n $n: $(grep -m1 "launched by" "$work/srun$n.log")"
  echo -n "srun --mpi=pmix -n $n vs mpirun -np $n: "
  compare "$work/mpirun$n/metrics.jsonl" "$work/srun$n/metrics.jsonl" 1 0
}

# Waits until the output $2 of job $1 shows $3 runs of the batch script ended and the job
# has left the queue (at most $4 seconds; squeue alone can miss a requeue in flight).
wait_job_runs() {
  local jid=$1 out=$2 runs=$3 limit=$4 state="" ended=0
  for _ in $(seq $((limit * 5))); do
    state="$(squeue -h -j "$jid" -o %T 2>/dev/null || true)"
    ended=$(grep -c "^kiln: train exited with status" "$out" 2>/dev/null || true)
    [ "${ended:-0}" -ge "$runs" ] && [ -z "$state" ] && return 0
    sleep 0.2
  done
  echo "FAILED: job $jid: ${ended:-0} of $runs runs ended, state '$state' after $limit s"
  cat "$out"
  exit 1
}

# Submits scripts/slurm/train.sbatch as job $name with $tasks tasks under $launcher, and
# returns once its run has logged 3 records (step 40 of 4000: the run has seconds left
# even when the machine is busy). Sets jid, run, out and args (the run's options).
submit_training() {
  local name=$1 tasks=$2 launcher=$3
  run="$work/$name" out="$work/job-$name.out"
  args=(--set "run.dir=$run" --set train.steps=4000 --set log.every=20 --set eval.every=1000
        --set checkpoint.every=0)
  jid=$(KILN="$kiln" KILN_LAUNCHER="$launcher" sbatch --parsable --ntasks="$tasks" -o "$out" \
        "$root/scripts/slurm/train.sbatch" "$work/tiny.toml" "${args[@]}")
  for _ in $(seq 300); do
    [ -s "$run/metrics.jsonl" ] && [ "$(wc -l < "$run/metrics.jsonl")" -ge 3 ] && return 0
    sleep 0.1
  done
  echo "FAILED: $name: job $jid did not start"
  cat "$out"
  exit 1
}

# The example script's job, stopped by `stop` (a command with the job id appended) while
# training; the requeued job must resume and end as an uninterrupted run does.
requeue_resumes_bitwise() {
  local name=$1 tasks=$2 launcher=$3 jid run out args
  shift 3
  submit_training "$name" "$tasks" "$launcher"
  "$@" "$jid"
  wait_job_runs "$jid" "$out" 2 120
  local stopped
  stopped=$(grep -o "stopping at step [0-9]*" "$out" | head -1) ||
    { echo "FAILED: $name: the ranks did not stop on the signal"; cat "$out"; exit 1; }
  grep -q "kiln: train exited with status 0" "$out" && grep -q "resuming from .*ckpt/step_" "$out" &&
    [ "$(grep -c "kiln: train exited with status 0" "$out")" = 2 ] ||
    { echo "FAILED: $name: job $jid did not save, requeue and resume"; cat "$out"; exit 1; }
  echo "$name: '$*': the ranks saved, ${stopped#stopping }; the requeued job: $(grep -o "resuming from .*" "$out" | head -1)"
  [ -d "$work/ref$tasks" ] || run_train "$work/tiny.toml" "ref$tasks" "$tasks" "${args[@]:2}"
  echo -n "$name vs an uninterrupted mpirun -np $tasks run: "
  compare "$work/ref$tasks/metrics.jsonl" "$run/metrics.jsonl" 1 0
}

srun_matches_mpirun 2
fails srun_without_pmi "launch with srun --mpi=pmix" srun -n 2 "$kiln" train "$work/tiny.toml" --set "run.dir=$work/nopmi"
[ "$(grep -c "error: srun started 2 tasks without a process-management interface" "$work/srun_without_pmi.log")" = 1 ] ||
  { echo "FAILED: the error is not said once"; cat "$work/srun_without_pmi.log"; exit 1; }
# A launcher whose local ranks collide (both tasks say 0: they would share a GPU).
fails same_local_rank "ranks 0 and 1 on host $(hostname) both have local rank 0" \
  srun --mpi=pmix -n 2 env OMPI_COMM_WORLD_LOCAL_RANK=0 "$kiln" train "$work/tiny.toml" --set "run.dir=$work/same"
requeue_resumes_bitwise requeue2 2 srun scontrol requeue
# scancel ends the job: the ranks save (a later job could resume) and it is not requeued.
submit_training cancel2 2 srun
scancel "$jid"
wait_job_runs "$jid" "$out" 1 60
grep -q "stopping at step [0-9]* (signal)" "$out" && ! grep -q "requeued job" "$out" &&
  [ "$(grep -c "^kiln: train exited with status 0" "$out")" = 1 ] ||
  { echo "FAILED: scancel of job $jid"; cat "$out"; exit 1; }
echo "scancel: $(grep -o "stopping at step [0-9]*" "$out"); the job ended, not requeued"

if [ "$long" = --long ]; then
  srun_matches_mpirun 4
  requeue_resumes_bitwise timelimit4 4 mpirun scancel --batch --signal=USR1
  grep -q "kiln: requeued job" "$work/job-timelimit4.out" ||
    { echo "FAILED: the batch script did not requeue its job"; cat "$work/job-timelimit4.out"; exit 1; }
fi
echo "Slurm tests passed"
