#!/usr/bin/env python3
"""Writes a JSONL corpus for bench/compare_prepare.sh: N documents, each a run of 1 to 8
consecutive verses of the King James Bible, one verse per line, as {"id": i, "text": ...}.

    make_corpus.py --out corpus.jsonl [--docs 100000] [--seed 1234] [--kjv data/kjv.txt]

The text is that of Debian's bible-kjv (`bible gen1:1-rev22:21`, as scripts/demo.sh makes
data/kjv.txt): --kjv names that file (default: data/kjv.txt when present, else the `bible`
program is run). Its layout: a chapter heading ("Genesis 1") after a blank line, then
verses "  N text" wrapped at ~80 columns; a verse's lines are joined with single spaces.
The same --docs, --seed and text give the same bytes (random.Random(seed), no other
state). Python 3 standard library only.
"""
import argparse
import json
import os
import random
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VERSE = re.compile(r"^  (\d+) (.*)$")


def read_kjv(path):
    if path:
        with open(path, encoding="utf-8") as f:
            return f.read()
    default = os.path.join(ROOT, "data", "kjv.txt")
    if os.path.exists(default):
        with open(default, encoding="utf-8") as f:
            return f.read()
    return subprocess.run(["bible", "gen1:1-rev22:21"], check=True, capture_output=True,
                          text=True).stdout


def verses(text):
    """The verses in order, each one line (its wrapped lines joined with a space)."""
    out = []
    lines = text.split("\n")
    for i, line in enumerate(lines):
        m = VERSE.match(line)
        if m:
            out.append(m.group(2).strip())
        elif line and not line[0].isspace() and (i == 0 or lines[i - 1] == ""):
            continue  # chapter heading
        elif line and out:
            out[-1] += " " + line.strip()  # continuation of the last verse
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=100_000, help="documents (default 100000)")
    ap.add_argument("--seed", type=int, default=1234, help="random seed (default 1234)")
    ap.add_argument("--out", required=True, help="the JSONL file to write")
    ap.add_argument("--kjv", help="the text of `bible gen1:1-rev22:21` (default: data/kjv.txt or run bible)")
    args = ap.parse_args()

    vs = verses(read_kjv(args.kjv))
    if len(vs) < 30000:
        sys.exit(f"make_corpus.py: found {len(vs)} verses, expected ~31,000: not bible-kjv's text?")
    rng = random.Random(args.seed)
    tmp = args.out + ".tmp"
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        for i in range(args.docs):
            k = rng.randint(1, 8)
            start = rng.randrange(len(vs) - k + 1)
            text = "\n".join(vs[start:start + k])
            f.write(json.dumps({"id": i, "text": text}, ensure_ascii=False) + "\n")
    os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
