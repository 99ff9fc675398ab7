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
