// GPT-2 as layers of the library (src/nn): the embeddings, n_layer pre-LN blocks and
// the final LayerNorm, named as Hugging Face's GPT2LMHeadModel. The output projection is
// the tied wte. One source of truth for the parameter layout (gpt2_param_specs) and the
// model (GPT2). Included only by the model's own .cpp files.
#pragma once

#include "models/gpt2/config.h"
#include "models/decoder_model.h"
#include "models/layered_model.h"
#include "nn/block.h"
#include "nn/embedding.h"
#include "nn/norm.h"

#include <cmath>
#include <string>
#include <vector>

namespace kiln {

inline nn::BlockSpec gpt2_block_spec(const GPT2Config& c) {
  nn::BlockSpec b;
  b.n_embd = c.n_embd;
  b.norm.eps = c.layernorm_eps;
  b.attention.n_head = c.n_head;
  b.attention.head_dim = c.n_embd / c.n_head;
  b.attention.causal = true;
  b.mlp_hidden = 4 * c.n_embd;
  b.bias = true;
  b.init_std = 0.02f;
  b.residual_init_std = 0.02f / std::sqrt(2.f * static_cast<float>(c.n_layer));
  return b;
}

struct GPT2Layers {
  explicit GPT2Layers(const GPT2Config& c)
      : embedding("transformer.wte.weight", "transformer.wpe.weight", c.vocab_size,
                  c.padded_vocab_size, c.block_size, c.n_embd, 0.02f),
        ln_f("transformer.ln_f", c.n_embd, nn::NormSpec{nn::NormKind::LayerNorm, c.layernorm_eps}) {
    c.validate();
    const nn::BlockSpec spec = gpt2_block_spec(c);
    blocks.reserve(static_cast<size_t>(c.n_layer));
    for (int l = 0; l < c.n_layer; ++l)
      blocks.emplace_back("transformer.h." + std::to_string(l) + ".", spec);
  }
  GPT2Layers(const GPT2Layers&) = delete;
  GPT2Layers& operator=(const GPT2Layers&) = delete;

  /// Parameters by part, in Hugging Face's order: [0] the embeddings (wte, wpe),
  /// [1 + l] block l, [n_layer + 1] the head (ln_f).
  std::vector<std::vector<nn::Param*>> parts() {
    std::vector<std::vector<nn::Param*>> out(blocks.size() + 2);
    embedding.collect(out.front());
    for (size_t l = 0; l < blocks.size(); ++l) blocks[l].collect(out[l + 1]);
    ln_f.collect(out.back());
    return out;
  }

  /// The layers by role and GPT-2's plans (the decoders': models/decoder_model.h), for a
  /// LayerPlan (the output projection is the tied wte).
  LayerRoles roles() {
    return layer_roles("gpt2", kDecoderParallelTables, embedding, blocks, ln_f, nullptr);
  }

  nn::TokenPositionEmbedding embedding;
  std::vector<nn::TransformerBlock> blocks;
  nn::Norm ln_f;
};

}  // namespace kiln
