// LoRA adapters on a mixture-of-experts layer's grouped expert projections (nn/moe.h):
// every expert e of a projection with weight [E, O, I] gains its own low-rank update, the
// update of nn/lora.h per expert, as Hugging Face PEFT adapts each expert's own module
// (Mixtral's experts.<e>.w1, w3, w2):
//   the rows x of expert e:  y[:, cols] += scale * (x A_e^T) B_e^T,
//   A [E, r, I] (each A_e Kaiming-uniform, bound 1 / sqrt(I)), B [E, rows, r] (zero),
// on the whole output or on one piece of a fused one (the gate or up rows of gate_up).
// Computed on the permuted rows grouped by expert, with the layer's own offsets
// (Backend::grouped_linear_forward/backward: two thin grouped GEMMs out, four back; x A^T
// recomputed in backward rather than saved), so it runs wherever the experts run: the
// single process, under tensor parallelism, in an expert-parallel chunk, in decoding.
//
// Cuts (slice()): those of the projection's weight. The ep cut of dimension 0 splits A and
// B by expert alike. A tp cut of the output (gate_up, column-parallel) splits B's rows as
// the weight's rows (A whole, its gradient a partial sum over tp); a tp cut of the input
// (down, row-parallel) splits A's columns (B whole, its gradient partial), as a Linear's
// adapters (nn/linear.h). No dropout: the LoRA plan refuses train.lora.dropout on experts.
#pragma once

#include "backend/backend.h"
#include "nn/linear.h"
#include "nn/lora.h"
#include "nn/param.h"

#include <string>
#include <vector>

namespace kiln::nn {

class ExpertLora {
 public:
  /// The adapters of projection `name` ("<prefix>.experts.gate_up_proj"), weight [E, O, I],
  /// whose output rows are `pieces` (summing to O; empty: one piece).
  ExpertLora(std::string name, int64_t E, int64_t O, int64_t I, std::vector<LinearPiece> pieces);

  /// Adds an adapter on piece `piece` (-1: the whole output), named <name>.<piece name> (or
  /// <name>), with parameters <unit>.lora_A.weight [E, r, I] and <unit>.lora_B.weight [E,
  /// rows, r], cut as the weight was at the last slice() (whole before any). Throws
  /// kiln::Error naming the adapter as Linear::add_lora does.
  void add_lora(int piece, const LoraSpec& spec);
  /// Takes the cuts of the projection's weight (after a tp or ep cut of it) for every
  /// adapter, those added later included.
  void slice(const ParamSlice& weight);

  /// out [R, local O] += each adapter's scaled output on its columns, from inp [R, local I],
  /// the rows of each expert [offsets[e], offsets[e+1]) (offsets int32 [local E + 1]). With
  /// `ragged` the rows past offsets[E] (dropped slots) are not computed and add zero.
  void forward(Backend& be, Stream s, const Tensor& out, const Tensor& inp,
               const Tensor& offsets, bool ragged) const;
  /// The adapters' gradients (+=, the trainable ones) from dout [R, local O] and forward's
  /// inp; their input gradient added into dinp [R, local I] (skipped when empty).
  void backward(Backend& be, Stream s, const Tensor& dinp, const Tensor& dout,
                const Tensor& inp, const Tensor& offsets, bool ragged) const;
  /// Each adapter's A and B.
  void collect(std::vector<Param*>& out);

  /// The projection's name (its weight's without ".weight").
  const std::string& name() const { return name_; }
  const std::vector<LinearPiece>& pieces() const { return pieces_; }
  int64_t experts() const { return E_; }
  const std::vector<LoraAdapter>& lora() const { return lora_; }
  std::vector<LoraAdapter>& lora() { return lora_; }
  bool empty() const { return lora_.empty(); }

 private:
  /// Adapter `a`'s columns of this rank's output: [first, first + width).
  std::pair<int64_t, int64_t> columns(const LoraAdapter& a) const;
  /// Sets `a`'s cuts from the weight's.
  void slice_adapter(LoraAdapter& a) const;
  /// The weight's tp cut of its output rows (gate_up, column-parallel): its parts, else 1.
  int output_parts() const { return weight_.tp_sharded() && weight_.dim == 1 ? weight_.parts : 1; }

  std::string name_;
  int64_t E_, O_, I_;
  std::vector<LinearPiece> pieces_;
  ParamSlice weight_;  // the weight's cuts (slice())
  std::vector<LoraAdapter> lora_;
};

}  // namespace kiln::nn
