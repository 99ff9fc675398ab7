#!/usr/bin/env bash
# The main job, end to end on this machine: the King James Bible (Debian's bible-kjv)
# -> a SentencePiece BPE tokenizer and token shards -> a ~4M-parameter GPT trained on
# 2 CPU cores -> the loss summary against a unigram baseline, and a sample.
# Installs missing Debian packages; idempotent (data is prepared once, the run starts
# fresh each time); works from any directory.
#   --arch gpt2|llama|moe|vit|dit  which demo model (default gpt2: configs/demo.toml;
#                       llama: configs/demo-llama.toml, the same budget with a Llama 3 block;
#                       moe: configs/demo-moe.toml, the Llama demo with Mixtral-style
#                       mixture-of-experts blocks (8 experts, 2 per token);
#                       vit: a ViT classifier on Debian's Fashion-MNIST,
#                       configs/vit-fashion-mnist.toml, then its per-class test accuracy;
#                       dit: a class-conditional DiT on Fashion-MNIST,
#                       configs/dit-fashion-mnist.toml, then sample grids with and
#                       without guidance, scored by the vit demo's classifier when
#                       runs/vit-fashion-mnist holds one);
#                       llava: a vision-language model trained from scratch on kiln scenes'
#                       2x2 Fashion-MNIST scenes, configs/llava-scenes.toml, then its
#                       greedy answers to the held-out scenes' questions per kind
#   KILN_DEMO_STEPS=N   override train.steps (default: the config's)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
start=$(date +%s)
arch=gpt2
while [ $# -gt 0 ]; do
  case "$1" in
    --arch) [ $# -ge 2 ] || { echo "demo.sh: --arch needs a value: gpt2, llama, moe, vit, dit or llava" >&2; exit 2; }
            arch="$2"; shift ;;
    --arch=*) arch="${1#--arch=}" ;;
    *) echo "demo.sh: unknown argument '$1' (use --arch gpt2|llama|moe|vit|dit|llava)" >&2; exit 2 ;;
  esac
  shift
done
case "$arch" in
  gpt2) config="$KILN_ROOT/configs/demo.toml" run="$KILN_ROOT/runs/demo" ;;
  llama) config="$KILN_ROOT/configs/demo-llama.toml" run="$KILN_ROOT/runs/demo-llama" ;;
  moe) config="$KILN_ROOT/configs/demo-moe.toml" run="$KILN_ROOT/runs/demo-moe" ;;
  vit) config="$KILN_ROOT/configs/vit-fashion-mnist.toml" run="$KILN_ROOT/runs/vit-fashion-mnist" ;;
  dit) config="$KILN_ROOT/configs/dit-fashion-mnist.toml" run="$KILN_ROOT/runs/dit-fashion-mnist" ;;
  llava) config="$KILN_ROOT/configs/llava-scenes.toml" run="$KILN_ROOT/runs/llava-scenes" ;;
  *) echo "demo.sh: --arch must be gpt2, llama, moe, vit, dit or llava, not '$arch'" >&2; exit 2 ;;
esac

images=false
[ "$arch" = vit ] || [ "$arch" = dit ] || [ "$arch" = llava ] && images=true
if $images; then
  kiln_apt_install "${KILN_BUILD_PACKAGES[@]}" "${KILN_VIT_DEMO_PACKAGES[@]}"
else
  kiln_apt_install "${KILN_BUILD_PACKAGES[@]}" "${KILN_DEMO_PACKAGES[@]}"
fi
# The program alone, in the same build folder as scripts/build.sh (bin/kiln links to it).
KILN_BUILD="${KILN_DEMO_BUILD_DIR:-$KILN_ROOT/build-app}"
kiln_build -DKILN_BUILD_TESTS=OFF -DKILN_BUILD_BENCH=OFF -DKILN_CUDA=OFF
kiln_link_bin
kiln="$KILN_BUILD/apps/kiln/kiln"
# Said last, whichever demo ran: where the program is for the README's "Using it" lines.
trap '[ $? -ne 0 ] || echo "demo: the kiln program is $KILN_ROOT/bin/kiln (export PATH=\"$KILN_ROOT/bin:\$PATH\" to type kiln)"' EXIT
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(nproc)}"
echo "demo: built kiln in $(( $(date +%s) - start )) s"

mkdir -p "$KILN_ROOT/data"
if [ "$arch" = llava ]; then
  # The scene set (seed 0: the same scenes every time) and its shards, with a
  # SentencePiece tokenizer trained on its conversations (160 caption slots hold each).
  scenes="$KILN_ROOT/data/scenes"
  data="$KILN_ROOT/data/scenes-prepared"
  # Sets an older kiln wrote (four rounds, 128 caption slots) are made again.
  if ! head -1 "$scenes/val.jsonl" 2>/dev/null | grep -q '"kinds":\["position","presence","count","presence","count","describe"\]'; then
    rm -rf "$scenes" "$data"
    "$kiln" scenes --out "$scenes" --train 50000 --val 1000
  fi
  if ! grep -q '"tokens": 160,' "$data/meta.json" 2>/dev/null; then
    rm -rf "$data"
    "$kiln" prepare --format llava --input "$scenes/train.jsonl" --val-input "$scenes/val.jsonl" \
      --out "$data" --tokenizer sentencepiece --vocab-size 1024 --caption-tokens 160
  fi
elif $images; then
  data="$KILN_ROOT/data/fashion-mnist"
  if [ ! -f "$data/meta.json" ]; then
    "$kiln" prepare --format idx --input /usr/share/datasets/fashion-mnist --out "$data" \
      --class-names "T-shirt/top,Trouser,Pullover,Dress,Coat,Sandal,Shirt,Sneaker,Bag,Ankle boot"
  fi
else
  data="$KILN_ROOT/data/kjv"
  if [ ! -f "$KILN_ROOT/data/kjv.txt" ]; then
    bible gen1:1-rev22:21 > "$KILN_ROOT/data/kjv.txt.tmp"
    mv "$KILN_ROOT/data/kjv.txt.tmp" "$KILN_ROOT/data/kjv.txt"
  fi
  if [ ! -f "$data/meta.json" ]; then
    "$kiln" prepare --input "$KILN_ROOT/data/kjv.txt" --out "$data" --tokenizer sentencepiece \
      --vocab-size 4096 --val-fraction 0.05
  fi
fi

rm -rf "$run"
sets=(--set "data.dir=$data" --set "run.dir=$run")
[ -n "${KILN_DEMO_STEPS:-}" ] && sets+=(--set "train.steps=$KILN_DEMO_STEPS")
train_start=$(date +%s)
"$kiln" train "$config" "${sets[@]}"
train_s=$(( $(date +%s) - train_start ))
ckpt=$(ls -d "$run"/ckpt/step_* | tail -1)

if [ "$arch" = vit ]; then
  echo
  echo "== test accuracy ($ckpt, the 10,000 test images) =="
  "$kiln" classify --checkpoint "$ckpt" --data "$data" --json "$run/classify.json"
  awk -F'"accuracy": ' '/^ "accuracy"/{split($2,a,/[,}]/); printf "top-1 accuracy:    %.2f%% %s\n", 100*a[1], (a[1]>=0.88)?"(target 88%: met)":"(target 88%: NOT met)"}' "$run/classify.json"
  echo "training time:     $train_s s on $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) (target: about 15 minutes on a quiet 2-core machine)"
  echo "demo: total wall time $(( $(date +%s) - start )) s"
  exit 0
fi

if [ "$arch" = llava ]; then
  echo
  echo "== greedy answers ($ckpt, the 1,000 held-out scenes: test-split items only) =="
  "$kiln" eval --model "$ckpt" --llava "$scenes/val.jsonl" --examples 2 --json "$run/answers.json"
  echo "targets:           position >= 90%, count >= 85%, presence >= 90% exact"
  echo "training time:     $train_s s on $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) (target: about 15 minutes on a quiet 2-core machine)"
  echo "demo: total wall time $(( $(date +%s) - start )) s"
  exit 0
fi

if [ "$arch" = dit ]; then
  echo
  echo "== samples ($ckpt, EMA weights, 10 per class, 50 Euler steps) =="
  for cfg in 1 5; do
    "$kiln" sample-images --checkpoint "$ckpt" --out "$run/samples_cfg$cfg.png" --classes 0-9 \
      --per-class 10 --steps 50 --cfg-scale "$cfg" --samples "$run/samples_cfg$cfg"
  done
  vit=$(ls -d "$KILN_ROOT"/runs/vit-fashion-mnist/ckpt/step_* 2>/dev/null | tail -1 || true)
  if [ -n "$vit" ]; then
    echo
    echo "== the ViT classifier ($vit) on the samples, relative to the real test images =="
    "$kiln" classify --checkpoint "$vit" --data "$data" --json "$run/classify_real.json" > /dev/null
    for cfg in 1 5; do
      echo "-- guidance scale $cfg:"
      "$kiln" classify --checkpoint "$vit" --data "$run/samples_cfg$cfg" \
        --relative-to "$run/classify_real.json" --json "$run/classify_cfg$cfg.json" | tail -12
    done
  else
    echo "(no ViT checkpoint in runs/vit-fashion-mnist: run scripts/demo.sh --arch vit to score the samples)"
  fi
  "$kiln" report "$run" > /dev/null
  echo "grids:             $run/samples_cfg1.png (no guidance), $run/samples_cfg5.png (scale 5); report $run/report.html"
  echo "training time:     $train_s s on $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) (target: about 15 minutes on a quiet 2-core machine)"
  echo "demo: total wall time $(( $(date +%s) - start )) s"
  exit 0
fi

echo
echo "== summary =="
unigram=$("$kiln" unigram --data "$data" | awk '{print $4}')
last=$(grep '"val_loss"' "$run/metrics.jsonl" | tail -1)
val=$(echo "$last" | sed -E 's/.*"val_loss":([0-9.eE+-]+).*/\1/')
tps=$(awk -F'"tokens_per_s":' 'NF>1{split($2,a,/[,}]/); s+=a[1]; n++} END{if(n) printf "%.0f", s/n}' "$run/metrics.jsonl")
printf 'val loss:          %.3f nats/token\n' "$val"
printf 'unigram val loss:  %.3f nats/token' "$unigram"
echo "  (target: val loss at least 1.5 nats below)"
awk -v v="$val" -v u="$unigram" 'BEGIN{printf "improvement:       %.3f nats/token %s\n", u-v, (u-v>=1.5)?"(met)":"(NOT met)"}'
echo "mean tokens/s:     $tps"
echo "training time:     $train_s s on $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) (target: under 600 s on a quiet 2-core machine)"

echo
echo "== sample (200 tokens, $ckpt) =="
sample=$("$kiln" sample --checkpoint "$ckpt" --max-new-tokens 200 --temperature 0.8 --top-k 40 --seed 1)
echo "$sample"
# Share of the sample's words (letters only, case-folded) that occur in the corpus.
tr -cs "[:alpha:]" '\n' < "$KILN_ROOT/data/kjv.txt" | tr '[:upper:]' '[:lower:]' | sort -u > "$run/corpus_words.txt"
echo "$sample" | tr -cs "[:alpha:]" '\n' | tr '[:upper:]' '[:lower:]' | grep -v '^$' > "$run/sample_words.txt" || true
total=$(wc -l < "$run/sample_words.txt")
known=$(grep -cxFf "$run/corpus_words.txt" "$run/sample_words.txt" || true)
awk -v k="$known" -v t="$total" 'BEGIN{if(t) printf "\nwords found in the corpus: %d of %d (%.1f%%, target 90%%)\n", k, t, 100*k/t}'
echo "demo: total wall time $(( $(date +%s) - start )) s"
