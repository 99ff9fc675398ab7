// A second model built only from the layer library (src/nn) and the Model interface,
// to prove the seams: nothing in trainer, parallel or checkpoint code knows it.
//
// TinyEncoder: a bidirectional encoder, nothing like GPT-2: token embeddings only (no
// position table), n_layer pre-norm blocks with RMSNorm, rotary grouped-query attention
// (n_head query heads over max(1, n_head / 2) key/value heads) that is NOT causal, a
// SwiGLU MLP of hidden width 2C and no biases anywhere, a final RMSNorm and an UNTIED
// output projection (lm_head) fused with the chunked cross-entropy. Batches may carry
// explicit positions (the rotary angles). Parts: 0 the embeddings, 1 + l block l,
// n_layer + 1 the head; none is tied. No dropout, no decoding. Trained on next-token
// targets it can see them (bidirectional), so its loss falls far below a causal model's:
// the training test checks that too.
#pragma once

#include "models/layered_model.h"
#include "models/registry.h"
#include "nn/block.h"
#include "nn/classifier.h"
#include "nn/embedding.h"
#include "nn/linear.h"
#include "nn/norm.h"

#include <memory>
#include <vector>

namespace kiln::testing {

class TinyEncoder final : public LayeredModel {
 public:
  /// Vocabulary padded to a multiple of 16 (the head's rows).
  TinyEncoder(const ModelOptions& o, Backend& be, const ModelStorage& storage);

  std::string arch() const override { return "tiny_encoder"; }
  std::string describe() const override;
  nlohmann::json config_json() const override;
  /// Inputs "tokens" int32 [B,T] and the optional "positions" int32 [B,T].
  BatchShape batch_shape(int B, int T) const override;
  LossSum forward(const Batch& batch, float grad_scale) override;
  void backward() override;
  void set_activation_checkpointing(nn::ActivationCheckpointing mode) override { mode_ = mode; }
  void set_dropout(bool, uint64_t, uint64_t) override {}
  double flops_per_token(int T) const override;
  int64_t num_parameters() const override;
  int padded_vocab_size() const { return static_cast<int>(vp_); }

 private:
  void reserve(int B, int T);
  nn::BlockPass pass(int l, const Tensor& positions) const;

  ModelOptions o_;
  int64_t vp_;
  nn::TokenPositionEmbedding embedding_;
  std::vector<nn::TransformerBlock> blocks_;
  nn::Norm norm_;
  nn::Linear head_;
  nn::ActivationCheckpointing mode_ = nn::ActivationCheckpointing::None;
  // Saved activations for one (B, T).
  int B_ = 0, T_ = 0;
  std::vector<Tensor> stream_, head_saved_;
  nn::SavedActivations saved_;
  nn::BlockScratch scratch_;
  Tensor logits_chunk_, losses_chunk_, dres_, tokens_, positions_;
  LossAccumulator loss_;
  bool have_grad_ = false;
};

/// Registers TinyEncoder as model.arch = "tiny_encoder", taking tensor and context
/// parallelism (its plan tables are in tiny_encoder.cpp).
void register_tiny_encoder();

}  // namespace kiln::testing
