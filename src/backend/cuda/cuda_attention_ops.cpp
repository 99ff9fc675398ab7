// CudaBackend's attention ops: attention forward/backward, over whole sequences or over
// documents packed into them (varlen: the same kernels with a key window per row;
// attention.cu, which hands bf16 without dropout to attention_tc.cu), the KV-cache
// decode step (attention_decode.cu) and rotary position embedding (rope.cu). Arguments
// are validated by op_checks against the AttentionShape (grouped-query, causal or not).
#include "backend/cuda/attention.h"
#include "backend/cuda/attention_decode.h"
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

namespace {
[[noreturn]] void no_ring_ops(const char* op) {
  throw Error(fmt::format("{}: context parallelism (parallel.cp > 1) is not implemented on the "
                          "CUDA backend yet; run it on the CPU backend", op));
}
}  // namespace

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
  checks::documents(cu_seqlens, "attention_varlen_backward");
  const auto d = checks::attention_backward(dqkv, dout, qkv, out, lse, shape);
  const Elem e = elem(qkv, "attention_varlen_backward", {&out, &dout, &dqkv});
  on_device(cu_seqlens, "attention_varlen_backward");
  head_dim_ok(d.HD, "attention_varlen_backward");
  const AttnShape a = attn_shape(d, shape, cu_seqlens);
  Scratch scratch(*this, st(s), cuda::attention_backward_scratch_bytes(a));
  cuda::attention_backward(st(s), e, dqkv.raw(), dout.raw(), qkv.raw(), out.raw(),
                           lse.data<float>(), a, drop(dropout), scratch.ptr(), simt_attention_);
}

void CudaBackend::attention_tile_forward(Stream, const Tensor&, const Tensor&, const Tensor&,
                                         const Tensor&, const Tensor&, const AttentionShape&,
                                         const AttentionTile&) {
  no_ring_ops("attention_tile_forward");
}
void CudaBackend::attention_tile_backward(Stream, const Tensor&, const Tensor&, const Tensor&,
                                          const Tensor&, const Tensor&, const Tensor&,
                                          const Tensor&, const Tensor&, const AttentionShape&,
                                          const AttentionTile&) {
  no_ring_ops("attention_tile_backward");
}
void CudaBackend::copy_columns(Stream, const Tensor&, const Tensor&, int64_t, int64_t, int64_t) {
  no_ring_ops("copy_columns");
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
