// GPT-2: the model, its parameters and its forward and backward passes.
//
// Pre-LN transformer blocks (LayerNorm -> attention -> residual, LayerNorm -> MLP ->
// residual), a final LayerNorm and an output projection tied to the token embedding, as
// in Radford et al. 2019 and Hugging Face's GPT2LMHeadModel, composed from the layer
// library (src/nn; gpt2_layers.h lists the layers). The model knows nothing of
// devices, ranks or parallelism: it calls the Backend interface only, and exposes
// per-block hooks through which parallel wrappers (ZeRO-3 gathers, checkpointing) act.
//
// Parameters live in one flat buffer (one contiguous allocation, category Parameters)
// in the order of params(); gradients in a second buffer of the same layout. Parameter
// names are Hugging Face's (transformer.h.0.attn.c_attn.weight, ...) but every linear
// weight is stored [out, in] like torch.nn.Linear (Hugging Face's Conv1D stores the
// transpose; export transposes).
#pragma once

#include "backend/backend.h"
#include "models/gpt2/config.h"
#include "nn/parameter.h"
#include "nn/saved.h"

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kiln {

struct GPT2Layers;
namespace nn {
struct BlockPass;
struct Param;
}

/// The parameter layout of a GPT-2: names, global shapes and offsets in the flat buffer,
/// in Hugging Face's order (wte, wpe, per block ln_1, attn.c_attn, attn.c_proj, ln_2,
/// mlp.c_fc, mlp.c_proj, then ln_f). Weight decay on 2-D tensors. Throws kiln::Error on
/// an invalid config.
/// `unit_alignment` > 1 pads each unit (see ParamUnit) to a multiple of it, so that a
/// unit splits evenly across that many data-parallel ranks; padding stays zero.
std::vector<ParamSpec> gpt2_param_specs(const GPT2Config& config, int64_t unit_alignment = 1);

/// The initial values of parameter `index` (its position in gpt2_param_specs) under
/// GPT-2's initialisation (see GPT2::init_weights), computed on the host.
std::vector<float> gpt2_init_values(const GPT2Config& config, const ParamSpec& p, size_t index,
                                    uint64_t seed);

/// A contiguous group of parameters that parallel wrappers handle as one: the
/// embeddings (part -1), each block (0..n_layer-1), the head (n_layer). FSDP calls it a
/// unit. [begin, end) in the flat buffer holds its parameters; [end, padded_end) is
/// zero padding up to the unit alignment.
struct ParamUnit {
  int part = 0;
  int64_t begin = 0, end = 0, padded_end = 0;
  int64_t padded_size() const { return padded_end - begin; }
};
std::vector<ParamUnit> gpt2_param_units(const GPT2Config& config, int64_t unit_alignment = 1);

/// What forward keeps for backward: one policy over the blocks' declared saved tensors
/// (nn/saved.h). None keeps all; Selective all but the GELU output (4C per token per
/// block); Full only each block's input, re-running the block in backward.
using nn::ActivationCheckpointing;
using nn::parse_activation_checkpointing;

/// How a GPT2 holds its parameters and gradients.
struct GPT2Storage {
  DType dtype = DType::F32;       // parameters and activations (mixed precision: bf16, fp16)
  DType grad_dtype = DType::F32;  // parameter gradients (fp32, or dtype)
  int64_t unit_alignment = 1;  // see gpt2_param_specs
  bool allocate_params = true;  // one flat buffer; false: the owner binds per unit (ZeRO-3)
  bool allocate_grads = true;   // likewise for gradients (ZeRO-2/3)
};

/// Callbacks around each part of the model, by ParamSpec::layer: -1 the embeddings
/// (wte, wpe), 0..n_layer-1 the blocks, n_layer the head (final LayerNorm; the output
/// projection is the tied wte). Forward visits -1, 0, .., n_layer; backward visits
/// n_layer, .., 0, -1. Parallel wrappers implement them (ZeRO-3 gathers, gradient
/// buckets); the default does nothing.
struct ModelHooks {
  virtual ~ModelHooks() = default;
  virtual void before_forward(int layer) {}
  virtual void after_forward(int layer) {}
  virtual void before_backward(int layer) {}
  virtual void after_backward(int layer) {}
};

class GPT2 {
 public:
  /// Builds the parameter layout and allocates parameters and gradients on `backend`
  /// (unless `storage` says that the caller binds them per unit).
  GPT2(const GPT2Config& config, Backend& backend, const GPT2Storage& storage = {});
  ~GPT2();

  const GPT2Config& config() const { return config_; }
  Backend& backend() const { return backend_; }
  const std::vector<ParamSpec>& params() const { return params_; }
  const std::vector<ParamUnit>& units() const { return units_; }
  /// The unit of a part (-1 .. n_layer).
  const ParamUnit& unit(int part) const { return units_[static_cast<size_t>(part + 1)]; }
  /// Total elements of the flat parameter buffer (padded vocabulary rows included).
  int64_t flat_size() const { return flat_size_; }
  /// Parameters and activations are in dtype(), parameter gradients in grad_dtype();
  /// LayerNorm statistics, attention log-sum-exps and losses are always fp32.
  DType dtype() const { return storage_.dtype; }
  DType grad_dtype() const { return storage_.grad_dtype; }
  /// The flat parameter / gradient buffers, [flat_size()] of dtype() / grad_dtype();
  /// empty when not allocated (see GPT2Storage).
  const Tensor& param_buffer() const { return param_buffer_; }
  const Tensor& grad_buffer() const { return grad_buffer_; }
  /// Points a unit's parameters (or gradients) at `storage` [padded_size] until the next
  /// bind; an empty Tensor unbinds. Using an unbound unit throws.
  void bind_params(int part, const Tensor& storage);
  void bind_grads(int part, const Tensor& storage);
  /// A parameter (or its gradient) by name, as a view into the flat buffer.
  /// Throws kiln::Error naming an unknown parameter.
  Tensor param(std::string_view name) const;
  Tensor grad(std::string_view name) const;
  Tensor param(const ParamSpec& p) const;
  Tensor grad(const ParamSpec& p) const;

  /// GPT-2 initialisation, computed on the host from Philox(seed): weights N(0, 0.02),
  /// residual projections (attn.c_proj, mlp.c_proj) N(0, 0.02 / sqrt(2 n_layer)),
  /// biases 0, LayerNorm gains 1, padded vocabulary rows 0. Parameter i draws from
  /// stream i, so weights do not depend on backend, rank or thread count.
  void init_weights(uint64_t seed);
  /// Sets all (bound) gradients to zero.
  void zero_grad();

  /// Training forward on tokens and targets (int32 [B,T], on the backend's device;
  /// targets may hold ignore_index = -1). Returns the SUM of per-token losses (nats)
  /// over non-ignored targets, and the number of such targets in *n_targets. When
  /// grad_scale > 0 it also computes the loss gradient (scaled by grad_scale, e.g.
  /// 1 / targets in the global batch) for the following backward(). B <= the B of the
  /// last reserve() (reserve grows as needed), T <= block_size.
  double forward(const Tensor& tokens, const Tensor& targets, float grad_scale,
                 int64_t* n_targets = nullptr);
  /// Accumulates (+=) parameter gradients of the last forward(grad_scale > 0).
  void backward();

  /// Inference forward: logits [B,T,Vp] (fp32, or the model dtype) for tokens int32
  /// [B,T] (padded columns included; callers use the first vocab_size).
  void forward_logits(const Tensor& tokens, const Tensor& logits);

  /// Incremental inference with a KV cache (for sampling; Pope et al. 2022 call the two
  /// phases prefill and decode). begin_decode allocates k/v caches of max_len <=
  /// block_size positions for B sequences (Temporaries); each decode() runs the tokens
  /// int32 [B,Tq] at the next Tq positions and writes the LAST position's logits fp32
  /// [B,Vp] (padded columns included). Throws when the cache would overflow.
  void begin_decode(int B, int max_len);
  void decode(const Tensor& tokens, const Tensor& logits);
  void end_decode();
  /// Positions already in the cache.
  int decoded_length() const;

  /// What forward keeps for backward (see ActivationCheckpointing). Gradients are equal
  /// in every mode: the recomputation runs the same kernels on the same inputs.
  void set_activation_checkpointing(ActivationCheckpointing mode);

  /// Dropout on or off (training vs eval); the seed keys the masks of each call.
  void set_dropout(bool on, uint64_t seed, uint64_t call_index);
  /// Hooks called around blocks; nullptr for none. Not owned.
  void set_hooks(ModelHooks* hooks) { hooks_ = hooks; }

 private:
  struct Activations;
  struct DecodeState;
  void reserve(int B, int T);
  void run_forward(const Tensor& tokens, int B, int T);
  DropoutSpec dropout_spec(int layer, uint64_t site) const;
  /// What block l's forward and backward need besides its input.
  nn::BlockPass block_pass(int l) const;

  GPT2Config config_;
  Backend& backend_;
  GPT2Storage storage_;
  std::unique_ptr<GPT2Layers> layers_;
  std::vector<ParamSpec> params_;
  std::vector<nn::Param*> param_ptrs_;  // the layer's Param of params_[i]
  std::vector<ParamUnit> units_;
  std::vector<Tensor> unit_params_, unit_grads_;  // per unit, [padded_size]
  int64_t flat_size_ = 0;
  Tensor param_buffer_;
  Tensor grad_buffer_;
  std::unique_ptr<Activations> acts_;
  std::unique_ptr<DecodeState> decode_;
  ModelHooks no_hooks_;
  ModelHooks* hooks_ = &no_hooks_;
  bool dropout_on_ = false;
  ActivationCheckpointing checkpointing_ = ActivationCheckpointing::None;
  uint64_t dropout_seed_ = 0;
  uint64_t dropout_call_ = 0;
};

}  // namespace kiln
