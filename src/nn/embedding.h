// Token and learned-position embeddings (GPT-2: Radford et al. 2019):
//   out[b, t, :] = wte[tokens[b, t], :] + wpe[t, :].
// The backend fuses the two look-ups into one op; positions are 0..T-1 (the row offset
// of `wpe` passed in shifts them, as KV-cache decoding does).
#pragma once

#include "backend/backend.h"
#include "nn/param.h"

#include <vector>

namespace kiln::nn {

class TokenPositionEmbedding {
 public:
  /// <token_name> [Vp, C], N(0, init_std^2) with rows >= vocab zero (padding);
  /// <position_name> [max_positions, C], N(0, init_std^2). Both decay (2-D).
  TokenPositionEmbedding(const std::string& token_name, const std::string& position_name,
                         int64_t vocab, int64_t padded_vocab, int64_t max_positions, int64_t C,
                         float init_std);

  /// out [B,T,C] from tokens int32 [B,T] at positions first_position .. first_position+T-1.
  void forward(Backend& be, Stream s, const Tensor& out, const Tensor& tokens,
               int64_t first_position = 0) const;
  /// dwte[tokens[b,t]] += dout[b,t]; dwpe[t] += sum_b dout[b,t] (positions from 0).
  void backward(Backend& be, Stream s, const Tensor& dout, const Tensor& tokens) const;
  void collect(std::vector<Param*>& out);

  Param wte, wpe;
};

}  // namespace kiln::nn
