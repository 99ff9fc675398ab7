// LayeredModel: the part of the Model interface every model built from the layer library
// shares, so that a model writes only its forward and backward: the flat layout of its
// layers' parameters (part by part, each part aligned), the flat buffers or per-part
// binding (ZeRO), look-ups by name, initial values and hooks.
#pragma once

#include "models/model.h"
#include "nn/param.h"

#include <memory>
#include <string>
#include <vector>

namespace kiln {

/// A part as a model declares it: its layers' parameters in order. A parameter listed
/// again by a later part (a tied one: GPT-2's wte in the head) belongs to the first part
/// that lists it; the later part only uses it.
struct PartLayout {
  std::string name;
  std::vector<nn::Param*> params;
  double cost = 1.0;
  bool resident = false;  // for its own reasons (a loss gradient made in forward)
};

/// The flat layouts (models/model.h, ModelPart) of the parts `held` (global indices,
/// increasing; empty: every part) of a model declared as `parts`: the trainable
/// parameters in the trainable layout, the frozen ones (nn::Param::trainable) in the
/// frozen layout, each in order and each part starting at a multiple of `alignment` and
/// padded to one in both; a part's expert-parallel parameters (ParamSlice::ep_sharded)
/// come after its dense ones in each layout, in a region of their own, also padded to the
/// alignment (ModelPart::expert_size, frozen_expert_size). A tied parameter is laid out
/// once, in its owner part;
/// when the owner is not held but a user is, the user holds a copy (ParamSpec::tied_copy).
/// A part is resident when it says so, owns a parameter a later held part uses, or holds
/// a copy. Init streams number the whole model's parameters, whatever is held.
struct FlatLayout {
  std::vector<ParamSpec> params;
  std::vector<nn::Param*> layer_params;  // the layer's Param of params[i]
  std::vector<ModelPart> parts;
};
FlatLayout lay_out(const std::vector<PartLayout>& parts, int64_t alignment,
                   const std::vector<int>& held = {});

/// The roles (for a LayerPlan) of a model built as an embedding, blocks, a final norm and,
/// when untied, an output projection (nullptr when tied), with its family's plan tables.
LayerRoles layer_roles(std::string arch, const ParallelTables& tables,
                       nn::TokenPositionEmbedding& embedding,
                       std::vector<nn::TransformerBlock>& blocks, nn::Norm& final_norm,
                       nn::Linear* lm_head);

class LayeredModel : public Model {
 public:
  Backend& backend() const override { return backend_; }
  DType dtype() const override { return storage_.dtype; }
  DType trainable_dtype() const override {
    return storage_.trainable_dtype.value_or(storage_.dtype);
  }
  DType grad_dtype() const override { return storage_.grad_dtype; }
  const std::vector<ParamSpec>& params() const override { return params_; }
  const std::vector<ModelPart>& parts() const override { return parts_; }
  int64_t flat_size() const override { return parts_.empty() ? 0 : parts_.back().padded_end; }
  int64_t frozen_flat_size() const override;
  const Tensor& param_buffer() const override { return param_buffer_; }
  const Tensor& grad_buffer() const override { return grad_buffer_; }
  const Tensor& frozen_buffer() const override { return frozen_buffer_; }
  void bind_params(int part, const Tensor& storage, const Tensor& frozen) override;
  void bind_grads(int part, const Tensor& storage) override;
  Tensor param(const ParamSpec& p) const override;
  Tensor grad(const ParamSpec& p) const override;
  using Model::grad;
  using Model::param;
  /// Parameter i draws from Philox stream params()[i].init_stream (its number in the whole
  /// model), element j at global index j.
  std::vector<float> init_values(size_t index, uint64_t seed, int64_t begin,
                                 int64_t end) const override;
  void zero_grad() override;
  void set_hooks(ModelHooks* hooks) override { hooks_ = hooks ? hooks : &no_hooks_; }

 protected:
  LayeredModel(Backend& backend, const ModelStorage& storage);
  /// Called once by the derived constructor after its layers exist: freezes the
  /// parameters ModelStorage::freeze names (the derived model may have frozen others
  /// itself, clearing nn::Param::trainable before this call), lays them out and
  /// allocates (and binds) the flat buffers the storage asks for. Throws on a dtype the
  /// backend cannot run `ops` in, gradients in a dtype other than fp32 or the trainable
  /// dtype, a trainable dtype other than dtype with a trainable parameter that is not an
  /// adapter, a freeze pattern matching no parameter, or every parameter frozen.
  void build(const std::vector<PartLayout>& parts, const std::vector<OpFamily>& ops);
  ModelHooks& hooks() const { return *hooks_; }
  /// The local index (ModelPart::index) of global part `global`; -1 when not held.
  int local_part(int global) const;
  /// Parts of the whole model (held or not).
  int global_parts() const { return global_parts_; }
  /// Inference logits out [N.., Vp] = x [N.., C] @ weight [Vp, C]^T, computed in the model
  /// dtype and converted when out is in another (fp32 for the caller).
  void project_logits(const Tensor& out, const Tensor& x, const Tensor& weight) const;
  /// out [B,C] = x[:, Tq-1, :] of x [B,Tq,C]: each sequence's last position (decoding).
  void last_positions(const Tensor& out, const Tensor& x) const;
  const ModelStorage& storage() const { return storage_; }

 private:
  const ModelPart& part_of(int index) const;
  /// Where `p` starts in its part's storage (trainable or frozen).
  int64_t in_part(const ParamSpec& p) const;

  Backend& backend_;
  ModelStorage storage_;
  std::vector<ParamSpec> params_;
  std::vector<nn::Param*> layer_params_;  // the layer's Param of params_[i]
  std::vector<ModelPart> parts_;
  std::vector<Tensor> part_params_, part_frozen_, part_grads_;  // bound storage per part
  Tensor param_buffer_, grad_buffer_, frozen_buffer_;
  std::vector<int> local_of_global_;
  int global_parts_ = 0;
  ModelHooks no_hooks_;
  ModelHooks* hooks_ = &no_hooks_;
};

}  // namespace kiln
