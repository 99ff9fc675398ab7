// LoRA's files (docs/lora.md): a LoRA checkpoint's model (its adapters on their base),
// Hugging Face PEFT adapter folders out and in, and the merged weights W + scale B A.
//
// PEFT's format (huggingface/peft, LoraConfig and save_pretrained): a folder with
// adapter_config.json ("peft_type": "LORA", "r", "lora_alpha", "use_rslora",
// "lora_dropout", "target_modules", "base_model_name_or_path", "task_type", "bias",
// "fan_in_fan_out") and adapter_model.safetensors, whose tensors are named
// base_model.model.<module>.lora_A.weight [r, in] and ...lora_B.weight [out, r], <module>
// the Hugging Face module (model.layers.0.self_attn.q_proj). A kiln adapter on a piece of
// a fused Linear is the adapter of that piece's Hugging Face module (the HfLayout's piece:
// Llama's qkv_proj piece q is q_proj); a fused Linear adapted whole has a module only where
// Hugging Face keeps it whole (GPT-2's c_attn). A MoE layer's expert projection has a
// module per expert (Mixtral's block_sparse_moe.experts.<e>.w1), holding that expert's
// A_e [r, in] and B_e [rows, r].
#pragma once

#include "checkpoint/checkpoint.h"
#include "model_io/model_io.h"
#include "models/lora_plan.h"

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace kiln {

/// Whether a checkpoint holds LoRA adapters (its state's "lora"), not a whole model.
bool is_lora_checkpoint(const checkpoint::CheckpointReader& reader);

/// The plan that rebuilds a checkpoint's adapters (its state's "lora": rank, alpha,
/// rslora, targets; dropout off); nullptr for a checkpoint without adapters.
std::unique_ptr<LoraPlan> checkpoint_lora_plan(const checkpoint::CheckpointReader& reader);

/// A LoRA checkpoint's frozen base into `model`'s parameters that are not adapters: its
/// model.init_from again (or `moved_to`, the same weights elsewhere: the commands'
/// --lora-base), whose files' crc32 must be the one the checkpoint records, or the random
/// model of its seed. Throws kiln::Error naming the checkpoint and the base when the base
/// is missing or has changed, or when `moved_to` is given for a random base.
void load_lora_base(const checkpoint::CheckpointReader& reader, Model& model,
                    const std::string& moved_to = "");

/// A checkpoint's model, built with its adapters when it holds some (the plan outlives the
/// model: the adapters point into it) and loaded (load_model_weights).
struct CheckpointModel {
  std::unique_ptr<LoraPlan> lora;
  std::unique_ptr<Model> model;
};
/// `lora_base`: load_lora_base's `moved_to`.
CheckpointModel load_checkpoint_model(const checkpoint::CheckpointReader& reader,
                                      Backend& backend, bool use_ema = false,
                                      const std::string& lora_base = "");

/// The Hugging Face PEFT modules of each adapted unit (above), by unit name: one, or one
/// per expert in expert order (LoraUnit::experts). Throws kiln::Error naming the unit when
/// it has none, or for an architecture without folders.
std::map<std::string, std::vector<std::string>> peft_modules(const ModelOptions& options,
                                                             const std::vector<LoraUnit>& units);

/// Writes a LoRA checkpoint's adapters as a PEFT adapter folder `out`, atomically
/// (fp32 tensors; `backend` builds the model's shapes, allocating nothing). Throws kiln::Error for a checkpoint without adapters or a unit without
/// a Hugging Face module.
void export_peft_folder(const checkpoint::CheckpointReader& reader, Backend& backend,
                        const std::filesystem::path& out);

/// Writes a LoRA checkpoint's model with its adapters merged (merged_lora_weights) as a
/// Hugging Face folder, as export_checkpoint writes one ("hf": `options`' dtype, default
/// the checkpoint's, and shard size; its lora_base the base's new place); the model is
/// built on `backend`, one process.
void export_merged_hf_folder(const checkpoint::CheckpointReader& reader, Backend& backend,
                             const ExportOptions& options, const std::filesystem::path& out);

/// The adapted Linears' weights with their adapters merged, W[row0 + i, :] += scale *
/// (B A)[i, :] for each unit (each expert's W_e += scale B_e A_e likewise), by weight name
/// ("<linear>.weight"), fp32, whole; computed in double and rounded once. `model` holds every parameter whole (one process).
std::map<std::string, std::vector<float>> merged_lora_weights(const Model& model,
                                                              const LoraPlan& plan);

/// A PEFT adapter folder as the source of `params`' adapters (train.lora.init_from): its
/// adapter_config.json must give the config's rank, alpha and rslora (else a kiln::Error
/// naming the file and key) and hold a tensor for every adapter, of its shape.
std::unique_ptr<WeightSource> open_peft_folder(const std::filesystem::path& dir,
                                               const ModelOptions& expect,
                                               const LoraPlan& plan, const nn::LoraSpec& spec);

}  // namespace kiln
