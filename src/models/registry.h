// The model registry: a Model from the architecture named by model.arch.
//
// Built in: "gpt2" (models/gpt2), with its own file formats (llm.c .bin, Hugging Face
// .safetensors), and "llama" (models/llama: Llama 3); both read and write Hugging Face
// model folders (models/hf_formats.h). "vit" (models/vit: a vision transformer classifier)
// takes images instead of tokens (Model::batch_shape) and has no file formats of its own. Tests and extensions add their own with register_model() or
// register_arch(); nothing that trains, shards, saves, samples or exports a model names
// its class.
#pragma once

#include "models/hf_formats.h"
#include "models/model.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace kiln {

/// The [model] keys every architecture reads (docs/config.md); each factory checks the
/// ones it needs and ignores none silently.
struct ModelOptions {
  std::string arch = "gpt2";
  int n_layer = 0;
  int n_head = 0;
  int n_embd = 0;
  int block_size = 0;  // maximum sequence length
  int vocab_size = 0;  // real vocabulary; the model pads it as it likes
  float dropout = 0.f;
  // Rotary / grouped-query / SwiGLU architectures (llama); GPT-2 rejects n_kv_head, ffn_hidden_size
  // and rope scaling other than its own.
  int n_kv_head = 0;        // key/value heads; 0 = n_head
  int ffn_hidden_size = 0;  // MLP hidden width; 0 = the architecture's default
  float norm_eps = 1e-5f;   // RMSNorm epsilon (GPT-2: its LayerNorm eps is fixed, 1e-5)
  RopeSpec rope;            // theta, Llama 3.1 rescaling (scale_factor 0: none)
  bool tie_embeddings = false;  // output head = token embedding (GPT-2 ignores it: always tied)
  // Vision transformers (vit): square images, patches, classes.
  int image_size = 0;
  int num_channels = 0;
  int patch_size = 0;
  int num_classes = 0;
  float class_dropout = 0.1f;  // dit: probability a training label becomes the null class
};

using ModelFactory =
    std::function<std::unique_ptr<Model>(const ModelOptions&, Backend&, const ModelStorage&)>;

/// A model's parameters on the host: fp32 values by global parameter name (ParamSpec::name),
/// row-major in the parameter's global shape.
using HostWeights = std::map<std::string, std::vector<float>>;
/// The fp32 values of a named global parameter (e.g. read from a kiln checkpoint).
using TensorSource = std::function<std::vector<float>(const std::string& name)>;

/// An architecture: its factory and, optionally (empty std::function: not supported), its
/// checkpoint config and its own file formats.
struct ModelArch {
  ModelFactory make;
  /// What the model reads (Model::batch_shape): tokens (language models) or images.
  bool takes_images = false;
  /// Whether the model generates images (Model::predict_velocity: kiln sample-images).
  bool generates_images = false;
  /// Whether the model takes the tensor-parallel plan (parallel.tp > 1; ModelStorage::plans)
  /// and the context-parallel plan (parallel.cp > 1). src/parallel's plans ask these, then
  /// apply the tables the model states (models/layer_plan.h LayerRoles).
  bool tensor_parallel = true;
  bool context_parallel = true;
  /// The options of a model from its Model::config_json() (a checkpoint's state "model").
  /// Throws kiln::Error for an invalid config.
  std::function<ModelOptions(const nlohmann::json& config)> options_from_json;
  /// The parameters of a model of `expect` from a file in another program's format (GPT-2:
  /// llm.c .bin, Hugging Face .safetensors), in the model's names, layouts and padding.
  /// Throws kiln::Error naming the file when it is unreadable or holds another shape.
  std::function<HostWeights(const std::filesystem::path& file, const ModelOptions& expect)>
      import_weights;
  /// Writes the parameters of the model that `config` (config_json) describes, each from
  /// `read`, as `format` (GPT-2: "llmc" or "safetensors") to `out`, atomically. Throws
  /// kiln::Error for an unknown format.
  std::function<void(const nlohmann::json& config, const TensorSource& read,
                     const std::string& format, const std::filesystem::path& out)>
      export_weights;
  /// Hugging Face folders (models/hf_formats.h). The options of a config.json whose
  /// model_type is this architecture (`file` names it in errors); throws kiln::Error naming
  /// the file and key for an unsupported option.
  std::function<ModelOptions(const nlohmann::json& hf_config, const std::string& file)>
      options_from_hf;
  /// The config.json of a model of `options` (transformers' fields for the model type).
  std::function<nlohmann::json(const ModelOptions& options)> hf_config;
  /// Where the parameters of a model of `options` live in a folder.
  std::function<HfLayout(const ModelOptions& options)> hf_layout;
};

/// Builds the model `options.arch` names. Throws kiln::Error listing the known
/// architectures when it is unknown, or the factory's error for a bad shape.
std::unique_ptr<Model> make_model(const ModelOptions& options, Backend& backend,
                                  const ModelStorage& storage = {});
/// Adds (or replaces) an architecture with only a factory.
void register_model(const std::string& arch, ModelFactory factory);
/// Adds (or replaces) an architecture with its config reader and file formats.
void register_arch(const std::string& arch, ModelArch entry);

/// ModelArch::options_from_json of `arch` (options.arch set to `arch`). Throws kiln::Error
/// when the architecture is unknown or cannot read its config.
ModelOptions model_options_from_json(const std::string& arch, const nlohmann::json& config);
/// ModelArch::import_weights of expect.arch. Throws kiln::Error (naming `file`) when the
/// architecture has no file formats of its own.
HostWeights import_model_weights(const std::filesystem::path& file, const ModelOptions& expect);
/// ModelArch::export_weights of `arch`. Throws kiln::Error when it has none.
void export_model_weights(const std::string& arch, const nlohmann::json& config,
                          const TensorSource& read, const std::string& format,
                          const std::filesystem::path& out);
/// A copy of the entry of `arch`. Throws kiln::Error listing the known architectures.
ModelArch model_arch(const std::string& arch);
/// The registered architectures, sorted.
std::vector<std::string> model_archs();

}  // namespace kiln
