// Token and (optionally) learned-position embeddings (GPT-2: Radford et al. 2019):
//   out[b, t, :] = wte[tokens[b, t], :] + wpe[pos[b, t], :]
// with pos the batch's positions (or 0..T-1, shifted by first_position as KV-cache
// decoding does). Without a position table (max_positions 0: rotary models) out is the
// token row alone. The backend fuses the look-ups into one op.
#pragma once

#include "backend/backend.h"
#include "nn/param.h"

#include <vector>

namespace kiln::nn {

class TokenPositionEmbedding {
 public:
  /// <token_name> [Vp, C], N(0, init_std^2) with rows >= vocab zero (padding);
  /// <position_name> [max_positions, C], N(0, init_std^2), none when max_positions is 0.
  /// Both decay (2-D).
  TokenPositionEmbedding(const std::string& token_name, const std::string& position_name,
                         int64_t vocab, int64_t padded_vocab, int64_t max_positions, int64_t C,
                         float init_std);

  /// out [B,T,C] from tokens int32 [B,T] at `positions` int32 [B,T] or, when empty,
  /// first_position .. first_position+T-1.
  void forward(Backend& be, Stream s, const Tensor& out, const Tensor& tokens,
               const Tensor& positions = Tensor(), int64_t first_position = 0) const;
  /// dwte[tokens[b,t]] += dout[b,t]; dwpe[pos[b,t]] += dout[b,t] (positions as forward's,
  /// from 0).
  void backward(Backend& be, Stream s, const Tensor& dout, const Tensor& tokens,
                const Tensor& positions = Tensor()) const;
  bool learned_positions() const { return wpe.shape.ndim() > 0; }
  void collect(std::vector<Param*>& out);

  Param wte, wpe;
};

}  // namespace kiln::nn
