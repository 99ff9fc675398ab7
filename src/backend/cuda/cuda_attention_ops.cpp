// CudaBackend's attention ops: attention forward/backward, over whole sequences or over
// documents packed into them (varlen: the same kernels with a key window per row;
// attention.cu, which hands bf16 without dropout to attention_tc.cu), the tiles of ring
// attention and its column copy (attention_tiles.cu, memory.cu), the KV-cache decode step
// (attention_decode.cu) and rotary position embedding (rope.cu). Arguments
// are validated by op_checks against the AttentionShape (grouped-query, causal or not).
#include "backend/cuda/attention.h"
#include "backend/cuda/attention_decode.h"
#include "backend/cuda/attention_tiles.h"
#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/nvtx.h"
#include "backend/cuda/rope.h"
#include "backend/op_checks.h"
#include "core/error.h"

#include <vector>

namespace kiln::cuda {

namespace {
// cu_seqlens: the documents (empty: none).
AttnShape attn_shape(const checks::AttentionDims& d, const AttentionShape& shape,
                     const Tensor& cu_seqlens = Tensor()) {
  AttnShape a{d.B, d.T, d.NH, d.NKV, d.HD, shape.causal};
  if (cu_seqlens) {
    a.cu_seqlens = cu_seqlens.data<int32_t>();
    a.cu_count = cu_seqlens.numel();
  }
  return a;
}
}  // namespace

void CudaBackend::attention_forward(Stream s, const Tensor& out, const Tensor& lse,
                                    const Tensor& qkv, const AttentionShape& shape,
                                    const DropoutSpec& dropout) {
  cuda::NvtxRange r("attention_forward");
  const auto d = checks::attention(out, lse, qkv, shape);
  const Elem e = elem(qkv, "attention", {&out});
  head_dim_ok(d.HD, "attention");
  cuda::attention_forward(st(s), e, out.raw(), lse.data<float>(), qkv.raw(), attn_shape(d, shape),
                          drop(dropout), nullptr, simt_attention_);
}

void CudaBackend::attention_backward(Stream s, const Tensor& dqkv, const Tensor& dout,
                                     const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                     const AttentionShape& shape, const DropoutSpec& dropout) {
  cuda::NvtxRange r("attention_backward");
  const auto d = checks::attention_backward(dqkv, dout, qkv, out, lse, shape);
  const Elem e = elem(qkv, "attention_backward", {&out, &dout, &dqkv});
  head_dim_ok(d.HD, "attention_backward");
  const AttnShape a = attn_shape(d, shape);
  Scratch scratch(*this, st(s), cuda::attention_backward_scratch_bytes(a));
  cuda::attention_backward(st(s), e, dqkv.raw(), dout.raw(), qkv.raw(), out.raw(),
                           lse.data<float>(), a, drop(dropout), scratch.ptr(), simt_attention_);
}

void CudaBackend::attention_decode(Stream s, const Tensor& out, const Tensor& k_cache,
                                   const Tensor& v_cache, const Tensor& qkv, int64_t past,
                                   const AttentionShape& shape) {
  cuda::NvtxRange r("attention_decode");
  const auto d = checks::attention_decode(out, k_cache, v_cache, qkv, past, shape);
  const Elem e = elem(qkv, "attention_decode", {&out, &k_cache, &v_cache});
  cuda::attention_decode(st(s), e, out.raw(), k_cache.raw(), v_cache.raw(), qkv.raw(), d.B, d.T,
                         d.Tmax, d.NH, d.NKV, d.HD, past);
}

// cu_seqlens stays on the device: the kernels turn it into one key window per row in
// scratch (attention.cu), so a bad cu_seqlens is not diagnosed (the interface leaves it
// undefined; the CPU backend throws).
void CudaBackend::attention_varlen_forward(Stream s, const Tensor& out, const Tensor& lse,
                                           const Tensor& qkv, const Tensor& cu_seqlens,
                                           const AttentionShape& shape,
                                           const DropoutSpec& dropout) {
  cuda::NvtxRange r("attention_varlen_forward");
  const auto d = checks::attention_varlen(out, lse, qkv, cu_seqlens, shape);
  const Elem e = elem(qkv, "attention_varlen_forward", {&out});
  on_device(cu_seqlens, "attention_varlen_forward");
  head_dim_ok(d.HD, "attention_varlen_forward");
  const AttnShape a = attn_shape(d, shape, cu_seqlens);
  Scratch scratch(*this, st(s), cuda::attention_forward_scratch_bytes(a));
  cuda::attention_forward(st(s), e, out.raw(), lse.data<float>(), qkv.raw(), a, drop(dropout),
                          scratch.ptr(), simt_attention_);
}

void CudaBackend::attention_varlen_backward(Stream s, const Tensor& dqkv, const Tensor& dout,
                                            const Tensor& qkv, const Tensor& out,
                                            const Tensor& lse, const Tensor& cu_seqlens,
                                            const AttentionShape& shape,
                                            const DropoutSpec& dropout) {
  cuda::NvtxRange r("attention_varlen_backward");
  const auto d = checks::attention_varlen_backward(dqkv, dout, qkv, out, lse, cu_seqlens, shape);
  const Elem e = elem(qkv, "attention_varlen_backward", {&out, &dout, &dqkv});
  on_device(cu_seqlens, "attention_varlen_backward");
  head_dim_ok(d.HD, "attention_varlen_backward");
  const AttnShape a = attn_shape(d, shape, cu_seqlens);
  Scratch scratch(*this, st(s), cuda::attention_backward_scratch_bytes(a));
  cuda::attention_backward(st(s), e, dqkv.raw(), dout.raw(), qkv.raw(), out.raw(),
                           lse.data<float>(), a, drop(dropout), scratch.ptr(), simt_attention_);
}

namespace {
// The tile op's TileShape (cu_seqlens: the documents, empty: none).
TileShape tile_shape(const checks::TileDims& d, const AttentionTile& t, const Tensor& cu_seqlens) {
  TileShape ts{d.a.B,     d.a.T,     d.Tk,      d.a.NH,    d.a.NKV,  d.a.HD,
               t.q_begin, t.q_len,   t.k_begin, t.k_len,   t.causal};
  if (cu_seqlens) {
    ts.cu_seqlens = cu_seqlens.data<int32_t>();
    ts.cu_count = cu_seqlens.numel();
    ts.seq_len = t.seq_len;
    ts.q_pos = t.q_pos;
    ts.k_pos = t.k_pos;
  }
  return ts;
}
}  // namespace

// Ring attention's tiles (attention_tiles.cu). As for the varlen ops, cu_seqlens is read
// on the device only (each query's document window by a binary search), so a bad one is
// not diagnosed. No scratch: D_i = dO_i . O_i is recomputed where it is used.
void CudaBackend::attention_tile_forward(Stream s, const Tensor& out_acc, const Tensor& lse,
                                         const Tensor& qkv, const Tensor& kv,
                                         const Tensor& cu_seqlens, const AttentionShape& shape,
                                         const AttentionTile& tile) {
  cuda::NvtxRange r("attention_tile_forward");
  const auto d = checks::attention_tile(out_acc, lse, qkv, kv, cu_seqlens, shape, tile);
  const Elem e = elem(qkv, "attention_tile_forward", {&kv});
  on_device_all({&out_acc, &lse, &kv, &cu_seqlens}, "attention_tile_forward");
  head_dim_ok(d.a.HD, "attention_tile_forward");
  cuda::attention_tile_forward(st(s), e, out_acc.data<float>(), lse.data<float>(), qkv.raw(),
                               kv.raw(), tile_shape(d, tile, cu_seqlens));
}

void CudaBackend::attention_tile_backward(Stream s, const Tensor& dq, const Tensor& dkv,
                                          const Tensor& dout, const Tensor& qkv, const Tensor& kv,
                                          const Tensor& out, const Tensor& lse,
                                          const Tensor& cu_seqlens, const AttentionShape& shape,
                                          const AttentionTile& tile) {
  cuda::NvtxRange r("attention_tile_backward");
  const auto d = checks::attention_tile_backward(dq, dkv, dout, qkv, kv, out, lse, cu_seqlens,
                                                 shape, tile);
  const Elem e = elem(qkv, "attention_tile_backward", {&kv, &dout, &out});
  on_device_all({&dq, &dkv, &dout, &kv, &out, &lse, &cu_seqlens}, "attention_tile_backward");
  head_dim_ok(d.a.HD, "attention_tile_backward");
  cuda::attention_tile_backward(st(s), e, dq.data<float>(), dkv.data<float>(), dout.raw(),
                                qkv.raw(), kv.raw(), out.raw(), lse.data<float>(),
                                tile_shape(d, tile, cu_seqlens));
}

// Any pair of float dtypes (fp16 too, as copy()): memory.cu's convert_columns.
void CudaBackend::copy_columns(Stream s, const Tensor& dst, const Tensor& src, int64_t dst_col,
                               int64_t src_col, int64_t ncols) {
  cuda::NvtxRange r("copy_columns");
  const auto d = checks::copy_columns(dst, src, dst_col, src_col, ncols);
  on_device(dst, "copy_columns");
  on_device(src, "copy_columns");
  cuda::convert_columns(st(s), dst.raw(), float_kind(dst, "copy_columns"), d.Wd, dst_col,
                        src.raw(), float_kind(src, "copy_columns"), d.Ws, src_col, d.N, ncols);
}

void CudaBackend::rope_forward(Stream s, const Tensor& qkv, const Tensor& positions,
                               const AttentionShape& shape, const RopeSpec& rope) {
  cuda::NvtxRange r("rope_forward");
  rope_apply(qkv, positions, shape, rope, s, 1.f, "rope");
}

void CudaBackend::rope_backward(Stream s, const Tensor& dqkv, const Tensor& positions,
                                const AttentionShape& shape, const RopeSpec& rope) {
  cuda::NvtxRange r("rope_backward");
  rope_apply(dqkv, positions, shape, rope, s, -1.f, "rope_backward");
}

// The inverse frequencies are computed on the host (rope_inv_freq, as every backend) and
// passed to the kernel by value.
void CudaBackend::rope_apply(const Tensor& qkv, const Tensor& positions,
                             const AttentionShape& shape, const RopeSpec& rope, Stream s,
                             float sign, const char* op) {
  const auto d = checks::rope(qkv, positions, shape);
  const Elem e = elem(qkv, op);
  if (positions) on_device(positions, op);
  KILN_CHECK(d.HD / 2 <= cuda::kRopeMaxHalf,
             "{}: the cuda backend supports head sizes up to {}, got {}", op,
             2 * cuda::kRopeMaxHalf, d.HD);
  const std::vector<float> inv_freq = rope_inv_freq(rope, d.HD);
  cuda::RopeFreqs f{};
  for (size_t i = 0; i < inv_freq.size(); ++i) f.inv_freq[i] = inv_freq[i];
  cuda::rope(st(s), e, qkv.raw(), positions ? positions.data<int32_t>() : nullptr, f, d.B, d.T,
             d.NH, d.NKV, d.HD, sign);
}

}  // namespace kiln::cuda
