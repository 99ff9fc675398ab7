# Shared by the reliability tests (sourced after setting $kiln and $work): a fresh $work,
# MPI as root, one OpenMP thread per rank, a random byte-level corpus prepared in
# $work/data, and the tiny model's [model] and [data] sections in $work/tiny.toml, to
# which each test appends its own sections.
rm -rf "$work" && mkdir -p "$work"
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
head -c 20000 /dev/urandom | base64 > "$work/corpus.txt"
"$kiln" prepare --input "$work/corpus.txt" --out "$work/data" --tokenizer byte >/dev/null
cat > "$work/tiny.toml" <<EOT
[model]
n_layer = 1
n_head = 2
n_embd = 16
block_size = 8
[data]
dir = "$work/data"
EOT

# Appends the sections of a run of $1 updates on 2 ranks at ZeRO 1 (global batch 2) that
# saves a checkpoint every $2 updates, keeping all, and logs every update.
append_saving_run() {
  cat >> "$work/tiny.toml" <<EOT
[train]
steps = $1
micro_batch = 1
global_batch = 2
seq_len = 8
[eval]
every = 0
[log]
every = 1
peak_tflops = 1.0
[checkpoint]
every = $2
keep = 0
[parallel]
timeout_s = 20
zero_stage = 1
EOT
}

# train_two_ranks RUN_DIR LOG [kiln train args...]: `kiln train $work/tiny.toml` on 2 ranks,
# its output in LOG. odls_base_sigkill_timeout 0: once a rank is killed, mpirun ends the
# others at once (not after 1 s).
train_two_ranks() {
  local dir=$1 log=$2
  shift 2
  mpirun --oversubscribe --bind-to none --mca odls_base_sigkill_timeout 0 -np 2 "$kiln" train \
    "$work/tiny.toml" --set "run.dir=$dir" "$@" > "$log" 2>&1
}

# Appends the sections of a run that trains until stopped, logging every $1 updates.
append_endless_run() {
  cat >> "$work/tiny.toml" <<EOT
[train]
steps = 1000000
micro_batch = 1
seq_len = 8
[eval]
every = 0
[log]
every = $1
peak_tflops = 1.0
EOT
}
