"""A safetensors file's tensors for the `kiln train` tests' checks (common.sh puts this
folder on PYTHONPATH): tensors(path) -> {name: (shape, raw bytes)}, the header's metadata
left out. The format: an 8-byte little-endian header length, a JSON header naming each
tensor's dtype, shape and data_offsets into the bytes that follow."""
import json
import struct


def tensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    return {k: (v["shape"], raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in header.items() if k != "__metadata__"}
