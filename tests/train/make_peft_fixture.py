#!/usr/bin/python3
"""Writes tests/train/peft_fixture/adapter_model.safetensors, the tensors of a Hugging Face
PEFT LoRA adapter folder as PEFT's save_pretrained names them (no PEFT in Debian: written
by hand from PEFT's documented format, beside the hand-written adapter_config.json, which
is what PEFT 0.13's LoraConfig writes for r=2, lora_alpha=4, target_modules q_proj and
v_proj of a LlamaForCausalLM):

  base_model.model.model.layers.<l>.self_attn.<m>.lora_A.weight  F32 [r, in]
  base_model.model.model.layers.<l>.self_attn.<m>.lora_B.weight  F32 [out, r]

for a tiny Llama (2 layers, hidden 16, 2 heads of 8, 1 key/value head: q_proj 16 -> 16,
v_proj 16 -> 8). Element i of tensor number t (in the order written) is
fixture_value(t, i) = ((t * 7 + i * 3) % 23 - 11) / 64, exact in fp32, which
tests/train/lora_files_test.cpp recomputes. Metadata {"format": "pt"} as PEFT writes.

Usage: /usr/bin/python3 tests/train/make_peft_fixture.py [--check]
"""
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "peft_fixture", "adapter_model.safetensors")
R, C = 2, 16
MODULES = [("q_proj", C, C), ("v_proj", C, 8)]  # (name, in, out)


def fixture_value(t, i):
    return ((t * 7 + i * 3) % 23 - 11) / 64


def tensors():
    out, t = [], 0
    for layer in range(2):
        for name, fan_in, fan_out in MODULES:
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{name}."
            for which, shape in (("lora_A", [R, fan_in]), ("lora_B", [fan_out, R])):
                n = shape[0] * shape[1]
                out.append((prefix + which + ".weight", shape, [fixture_value(t, i) for i in range(n)]))
                t += 1
    return out


def encode():
    header, data = {"__metadata__": {"format": "pt"}}, b""
    for name, shape, values in tensors():
        raw = struct.pack(f"<{len(values)}f", *values)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + data


if __name__ == "__main__":
    blob = encode()
    if sys.argv[1:] == ["--check"]:
        ok = open(OUT, "rb").read() == blob
        print("peft fixture: " + ("matches its generator" if ok else "DIFFERS from its generator"))
        sys.exit(0 if ok else 1)
    open(OUT, "wb").write(blob)
    print(f"wrote {OUT} ({len(blob)} bytes)")
