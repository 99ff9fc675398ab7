// Encodes text files with the npm package gpt-3-encoder (the reference for kiln's GPT-2
// tokenizer test). Usage: node gpt2_reference.js <npm prefix> <out.json> <in.txt>...
// Writes a JSON array with one array of token ids per input file.
const fs = require('fs');
const path = require('path');
const [prefix, out, ...inputs] = process.argv.slice(2);
const { encode } = require(path.join(prefix, 'node_modules', 'gpt-3-encoder'));
const result = inputs.map(f => encode(fs.readFileSync(f, 'utf8')));
fs.writeFileSync(out, JSON.stringify(result));
