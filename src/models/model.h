// Model: the one core interface between a model and everything that trains, shards,
// saves or samples it (data parallel and ZeRO, pipeline stages, checkpoints, the memory
// planner): its layout and binding, its training passes, its stages, the batch it takes
// and its FLOPs. What a model can do beyond training (decode text, classify images,
// generate images) are capability interfaces of their own (models/capabilities.h),
// reached through language_model(), image_classifier() and flow_model().
//
// A model is a sequence of parts (FSDP calls them units; a pipeline stage holds a range
// of them): part 0 is the input end (embeddings), the last part the output end.
// Every parameter has a global name and a global shape and belongs to one part; a part's
// parameters are contiguous in the model's flat layout, so a wrapper can hold, gather,
// bind or reduce a part as one flat tensor. A parameter used by two parts (GPT-2's wte:
// input embedding and output head) belongs to the first, and that part is `resident`:
// its parameters are needed, and its gradient written, between its forward and its
// backward (likewise a head that computes its loss gradient during forward).
//
// The model never calls a collective: parallel wrappers act through ModelHooks, called
// before and after each part's forward and backward, and by binding storage to parts.
#pragma once

#include "backend/backend.h"
#include "models/batch.h"
#include "models/capabilities.h"
#include "models/layer_plan.h"
#include "models/model_options.h"
#include "nn/parameter.h"
#include "nn/saved.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kiln {
/// One part. A model stores its parameters in two flat layouts, each a buffer of its own:
/// the trainable layout (every trainable parameter; the gradient layout is the same) and
/// the frozen layout (ParamSpec::trainable false: no gradient). A part is a range of each,
/// started and padded with zeros to the part alignment (see ModelStorage):
///   trainable  [begin, end) its trainable parameters, [end, padded_end) padding; two
///              regions, each padded to the alignment:
///     dense    those every expert-parallel rank holds alike, dense_size() elements;
///     expert   its expert-parallel ones (ParamSlice::ep_sharded: each ep rank holds other
///              experts; data parallelism reduces them over the expert-data-parallel
///              group), expert_size elements from expert_begin();
///   frozen     [frozen_begin, frozen_begin + frozen_size) of the frozen layout: its dense
///              frozen parameters, then (padded apart, the last frozen_expert_size elements)
///              its expert-parallel ones, which each ep rank holds for other experts (the
///              expert-data-parallel group shards them).
/// A LoRA fine-tune's adapters are thus the trainable buffer and its base the frozen one
/// (ModelStorage::trainable_dtype gives them a dtype of their own).
struct ModelPart {
  int index = 0;        // 0 .. parts().size() - 1, in forward order
  int global_index = 0; // in the whole model (differs from index on a pipeline stage)
  std::string name;     // e.g. "embeddings", "h.3", "head"
  int64_t begin = 0, end = 0, padded_end = 0;  // in the trainable layout
  int64_t expert_size = 0;    // elements of its trainable expert region (padding
                              // included); 0: none
  int64_t frozen_begin = 0;   // in the frozen layout
  int64_t frozen_size = 0;    // elements of its frozen region (padding included); 0: none
  int64_t frozen_expert_size = 0;  // of them, the frozen expert-parallel ones' (padded)
  double cost = 1.0;    // relative compute per token (balancing pipeline stages)
  bool resident = false;  // parameters used and gradient written from its forward to its
                          // backward (tied parameters, a loss gradient made in forward)
  /// Elements of its trainable range, padding included: its gradient's size.
  int64_t padded_size() const { return padded_end - begin; }
  /// Elements of its dense trainable region (padding included).
  int64_t dense_size() const { return padded_size() - expert_size; }
  /// Where its expert region starts in the trainable layout.
  int64_t expert_begin() const { return begin + dense_size(); }
};

/// How a model holds its parameters and gradients.
struct ModelStorage {
  DType dtype = DType::F32;       // parameters and activations (mixed precision: bf16, fp16)
  DType grad_dtype = DType::F32;  // parameter gradients (fp32, or trainable_dtype)
  /// The trainable parameters' dtype (their flat buffer's); nullopt: dtype. It may differ
  /// from dtype only when every trainable parameter is a LoRA adapter (nn::Param::adapter:
  /// fp32 adapters on a bf16 base, train.lora.dtype), whose layers cast it to dtype.
  std::optional<DType> trainable_dtype;
  int64_t part_alignment = 1;     // each part padded to a multiple (ZeRO: the dp size)
  bool allocate_params = true;    // one flat buffer; false: the owner binds per part (ZeRO-3)
  bool allocate_grads = true;     // likewise for gradients (ZeRO-2/3)
  /// MiB of fp32 logits per chunk of the fused output projection and loss
  /// (train.classifier_chunk_mb; nn::classifier_chunk_rows).
  double classifier_chunk_mb = 16.0;
  /// Applied to the layers, in order, before the layout (tensor, context parallel).
  std::vector<const LayerPlan*> plans;
  /// The parts this model builds, by global index (a pipeline stage's chunks); empty: all.
  /// Parameter names, initial values and layer numbers stay those of the whole model.
  std::vector<int> held_parts;
  /// Glob patterns of the parameters to freeze (train.freeze; nn::freeze_matching), over
  /// the whole model's parameter names, held or not; each must match one.
  std::vector<std::string> freeze;
};

/// Callbacks around each part (by ModelPart::index): forward visits 0, 1, .., P-1;
/// backward P-1, .., 0. The default does nothing.
struct ModelHooks {
  virtual ~ModelHooks() = default;
  virtual void before_forward(int part) {}
  virtual void after_forward(int part) {}
  virtual void before_backward(int part) {}
  virtual void after_backward(int part) {}
};

/// One pipeline chunk's pass (parallel/pipeline.h): parts [first, end) by global index,
/// all held by the model, on micro-batch slot `slot` (one per micro-batch in flight on
/// the chunk; a slot's forward is followed by its backward before the slot is reused).
/// `batch` is the whole micro-batch (tokens read by part 0, targets by the last part),
/// kept valid by the caller until the slot's backward. Activations between chunks are
/// Model::stage_activation_shape, in the model dtype.
struct StagePass {
  int first = 0, end = 0;
  int slot = 0;
  Batch batch;
  Tensor input, output;    // forward: the activation in (first > 0) and out (end < parts)
  Tensor dinput, doutput;  // backward: dL/d(input) out (first > 0), dL/d(output) in (end < parts)
};

/// A mixture-of-experts model's balancing figures since they were last taken
/// (Model::take_moe_stats): the auxiliary load-balancing loss and the router z-loss as
/// optimised (coefficients applied), each the mean over the micro-batches this rank ran,
/// and the (token, choice) slots each expert received, per MoE layer (in block order, every
/// MoE layer of the model), summed over those micro-batches (the router's choice, before
/// any dropping). A pipeline stage's cover its own MoE layers: the others' rows are zero and
/// their share of the losses is elsewhere (the trainer sums them over the stages).
struct MoeStats {
  double aux_loss = 0.0, z_loss = 0.0;
  int64_t micro_batches = 0;
  std::vector<std::vector<double>> tokens_per_expert;  // [MoE layer][expert]
  /// With token dropping (moe.capacity_factor > 0), the slots dropped past an expert's
  /// capacity, summed over the MoE layers and micro-batches (the slots of all are the sum
  /// of tokens_per_expert); nullopt when dropless.
  std::optional<double> dropped_slots;
  /// The auxiliary-loss-free selection bias after the step's update (Model::
  /// update_moe_bias), [MoE layer][expert]; empty without moe.expert_bias.
  std::vector<std::vector<float>> expert_bias;
};

/// A model's state that is not a parameter: no gradient, no optimizer state, fp32, whole
/// on every rank (never sharded: ZeRO and tensor parallelism leave it alone), saved in
/// checkpoints under its global name and read back by a resume, an init_from and `kiln
/// sample` (model_io.h). E.g. a mixture of experts' selection bias.
struct ModelBuffer {
  std::string name;  // e.g. "model.layers.3.mlp.router.expert_bias"
  Tensor value;      // fp32, on the model's device
};

/// The ranks over which a mixture of experts balances its load: those sharing a
/// micro-batch (context parallelism) or, with moe.aux_loss_scope "global" (Megatron-core's
/// global_aux_loss), the data-parallel ranks too: a sum over the ranks, each calling it in
/// the same order. src/parallel implements it over a Communicator (CommMoeBalanceGroup)
/// and the trainer installs it (Model::set_moe_balance_groups), so that the models include
/// no communication header.
class MoeBalanceGroup {
 public:
  virtual ~MoeBalanceGroup() = default;
  virtual int size() const = 0;
  /// t (fp32, on the device) <- its sum over the group's ranks, after the work queued on
  /// `s`. Collective.
  virtual void all_reduce_sum(Stream s, const Tensor& t) = 0;
};

/// The SUM of per-target losses (nats) over non-ignored targets, and their number; for a
/// classifier's forward without gradient also how many targets were its top class
/// (-1: not computed). Zero when the batch brought its accumulator (Batch::loss).
struct LossSum {
  double sum = 0.0;
  int64_t targets = 0;
  int64_t correct = -1;
};

/// Where a model's forward adds its loss (Batch::loss): the batch's accumulator, or
/// without one the model's own, zeroed by target() and read back by result().
class LossAccumulator {
 public:
  /// The fp64 [2] accumulator for `batch`'s loss.
  Tensor target(Backend& be, const Batch& batch);
  /// The sums, read back (one host wait) from the own accumulator; {} with the batch's.
  LossSum result(Backend& be, const Batch& batch) const;

 private:
  Tensor own_;
};

class Model {
 public:
  virtual ~Model() = default;

  virtual std::string arch() const = 0;
  /// One line for logs (architecture, shape, parameter count).
  virtual std::string describe() const = 0;
  /// Hyper-parameters as stored in a checkpoint's state ("model").
  virtual nlohmann::json config_json() const = 0;
  /// The options of the model this one holds under the parameter prefix `prefix` (a
  /// LLaVA's "language_model", an MMDiT's Llama "text_encoder"), the family keys among
  /// them those that must agree with a model.init_parts source's (what changes the
  /// computation from given weights without changing a tensor's shape: heads, norm
  /// epsilon, rotary settings); nullopt when no such model is known (nothing is checked).
  virtual std::optional<ModelOptions> part_options(std::string_view prefix) const {
    (void)prefix;
    return std::nullopt;
  }
  virtual Backend& backend() const = 0;
  /// Activations and frozen parameters are in dtype(), trainable parameters in
  /// trainable_dtype() (dtype() but for a LoRA fine-tune's adapters: ModelStorage), their
  /// gradients in grad_dtype().
  virtual DType dtype() const = 0;
  virtual DType trainable_dtype() const = 0;
  virtual DType grad_dtype() const = 0;

  // ---- parameters ---------------------------------------------------------------------
  /// Every parameter in flat-layout order (ParamSpec::part says which part holds it).
  virtual const std::vector<ParamSpec>& params() const = 0;
  virtual const std::vector<ModelPart>& parts() const = 0;
  /// Elements of the trainable layout (padding included), which is also the gradient's.
  virtual int64_t flat_size() const = 0;
  /// Elements of the frozen layout (padding included).
  virtual int64_t frozen_flat_size() const = 0;
  /// Elements of the parameters (each tied one once, padding and tp slicing aside: global
  /// shapes) that train and that are frozen, of the parts this model holds.
  int64_t trainable_elements() const;
  int64_t frozen_elements() const;
  /// The flat buffers: trainable parameters [flat_size()], their gradients [flat_size()],
  /// frozen parameters [frozen_flat_size()]; empty when not allocated (ModelStorage).
  virtual const Tensor& param_buffer() const = 0;
  virtual const Tensor& grad_buffer() const = 0;
  virtual const Tensor& frozen_buffer() const = 0;
  /// Points a part's trainable parameters at `storage` [padded_size()] and its frozen ones
  /// at `frozen` [frozen_size] (or its gradients at `storage` [padded_size()]) until the
  /// next bind; an empty Tensor unbinds. Using an unbound part throws. A frozen
  /// parameter's gradient is never bound.
  virtual void bind_params(int part, const Tensor& storage, const Tensor& frozen) = 0;
  virtual void bind_grads(int part, const Tensor& storage) = 0;
  /// A parameter (or its gradient) as a view of its part's storage. Throws kiln::Error
  /// naming an unknown or unbound parameter, or the gradient of a frozen one.
  virtual Tensor param(const ParamSpec& p) const = 0;
  virtual Tensor grad(const ParamSpec& p) const = 0;
  Tensor param(std::string_view name) const { return param(spec(name)); }
  Tensor grad(std::string_view name) const { return grad(spec(name)); }
  const ParamSpec& spec(std::string_view name) const;
  /// Elements [begin, end) (row-major in the global tensor) of parameter `index`'s
  /// initial values under `seed`: a function of (seed, index, element) only, so every
  /// layout initialises identically.
  virtual std::vector<float> init_values(size_t index, uint64_t seed, int64_t begin,
                                         int64_t end) const = 0;
  /// Every (bound) parameter from init_values.
  void init_weights(uint64_t seed);
  /// Sets all bound gradients to zero.
  virtual void zero_grad() = 0;

  // ---- training -----------------------------------------------------------------------
  /// The micro-batch a [micro_batch B, seq_len T] step feeds forward(): the inputs by
  /// name, shape and dtype (models/batch.h) and the targets. Throws kiln::Error when T
  /// does not fit the model (e.g. a vision transformer's patch count).
  virtual BatchShape batch_shape(int B, int T) const = 0;
  /// Forward of a micro-batch (its inputs as batch_shape declares them). When grad_scale
  /// > 0 it also prepares backward() for the gradient of grad_scale * loss sum (e.g. 1 /
  /// targets in the global batch).
  virtual LossSum forward(const Batch& batch, float grad_scale) = 0;
  /// Accumulates (+=) parameter gradients of the last forward(grad_scale > 0).
  virtual void backward() = 0;
  /// The factor on the gradients of the model's own auxiliary losses (a mixture of
  /// experts' balancing losses) in each micro-batch's backward: the loss scale / (the
  /// micro-batches of the step over all data-parallel ranks), so that they enter as their
  /// mean. 1 until set; models without such losses ignore it.
  virtual void set_aux_loss_scale(float scale) { (void)scale; }
  /// The groups the balancing statistics are summed over (not owned; they outlive the
  /// model): `micro_batch`, the ranks that share each micro-batch (context parallelism's
  /// cp group), for moe.aux_loss_scope "micro_batch", and `global`, the dp x cp ranks, for
  /// "global"; none (nullptr, the default) is a group of one. Models without such losses
  /// ignore them.
  virtual void set_moe_balance_groups(MoeBalanceGroup* micro_batch, MoeBalanceGroup* global) {
    (void)micro_batch;
    (void)global;
  }
  /// The balancing figures since the last call (one host read), then reset; nullopt for a
  /// model without mixture-of-experts layers.
  virtual std::optional<MoeStats> take_moe_stats() { return std::nullopt; }
  /// After an applied update (not a skipped one): DeepSeek-V3's auxiliary-loss-free
  /// balancing (moe.expert_bias) moves each MoE layer's selection bias by the step's
  /// tokens per expert (`step`, summed over the data-parallel ranks: the same on every
  /// rank) and records the moved bias in step.expert_bias. Others do nothing.
  virtual void update_moe_bias(MoeStats& step) { (void)step; }
  /// The model's buffers (ModelBuffer), of the parts it holds; none by default.
  virtual std::vector<ModelBuffer> buffers() const { return {}; }
  virtual void set_activation_checkpointing(nn::ActivationCheckpointing mode) = 0;
  /// Dropout on or off (training vs eval); (seed, first_sample) key the masks and any
  /// other per-sample draw, first_sample being the global index of the micro-batch's
  /// first sample in the run's stream of samples (((update * grad_accum_steps +
  /// micro-step) * dp + dp rank) * micro_batch, the loader's order): each draw is keyed
  /// by its sample's global index and its position within the sample, so every layout
  /// (dp, micro_batch, accumulation, tp, sp, pp) draws the same for the same token.
  virtual void set_dropout(bool on, uint64_t seed, uint64_t first_sample) = 0;
  /// Hooks called around parts; nullptr for none. Not owned.
  virtual void set_hooks(ModelHooks* hooks) = 0;
  /// Training FLOPs per token at sequence length T (for MFU).
  virtual double flops_per_token(int T) const = 0;
  /// Trainable parameters as the model's paper counts them: a tied parameter once, padding
  /// (e.g. padded vocabulary rows) excluded.
  virtual int64_t num_parameters() const = 0;

  // ---- pipeline stages (parallel/pipeline.h) --------------------------------------------
  /// The activation between two chunks of a [B,T] micro-batch, in the model dtype; nullopt
  /// for a model that runs only as one chunk (no pipeline parallelism).
  virtual std::optional<Shape> stage_activation_shape(int B, int T) const { return std::nullopt; }
  /// Forward of one chunk; returns the loss sum on the chunk holding the last part (else
  /// zero) and, when grad_scale > 0, prepares the slot's backward_stage. The default runs
  /// the whole model as slot 0 (forward(), backward()). Throws kiln::Error for a range or
  /// slot the model cannot run.
  virtual LossSum forward_stage(const StagePass& pass, float grad_scale);
  /// Backward of the slot's last forward_stage: accumulates (+=) parameter gradients.
  virtual void backward_stage(const StagePass& pass);

  // ---- capabilities (models/capabilities.h) ---------------------------------------------
  /// This model as a language model, image classifier or flow model; nullptr when it is
  /// not one (as_language_model() etc. turn that into an error naming the arch).
  virtual LanguageModel* language_model() { return nullptr; }
  virtual ImageClassifier* image_classifier() { return nullptr; }
  virtual FlowModel* flow_model() { return nullptr; }
  virtual VisionLanguageModel* vision_language_model() { return nullptr; }
};

}  // namespace kiln
