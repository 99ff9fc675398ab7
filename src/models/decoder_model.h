// DecoderModel: the training passes shared by the decoder-only language models (GPT-2,
// Llama): token embedding -> n_layer transformer blocks -> final norm -> output head
// fused with the chunked cross-entropy (nn/classifier.h), the head's weight its own
// (lm_head) or the tied token embedding.
//
// Parts (ModelPart, by global index): 0 the embeddings, 1 + l block l, n_layer + 1 the
// head. A pass runs a contiguous range of them (a pipeline chunk; the whole model for
// forward()/backward()) on one of several micro-batches in flight ("slots"): each slot
// keeps its own saved activations for the range's blocks (nn/saved.h) from its forward to
// its backward; backward scratch is shared. Between chunks flows the residual stream
// [B,T,C] in the model dtype ([B*T/tp, C] rows under sequence parallelism).
//
// A derived model declares its layers (set_layers) and, when it has dropout, its masks
// (dropout_spec); everything else here is the same code for both.
#pragma once

#include "models/layered_model.h"
#include "models/moe_balance.h"
#include "nn/saved.h"

#include <map>
#include <memory>
#include <utility>
#include <vector>

namespace kiln {

namespace nn {
struct BlockPass;
struct TpPlacement;
class Param;
}  // namespace nn

/// The decoders' parallel plans, as GPT-2 and Llama state them (GPT2Layers::roles,
/// LlamaLayers::roles; a family may state another), applied by parallel/tp_plan.h and
/// parallel/context_parallel.h. Tensor parallel, Megatron-LM's:
///   embedding       vocab      wte's rows split (and the tied head's: the loss
///                              vocab-parallel over them)
///   attention.qkv   column     heads split, each of q, k and v separately
///   attention.proj  row
///   mlp.fc          column     hidden units split (SwiGLU: gate and up separately; a
///                              MoE block's every expert and its shared experts alike,
///                              its router whole: nn/moe.h)
///   mlp.proj        row
///   norms           sequence   the rank's rows under sequence parallelism
///   final_norm      sequence
///   lm_head         column     untied: the vocabulary rows, the loss vocab-parallel
/// A partial sum never enters a norm: every row-parallel output is reduced (or
/// reduce-scattered) before the residual add. Context parallel: every block's
/// self-attention takes the ring.
inline constexpr ParallelTables kDecoderParallelTables{
    .tp = TensorParallelTable{.embedding = nn::TpStyle::Vocab,
                              .attention_qkv = nn::TpStyle::Column,
                              .attention_proj = nn::TpStyle::Row,
                              .mlp_fc = nn::TpStyle::Column,
                              .mlp_proj = nn::TpStyle::Row,
                              .norms = nn::TpStyle::Sequence,
                              .final_norm = nn::TpStyle::Sequence,
                              .lm_head = nn::TpStyle::Column},
    .cp = ContextParallelTable{.attention = true},
};

/// The layers a decoder model trains through, owned by the derived model.
struct DecoderLayers {
  nn::TokenPositionEmbedding* embedding = nullptr;
  std::vector<nn::TransformerBlock>* blocks = nullptr;
  nn::Norm* norm = nullptr;
  nn::Param* head_weight = nullptr;  // lm_head.weight [Vp, C], or the tied wte
  const nn::TpPlacement* head_placement = nullptr;
  int vocab_size = 0;
  int64_t n_embd = 0;
  MoeBalanceSpec balance;  // the MoE blocks' balancing losses (models/moe_balance.h)
};

class DecoderModel : public LayeredModel, public LanguageModel {
 public:
  ~DecoderModel() override;

  /// Inputs "tokens" int32 [B,T] and the optional "positions" int32 [B,T] (the rotary
  /// angles, or the rows of learned position embeddings; context parallelism's chunks;
  /// absent: 0..T-1); targets int32 [B,T] (may hold -1).
  BatchShape batch_shape(int B, int T) const override;
  /// The loss gradient (x grad_scale) is made here, in the output head, for the following
  /// backward(). The whole model, slot 0.
  LossSum forward(const Batch& batch, float grad_scale) override;
  void backward() override;
  void set_activation_checkpointing(nn::ActivationCheckpointing mode) override;
  LanguageModel* language_model() override { return this; }
  /// Mixture-of-experts blocks: the balancing losses' gradient factor, and their figures.
  void set_aux_loss_scale(float scale) override;
  void set_moe_balance_groups(MoeBalanceGroup* micro_batch, MoeBalanceGroup* global) override;
  std::optional<MoeStats> take_moe_stats() override;
  /// The MoE blocks' auxiliary-loss-free selection biases (models/moe_balance.h).
  void update_moe_bias(MoeStats& step) override;
  std::vector<ModelBuffer> buffers() const override;

  std::optional<Shape> stage_activation_shape(int B, int T) const override;
  LossSum forward_stage(const StagePass& pass, float grad_scale) override;
  void backward_stage(const StagePass& pass) override;

  /// Inference forward: logits [B,T,Vp] (fp32, or the model dtype) for tokens int32
  /// [B,T] at positions 0..T-1 (padded columns included; callers use the first
  /// vocab_size). Throws kiln::Error for a tensor-parallel or pipeline-stage model.
  void forward_logits(const Tensor& tokens, const Tensor& logits);

 protected:
  DecoderModel(Backend& backend, const ModelStorage& storage);
  /// Called by the derived constructor, before build().
  void set_layers(const DecoderLayers& layers);
  /// The mask of dropout site `site` (nn::DropoutSite) of block `block` (-1: the
  /// embeddings) for the current micro-batch of sequences of T tokens; p = 0 (the
  /// default) for none.
  virtual DropoutSpec dropout_spec(int block, uint64_t site, int64_t T) const;
  /// Part 0's forward: the residual stream's input out [B,T,C] of a micro-batch whose
  /// targets are [B,T], at `positions` int32 [B,T] (empty: 0..T-1). The decoders': the
  /// token embedding of "tokens" [B,T] and its dropout. A model that reads more (a
  /// vision-language model's image) overrides both; the pair sees one micro-batch at a
  /// time (a model that overrides them runs no pipeline).
  virtual void embed_forward(const Batch& batch, const Tensor& positions, const Tensor& out);
  /// Part 0's backward: accumulates its parameters' gradients from dout = dL/d(out)
  /// (which it may overwrite) of the same micro-batch's embed_forward.
  virtual void embed_backward(const Batch& batch, const Tensor& positions, const Tensor& dout);
  int n_layer() const;

 private:
  struct Shared;
  struct Slot;
  /// Shared scratch for [B,T] (reallocated when B, T or the checkpointing mode change,
  /// which drops every slot).
  void reserve(int B, int T);
  /// The slot of chunk [first, end), allocated on first use.
  Slot& slot(int first, int end, int index);
  nn::BlockPass block_pass(const Slot& a, int l) const;
  /// The MoE layers (indices among them) of blocks [b0, b1): [first, end).
  std::pair<int, int> moe_layers(int b0, int b1) const;
  /// Part 0's forward into the slot's stream[0] (embed_forward between its hooks).
  void embed(Slot& a);
  /// The sequence-parallel scratch as [B,T,C] for the embedding (empty without SP).
  Tensor stream_work() const;

  DecoderLayers layers_;
  nn::ActivationCheckpointing mode_ = nn::ActivationCheckpointing::None;
  std::unique_ptr<Shared> shared_;
  LossAccumulator loss_;
  std::map<std::pair<int, int>, std::unique_ptr<Slot>> slots_;  // by (first part, slot)
  // Mixture-of-experts blocks (none: balance_ empty): block l's index among them (-1:
  // dense) and their balancing losses.
  std::vector<int> moe_index_;
  std::unique_ptr<MoeBalance> balance_;
};

}  // namespace kiln
