// Moving GPT-2 weights and training state between the trainer, kiln checkpoints and
// other formats (llm.c's .bin, Hugging Face's model.safetensors).
#pragma once

#include "checkpoint/checkpoint.h"
#include "checkpoint/gpt2_formats.h"
#include "data/tokenizer.h"
#include "models/gpt2/gpt2.h"
#include "models/registry.h"
#include "optim/adamw.h"
#include "train/config.h"

#include <filesystem>
#include <memory>
#include <string>

namespace kiln {

/// The [model] section of a training config, for make_model (models/registry.h).
ModelOptions model_options_from(const TrainConfig& config);
/// The GPT-2 of a training config (vocabulary padded to a multiple of 128), for GPT-2's
/// own file formats.
GPT2Config gpt2_config_from(const TrainConfig& config);

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

/// GPT-2 weights (kiln names and layouts, vocabulary padded like `expect`) from a kiln
/// checkpoint directory, an llm.c GPT-2 .bin (magic 20240326, fp32) or a Hugging Face
/// GPT-2 .safetensors, chosen by what `path` is. Throws kiln::Error naming the file when
/// it is missing, corrupt, or holds a model of another shape than `expect`.
GPT2Weights read_gpt2_weights(const std::filesystem::path& path, const GPT2Config& expect);

/// Loads GPT-2 weights into `model` (a GPT-2 of shape `expect`) from a kiln checkpoint
/// directory, an llm.c GPT-2 .bin (magic 20240326, fp32) or a Hugging Face GPT-2
/// .safetensors, chosen by what `path` is. Throws kiln::Error when the model is not a
/// GPT-2 or the file's model shape differs from `expect`.
void load_weights_into(Model& model, const GPT2Config& expect, const std::filesystem::path& path);

/// Writes the model weights of a kiln checkpoint as an llm.c GPT-2 .bin ("llmc") or a
/// Hugging Face model.safetensors ("safetensors"), atomically.
void export_checkpoint(const std::filesystem::path& checkpoint_dir, const std::string& format,
                       const std::filesystem::path& out);

/// The tokenizer files (Tokenizer::save output) as name -> bytes, to store in a
/// checkpoint under "tokenizer/<name>".
std::map<std::string, std::string> tokenizer_files(const data::Tokenizer& tokenizer);
/// The tokenizer stored in a checkpoint. Throws when the checkpoint has none.
std::unique_ptr<data::Tokenizer> load_checkpoint_tokenizer(const checkpoint::CheckpointReader& r);

}  // namespace kiln
