#!/usr/bin/env python3
"""Writes a Hugging Face tokenizer.json in Llama 3's shape for the tests: byte-level BPE
with Llama 3's Split regex + ByteLevel pre-tokenizer and ignore_merges, a few hundred
merges learned on the given texts (plain BPE counting), and special added tokens.

  make_hf_tokenizer.py OUT_DIR TEXT_FILE... [--first-id N] [--vocab-size V]
                       [--merges M] [--specials A,B,...]

Ids: <filler_i> tokens below --first-id (default 0), then the 256 byte tokens, the merges,
fillers up to --vocab-size (default: none), then the specials (default Llama 3's
<|begin_of_text|>, <|end_of_text|>). Standard library only.
"""
import argparse, collections, json, os, re

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def bytes_to_unicode():
    """encoder.py's table, restated."""
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b); cs.append(256 + n); n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def learn_merges(text, b2u, count, vocab):
    freq = collections.Counter("".join(b2u[b] for b in w.encode()) for w in re.findall(r" ?\w+| ?[^\w\s]+|\s+", text))
    seqs = {w: list(w) for w in freq}
    merges = []
    for _ in range(count):
        pairs = collections.Counter()
        for w, f in freq.items():
            s = seqs[w]
            for a, b in zip(s, s[1:]):
                pairs[a, b] += f
        if not pairs:
            break
        (a, b), _ = pairs.most_common(1)[0]
        merges.append([a, b])
        vocab.setdefault(a + b, len(vocab))
        for w in seqs:
            s, i, t = seqs[w], 0, []
            while i < len(s):
                if i + 1 < len(s) and s[i] == a and s[i + 1] == b:
                    t.append(a + b); i += 2
                else:
                    t.append(s[i]); i += 1
            seqs[w] = t
    return merges


def make(texts, first_id=0, vocab_size=0, merges=400, specials=("<|begin_of_text|>", "<|end_of_text|>")):
    b2u = bytes_to_unicode()
    vocab = {f"<filler_{i}>": i for i in range(first_id)}
    for b in range(256):
        vocab[b2u[b]] = first_id + b
    merge_list = learn_merges("".join(texts), b2u, merges, vocab)
    while len(vocab) < vocab_size - len(specials):
        vocab[f"<filler_{len(vocab)}>"] = len(vocab)
    added = [{"id": len(vocab) + i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, c in enumerate(specials)]
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": LLAMA3_PATTERN}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
            "post_processor": None,
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                      "vocab": vocab, "merges": merge_list}}


def decode(tok, ids):
    """The bytes of `ids` (ByteLevel decoding; added tokens as their content)."""
    u2b = {u: b for b, u in bytes_to_unicode().items()}
    by_id = {i: t for t, i in tok["model"]["vocab"].items()}
    added = {a["id"]: a["content"] for a in tok["added_tokens"]}
    out = bytearray()
    for i in ids:
        out += added[i].encode() if i in added else bytes(u2b[c] for c in by_id[i])
    return bytes(out)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("texts", nargs="+")
    ap.add_argument("--first-id", type=int, default=0)
    ap.add_argument("--vocab-size", type=int, default=0)
    ap.add_argument("--merges", type=int, default=400)
    ap.add_argument("--specials", default="<|begin_of_text|>,<|end_of_text|>")
    a = ap.parse_args()
    texts = [open(t, encoding="utf-8").read() for t in a.texts]
    tok = make(texts, a.first_id, a.vocab_size, a.merges, a.specials.split(","))
    os.makedirs(a.out_dir, exist_ok=True)
    json.dump(tok, open(f"{a.out_dir}/tokenizer.json", "w"), ensure_ascii=False)
