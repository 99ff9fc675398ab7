// GPT-2: the model, its parameters and its forward and backward passes.
//
// Pre-LN transformer blocks (LayerNorm -> attention -> residual, LayerNorm -> MLP ->
// residual), a final LayerNorm and an output projection tied to the token embedding, as
// in Radford et al. 2019 and Hugging Face's GPT2LMHeadModel, composed from the layer
// library (src/nn; gpt2_layers.h lists the layers) and seen by everything else through
// the Model interface (models/model.h). Parts: 0 the embeddings (wte, wpe; tied: wte is
// also the output projection), 1 + l block l, n_layer + 1 the head (ln_f).
//
// Parameter names are Hugging Face's (transformer.h.0.attn.c_attn.weight, ...) but every
// linear weight is stored [out, in] like torch.nn.Linear (Hugging Face's Conv1D stores
// the transpose; export transposes).
#pragma once

#include "backend/backend.h"
#include "models/decoder_model.h"
#include "models/gpt2/config.h"

#include <memory>
#include <string>
#include <vector>

namespace kiln {

struct GPT2Layers;

/// The parameter layout of a GPT-2: names, global shapes and offsets in the flat buffer,
/// in Hugging Face's order (wte, wpe, per block ln_1, attn.c_attn, attn.c_proj, ln_2,
/// mlp.c_fc, mlp.c_proj, then ln_f). Weight decay on 2-D tensors. `part_alignment` pads
/// each part as ModelStorage says. Throws kiln::Error on an invalid config.
std::vector<ParamSpec> gpt2_param_specs(const GPT2Config& config, int64_t part_alignment = 1);

class GPT2 final : public DecoderModel {
 public:
  /// Builds the layers and allocates parameters and gradients on `backend` (unless
  /// `storage` says that the caller binds them per part).
  GPT2(const GPT2Config& config, Backend& backend, const ModelStorage& storage = {});
  ~GPT2() override;

  const GPT2Config& config() const { return config_; }

  // Model
  std::string arch() const override { return "gpt2"; }
  std::string describe() const override { return config_.str(); }
  nlohmann::json config_json() const override;
  // forward (DecoderModel): positions must be empty (0..T-1: learned positions); the
  // loss gradient is made in the tied output projection (wte).
  void set_dropout(bool on, uint64_t seed, uint64_t first_sample) override;
  double flops_per_token(int T) const override { return config_.flops_per_token(T); }
  int64_t num_parameters() const override { return config_.num_parameters(); }
  int vocab_size() const override { return config_.vocab_size; }
  int padded_vocab_size() const override { return config_.padded_vocab_size; }
  int max_positions() const override { return config_.block_size; }
  /// Incremental inference with a KV cache (Pope et al. 2022 call the two phases
  /// prefill and decode). begin_decode allocates k/v caches of max_len <= block_size
  /// positions for B sequences (Temporaries); each decode() runs the tokens int32
  /// [B,Tq] at the next Tq positions and writes the LAST position's logits fp32 [B,Vp]
  /// (padded columns included). Throws when the cache would overflow.
  void begin_decode(int B, int max_len) override;
  void decode(const Tensor& tokens, const Tensor& logits) override;
  void end_decode() override;
  int decoded_length() const override;

 protected:
  /// The mask of dropout site `site` of block `block` (-1: the embeddings): one Philox
  /// stream per (block, site) for the whole run, element e of global sample s (the
  /// micro-batch's first is set_dropout's first_sample) at index s * n + e, n the
  /// elements of one sample there (T C; n_head T T for attention probabilities), e its
  /// position within the sample (t C + c; (h T + i) T + j).
  DropoutSpec dropout_spec(int block, uint64_t site, int64_t T) const override;

 private:
  struct DecodeState;

  GPT2Config config_;
  std::unique_ptr<GPT2Layers> layers_;
  std::unique_ptr<DecodeState> decode_;
  bool dropout_on_ = false;
  uint64_t dropout_seed_ = 0;
  uint64_t dropout_first_sample_ = 0;
};

}  // namespace kiln
