// Moving model weights and training state between the trainer, kiln checkpoints and a
// model's own file formats (GPT-2: llm.c's .bin, Hugging Face's model.safetensors; through
// the registry, models/registry.h).
#pragma once

#include "checkpoint/checkpoint.h"
#include "data/tokenizer.h"
#include "models/registry.h"
#include "optim/adamw.h"

#include <filesystem>
#include <memory>
#include <string>

namespace kiln {

/// The architecture of a checkpoint's state: "arch", or "gpt2" for checkpoints written
/// before it was recorded.
std::string checkpoint_arch(const nlohmann::json& state);
/// The options of the model a checkpoint holds (state "arch" and "model"), for make_model.
/// Throws kiln::Error when the architecture is unknown or its config invalid.
ModelOptions checkpoint_model_options(const checkpoint::CheckpointReader& reader);



/// Elements [begin, end) of the rank's tensor of `spec` (its tp slice, row-major; host
/// data of `dtype`, borrowed as CheckpointWriter::add_box) as the flat ranges of global
/// tensor `name` they are: one range unless tp-sharded (ParamSlice::global_runs).
void add_param_range(checkpoint::CheckpointWriter& writer, const std::string& name,
                     const ParamSpec& spec, DType dtype, int64_t begin, int64_t end,
                     const void* data);
/// The reverse: elements [begin, end) of the rank's tensor of `spec` from global tensor
/// `name`, into dst (end - begin elements of `dtype`), whatever layout wrote them.
void read_param_range(const checkpoint::CheckpointReader& reader, const std::string& name,
                      const ParamSpec& spec, int64_t begin, int64_t end, void* dst, DType dtype);

/// Host copies of tensors that a CheckpointWriter borrows until its write ends. Reusable:
/// reset() keeps the buffers, so that the next save copies into memory already mapped (a
/// fresh allocation of a GPT-2 124M training state, 1.4 GB, took 7 s of page faults in this
/// project's sandboxed machines); release() frees them.
class HostCopies {
 public:
  /// `t` as fp32 on the host (download_f32), valid until reset(), release() or destruction.
  const float* copy(Backend& be, const Tensor& t);
  /// `bytes` bytes of host memory (4-byte aligned, contents unspecified), valid as copy()'s.
  void* raw(size_t bytes);
  /// Makes every buffer available to the next copies; their storage stays.
  void reset() { used_ = 0; }
  /// Frees every buffer.
  void release() { buffers_.clear(), used_ = 0; }

 private:
  std::vector<float>& next(size_t floats);
  std::vector<std::vector<float>> buffers_;
  size_t used_ = 0;
};

/// The optimizer's moments of segment i (add_param_range of "optimizer.exp_avg.<name>"
/// and "optimizer.exp_avg_sq.<name>") and, when it keeps one, its moving average of the
/// weights ("ema.<name>", fp32); their host copies are made in `copies`.
void add_optimizer_segment(checkpoint::CheckpointWriter& writer, const AdamW& optimizer,
                           size_t i, HostCopies& copies);
/// Reads the moments of the optimizer's segments, whatever layout wrote them, and its
/// moving average when it keeps one: from "ema.<name>", or, when the checkpoint has no
/// "ema." tensors, from the weights already loaded (AdamW::reset_ema; returns false then).
/// A checkpoint's EMA is ignored by an optimizer without one. Returns true otherwise.
bool load_optimizer_from_checkpoint(const checkpoint::CheckpointReader& reader, AdamW& optimizer);
/// Reads parameters (and optimizer moments when `optimizer` is given) back. Throws when
/// a tensor is missing or its global shape differs from the model's.
void load_model_from_checkpoint(const checkpoint::CheckpointReader& reader, Model& model,
                                AdamW* optimizer);
/// The model's buffers (Model::buffers: fp32, whole) as global tensors of their names;
/// their host copies are made in `copies`. One rank of their replicas calls it.
void add_model_buffers(checkpoint::CheckpointWriter& writer, const Model& model,
                       HostCopies& copies);
/// Reads the model's buffers back from their tensors. A buffer the checkpoint does not
/// hold (saved without it, e.g. without moe.expert_bias) keeps its value; returns
/// their names. Throws kiln::Error naming the checkpoint when a tensor's shape differs.
std::vector<std::string> load_model_buffers(const checkpoint::CheckpointReader& reader,
                                            Model& model);
/// Whether a checkpoint holds a moving average of the weights ("ema.<name>" tensors,
/// saved by a run with train.ema_decay > 0).
bool checkpoint_has_ema(const checkpoint::CheckpointReader& reader);
/// Reads a checkpoint's model weights into every parameter of `model` (for sampling,
/// classifying, exporting): the trained parameters "<name>" (fp32, the master weights
/// under mixed precision), or with `use_ema` their moving average "ema.<name>" instead
/// (a parameter frozen in training has none: its "<name>").
/// Throws kiln::Error naming the checkpoint directory when use_ema and the checkpoint has
/// no EMA (trained with train.ema_decay = 0), or when a tensor is missing or its global
/// shape differs from the model's. The model's buffers too (load_model_buffers).
void load_model_weights(const checkpoint::CheckpointReader& reader, Model& model, bool use_ema,
                        const std::string& lora_base = "");

/// A model's initial parameters (model.init_from), read piecewise: each rank reads the
/// element ranges it holds, one tensor at a time.
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  /// Elements [begin, end) of parameter `p` (row-major in its global shape) as fp32 into
  /// dst (end - begin floats). Throws kiln::Error naming the file at fault.
  virtual void read(const ParamSpec& p, int64_t begin, int64_t end, float* dst) const = 0;
};

/// The parameters `params` (names, global shapes) of a model of `expect`, chosen by what
/// `path` is: a Hugging Face model folder (a directory with config.json; ranges read from
/// its shards, models/hf_formats.h), a kiln checkpoint directory of expect.arch (ranges
/// read from its slices), or a file in the architecture's own formats (registry
/// import_model_weights, read whole once; GPT-2: an llm.c .bin, magic 20240326, or a
/// Hugging Face .safetensors). Throws kiln::Error naming the file when it is missing,
/// corrupt, of another architecture, or holds a model of another shape than `expect` (a
/// parameter missing or of another size).
std::unique_ptr<WeightSource> open_model_weights(const std::filesystem::path& path,
                                                 const ModelOptions& expect,
                                                 const std::vector<ParamSpec>& params);

/// One part of a model started from another model (model.init_parts): this model's
/// parameters `params`, each named `prefix` + "." + N, read as parameter N of the model at
/// `path` (a kiln checkpoint directory, of its state's options, or a Hugging Face folder,
/// of its config.json's), which must have the same shape; a pos_embed may have more rows
/// there, of which the first are read (a ViT's, its class-token row last). Throws
/// kiln::Error naming the path and tensor for a missing tensor or another shape, the
/// prefix when a parameter lacks it, and a path that is neither kind. With `expect` (the
/// part's Model::part_options), the source must also be of its arch with the same
/// n_layer, n_head and n_embd and, for each of its family keys, the same value (floats
/// within 1e-6 relative); an error names the key and both values.
std::unique_ptr<WeightSource> open_part_weights(const std::filesystem::path& path,
                                                const std::string& prefix,
                                                const std::vector<ParamSpec>& params,
                                                const std::optional<ModelOptions>& expect = {});

/// model.init_parts of a part that reads the data's token ids (a decoder, a text encoder):
/// the kiln checkpoint at `path` must hold the tokenizer of the data set in `data_dir`
/// (the "hash" of each one's tokenizer.json). Nothing is checked when either has none
/// saved (a Hugging Face folder, data without a tokenizer). Throws kiln::Error naming
/// both hashes.
void check_part_tokenizer(const std::filesystem::path& path, const std::filesystem::path& data_dir,
                          const std::string& where);

/// What identifies the weights at `path` (a model.init_from: a file, or a folder's
/// *.safetensors, *.bin, config.json and manifest.json; not its README, tokenizer or
/// generation config, nor subfolders): {"path": as given, "bytes": B, "crc32": the crc32
/// of each file's name, size and crc32, in name order, as 8 hex digits, "files": {name:
/// its crc32}}. A LoRA checkpoint names its base so (docs/lora.md). Throws kiln::Error
/// naming an unreadable file.
nlohmann::json weights_identity(const std::filesystem::path& path);
/// Which files differ between two weights_identity records: "config.json changed,
/// model-00002-of-00002.safetensors missing", for an error message.
std::string weights_difference(const nlohmann::json& then, const nlohmann::json& now);

/// Loads open_model_weights(path, expect, model.params()) into every parameter of `model`
/// (a model of `expect`, its parameters allocated).
void load_weights_into(Model& model, const ModelOptions& expect, const std::filesystem::path& path);

/// The dtype a checkpoint's parameters were trained in: that of its "lowp.<name>" copies
/// (fp32 when it has none).
DType checkpoint_dtype(const checkpoint::CheckpointReader& reader);

/// How `kiln export` writes a checkpoint.
struct ExportOptions {
  std::string format;  // "hf" (a Hugging Face folder), or the architecture's own file formats
  /// "hf": "" = the checkpoint's dtype (its low-precision copies, bf16 / fp16, when it has
  /// them, else fp32), or "fp32" | "bf16" | "fp16".
  std::string dtype;
  uint64_t shard_bytes = 5'000'000'000;  // "hf": most tensor bytes per shard (transformers' 5GB)
  std::string lora_base;  // --merge-lora: the LoRA base's new place ("": where it was trained)
};

/// Writes the model weights of a kiln checkpoint atomically: as a Hugging Face folder
/// ("hf": config.json, generation_config.json, model.safetensors or shards and their index,
/// the tokenizer's files: hf_tokenizer_files), or in one of its architecture's
/// own formats (GPT-2: an llm.c .bin, "llmc", or a Hugging Face model.safetensors,
/// "safetensors"). Throws kiln::Error for an unknown format or an architecture without it.
void export_checkpoint(const std::filesystem::path& checkpoint_dir, const ExportOptions& options,
                       const std::filesystem::path& out);

/// The tokenizer files of a Hugging Face folder for the checkpoint's tokenizer (name ->
/// contents: data::Tokenizer::hf_files, i.e. tokenizer.json or tokenizer.model, and
/// tokenizer_config.json; none for the byte kind), and the token ids config.json names
/// (bos_token_id, eos_token_id: tokenizer_config's bos/eos tokens where they are single
/// ids, else the tokenizer's end-of-text id) in `config_fields`. Empty when the
/// checkpoint has no tokenizer.
std::map<std::string, std::string> hf_tokenizer_files(const checkpoint::CheckpointReader& reader,
                                                      nlohmann::json& config_fields);

/// The tokenizer files (Tokenizer::save output) as name -> bytes, to store in a
/// checkpoint under "tokenizer/<name>".
std::map<std::string, std::string> tokenizer_files(const data::Tokenizer& tokenizer);
/// The tokenizer stored in a checkpoint. Throws when the checkpoint has none.
std::unique_ptr<data::Tokenizer> load_checkpoint_tokenizer(const checkpoint::CheckpointReader& r);

}  // namespace kiln
