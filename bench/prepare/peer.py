#!/usr/bin/env python3
"""The Python peer of `kiln prepare --format jsonl` (bench/compare_prepare.sh): JSONL in,
one llm.c token shard out, the way llm.c's dev/data/fineweb.py does it.

    peer.py --input corpus.jsonl[.gz|.zst] --model tokenizer.model --out peer.bin
            [--workers 2] [--text-key text] [--chunk-bytes 1048576]

Each line is json.loads'ed; a record whose "text" is a non-empty string becomes eot_id
followed by SentencePieceProcessor.encode(text) (Debian's python3-sentencepiece);
empty texts are skipped, as are lines that are not JSON objects with a string text.
eot_id is the id of the piece "<|endoftext|>", else the model's eos id (as kiln finds it).
The tokens go to one shard in llm.c's format: a 1024-byte header of 256 int32
([0] = 20240520, [1] = 1 for uint16 tokens, [2] = the token count), then the tokens as
uint16.

--workers N (default 2): the main process reads the file in chunks of whole lines
(about --chunk-bytes each) and a multiprocessing.Pool of N processes parses and encodes
them through Pool.imap, which keeps the chunks in order; --workers 1 does it all in this
process. A .gz input is read through Python's gzip, a .zst one through a `zstd -dc` pipe.

kiln cuts the text at '\\n' and at a literal U+2581 and emits their byte pieces itself
(src/data/sp_tokenizer.cpp). For '\\n' sentencepiece's own encode gives the same ids
(<0x0A>, and no piece spans it); for U+2581 it does not, so texts holding that
character would tokenize differently here. The bench's corpus has none, and
compare_prepare.sh checks that both token streams are equal.

Prints one line: documents, MB of JSONL read (10^6 bytes, uncompressed), tokens,
seconds and MB/s. Standard library and sentencepiece only.
"""
import argparse
import array
import gzip
import json
import multiprocessing
import os
import struct
import subprocess
import sys
import time

MAGIC, VERSION, HEADER_INTS = 20240520, 1, 256

_sp = None
_eot = None
_key = None


def load(model, key):
    """Loads the model into this process (the pool's initializer, or the main process)."""
    global _sp, _eot, _key
    import sentencepiece
    _sp = sentencepiece.SentencePieceProcessor(model_file=model)
    _eot = _sp.piece_to_id("<|endoftext|>")
    if _sp.id_to_piece(_eot) != "<|endoftext|>":
        _eot = _sp.eos_id()
    if _eot < 0:
        raise SystemExit(f"peer.py: {model} has neither '<|endoftext|>' nor an eos id")
    if _sp.get_piece_size() > 65536:
        raise SystemExit(f"peer.py: {model} has {_sp.get_piece_size()} pieces: not uint16 tokens")
    _key = key


def encode_chunk(lines):
    """A chunk of JSONL lines -> (documents, uint16 tokens as bytes, JSONL bytes)."""
    tokens = array.array("H")
    docs = nbytes = 0
    for line in lines:
        nbytes += len(line)
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        text = rec.get(_key) if isinstance(rec, dict) else None
        if not isinstance(text, str) or not text:
            continue
        tokens.append(_eot)
        tokens.extend(_sp.encode(text))
        docs += 1
    return docs, tokens.tobytes(), nbytes


def open_input(path):
    """A binary stream of the (decompressed) JSONL and a function that closes it."""
    if path.endswith(".gz"):
        f = gzip.open(path, "rb")
        return f, f.close
    if path.endswith(".zst"):
        p = subprocess.Popen(["zstd", "-dc", "--", path], stdout=subprocess.PIPE)

        def close():
            p.stdout.close()
            if p.wait() != 0:
                raise SystemExit(f"peer.py: zstd -dc {path} failed")
        return p.stdout, close
    f = open(path, "rb")
    return f, f.close


def chunks(f, size):
    while True:
        lines = f.readlines(size)  # whole lines, about `size` bytes
        if not lines:
            return
        yield lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--input", required=True, help="JSONL, plain, .gz or .zst")
    ap.add_argument("--model", required=True, help="the sentencepiece .model (kiln's tokenizer.model)")
    ap.add_argument("--out", required=True, help="the shard to write")
    ap.add_argument("--workers", type=int, default=2, help="encoding processes (default 2; 1: in-process)")
    ap.add_argument("--text-key", default="text", help="the key of each record's text (default text)")
    ap.add_argument("--chunk-bytes", type=int, default=1 << 20, help="JSONL bytes per chunk (default 1 MiB)")
    args = ap.parse_args()

    start = time.perf_counter()
    f, close = open_input(args.input)
    docs = ntok = nbytes = 0
    with open(args.out + ".tmp", "wb") as out:
        out.write(b"\0" * (4 * HEADER_INTS))
        if args.workers <= 1:
            load(args.model, args.text_key)
            results = map(encode_chunk, chunks(f, args.chunk_bytes))
            pool = None
        else:
            pool = multiprocessing.Pool(args.workers, initializer=load,
                                        initargs=(args.model, args.text_key))
            results = pool.imap(encode_chunk, chunks(f, args.chunk_bytes))
        for d, tok, nb in results:
            out.write(tok)
            docs += d
            ntok += len(tok) // 2
            nbytes += nb
        if pool is not None:
            pool.close()
            pool.join()
        if ntok >= 2**31:
            raise SystemExit(f"peer.py: {ntok} tokens do not fit one shard's int32 count")
        out.seek(0)
        out.write(struct.pack(f"<{HEADER_INTS}i", MAGIC, VERSION, ntok, *[0] * (HEADER_INTS - 3)))
    close()
    os.replace(args.out + ".tmp", args.out)
    secs = time.perf_counter() - start
    print(f"peer: {docs} documents, {nbytes / 1e6:.1f} MB -> {ntok} tokens in {secs:.2f} s "
          f"({nbytes / 1e6 / secs:.2f} MB/s, {args.workers} worker{'s' if args.workers != 1 else ''}) -> {args.out}")


if __name__ == "__main__":
    sys.exit(main())
