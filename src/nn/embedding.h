// Token and (optionally) learned-position embeddings (GPT-2: Radford et al. 2019):
//   out[b, t, :] = wte[tokens[b, t], :] + wpe[pos[b, t], :]
// with pos the batch's positions (or 0..T-1, shifted by first_position as KV-cache
// decoding does). Without a position table (max_positions 0: rotary models) out is the
// token row alone. The backend fuses the look-ups into one op.
//
// Vocab-parallel (Megatron-LM's VocabParallelEmbedding, installed by shard()): tp rank r
// holds wte rows [r Vp/tp, (r+1) Vp/tp); tokens held elsewhere read a zero row, tp rank 0
// adds the (replicated) position rows, and the partial sums are reduced over tp:
// reduce_from_tp (out [B,T,C] on every rank) or, with sequence parallelism,
// reduce_scatter_to_sp (out [B*T/tp, C], the rank's rows). Backward takes the matching
// dout, gathers it when sequence parallel, and accumulates the rank's own wte rows and
// the whole wpe gradient (the same on every rank).
#pragma once

#include "backend/backend.h"
#include "nn/param.h"
#include "nn/tensor_parallel.h"

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

  /// Splits wte's rows over placement.group (style Vocab). Throws kiln::Error naming wte
  /// when the padded vocabulary does not divide over tp.
  void shard(const TpPlacement& placement);
  /// out [B,T,C] from tokens int32 [B,T] at `positions` int32 [B,T] or, when empty,
  /// first_position .. first_position+T-1. Vocab-parallel: first_position must be 0 and
  /// `work` [B,T,C] is scratch under sequence parallelism (out is then [B*T/tp, C]).
  void forward(Backend& be, Stream s, const Tensor& out, const Tensor& tokens,
               const Tensor& positions = Tensor(), int64_t first_position = 0,
               const Tensor& work = Tensor()) const;
  /// dwte[tokens[b,t]] += dout[b,t]; dwpe[pos[b,t]] += dout[b,t] (positions as forward's,
  /// from 0). `work` as forward's.
  void backward(Backend& be, Stream s, const Tensor& dout, const Tensor& tokens,
                const Tensor& positions = Tensor(), const Tensor& work = Tensor()) const;
  bool learned_positions() const { return wpe.shape.ndim() > 0; }
  void collect(std::vector<Param*>& out);

  const TpPlacement& placement() const { return placement_; }
  Param wte, wpe;

 private:
  /// tokens as this vocab-parallel rank sees them (shard_ids), in a new int32 [B,T].
  Tensor local_tokens(Backend& be, Stream s, const Tensor& tokens) const;
  /// A frozen wte's stand-in gradient beside a trainable wpe's (dwpe): zeroed scratch.
  Tensor frozen_table_grad(Backend& be, Stream s, const Tensor& dwpe) const;
  TpPlacement placement_;
};

}  // namespace kiln::nn
