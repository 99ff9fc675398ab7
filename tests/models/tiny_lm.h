// A second model built only from the layer library (src/nn) and the Model interface,
// to prove the seams: nothing in trainer, parallel or checkpoint code knows it.
//
// TinyLM: token + learned-position embeddings, n_layer pre-norm blocks WITHOUT biases on
// their Linears and with an MLP of width 3C, a final LayerNorm and an UNTIED output
// projection (lm_head, no bias) fused with the chunked cross-entropy. Parts: 0 the
// embeddings, 1 + l block l, n_layer + 1 the head; none is tied. No dropout, no decoding.
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

class TinyLM final : public LayeredModel {
 public:
  /// Vocabulary padded to a multiple of 16 (the head's rows).
  TinyLM(const ModelOptions& o, Backend& be, const ModelStorage& storage);

  std::string arch() const override { return "tiny_lm"; }
  std::string describe() const override;
  nlohmann::json config_json() const override;
  LossSum forward(const Batch& batch, float grad_scale) override;
  void backward() override;
  void set_activation_checkpointing(nn::ActivationCheckpointing mode) override { mode_ = mode; }
  void set_dropout(bool, uint64_t, uint64_t) override {}
  double flops_per_token(int T) const override;
  int64_t num_parameters() const override;
  int vocab_size() const override { return static_cast<int>(o_.vocab_size); }
  int padded_vocab_size() const override { return static_cast<int>(vp_); }
  int max_positions() const override { return o_.block_size; }
  void begin_decode(int, int) override { KILN_FAIL("tiny_lm: no decoding"); }
  void decode(const Tensor&, const Tensor&) override { KILN_FAIL("tiny_lm: no decoding"); }
  void end_decode() override {}
  int decoded_length() const override { return 0; }

 private:
  void reserve(int B, int T);
  nn::BlockPass pass(int l) const;

  ModelOptions o_;
  int64_t vp_;
  nn::TokenPositionEmbedding embedding_;
  std::vector<nn::TransformerBlock> blocks_;
  nn::LayerNorm norm_;
  nn::Linear head_;
  nn::ActivationCheckpointing mode_ = nn::ActivationCheckpointing::None;
  // Saved activations for one (B, T).
  int B_ = 0, T_ = 0;
  std::vector<Tensor> stream_, head_saved_;
  nn::SavedActivations saved_;
  nn::BlockScratch scratch_;
  Tensor logits_chunk_, losses_chunk_, dres_, tokens_;
  bool have_grad_ = false;
};

/// Registers TinyLM as model.arch = "tiny_lm".
void register_tiny_lm();

}  // namespace kiln::testing
