// Tensor parallelism as the layers see it: Megatron-LM's split of a layer over the ranks
// of a tp group (Shoeybi et al. 2019, section 3) and sequence parallelism for the
// activations between the split regions (Korthikanti et al. 2022, section 4.2.2).
//
// A sharded layer talks to the other ranks only through the four operations of TpComm,
// which come in conjugate pairs: the backward of each is the forward of its conjugate.
//
//   op                 forward                               backward (= conjugate's fwd)
//   CopyToTp           identity                              all_reduce over tp
//   ReduceFromTp       all_reduce over tp                    identity
//   GatherFromSp       all_gather rows [N/tp,C] -> [N,C]     reduce_scatter rows
//   ReduceScatterToSp  reduce_scatter rows [N,C] -> [N/tp,C] all_gather rows
//
// Rows are those of the flattened [B*T, C] activations; tp rank r holds rows
// [r N/tp, (r+1) N/tp). The group is an interface (TpGroup): src/parallel implements it
// over a Communicator and the sharding plan installs it on the layers, so the layer
// library includes no communication header.
#pragma once

#include "backend/backend.h"
#include "core/tensor.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kiln::nn {

/// The collectives of one tensor-parallel group, on buffers of the layers' backend. Every
/// rank of the group calls the same operations in the same order.
class TpGroup {
 public:
  virtual ~TpGroup() = default;
  virtual int size() const = 0;
  virtual int rank() const = 0;
  /// t <- sum over the group's ranks of t, in place (fp32, bf16, fp16).
  virtual void all_reduce_sum(Stream s, const Tensor& t) = 0;
  /// out [size() * n ...] <- every rank's in [n ...], rank r's at rows [r n, (r+1) n).
  virtual void all_gather_rows(Stream s, const Tensor& out, const Tensor& in) = 0;
  /// out [n ...] <- rows [rank() n, (rank()+1) n) of the sum over ranks of in [size() * n ...].
  virtual void reduce_scatter_rows(Stream s, const Tensor& out, const Tensor& in) = 0;
};

enum class TpComm : uint8_t { CopyToTp, ReduceFromTp, GatherFromSp, ReduceScatterToSp };
/// "copy_to_tp", "reduce_from_tp", "gather_from_sp", "reduce_scatter_to_sp".
const char* tp_comm_name(TpComm c);
/// CopyToTp <-> ReduceFromTp, GatherFromSp <-> ReduceScatterToSp.
TpComm conjugate(TpComm c);

/// out <- c(in) (the table above). CopyToTp and ReduceFromTp: out and in of one shape, out
/// may alias in. GatherFromSp: in [n, ...], out [tp n, ...]. ReduceScatterToSp: in
/// [tp n, ...], out [n, ...]. Throws kiln::Error naming the op on other shapes.
void tp_forward(TpComm c, TpGroup& g, Backend& be, Stream s, const Tensor& out, const Tensor& in);
/// din <- backward of c at dout, which is tp_forward(conjugate(c), .., din, dout).
void tp_backward(TpComm c, TpGroup& g, Backend& be, Stream s, const Tensor& din,
                 const Tensor& dout);

/// How the plan splits a layer over tp (torchtitan's ParallelStyle; Megatron's layers):
///   Replicated  every rank holds and computes the whole layer.
///   Column      a Linear's output features split (ColumnParallelLinear): weight rows
///               (and bias) sharded, input replicated, output [N, out/tp].
///   Row         a Linear's input features split (RowParallelLinear): weight columns
///               sharded, input [N, in/tp], output partial sums reduced over tp; the
///               bias is replicated and added once, after the reduction.
///   Vocab       an embedding's (or tied head's) vocabulary rows split.
///   Sequence    a norm on the residual stream between the split regions: under sequence
///               parallelism each rank normalises its rows [N/tp, C] and the gain and
///               shift gradients are partial sums over tp; without it, replicated.
/// A model family states the style of each of its layer roles in a table
/// (models/layer_plan.h TensorParallelTable); src/parallel (parallel/tp_plan.h) makes the
/// placements from it and hands them to the layers' shard(), which run the style they are
/// given (or refuse it with a kiln::Error) and choose none themselves.
enum class TpStyle : uint8_t { Replicated, Column, Row, Vocab, Sequence };
/// "replicated", "column", "row", "vocab", "sequence".
const char* tp_style_name(TpStyle s);

/// A layer's placement: its style, the group (not owned; outlives the layer's use) and
/// whether the activations outside the split regions are sequence parallel (rows split).
/// Inactive (the layer whole on every rank) when replicated or without a group of more
/// than one rank.
struct TpPlacement {
  TpStyle style = TpStyle::Replicated;
  TpGroup* group = nullptr;
  bool sequence_parallel = false;
  bool active() const { return group != nullptr && group->size() > 1 && style != TpStyle::Replicated; }
};

/// Whether a layer's pair of Linears, `first` then `second` (attention's qkv and proj, an
/// MLP's fc and proj), is split as Megatron-LM splits it, Column then Row, over a group of
/// more than one rank; false when both are Replicated or the group has one rank. Throws
/// kiln::Error naming `layer` for any other pair of styles.
bool column_row_split(const TpPlacement& first, const TpPlacement& second,
                      const std::string& layer);

/// The dropout spec of this rank's rows of a sequence-parallel activation of `local_numel`
/// elements per rank (rank r's rows start at global element r * local_numel), so that the
/// rows draw the single process's mask; `d` unchanged without sequence parallelism.
DropoutSpec rows_dropout(DropoutSpec d, const TpPlacement& placement, int64_t local_numel);

}  // namespace kiln::nn
