// Moving model weights and training state between the trainer, kiln checkpoints and a
// model's own file formats (GPT-2: llm.c's .bin, Hugging Face's model.safetensors; through
// the registry, models/registry.h).
#pragma once

#include "checkpoint/checkpoint.h"
#include "data/tokenizer.h"
#include "models/registry.h"
#include "optim/adamw.h"
#include "train/config.h"

#include <filesystem>
#include <memory>
#include <string>

namespace kiln {

/// The [model] section of a training config, for make_model (models/registry.h).
ModelOptions model_options_from(const TrainConfig& config);
/// The architecture of a checkpoint's state: "arch", or "gpt2" for checkpoints written
/// before it was recorded.
std::string checkpoint_arch(const nlohmann::json& state);
/// The options of the model a checkpoint holds (state "arch" and "model"), for make_model.
/// Throws kiln::Error when the architecture is unknown or its config invalid.
ModelOptions checkpoint_model_options(const checkpoint::CheckpointReader& reader);

/// The optimizer settings of a training config ([optim] and train.stochastic_rounding).
AdamWConfig adamw_config_from(const TrainConfig& config);


/// The optimizer's moments over its segments, as flat ranges of named global tensors.
void add_optimizer_to_checkpoint(checkpoint::CheckpointWriter& writer, const AdamW& optimizer,
                                 std::vector<std::vector<float>>& keep);
/// Reads the moments of the optimizer's segments, whatever layout wrote them.
void load_optimizer_from_checkpoint(const checkpoint::CheckpointReader& reader, AdamW& optimizer);
/// Reads parameters (and optimizer moments when `optimizer` is given) back. Throws when
/// a tensor is missing or its global shape differs from the model's.
void load_model_from_checkpoint(const checkpoint::CheckpointReader& reader, Model& model,
                                AdamW* optimizer);

/// The parameters `params` (names, global shapes) of a model of `expect` (model.init_from):
/// from a kiln checkpoint directory of expect.arch, or from a file in the architecture's
/// own formats (registry import_model_weights; GPT-2: an llm.c .bin, magic 20240326, or a
/// Hugging Face .safetensors), chosen by what `path` is. Throws kiln::Error naming the
/// file when it is missing, corrupt, of another architecture, or holds a model of another
/// shape than `expect` (a parameter missing or of another size).
HostWeights read_model_weights(const std::filesystem::path& path, const ModelOptions& expect,
                               const std::vector<ParamSpec>& params);

/// Loads read_model_weights(path, expect, model.params()) into every parameter of `model`
/// (a model of `expect`, its parameters allocated).
void load_weights_into(Model& model, const ModelOptions& expect, const std::filesystem::path& path);

/// Writes the model weights of a kiln checkpoint in one of its architecture's own formats
/// (GPT-2: an llm.c .bin, "llmc", or a Hugging Face model.safetensors, "safetensors"),
/// atomically. Throws kiln::Error for an unknown format or an architecture without any.
void export_checkpoint(const std::filesystem::path& checkpoint_dir, const std::string& format,
                       const std::filesystem::path& out);

/// The tokenizer files (Tokenizer::save output) as name -> bytes, to store in a
/// checkpoint under "tokenizer/<name>".
std::map<std::string, std::string> tokenizer_files(const data::Tokenizer& tokenizer);
/// The tokenizer stored in a checkpoint. Throws when the checkpoint has none.
std::unique_ptr<data::Tokenizer> load_checkpoint_tokenizer(const checkpoint::CheckpointReader& r);

}  // namespace kiln
