#!/usr/bin/python3
"""Writes tests/golden/moe_hf/: tiny Hugging Face folders of the two mixture-of-experts
layouts kiln reads and of dense Qwen3 (their attention), and the kiln tensors each must
become.

Written by hand from transformers' formats (no transformers, no torch):
- moe_hf/mixtral/: MixtralForCausalLM (model_type "mixtral"), config.json with the fields
  of a released Mixtral config (no head_dim, no router_jitter_noise: their defaults),
  model.safetensors in F32 with the names of MixtralForCausalLM's state_dict:
  model.layers.{l}.block_sparse_moe.gate.weight [E, C] and
  block_sparse_moe.experts.{e}.w1 / w3 [F, C], w2 [C, F]; untied lm_head.
- moe_hf/qwen3_moe/: Qwen3MoeForCausalLM ("qwen3_moe") in BF16, sharded in two files with
  model.safetensors.index.json; head_dim 6 != hidden_size / heads; q_norm / k_norm [HD];
  decoder_sparse_step 2 and mlp_only_layers [3], so that of 6 blocks 1 and 5 are MoE
  (mlp.gate.weight, mlp.experts.{e}.gate_proj / up_proj / down_proj) and 0, 2, 3, 4 dense
  (mlp.gate_proj / up_proj / down_proj, of intermediate_size); tied embeddings.
- moe_hf/qwen3/: Qwen3ForCausalLM ("qwen3", dense) in BF16, one file; config.json as
  transformers >= 4.53 writes Qwen3Config (layer_types, max_window_layers, no sliding
  window); head_dim 6 != hidden_size / heads; q_norm / k_norm [HD]; untied lm_head.
- moe_hf/<name>_kiln.safetensors: the same values under kiln's names and layouts
  (src/models/llama/moe_formats.h), F32, built here independently of kiln: q/k/v stacked
  by rows into self_attn.qkv_proj, gate/up into mlp.gate_up_proj; per MoE block the router
  mlp.router.weight, the experts stacked into mlp.experts.gate_up_proj [E, 2F, C] (expert
  e's gate rows then its up rows) and mlp.experts.down_proj [E, C, F]; the embedding and
  lm_head padded with zero rows to a multiple of 128.

Every element is a distinct value drawn from a fixed seed (BF16 ones exactly
representable; their sizes span 2^-40..2^9, as only layouts are tested), so that a test
finds any element in the wrong place.

Usage: make_moe_hf_folders.py [--out DIR]   (default tests/golden/moe_hf)
       make_moe_hf_folders.py --check       (exit 0 when the committed files are what this
                                             script writes, byte for byte)
"""

import argparse
import filecmp
import json
import math
import os
import random
import struct
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_gpt2_golden as g  # noqa: E402  (the safetensors header encoder)

DEFAULT_OUT = os.path.join(HERE, "moe_hf")
SEED = 20261204

MIXTRAL = {
    "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
    "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 8, "initializer_range": 0.02,
    "intermediate_size": 6, "max_position_embeddings": 32, "model_type": "mixtral",
    "num_attention_heads": 2, "num_experts_per_tok": 2, "num_hidden_layers": 2,
    "num_key_value_heads": 1, "num_local_experts": 4, "output_router_logits": False,
    "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02,
    "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "float32",
    "transformers_version": "4.36.0.dev0", "use_cache": True, "vocab_size": 20,
}

QWEN3_MOE = {
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 17, "decoder_sparse_step": 2, "eos_token_id": 18, "head_dim": 6,
    "hidden_act": "silu", "hidden_size": 8, "initializer_range": 0.02, "intermediate_size": 12,
    "max_position_embeddings": 64, "max_window_layers": 6, "mlp_only_layers": [3],
    "model_type": "qwen3_moe", "moe_intermediate_size": 5, "norm_topk_prob": True,
    "num_attention_heads": 2, "num_experts": 3, "num_experts_per_tok": 2,
    "num_hidden_layers": 6, "num_key_value_heads": 1, "output_router_logits": False,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001, "sliding_window": None, "tie_word_embeddings": True,
    "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": True,
    "use_sliding_window": False, "vocab_size": 20,
}

QWEN3 = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 17, "eos_token_id": 18, "head_dim": 6, "hidden_act": "silu",
    "hidden_size": 8, "initializer_range": 0.02, "intermediate_size": 12,
    "layer_types": ["full_attention", "full_attention"], "max_position_embeddings": 64,
    "max_window_layers": 2, "model_type": "qwen3", "num_attention_heads": 2,
    "num_hidden_layers": 2, "num_key_value_heads": 1, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 1000000.0, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.53.0",
    "use_cache": True, "use_sliding_window": False, "vocab_size": 20,
}


def qk_norm(cfg):
    return cfg["model_type"] in ("qwen3", "qwen3_moe")


def dims(cfg):
    C, nh, nkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    return C, nh, nkv, cfg.get("head_dim", C // nh)


def is_moe(cfg, l):
    if cfg["model_type"] in ("mixtral", "qwen3"):
        return cfg["model_type"] == "mixtral"
    return l not in cfg["mlp_only_layers"] and (l + 1) % cfg["decoder_sparse_step"] == 0


def experts(cfg):
    if cfg["model_type"] == "mixtral":
        return cfg["num_local_experts"], cfg["intermediate_size"], "block_sparse_moe.", \
            ("w1", "w3", "w2")
    return cfg["num_experts"], cfg["moe_intermediate_size"], "mlp.", \
        ("gate_proj", "up_proj", "down_proj")


def hf_specs(cfg):
    """(name, shape) of the model's state_dict, in module order."""
    C, nh, nkv, hd = dims(cfg)
    V, F = cfg["vocab_size"], cfg["intermediate_size"]
    out = [("model.embed_tokens.weight", [V, C])]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        out += [(p + "self_attn.q_proj.weight", [nh * hd, C]),
                (p + "self_attn.k_proj.weight", [nkv * hd, C]),
                (p + "self_attn.v_proj.weight", [nkv * hd, C]),
                (p + "self_attn.o_proj.weight", [C, nh * hd])]
        if qk_norm(cfg):
            out += [(p + "self_attn.q_norm.weight", [hd]), (p + "self_attn.k_norm.weight", [hd])]
        if is_moe(cfg, l):
            E, Fe, mod, (gate, up, down) = experts(cfg)
            out.append((p + mod + "gate.weight", [E, C]))
            for e in range(E):
                x = f"{p}{mod}experts.{e}."
                out += [(x + gate + ".weight", [Fe, C]), (x + down + ".weight", [C, Fe]),
                        (x + up + ".weight", [Fe, C])]
        else:
            out += [(p + "mlp.gate_proj.weight", [F, C]), (p + "mlp.up_proj.weight", [F, C]),
                    (p + "mlp.down_proj.weight", [C, F])]
        out += [(p + "input_layernorm.weight", [C]), (p + "post_attention_layernorm.weight", [C])]
    out.append(("model.norm.weight", [C]))
    if not cfg["tie_word_embeddings"]:
        out.append(("lm_head.weight", [V, C]))
    return out


def draw(specs, bf16, rng):
    """name -> flat list of distinct floats, each a random sign, a binary exponent in
    -40..8 and a random mantissa (7 bits when bf16, so that BF16 holds it exactly)."""
    seen, out = set(), {}
    for name, shape in specs:
        vals = []
        while len(vals) < math.prod(shape):
            mantissa = rng.getrandbits(7) << 16 if bf16 else rng.getrandbits(23)
            bits = rng.getrandbits(1) << 31 | (127 + rng.randint(-40, 8)) << 23 | mantissa
            if bits in seen:
                continue
            seen.add(bits)
            vals.append(struct.unpack("<f", struct.pack("<I", bits))[0])
        out[name] = vals
    return out


def blob(vals, dtype):
    data = struct.pack(f"<{len(vals)}f", *vals)
    if dtype == "F32":
        return data
    return b"".join(data[i + 2:i + 4] for i in range(0, len(data), 4))  # the high halves


def write_st(path, tensors, dtype):
    """tensors: [(name, shape, flat float values)] in order; dtype F32 or BF16."""
    size = {"F32": 4, "BF16": 2}[dtype]
    header, pos, blobs = {"__metadata__": {"format": "pt"}}, 0, []
    for name, shape, vals in tensors:
        b = blob(vals, dtype)
        assert len(b) == size * math.prod(shape), name
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [pos, pos + len(b)]}
        pos += len(b)
        blobs.append(b)
    with open(path, "wb") as f:
        f.write(g.encode_header(header))
        for b in blobs:
            f.write(b)


def kiln_tensors(cfg, hf):
    """kiln's names, shapes and values (see the module docstring)."""
    C, nh, nkv, hd = dims(cfg)
    V, F = cfg["vocab_size"], cfg["intermediate_size"]
    Vp = (V + 127) // 128 * 128
    pad = [0.0] * ((Vp - V) * C)
    out = [("model.embed_tokens.weight", [Vp, C], hf["model.embed_tokens.weight"] + pad)]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        a = p + "self_attn."
        out.append((p + "input_layernorm.weight", [C], hf[p + "input_layernorm.weight"]))
        out.append((a + "qkv_proj.weight", [(nh + 2 * nkv) * hd, C],
                    hf[a + "q_proj.weight"] + hf[a + "k_proj.weight"] + hf[a + "v_proj.weight"]))
        if qk_norm(cfg):
            out += [(a + "q_norm.weight", [hd], hf[a + "q_norm.weight"]),
                    (a + "k_norm.weight", [hd], hf[a + "k_norm.weight"])]
        out.append((a + "o_proj.weight", [C, nh * hd], hf[a + "o_proj.weight"]))
        out.append((p + "post_attention_layernorm.weight", [C], hf[p + "post_attention_layernorm.weight"]))
        if not is_moe(cfg, l):
            m = p + "mlp."
            out += [(m + "gate_up_proj.weight", [2 * F, C], hf[m + "gate_proj.weight"] + hf[m + "up_proj.weight"]),
                    (m + "down_proj.weight", [C, F], hf[m + "down_proj.weight"])]
            continue
        E, Fe, mod, (gate, up, down) = experts(cfg)
        out.append((p + "mlp.router.weight", [E, C], hf[p + mod + "gate.weight"]))
        gate_up, downs = [], []
        for e in range(E):
            x = f"{p}{mod}experts.{e}."
            gate_up += hf[x + gate + ".weight"] + hf[x + up + ".weight"]  # [Fe, C] each
            downs += hf[x + down + ".weight"]
        out += [(p + "mlp.experts.gate_up_proj.weight", [E, 2 * Fe, C], gate_up),
                (p + "mlp.experts.down_proj.weight", [E, C, Fe], downs)]
    out.append(("model.norm.weight", [C], hf["model.norm.weight"]))
    if not cfg["tie_word_embeddings"]:
        out.append(("lm_head.weight", [Vp, C], hf["lm_head.weight"] + pad))
    return out


def write_folder(folder, cfg, hf, specs, dtype, shards):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    tensors = [(n, s, hf[n]) for n, s in specs]
    if shards == 1:
        write_st(os.path.join(folder, "model.safetensors"), tensors, dtype)
        return
    per = (len(tensors) + shards - 1) // shards
    weight_map, total = {}, 0
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = tensors[i * per:(i + 1) * per]
        write_st(os.path.join(folder, name), part, dtype)
        for n, s, _ in part:
            weight_map[n] = name
            total += math.prod(s) * (4 if dtype == "F32" else 2)
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2,
                  sort_keys=True)
        f.write("\n")


def generate(out):
    rng = random.Random(SEED)
    for name, cfg, dtype, shards in (("mixtral", MIXTRAL, "F32", 1),
                                     ("qwen3_moe", QWEN3_MOE, "BF16", 2),
                                     ("qwen3", QWEN3, "BF16", 1)):
        specs = hf_specs(cfg)
        hf = draw(specs, dtype == "BF16", rng)
        write_folder(os.path.join(out, name), cfg, hf, specs, dtype, shards)
        write_st(os.path.join(out, f"{name}_kiln.safetensors"), kiln_tensors(cfg, hf), "F32")


def check(committed):
    with tempfile.TemporaryDirectory() as tmp:
        generate(tmp)
        fresh = sorted(os.path.relpath(os.path.join(d, f), tmp)
                       for d, _, fs in os.walk(tmp) for f in fs)
        stored = sorted(os.path.relpath(os.path.join(d, f), committed)
                        for d, _, fs in os.walk(committed) for f in fs)
        bad = [f for f in fresh if f not in stored or
               not filecmp.cmp(os.path.join(tmp, f), os.path.join(committed, f), shallow=False)]
        bad += [f for f in stored if f not in fresh]
    if bad:
        print(f"{committed} is stale ({', '.join(bad)}): regenerate it with /usr/bin/python3 "
              f"{os.path.relpath(__file__)}", file=sys.stderr)
        return 1
    print(f"{committed}: every file is what the generator writes")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--check", nargs="?", const=DEFAULT_OUT, metavar="DIR")
    args = ap.parse_args()
    if args.check:
        return check(args.check)
    generate(args.out)
    return check(args.out)


if __name__ == "__main__":
    sys.exit(main())
