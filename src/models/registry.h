// The model registry: a Model from the architecture named by model.arch.
//
// Built in: "gpt2" (models/gpt2). Tests and extensions add their own with
// register_model(); nothing that trains, shards or saves a model names its class.
#pragma once

#include "models/model.h"

#include <functional>
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
};

using ModelFactory =
    std::function<std::unique_ptr<Model>(const ModelOptions&, Backend&, const ModelStorage&)>;

/// Builds the model `options.arch` names. Throws kiln::Error listing the known
/// architectures when it is unknown, or the factory's error for a bad shape.
std::unique_ptr<Model> make_model(const ModelOptions& options, Backend& backend,
                                  const ModelStorage& storage = {});
/// Adds (or replaces) an architecture.
void register_model(const std::string& arch, ModelFactory factory);
/// The registered architectures, sorted.
std::vector<std::string> model_archs();

}  // namespace kiln
