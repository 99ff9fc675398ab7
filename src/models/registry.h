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
#include "models/model_options.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kiln {

using ModelFactory =
    std::function<std::unique_ptr<Model>(const ModelOptions&, Backend&, const ModelStorage&)>;

/// A model's parameters on the host: fp32 values by global parameter name (ParamSpec::name),
/// row-major in the parameter's global shape.
using HostWeights = std::map<std::string, std::vector<float>>;
/// The fp32 values of a named global parameter (e.g. read from a kiln checkpoint).
using TensorSource = std::function<std::vector<float>(const std::string& name)>;

/// An architecture: its factory, what it supports and, optionally (empty std::function:
/// not supported), its checkpoint config, presets and its own file formats. Each family
/// states its entry in its own folder (e.g. models/gpt2/arch.cpp); the registry lists them.
/// What the entry says it supports is what its models do (tests/models/registry_test.cpp
/// builds one of each and checks).
struct ModelArch {
  ModelFactory make;
  /// What the model reads (Model::batch_shape): tokens (language models) or images, and
  /// with takes_text both: image-text pairs (a vision-language model).
  bool takes_images = false;
  bool takes_text = false;
  /// Its models are language models (Model::language_model: kiln sample).
  bool decodes = false;
  /// Its models classify images (Model::image_classifier: kiln classify).
  bool classifies_images = false;
  /// Its models generate images (Model::flow_model: kiln sample-images).
  bool generates_images = false;
  /// Its models run as pipeline stages (Model::stage_activation_shape: parallel.pp > 1).
  bool stages = false;
  /// Whether the model takes the tensor-parallel plan (parallel.tp > 1; ModelStorage::plans)
  /// and the context-parallel plan (parallel.cp > 1). src/parallel's plans ask these, then
  /// apply the tables the model states (models/layer_plan.h LayerRoles).
  bool tensor_parallel = false;
  bool context_parallel = false;
  /// Why a model of `options` runs only with parallel.<axis> = 1 (`axis` "tp", "pp" or
  /// "cp") though the flags above say the family takes that axis (e.g. a Llama whose
  /// auxiliary loss couples every mixture-of-experts layer, under pp), or "" when it
  /// holds for it. Optional.
  std::function<std::string(const ModelOptions& options, std::string_view axis)>
      single_layout_reason;
  /// Why a model of `options` cannot split over `tp` tensor-parallel ranks (a width tp does
  /// not divide, naming its key), or "". Checked when the config loads; the layers check
  /// the rest when the model is built (naming the tensor). Optional.
  std::function<std::string(const ModelOptions& options, int tp)> tp_split_reason;
  /// The routed experts of each mixture-of-experts layer of a model of `options` (0: none,
  /// a dense model), which expert parallelism (parallel.ep > 1) splits; nullptr: the family
  /// has no such layers.
  std::function<int64_t(const ModelOptions& options)> num_experts;
  /// The family's own [model] keys beyond the common ones (ModelOptions: arch .. dropout,
  /// and the config's preset and init_from), stated in its folder (e.g.
  /// models/llama_config.cpp llama_keys()). The config reads, checks and writes them from
  /// here; its models read them with ModelOptions::value. make_model refuses any other.
  ModelKeys keys;
  /// Checks between its keys that hold for a config still being resolved (0 = unset, e.g.
  /// n_head before the data set gives vocab_size), run when a config loads; `source(key)`
  /// ("model.n_kv_head") names where that key came from, for the error. Optional.
  std::function<void(const ModelOptions& options, const KeySource& source)> check_options;
  /// The model presets of the family (model.preset), each a shape of its [model] keys.
  std::vector<ModelPreset> presets;
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
  /// model_type is one of this architecture's (hf_model_types; `file` names it in errors);
  /// throws kiln::Error naming the file and key for an unsupported option.
  std::function<ModelOptions(const nlohmann::json& hf_config, const std::string& file)>
      options_from_hf;
  /// The config.json model_types that options_from_hf reads (llama: "llama", "mixtral",
  /// "qwen3", "qwen3_moe"); empty: the architecture's own name.
  std::vector<std::string> hf_model_types;
  /// The config.json of a model of `options` (transformers' fields for the model type).
  std::function<nlohmann::json(const ModelOptions& options)> hf_config;
  /// Where the parameters of a model of `options` live in a folder.
  std::function<HfLayout(const ModelOptions& options)> hf_layout;
};

/// Builds the model `options.arch` names. Throws kiln::Error listing the known
/// architectures when it is unknown, naming a key of options.family the arch does not
/// declare, or the factory's error for a bad shape.
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
/// The registered architectures whose entry has `flag` set (e.g. &ModelArch::stages), sorted.
std::vector<std::string> model_archs_with(bool ModelArch::*flag);
/// The registered architectures that declare the [model] key `name` (ModelArch::keys),
/// sorted.
std::vector<std::string> model_archs_with_key(std::string_view name);
/// Every registered preset, by architecture then in the family's order.
std::vector<ModelPreset> model_presets();
/// The preset called `name`, if any family lists one.
std::optional<ModelPreset> find_model_preset(std::string_view name);

}  // namespace kiln
