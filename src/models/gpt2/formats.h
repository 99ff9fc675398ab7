// GPT-2 weights in other programs' formats: llm.c's checkpoint and Hugging Face's
// model.safetensors. Both work on a host-side GPT2Weights keyed by kiln's parameter names
// and layouts (every linear weight [out, in]; the token embedding padded to Vp rows).
// The registry (models/registry.cpp) offers them to everything else as GPT-2's
// ModelArch::import_weights and export_weights.
#pragma once

#include "core/dtype.h"
#include "models/gpt2/config.h"
#include "models/gpt2/gpt2.h"  // gpt2_param_specs
#include "models/registry.h"
#include "nn/parameter.h"

#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace kiln {

/// GPT-2 weights on the host: config plus one fp32 vector per kiln parameter name (row-major
/// in kiln's layout; "transformer.wte.weight" has padded_vocab_size rows, the padded rows
/// zero).
struct GPT2Weights {
  GPT2Config config;
  std::map<std::string, std::vector<float>> tensors;
};

/// Zero-filled weights of the right sizes for `config`.
GPT2Weights gpt2_zero_weights(const GPT2Config& config);

/// Throws kiln::Error naming the tensor when `w` lacks a parameter of its config, has one of
/// the wrong size, or has an unknown name.
void check_gpt2_weights(const GPT2Weights& w);

/// Reads an llm.c GPT-2 checkpoint (gpt2_124M.bin): a header of 256 int32 — [0] magic
/// 20240326, [1] version (3: fp32 with padded vocabulary, 5: bf16, converted to fp32; 1:
/// the old fp32 file without [7], padded here to a multiple of 128), [2] max_seq_len, [3]
/// vocab_size, [4] num_layers, [5] num_heads, [6] channels, [7] padded_vocab_size — then
/// the 16 parameter tensors stacked over layers in llm.c's order (wte, wpe, ln1w, ln1b,
/// qkvw, qkvb, attprojw, attprojb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb, lnfw, lnfb),
/// weights [out, in] as kiln's. Throws kiln::Error naming the file on any mismatch
/// (magic, version, size).
GPT2Weights load_llmc(const std::filesystem::path& path);

/// Writes `w` as an llm.c checkpoint, version 3 (fp32) or, with dtype BF16, version 5
/// (round to nearest even). Atomic (temporary file, fsync, rename).
void save_llmc(const std::filesystem::path& path, const GPT2Weights& w, DType dtype = DType::F32);

/// Reads a Hugging Face GPT-2 model.safetensors (GPT2Model or GPT2LMHeadModel names: an
/// optional "transformer." prefix; the attn.bias / attn.masked_bias buffers are ignored,
/// as is lm_head.weight when it equals wte). F32, F16 and BF16 files are read as fp32.
/// Conv1D weights (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj; stored [in, out]) are
/// transposed to kiln's [out, in]; wte is padded with zero rows to
/// GPT2Config::pad_vocab(V) (or to the "padded_vocab_size" metadata entry when present).
/// The config comes from the shapes (n_layer, n_embd, vocab_size, block_size); n_head
/// cannot be inferred from shapes, so it is taken from the "n_head" metadata entry when
/// present, else from `default_n_head` when > 0, else n_embd / 64 (the head size of every
/// released GPT-2). Throws kiln::Error naming the file and tensor at fault.
GPT2Weights load_hf_safetensors(const std::filesystem::path& path, int default_n_head = 0);

/// Writes `w` as a Hugging Face GPT-2 model.safetensors (GPT2Model names without prefix,
/// as the released "gpt2" files; loads into GPT2LMHeadModel with the head tied): Conv1D
/// weights transposed to [in, out], wte stripped to vocab_size rows, fp32. Metadata:
/// format=pt, n_head, n_layer, n_embd, n_positions, vocab_size, padded_vocab_size. Atomic.
void save_hf_safetensors(const std::filesystem::path& path, const GPT2Weights& w);

/// GPT-2's ModelArch::import_weights: an llm.c .bin or (by extension) a Hugging Face
/// .safetensors (n_head, when not in its metadata, from `expect`), holding a model of
/// expect's n_layer, n_embd, block_size and vocab_size; wte re-padded with zero rows to
/// the padded vocabulary of a model built from `expect`. Throws kiln::Error naming the
/// file when it is missing, corrupt, or of another shape.
HostWeights gpt2_import_weights(const std::filesystem::path& path, const ModelOptions& expect);
/// GPT-2's ModelArch::export_weights: the GPT-2 of `config` (gpt2_config_json), tensors
/// from `read`, as "llmc" (save_llmc, fp32) or "safetensors" (save_hf_safetensors).
/// Throws kiln::Error for another format.
void gpt2_export_weights(const nlohmann::json& config, const TensorSource& read,
                         const std::string& format, const std::filesystem::path& out);

/// GPT-2 in Hugging Face folders (models/hf_formats.h): the options of a GPT2Config
/// config.json (n_embd, n_layer, n_head, vocab_size, n_positions), rejecting, with a
/// kiln::Error naming the file and key, what kiln's GPT-2 does not compute
/// (activation_function other than gelu_new / gelu_pytorch_tanh, n_inner != 4 n_embd,
/// layer_norm_epsilon != 1e-5, tie_word_embeddings false, scale_attn_weights false,
/// scale_attn_by_inverse_layer_idx true); HF's dropout fields are not read (kiln's
/// model.dropout applies).
ModelOptions gpt2_options_from_hf(const nlohmann::json& cfg, const std::string& file);
/// The config.json of a GPT-2 of `options` (architectures GPT2LMHeadModel; the dropout
/// fields = model.dropout).
nlohmann::json gpt2_hf_config(const ModelOptions& options);
/// GPT2LMHeadModel's names (the "transformer." prefix optional), Conv1D weights stored
/// [in, out], wte vocab_size rows; attn.bias / attn.masked_bias buffers and the tied
/// lm_head.weight ignored.
HfLayout gpt2_hf_layout(const ModelOptions& options);

}  // namespace kiln
