# Sourced by the MoE train tests (after common.sh): a byte-level corpus prepared in
# $work/data and $work/tiny.toml, the tiny MoE Llama they share (3 blocks, the first dense;
# 4 experts, top-2, one shared expert; aux loss and z-loss on; fp32), 10 updates of global
# batch 4 in micro-batches of 1, every step logged with its tokens per expert
# (log.expert_counts, for compare_moe); train RUN_NAME NP [--set ...] (run_train); and
# check REF RUN LABEL: compare_moe of two runs' metrics, after the label.
make_corpus 5 "$work/corpus.txt"
"$kiln" prepare --input "$work/corpus.txt" --out "$work/data" --tokenizer byte --val-fraction 0.1 >/dev/null

cat > "$work/tiny.toml" <<EOF2
[model]
arch = "llama"
n_layer = 3
n_head = 4
n_kv_head = 2
n_embd = 32
ffn_hidden_size = 48
block_size = 16
[model.moe]
num_experts = 4
top_k = 2
ffn_hidden_size = 16
shared_experts = 1
first_k_dense = 1
aux_loss_coef = 0.01
z_loss_coef = 0.001
[data]
dir = "$work/data"
[train]
steps = 10
micro_batch = 1
global_batch = 4
seq_len = 16
[optim]
lr = 3e-3
[schedule]
warmup_steps = 2
[eval]
every = 5
batches = 1
[log]
every = 1
peak_tflops = 1.0
expert_counts = true
[checkpoint]
every = 0
[parallel]
timeout_s = 20
bucket_mb = 0.004
EOF2

train() { run_train "$work/tiny.toml" "$@"; }  # train RUN_NAME NP [--set ...]
# The LM loss and the balancing losses, up to the first expert-selection flip (common.sh).
check() {  # check REF RUN LABEL
  echo -n "$3: "
  compare_moe "$work/$1/metrics.jsonl" "$work/$2/metrics.jsonl"
}
