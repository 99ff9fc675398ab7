#!/usr/bin/env bash
# Chat fine-tuning end to end, against independent references:
#   1. `kiln prepare --format chat` renders conversations as the published Jinja chat
#      templates do (Llama 3 Instruct's and ChatML, rendered by Debian's python3-jinja2):
#      its ids, decoded with a generated Llama-3-shaped tokenizer.json
#      (make_hf_tokenizer.py), equal the Jinja text, and the loss spans hold exactly the
#      assistants' contents and end-of-turn tokens;
#   2. supervised fine-tuning: a tiny Llama exported as a Hugging Face folder is the
#      model.init_from of a run on chat data of a fixed form ("The answer is Y." for 12
#      questions); its assistant-token training loss falls below 0.1 and greedy samples
#      answer the questions as taught; `kiln eval` scores its val split as the trainer did.
# Usage: chat_sft_test.sh KILN WORK_DIR
set -euo pipefail
kiln="$1"
work="$2"
here="$(cd "$(dirname "$0")" && pwd)"
py=/usr/bin/python3
rm -rf "$work" && mkdir -p "$work/tok"
export OMP_NUM_THREADS=2

"$py" - "$work" <<'PY'
import json, sys
work = sys.argv[1]
pairs = {"red": "apple", "blue": "sky", "green": "grass", "white": "snow", "black": "night", "gold": "sun",
         "grey": "stone", "pink": "rose", "brown": "earth", "silver": "moon", "orange": "fire", "violet": "plum"}
with open(f"{work}/sft.jsonl", "w") as f:
    for i in range(600):
        q = list(pairs)[i % len(pairs)]
        f.write(json.dumps({"messages": [{"role": "user", "content": f"What is {q}?"},
                                         {"role": "assistant", "content": f"The answer is {pairs[q]}."}]}) + "\n")
# The template check's conversations: system turns, several assistant turns, whitespace
# that Llama 3's trim removes, non-ASCII text, a newline inside a message.
conv = [
    [{"role": "system", "content": "  You are terse.\n"}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": " Hello. "}, {"role": "user", "content": "Bye\u00a0"},
     {"role": "assistant", "content": "Au revoir — à bientôt!\n\nSee you."}],
    [{"role": "user", "content": "2 + 2?"}, {"role": "assistant", "content": "4"}],
    [{"role": "user", "content": "\u3000wide\u3000"}, {"role": "assistant", "content": "\tok\t"},
     {"role": "assistant", "content": "again"}],
]
with open(f"{work}/check.jsonl", "w") as f:
    for c in conv:
        f.write(json.dumps({"messages": c}, ensure_ascii=False) + "\n")
json.dump(conv, open(f"{work}/check.json", "w"))
open(f"{work}/corpus.txt", "w").write(" ".join(f"What is {q}? The answer is {a}." for q, a in pairs.items()) * 20)
PY
"$py" "$here/make_hf_tokenizer.py" "$work/tok" "$work/corpus.txt" --merges 200 \
  --specials "<|begin_of_text|>,<|end_of_text|>,<|start_header_id|>,<|end_header_id|>,<|eot_id|>,<|im_start|>,<|im_end|>"

# 1. The templates against Jinja.
for tmpl in llama3 chatml; do
  "$kiln" prepare --format chat --chat-template "$tmpl" --input "$work/check.jsonl" --out "$work/check-$tmpl" \
    --tokenizer hf --tokenizer-files "$work/tok" > /dev/null
done
"$py" - "$work" "$here" <<'PY'
import json, struct, sys
import jinja2
work, here = sys.argv[1], sys.argv[2]
sys.path.insert(0, here)
from make_hf_tokenizer import decode
tok = json.load(open(f"{work}/tok/tokenizer.json"))
conv = json.load(open(f"{work}/check.json"))
# The published templates: Meta-Llama-3-8B-Instruct's tokenizer_config.json chat_template,
# and ChatML's.
LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
          "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
          "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
          "{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant"
          "<|end_header_id|>\n\n' }}{% endif %}")
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
env = jinja2.Environment()
bos = "<|begin_of_text|>"
bos_id = next(a["id"] for a in tok["added_tokens"] if a["content"] == bos)
for name, src, eot in (("llama3", LLAMA3, "<|eot_id|>"), ("chatml", CHATML, "<|im_end|>")):
    d = f"{work}/check-{name}"
    m = json.load(open(f"{d}/meta.json"))
    ids = []
    for s in m["shards"]["train"]:
        raw = open(f"{d}/{s['file']}", "rb").read()
        n = struct.unpack("<3i", raw[:12])[2]
        ids += struct.unpack(f"<{n}H", raw[1024:])
    raw = open(f"{d}/{m['loss_index']['train']['file']}", "rb").read()
    n = struct.unpack("<Q", raw[16:24])[0]
    bounds = struct.unpack(f"<{n}Q", raw[32:])
    in_loss = [False] * len(ids)
    for b, e in zip(bounds[::2], bounds[1::2]):
        for p in range(b, e):
            in_loss[p] = True
    # Each conversation: from its separator (<|begin_of_text|>) to the next.
    starts = [i for i, t in enumerate(ids) if t == bos_id] + [len(ids)]
    assert len(starts) - 1 == len(conv), (name, len(starts) - 1)
    for k, c in enumerate(conv):
        a, b = starts[k], starts[k + 1]
        text = decode(tok, ids[a:b]).decode()
        want = env.from_string(src).render(messages=c, bos_token=bos, add_generation_prompt=False)
        if name == "chatml":
            want = bos + want  # kiln's separator; Llama 3's template has it as bos_token already
        assert text == want, (name, k, text, want)
        got_loss = b"".join(decode(tok, [ids[p]]) for p in range(a, b) if in_loss[p]).decode()
        strip = (lambda s: s.strip()) if name == "llama3" else (lambda s: s)
        want_loss = "".join(strip(x["content"]) + eot for x in c if x["role"] == "assistant")
        assert got_loss == want_loss, (name, k, got_loss, want_loss)
    print(f"{name}: {len(conv)} conversations render as Jinja renders them; loss spans = the assistants' turns")
PY

# 2. Supervised fine-tuning from a Hugging Face folder.
"$kiln" prepare --input "$work/corpus.txt" --out "$work/text" --tokenizer hf --tokenizer-files "$work/tok" \
  --val-fraction 0.1 > /dev/null
"$kiln" prepare --format chat --input "$work/sft.jsonl" --out "$work/sft" --tokenizer hf \
  --tokenizer-files "$work/tok" --val-fraction 0.05 > /dev/null
cat > "$work/base.toml" <<TOML
[model]
arch = "llama"
n_layer = 2
n_head = 4
n_kv_head = 2
n_embd = 64
block_size = 64
[data]
dir = "$work/text"
[train]
steps = 10
micro_batch = 4
seq_len = 64
[optim]
lr = 3e-3
[checkpoint]
every = 10
[log]
every = 10
peak_tflops = 1.0
[run]
dir = "$work/base"
TOML
"$kiln" train "$work/base.toml" > "$work/base.log" 2>&1 || { cat "$work/base.log"; exit 1; }
"$kiln" export --checkpoint "$work/base/ckpt/step_00000010" --format hf --out "$work/hf" > /dev/null
cat > "$work/sft.toml" <<TOML
[model]
arch = "llama"
init_from = "$work/hf"
[data]
dir = "$work/sft"
[train]
steps = 300
micro_batch = 8
seq_len = 64
[optim]
lr = 3e-3
[schedule]
kind = "cosine"
warmup_steps = 10
[eval]
every = 300
batches = 4
[checkpoint]
every = 300
[log]
every = 1
peak_tflops = 1.0
[run]
dir = "$work/run"
TOML
"$kiln" train "$work/sft.toml" > "$work/sft.log" 2>&1 || { cat "$work/sft.log"; exit 1; }
"$py" - "$work/run/metrics.jsonl" <<'PY'
import json, sys
recs = [r for r in map(json.loads, open(sys.argv[1])) if "loss" in r]
first, last = recs[0]["loss"], recs[-1]["loss"]
val = [r["val_loss"] for r in recs if "val_loss" in r]
# Val stays higher: a window that starts inside a conversation cuts its question off, and
# the answer it asked for cannot be known (packing with document masks is another issue).
assert last < 0.1 and val and val[-1] < first / 5, f"the assistant-token loss did not fall: {first} -> {last}, val {val}"
print(f"SFT: assistant-token loss {first:.3f} -> {last:.4f}, val {val[-1]:.4f}")
PY
for q in red violet silver; do
  out=$("$kiln" sample --checkpoint "$work/run/ckpt/step_00000300" --temperature 0 --max-new-tokens 8 \
    --prompt "<|start_header_id|>user<|end_header_id|>

What is $q?<|eot_id|><|start_header_id|>assistant<|end_header_id|>

")
  case "$q" in red) want="The answer is apple.<|eot_id|>" ;; violet) want="The answer is plum.<|eot_id|>" ;;
    silver) want="The answer is moon.<|eot_id|>" ;; esac
  case "$out" in
    *"$want"*) echo "sample for $q: ...${want}" ;;
    *) echo "FAIL: the answer for $q is not '$want': $out"; exit 1 ;;
  esac
done
# kiln eval scores the chat val split as the trainer did: the assistants' tokens only.
"$kiln" eval --model "$work/run/ckpt/step_00000300" --data "$work/sft" --seq-len 64 --json "$work/eval.json" > /dev/null
"$py" - "$work" <<'PY'
import json, sys
work = sys.argv[1]
ev = json.load(open(f"{work}/eval.json"))["perplexity"][0]
val = [r["val_loss"] for r in map(json.loads, open(f"{work}/run/metrics.jsonl")) if "val_loss" in r][-1]
assert abs(ev["loss"] - val) <= 1e-6 * val, (ev, val)
print(f"kiln eval: val loss {ev['loss']:.6f} over {ev['targets']} assistant tokens = the trainer's {val:.6f}")
PY
echo "chat_sft_test: ok"
