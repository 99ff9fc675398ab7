// Linear: y = x W^T + b, the layer of torch.nn.Linear (weight stored [out, in]), and its
// tensor-parallel styles (Megatron-LM's ColumnParallelLinear and RowParallelLinear,
// Shoeybi et al. 2019, section 3), installed by the sharding plan with shard().
//
// N is the row count of the flattened [B*T, .] activations; with sequence parallelism a
// rank holds rows [r N/tp, (r+1) N/tp) outside the split regions (nn/tensor_parallel.h).
//   style       inp                  out                   communication (fwd / bwd)
//   replicated  [N, in]              [N, out]              none
//   column      [N, in]              [N, out/tp]           copy_to_tp: - / all_reduce dinp
//     + SP      [N/tp, in]           [N, out/tp]           gather_from_sp: all_gather inp /
//                                                          reduce_scatter dinp
//   row         [N, in/tp]           [N, out]              reduce_from_tp: all_reduce out / -
//     + SP      [N, in/tp]           [N/tp, out]           reduce_scatter_to_sp: reduce_scatter
//                                                          out / all_gather dout
// A row-parallel bias is replicated and added once: tp rank 0 adds it before the
// reduction. Every gradient is complete on its rank (a row-parallel bias's is the column
// sum of the whole dout, the same on every rank).
//
// With set_fp8() (train.fp8) the layer's GEMMs run on fp8 operands (nn/fp8.h): each call
// first takes the amaxes of the tensors its GEMMs read, exactly as they reach the GEMM
// (a sequence-parallel input after its all_gather), reduced over the Fp8Linear's group.
//
// With add_lora() (train.lora, nn/lora.h) low-rank adapters add to the output: on the
// whole output, or on one piece of a fused output (Llama's q of qkv_proj). Each adapter
// reads the input exactly as the layer's GEMM does (a sequence-parallel input gathered) and
// adds into the output before any reduction, so it takes the layer's tensor-parallel
// style: column-parallel, A whole and B split like the output rows (A's gradient a
// partial sum over tp); row-parallel, A split like the input columns and B whole (B's
// gradient partial). The base weight is then usually frozen (its gradient skipped).
#pragma once

#include "backend/backend.h"
#include "nn/fp8.h"
#include "nn/lora.h"
#include "nn/param.h"
#include "nn/tensor_parallel.h"

#include <string>
#include <vector>

namespace kiln::nn {

/// A named piece of a fused Linear's output (consecutive rows of its weight): GPT-2's
/// c_attn and Llama's qkv_proj are q, k, v; a SwiGLU MLP's fc is gate, up.
struct LinearPiece {
  std::string name;
  int64_t rows = 0;
};

/// A new adapter's name, piece and rows on a layer named `host` whose output is `out` rows
/// in `pieces` (empty: one piece), on piece `piece` (-1: the whole output), beside the
/// layer's `existing` adapters; A and B are the caller's to make. Throws kiln::Error naming
/// the adapter when the piece is out of range, already adapted (or the whole output and
/// one of its pieces both), or when spec's rank is not positive.
LoraAdapter new_lora_adapter(const std::string& host, const std::vector<LinearPiece>& pieces,
                             int64_t out, int piece, const LoraSpec& spec,
                             const std::vector<LoraAdapter>& existing);

class Linear {
 public:
  /// `name` is the global prefix (e.g. transformer.h.0.attn.c_attn): parameters
  /// <name>.weight [out, in] (decays, initialised N(0, init_std^2)) and, with `bias`,
  /// <name>.bias [out] (zeros). `pieces` (rows summing to out; empty: one piece) name the
  /// parts of a fused output.
  Linear(const std::string& name, int64_t in, int64_t out, bool bias, float init_std,
         std::vector<LinearPiece> pieces = {});

  /// Splits the layer over placement.group (Column or Row; Replicated undoes nothing and
  /// is a no-op). Column splits each of the pieces over tp separately, so a rank holds
  /// its share of q, k and v. Call before the model lays out its parameters. Throws
  /// kiln::Error naming the parameter when a split dimension does not divide, or for a
  /// row-parallel Linear with pieces.
  void shard(const TpPlacement& placement);

  /// out = inp @ weight^T (+ bias), shapes per the table above. Any leading dims flatten.
  /// `work` [N, work_width()] is scratch for sequence parallelism (else unused).
  void forward(Backend& be, Stream s, const Tensor& out, const Tensor& inp,
               const Tensor& work = Tensor()) const;
  /// dinp = d/dinp (overwritten; skipped when empty); dweight += dout^T @ inp; dbias +=
  /// column sums of dout. inp is forward's; `work` as forward's.
  void backward(Backend& be, Stream s, const Tensor& dinp, const Tensor& dout,
                const Tensor& inp, const Tensor& work = Tensor()) const;
  /// weight, bias, then each adapter's A and B.
  void collect(std::vector<Param*>& out);
  /// Runs the layer's GEMMs in fp8 with `fp8.amax` as their amax buffer (nn/fp8.h).
  void set_fp8(const Fp8Linear& fp8) { fp8_ = fp8; }
  bool fp8() const { return static_cast<bool>(fp8_.amax); }

  /// Adds a LoRA adapter on piece `piece` (an index into pieces(); -1: the whole output),
  /// named <name>.<piece name> (or <name>); see nn/lora.h. Call before the model lays out
  /// its parameters (before or after shard()). Throws kiln::Error naming the adapter when
  /// the piece is out of range, already adapted (or the whole output and one of its
  /// pieces both), or when its rank is not positive.
  void add_lora(int piece, const LoraSpec& spec);
  const std::vector<LoraAdapter>& lora() const { return lora_; }
  std::vector<LoraAdapter>& lora() { return lora_; }
  /// The name of the layer (its weight's name without ".weight").
  std::string name() const;
  const std::vector<LinearPiece>& pieces() const { return pieces_; }

  int64_t in() const { return in_; }    // global sizes
  int64_t out() const { return out_; }
  int64_t local_in() const { return weight.local_shape()[1]; }
  int64_t local_out() const { return weight.local_shape()[0]; }
  /// Columns of the sequence-parallel scratch: in (column) or out (row), 0 without SP.
  int64_t work_width() const;
  bool has_bias() const { return has_bias_; }
  const TpPlacement& placement() const { return placement_; }
  Param weight, bias;

 private:
  /// linear_forward, or its fp8 form after taking the amaxes of inp and the weight.
  void gemm_forward(Backend& be, Stream s, const Tensor& out, const Tensor& inp,
                    const Tensor& b) const;
  /// fp8: the amaxes of inp, the weight and (when given) dout as the GEMMs read them:
  /// this call's, reduced over the group (tensorwise), or max-accumulated into the step's
  /// (delayed). A no-op without fp8.
  void take_amax(Backend& be, Stream s, const Tensor& inp, const Tensor& dout) const;
  /// linear_backward, or its fp8 form (after take_amax).
  void gemm_backward(Backend& be, Stream s, const Tensor& dinp, const Tensor& dw,
                     const Tensor& db, const Tensor& dout, const Tensor& inp) const;
  /// The adapters' outputs added into out [N, local out] (before any tp reduction) from
  /// the input as the GEMM read it, inp [N, local in].
  void lora_forward(Backend& be, Stream s, const Tensor& out, const Tensor& inp) const;
  /// The adapters' gradients (A, B) from dout [N, local out] and inp as forward's, and
  /// their input gradient added into dinp [N, local in] (skipped when empty).
  void lora_backward(Backend& be, Stream s, const Tensor& dinp, const Tensor& dout,
                     const Tensor& inp) const;
  /// Adapter `a`'s columns of this rank's output: [first, first + width).
  std::pair<int64_t, int64_t> lora_columns(const LoraAdapter& a) const;
  /// The adapter's input: x [N, in], or x through its dropout (a temporary) in training.
  Tensor lora_input(Backend& be, Stream s, const LoraAdapter& a, const Tensor& x) const;
  /// Whether an adapter has a gradient to compute.
  bool lora_trains() const;
  /// Sets the adapters' slices for the current placement.
  void slice_lora();

  int64_t in_, out_;
  bool has_bias_;
  std::vector<LinearPiece> pieces_;
  TpPlacement placement_;
  Fp8Linear fp8_;
  std::vector<LoraAdapter> lora_;
};

}  // namespace kiln::nn
