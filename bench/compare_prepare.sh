#!/usr/bin/env bash
# kiln prepare vs a Python peer: the same JSONL corpus tokenized with the same
# sentencepiece model into llm.c-format uint16 token shards, by `kiln prepare --format
# jsonl` and by bench/prepare/peer.py (json.loads + Debian's python3-sentencepiece in a
# multiprocessing.Pool, as llm.c's dev/data/fineweb.py does), timed in alternating runs
# (kiln, peer, kiln, peer) so that a change in machine load hits both alike.
#
#   bench/compare_prepare.sh [--quick] [--docs N] [--seed S] [--runs N] [--threads N]
#                            [--compressed zstd|gzip] [--work DIR] [--kiln PATH]
#
# The corpus (bench/prepare/make_corpus.py): --docs documents (default 100,000, about
# 63 MB of JSONL; --quick: 10,000), each a run of 1 to 8 consecutive verses of the King
# James Bible (Debian's bible-kjv; data/kjv.txt when present, as scripts/demo.sh makes
# it), one verse per line, from --seed (default 1234). It and the model are cached in
# --work (default build/bench-prepare/).
#
# Steps:
#   1. kiln trains a sentencepiece model of 8,192 pieces on the corpus, once and untimed
#      (`kiln prepare --format jsonl --tokenizer sentencepiece --vocab-size 8192`).
#   2. --runs N (default 2) runs of each side, alternated, timed by wall clock (process
#      start to exit): kiln prepare with that model (--tokenizer-files, --val-fraction 0,
#      OMP_NUM_THREADS=--threads) and peer.py with --threads workers (default 2).
#   3. After the first pair, kiln's train shards (and val shards, if any) must hold
#      exactly the peer's tokens, else the script stops with status 1: a speed ratio of
#      different work means nothing.
# --compressed zstd|gzip compresses the corpus first (zstd -3, gzip -6) and both sides
# read the compressed file: kiln itself, the peer through Python's gzip or a `zstd -dc`
# pipe. MB/s is always of the uncompressed JSONL (MB = 10^6 bytes).
#
# Reported: the CPU, the load average before and after, and per side the corpus MB,
# documents, tokens, each run's seconds, the best run's seconds and MB/s, and the ratio
# kiln/peer of the best runs' MB/s. On a machine shared with builds the load average
# says how far to trust the numbers. The default run takes about 1.5 minutes on 2 cores
# the first time (corpus and model made, ~40 s), about 1 minute after; --quick ~15 s.
# Not part of ctest.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
kiln="${KILN:-}"
work=""
docs=100000
seed=1234
runs=2
threads=2
compressed=""
vocab=8192
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) docs=10000 ;;
    --docs) docs="$2"; shift ;;
    --seed) seed="$2"; shift ;;
    --runs) runs="$2"; shift ;;
    --threads) threads="$2"; shift ;;
    --work) work="$2"; shift ;;
    --kiln) kiln="$2"; shift ;;
    --compressed)
      case "$2" in
        zstd|gzip) compressed="$2" ;;
        *) echo "compare_prepare.sh: --compressed zstd or gzip, not $2" >&2; exit 2 ;;
      esac
      shift ;;
    -h|--help) sed -n '2,/^# Not part of ctest/p' "$0"; exit 0 ;;
    *) echo "compare_prepare.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[ "$runs" -ge 1 ] || { echo "compare_prepare.sh: --runs must be at least 1" >&2; exit 2; }

# What a new user needs: the Bible text, Debian's sentencepiece for Python (the peer
# runs under /usr/bin/python3, where apt installs it) and zstd for --compressed zstd.
source "$root/scripts/lib/common.sh"
packages=("${KILN_DEMO_PACKAGES[@]}" python3 python3-sentencepiece)
[ "$compressed" = zstd ] && packages+=(zstd)
kiln_apt_install "${packages[@]}"
py=/usr/bin/python3
"$py" -c "import sentencepiece" 2>/dev/null || { echo "compare_prepare.sh: $py has no sentencepiece (apt-get install python3-sentencepiece)" >&2; exit 1; }
if [ -z "$kiln" ]; then
  for c in "$root/build/apps/kiln/kiln" "$root"/build*/apps/kiln/kiln; do
    if [ -x "$c" ]; then kiln="$c"; break; fi
  done
fi
[ -n "$kiln" ] && [ -x "$kiln" ] || { echo "compare_prepare.sh: no kiln binary (build it, or pass --kiln PATH)" >&2; exit 1; }
[ -n "$work" ] || work="$root/build/bench-prepare"
mkdir -p "$work"
export OMP_NUM_THREADS="$threads"
export OMP_WAIT_POLICY=passive

# The corpus, its compressed copy and the model: made once per (docs, seed), then reused.
make_corpus() {
  corpus="$work/kjv-$docs-seed$seed.jsonl"
  [ -f "$corpus" ] && return 0
  local kjv="$root/data/kjv.txt"
  if [ ! -f "$kjv" ]; then
    kjv="$work/kjv.txt"
    if [ ! -f "$kjv" ]; then
      bible gen1:1-rev22:21 > "$kjv.tmp"
      mv "$kjv.tmp" "$kjv"
    fi
  fi
  echo "== making the corpus: $docs documents, seed $seed -> $corpus"
  "$py" "$here/prepare/make_corpus.py" --docs "$docs" --seed "$seed" --kjv "$kjv" --out "$corpus"
}

compress_corpus() {
  input="$corpus"
  case "$compressed" in
    zstd) input="$corpus.zst"; [ -f "$input" ] || zstd -q -3 -T1 -f "$corpus" -o "$input" ;;
    gzip) input="$corpus.gz"; [ -f "$input" ] || { gzip -6 -c "$corpus" > "$input.tmp"; mv "$input.tmp" "$input"; } ;;
  esac
}

train_model() {
  model_dir="$work/model-$docs-seed$seed-v$vocab"
  [ -f "$model_dir/tokenizer.model" ] && return 0
  echo "== training the sentencepiece model ($vocab pieces, untimed) -> $model_dir"
  rm -rf "$model_dir"
  "$kiln" prepare --format jsonl --input "$corpus" --out "$model_dir" --tokenizer sentencepiece \
    --vocab-size "$vocab" --val-fraction 0 2> "$work/train-model.log"
}

# timed LOG CMD...: runs CMD with stdout and stderr to LOG, prints its wall seconds.
timed() {
  local log="$1"; shift
  local t0 t1
  t0=$(date +%s.%N)
  "$@" > "$log" 2>&1 || { echo "compare_prepare.sh: failed: $* (log: $log)" >&2; tail -n 20 "$log" >&2; exit 1; }
  t1=$(date +%s.%N)
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }'
}

run_kiln() {
  rm -rf "$work/out-kiln"
  timed "$work/kiln-$1.log" "$kiln" prepare --format jsonl --input "$input" --out "$work/out-kiln" \
    --tokenizer sentencepiece --tokenizer-files "$model_dir/tokenizer.model" --val-fraction 0 \
    --threads "$threads"
}

run_peer() {
  rm -f "$work/out-peer.bin"
  timed "$work/peer-$1.log" "$py" "$here/prepare/peer.py" --input "$input" \
    --model "$model_dir/tokenizer.model" --out "$work/out-peer.bin" --workers "$threads"
}

# Compares kiln's shards (train, then val, in meta.json's order) with the peer's shard,
# token by token; prints "documents tokens" of kiln's output, or the first difference
# and exits 1.
same_tokens() {
  "$py" - "$work/out-kiln" "$work/out-peer.bin" <<'PY'
import json, os, struct, sys
kdir, peer = sys.argv[1], sys.argv[2]
def tokens(path):
    with open(path, "rb") as f:
        data = f.read()
    magic, version, n = struct.unpack_from("<3i", data)
    if magic != 20240520 or version != 1 or len(data) != 1024 + 2 * n:
        sys.exit(f"{path}: not an llm.c uint16 shard of {n} tokens (magic {magic}, version {version}, {len(data)} bytes)")
    return data[1024:]
meta = json.load(open(os.path.join(kdir, "meta.json")))
k = b"".join(tokens(os.path.join(kdir, s["file"])) for split in ("train", "val")
             for s in meta["shards"].get(split, []))
p = tokens(peer)
if k != p:
    i = next((i for i in range(0, min(len(k), len(p)), 2) if k[i:i + 2] != p[i:i + 2]), min(len(k), len(p)))
    sys.exit(f"token streams differ: kiln {len(k) // 2} tokens, peer {len(p) // 2}; first difference at token {i // 2}")
print(meta["documents"], len(k) // 2)
PY
}

make_corpus
compress_corpus
train_model
corpus_bytes=$(stat -c %s "$corpus")
cpu_model="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "== kiln prepare vs Python peer, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs, $threads threads / workers"
echo "== CPU: $cpu_model"
echo "== input: $input ($(awk -v b="$corpus_bytes" 'BEGIN { printf "%.1f", b / 1e6 }') MB of JSONL$( [ -z "$compressed" ] || printf ', %s: %.1f MB' "$compressed" "$(awk -v b="$(stat -c %s "$input")" 'BEGIN { print b / 1e6 }')"))"
echo "== kiln: $kiln; peer: $py $here/prepare/peer.py (sentencepiece $("$py" -c 'import sentencepiece; print(sentencepiece.__version__)'))"
echo "== load average at start: $(cut -d' ' -f1-3 /proc/loadavg); logs: $work"

kiln_s=()
peer_s=()
for r in $(seq 1 "$runs"); do
  kiln_s+=("$(run_kiln "$r")")
  peer_s+=("$(run_peer "$r")")
  echo "run $r: kiln ${kiln_s[-1]} s, peer ${peer_s[-1]} s"
  if [ "$r" -eq 1 ]; then
    counts=$(same_tokens) || { echo "compare_prepare.sh: kiln and the peer wrote different tokens" >&2; exit 1; }
    read -r kiln_docs kiln_tokens <<< "$counts"
    peer_docs=$(sed -n 's/^peer: \([0-9]*\) documents.*/\1/p' "$work/peer-1.log")
    echo "token streams identical: $kiln_tokens tokens, kiln $kiln_docs documents, peer $peer_docs"
  fi
done
echo "== load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"

best() { printf '%s\n' "$@" | sort -g | head -1; }
kiln_best=$(best "${kiln_s[@]}")
peer_best=$(best "${peer_s[@]}")
echo
awk -v mb="$corpus_bytes" -v kd="$kiln_docs" -v pd="$peer_docs" -v tok="$kiln_tokens" \
    -v kb="$kiln_best" -v pb="$peer_best" -v kr="${kiln_s[*]}" -v pr="${peer_s[*]}" \
    -v inp="${compressed:-jsonl}" -v t="$threads" 'BEGIN {
  mb /= 1e6
  printf "| %-26s | %-6s | %9s | %9s | %10s | %-17s | %7s | %7s |\n", "side", "input", "corpus MB", "documents", "tokens", "runs (s)", "best s", "MB/s"
  printf "|%s|%s|%s|%s|%s|%s|%s|%s|\n", "----------------------------", "--------", "-----------", "-----------", "------------", "-------------------", "---------", "---------"
  printf "| %-26s | %-6s | %9.1f | %9d | %10d | %-17s | %7.2f | %7.2f |\n", "kiln prepare (" t " threads)", inp, mb, kd, tok, kr, kb, mb / kb
  printf "| %-26s | %-6s | %9.1f | %9d | %10d | %-17s | %7.2f | %7.2f |\n", "peer.py (" t " workers)", inp, mb, pd, tok, pr, pb, mb / pb
  printf "\nkiln/peer (MB/s of the best runs): %.2fx\n", pb / kb
}'
