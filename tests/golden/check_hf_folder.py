#!/usr/bin/python3
"""Checks Hugging Face model folders that kiln exported from the golden parameters.

golden_hf_export (hf_golden_test.cpp) writes each golden file's parameters (kiln's names
and layouts) as a Hugging Face folder with kiln's exporter: FOLDERS/gpt2 and
FOLDERS/llama. This script, which shares no code with kiln, reads each folder the way
transformers would: config.json's fields against the generator's CONFIG; the tensor names
and shapes against GPT2LMHeadModel's / LlamaForCausalLM's state_dict (GPT-2's Conv1D
weights [in, out], nn.Linear weights [out, in], the real vocabulary, Llama's separate
q/k/v and gate/up projections); then it loads the tensors by those names into the
generator's own reference model (make_gpt2_golden.forward_logits with the Conv1D weights
transposed back, make_llama_golden.forward_logits as is), runs it in float64 on the golden
input tokens and compares the logits with the committed golden logits.

Usage: check_hf_folder.py FOLDERS   (exit 0: all match; 1: a mismatch; 77: no torch)
"""

import json
import os
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
SKIP = 77
TOLERANCE = 1e-6  # relative norm: the same float64 computation on the same float32 weights


def torch_or_reexec():
    try:
        import torch  # noqa: F401
        return True
    except ImportError:
        pass
    # The golden generators run with Debian's python3-torch under /usr/bin/python3.
    if os.path.exists("/usr/bin/python3") and os.path.realpath(sys.executable) != "/usr/bin/python3" \
            and not os.environ.get("KILN_HF_CHECK_REEXEC"):
        env = dict(os.environ, KILN_HF_CHECK_REEXEC="1")
        sys.exit(subprocess.call(["/usr/bin/python3", os.path.abspath(__file__)] + sys.argv[1:],
                                 env=env))
    return False


def read_safetensors(path):
    """name -> torch tensor (F32, BF16, F16, I32), read by hand (8-byte length, JSON, data)."""
    import torch
    dtypes = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16,
              "I32": torch.int32}
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n).decode("utf-8"))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        t = torch.frombuffer(bytearray(data[b:end]), dtype=dtypes[e["dtype"]])
        out[name] = t.reshape(e["shape"])
    return out


def read_folder(folder):
    index = os.path.join(folder, "model.safetensors.index.json")
    if not os.path.exists(index):
        return read_safetensors(os.path.join(folder, "model.safetensors"))
    with open(index) as f:
        weight_map = json.load(f)["weight_map"]
    tensors = {}
    for shard in sorted(set(weight_map.values())):
        tensors.update(read_safetensors(os.path.join(folder, shard)))
    assert set(tensors) == set(weight_map), "the index and the shards disagree"
    return tensors


def expect(cond, what, failures):
    if not cond:
        failures.append(what)


def check_gpt2(folder, config, tensors, failures):
    import make_gpt2_golden as g
    cfg = g.CONFIG
    for key, want in [("model_type", "gpt2"), ("architectures", ["GPT2LMHeadModel"]),
                      ("n_embd", cfg["n_embd"]), ("n_layer", cfg["n_layer"]),
                      ("n_head", cfg["n_head"]), ("vocab_size", cfg["vocab_size"]),
                      ("n_positions", cfg["block_size"]),
                      ("layer_norm_epsilon", cfg["layernorm_eps"]),
                      ("activation_function", "gelu_new"), ("tie_word_embeddings", True)]:
        expect(config.get(key) == want, f"gpt2 config.json {key} = {config.get(key)!r}, "
               f"expected {want!r}", failures)
    conv = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
    want_shapes = {}
    for name, shape in g.param_specs(cfg):
        if name == "transformer.wte.weight":
            shape = [cfg["vocab_size"], shape[1]]
        elif name.endswith(conv):
            shape = [shape[1], shape[0]]  # Conv1D: [in, out]
        want_shapes[name] = shape
    got_shapes = {n: list(t.shape) for n, t in tensors.items()}
    expect(got_shapes == want_shapes, f"gpt2 tensors {got_shapes} != GPT2LMHeadModel's "
           f"{want_shapes}", failures)
    P = {n: (t.t() if n.endswith(conv) else t).double() for n, t in tensors.items()}
    return g, cfg, P


def check_llama(folder, config, tensors, failures):
    import make_llama_golden as g
    cfg = g.CONFIG
    C, nh, nkv, hd, F = g.dims(cfg)
    rope = {"rope_type": "llama3", "factor": cfg["rope_scaling.factor"],
            "low_freq_factor": cfg["rope_scaling.low_freq_factor"],
            "high_freq_factor": cfg["rope_scaling.high_freq_factor"],
            "original_max_position_embeddings": cfg["rope_scaling.original_max_position"]}
    for key, want in [("model_type", "llama"), ("architectures", ["LlamaForCausalLM"]),
                      ("hidden_size", C), ("num_hidden_layers", cfg["n_layer"]),
                      ("num_attention_heads", nh), ("num_key_value_heads", nkv),
                      ("head_dim", hd), ("intermediate_size", F),
                      ("vocab_size", cfg["vocab_size"]),
                      ("max_position_embeddings", cfg["block_size"]),
                      ("rms_norm_eps", cfg["norm_eps"]), ("rope_theta", cfg["rope_theta"]),
                      ("rope_scaling", rope), ("tie_word_embeddings", cfg["tie_embeddings"]),
                      ("hidden_act", "silu"), ("attention_bias", False), ("mlp_bias", False)]:
        expect(config.get(key) == want, f"llama config.json {key} = {config.get(key)!r}, "
               f"expected {want!r}", failures)
    want_shapes = {}
    for name, shape in g.hf_specs(cfg):
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            shape = [cfg["vocab_size"], shape[1]]
        want_shapes[name] = shape
    got_shapes = {n: list(t.shape) for n, t in tensors.items()}
    expect(got_shapes == want_shapes, f"llama tensors {got_shapes} != LlamaForCausalLM's "
           f"{want_shapes}", failures)
    P = {n: t.double() for n, t in tensors.items()}
    return g, cfg, P


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    if not torch_or_reexec():
        print("check_hf_folder: torch is not installed: skipped")
        return SKIP
    import torch
    failures = []
    for arch, check in (("gpt2", check_gpt2), ("llama", check_llama)):
        folder = os.path.join(sys.argv[1], arch)
        with open(os.path.join(folder, "config.json")) as f:
            config = json.load(f)
        tensors = read_folder(folder)
        g, cfg, P = check(folder, config, tensors, failures)
        golden = read_safetensors(os.path.join(HERE, f"{arch}_golden.safetensors"))
        idx = golden["input_tokens"].long()
        with torch.no_grad():
            logits = g.forward_logits(P, idx, cfg)[..., :cfg["vocab_size"]]
        want = golden["logits"].double()
        rel = ((logits - want).norm() / want.norm()).item()
        print(f"{arch}: {len(tensors)} tensors by Hugging Face names, logits rel error {rel:.2e} "
              f"against {arch}_golden.safetensors")
        expect(rel < TOLERANCE, f"{arch}: logits from the folder differ from the golden ones "
               f"(relative {rel:.2e} >= {TOLERANCE})", failures)
    for f in failures:
        print("FAIL: " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
