// CpuBackend: validates each call (op_checks), then runs the kernel of kernels.h for the
// tensors' storage types (fp32, bf16, fp16 activations/parameters; fp32 or the same low
// precision for parameter gradients).
#include "backend/cpu/cpu_backend.h"

#include "backend/cpu/gemm.h"
#include "backend/cpu/kernels.h"
#include "backend/op_checks.h"

#include <cmath>
#include <cstring>
#include <utility>

namespace kiln {

namespace {

template <class T>
T* p(const Tensor& t) {
  if (!t) return nullptr;
  KILN_CHECK(t.dtype() == cpu::dtype_of<T>(), "tensor {} used as {}", t.str(),
             dtype_name(cpu::dtype_of<T>()));
  return static_cast<T*>(t.raw());
}

// Calls f(T{}, G{}) for activations of `act` and gradients of `grad` (fp32 or == act).
template <class F>
void dispatch_tg(DType act, DType grad, const char* op, F&& f) {
  cpu::dispatch_float(act, op, [&](auto t) {
    using T = decltype(t);
    if (grad == DType::F32) return f(t, float{});
    KILN_CHECK(grad == act, "{}: gradients in {} with activations in {} are not supported", op,
               dtype_name(grad), dtype_name(act));
    return f(t, T{});
  });
}

class CpuBackend final : public Backend {
 public:
  CpuBackend() : gemm_(alloc_) {}

  std::string name() const override { return "cpu"; }
  Device device() const override { return Device::cpu(); }
  Allocator& allocator() override { return alloc_; }
  Stream default_stream() override { return {}; }
  void synchronize(Stream) override {}
  std::string gemm_path(DType dtype) const override { return cpu::Gemm::path_description(dtype); }

  void copy_from_host(Stream, const Tensor& dst, const void* src) override {
    if (dst.nbytes()) std::memcpy(dst.raw(), src, dst.nbytes());
  }
  void copy_to_host(Stream, void* dst, const Tensor& src) override {
    if (src.nbytes()) std::memcpy(dst, src.raw(), src.nbytes());
  }
  void copy(Stream, const Tensor& dst, const Tensor& src) override {
    KILN_CHECK(dst.numel() == src.numel(), "copy: {} and {} differ in size", dst.str(), src.str());
    if (dst.dtype() == src.dtype()) {
      if (dst.raw() != src.raw() && src.nbytes()) std::memcpy(dst.raw(), src.raw(), src.nbytes());
      return;
    }
    if (is_fp8(dst.dtype()) || is_fp8(src.dtype())) {  // storage only: core's conversions
      return convert(src.raw(), src.dtype(), dst.raw(), dst.dtype(), static_cast<size_t>(src.numel()));
    }
    cpu::dispatch_float(dst.dtype(), "copy", [&](auto d) {
      using D = decltype(d);
      cpu::dispatch_float(src.dtype(), "copy", [&](auto s) {
        using S = decltype(s);
        cpu::convert(p<D>(dst), p<S>(src), dst.numel());
      });
    });
  }
  void copy_stochastic_round(Stream, const Tensor& dst, const Tensor& src, uint64_t seed,
                             uint64_t stream, const GlobalIndices& at) override {
    KILN_CHECK(dst.numel() == src.numel() && dst.dtype() == DType::BF16 &&
                   src.dtype() == DType::F32,
               "copy_stochastic_round: {} <- {} (bf16 <- fp32 of one size)", dst.str(), src.str());
    cpu::stochastic_round_bf16(p<cpu::bf16>(dst), p<float>(src), src.numel(), seed, stream, at);
  }
  void fill(Stream, const Tensor& t, float value) override {
    if (t.dtype() == DType::I32) {
      std::fill_n(t.data<int32_t>(), t.numel(), static_cast<int32_t>(value));
      return;
    }
    if (t.dtype() == DType::F64) {
      std::fill_n(t.data<double>(), t.numel(), static_cast<double>(value));
      return;
    }
    cpu::dispatch_float(t.dtype(), "fill", [&](auto x) {
      using T = decltype(x);
      cpu::fill(p<T>(t), value, t.numel());
    });
  }
  void sum_squares(Stream, const Tensor& acc, const Tensor& x) override {
    checks::sum_squares(acc, x);
    acc.data<double>()[0] += cpu::dispatch_float(x.dtype(), "sum_squares", [&](auto e) {
      using T = decltype(e);
      return cpu::sum_squares(p<T>(x), x.numel());
    });
  }

  void embedding_forward(Stream, const Tensor& out, const Tensor& tokens, const Tensor& positions,
                         const Tensor& wte, const Tensor& wpe) override {
    const auto d = checks::embedding(out, tokens, positions, wte, wpe);
    cpu::dispatch_float(out.dtype(), "embedding", [&](auto x) {
      using T = decltype(x);
      cpu::embedding_forward(p<T>(out), tokens.data<int32_t>(), p<int32_t>(positions), p<T>(wte),
                             p<T>(wpe), d.B, d.T, d.C, d.Vp, d.maxT);
    });
  }
  void embedding_backward(Stream, const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                          const Tensor& tokens, const Tensor& positions) override {
    const auto d = checks::embedding(dout, tokens, positions, dwte, dwpe);
    dispatch_tg(dout.dtype(), dwte.dtype(), "embedding_backward", [&](auto t, auto g) {
      using T = decltype(t);
      using G = decltype(g);
      cpu::embedding_backward(p<G>(dwte), p<G>(dwpe), p<T>(dout), tokens.data<int32_t>(),
                              p<int32_t>(positions), d.B, d.T, d.C, d.Vp, d.maxT);
    });
  }

  void layernorm_forward(Stream, const Tensor& out, const Tensor& mean, const Tensor& rstd,
                         const Tensor& inp, const Tensor& weight, const Tensor& bias,
                         float eps) override {
    const auto d = checks::layernorm(out, mean, rstd, inp, weight, bias);
    cpu::dispatch_float(inp.dtype(), "layernorm", [&](auto x) {
      using T = decltype(x);
      cpu::layernorm_forward(p<T>(out), p<float>(mean), p<float>(rstd), p<T>(inp), p<T>(weight),
                             p<T>(bias), d.N, d.C, eps);
    });
  }
  void layernorm_backward(Stream, const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                          const Tensor& dout, const Tensor& inp, const Tensor& weight,
                          const Tensor& mean, const Tensor& rstd) override {
    const auto d =
        checks::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd);
    const DType gdt = dweight ? dweight.dtype() : (dbias ? dbias.dtype() : DType::F32);
    dispatch_tg(inp.dtype(), gdt, "layernorm_backward", [&](auto t, auto g) {
      using T = decltype(t);
      using G = decltype(g);
      cpu::layernorm_backward(p<T>(dinp), p<G>(dweight), p<G>(dbias), p<T>(dout), p<T>(inp),
                              p<T>(weight), p<float>(mean), p<float>(rstd), d.N, d.C);
    });
  }

  void rmsnorm_forward(Stream, const Tensor& out, const Tensor& rstd, const Tensor& inp,
                       const Tensor& weight, float eps) override {
    const auto d = checks::rmsnorm(out, rstd, inp, weight);
    cpu::dispatch_float(inp.dtype(), "rmsnorm", [&](auto x) {
      using T = decltype(x);
      cpu::rmsnorm_forward(p<T>(out), p<float>(rstd), p<T>(inp), p<T>(weight), d.N, d.C, eps);
    });
  }
  void rmsnorm_backward(Stream, const Tensor& dinp, const Tensor& dweight, const Tensor& dout,
                        const Tensor& inp, const Tensor& weight, const Tensor& rstd) override {
    const auto d = checks::rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd);
    dispatch_tg(inp.dtype(), dweight ? dweight.dtype() : DType::F32, "rmsnorm_backward",
                [&](auto t, auto g) {
                  using T = decltype(t);
                  using G = decltype(g);
                  cpu::rmsnorm_backward(p<T>(dinp), p<G>(dweight), p<T>(dout), p<T>(inp),
                                        p<T>(weight), p<float>(rstd), d.N, d.C);
                });
  }

  void linear_forward(Stream, const Tensor& out, const Tensor& inp, const Tensor& weight,
                      const Tensor& bias) override {
    const auto d = checks::linear(out, inp, weight, bias);
    cpu::dispatch_float(inp.dtype(), "linear", [&](auto x) {
      using T = decltype(x);
      cpu::linear_forward(gemm_, p<T>(out), p<T>(inp), p<T>(weight), p<T>(bias), d.N, d.IC,
                          d.OC);
    });
  }
  void linear_backward(Stream, const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                       const Tensor& dout, const Tensor& inp, const Tensor& weight) override {
    const auto d = checks::linear_backward(dinp, dweight, dbias, dout, inp, weight);
    const DType gdt = dweight ? dweight.dtype() : (dbias ? dbias.dtype() : DType::F32);
    dispatch_tg(inp.dtype(), gdt, "linear_backward", [&](auto t, auto g) {
      using T = decltype(t);
      using G = decltype(g);
      cpu::linear_backward(gemm_, p<T>(dinp), p<G>(dweight), p<G>(dbias), p<T>(dout), p<T>(inp),
                           p<T>(weight), d.N, d.IC, d.OC);
    });
  }

  void fp8_amax(Stream, const Tensor& amax, const Tensor& x) override {
    checks::fp8_amax(amax, x);
    cpu::dispatch_float(x.dtype(), "fp8_amax", [&](auto t) {
      using T = decltype(t);
      float& a = *amax.data<float>();
      const float m = cpu::amax(p<T>(x), x.numel());
      a = std::isnan(m) || std::isnan(a) ? m + a : std::max(a, m);
    });
  }
  void fp8_amax_history(Stream, const Tensor& amax, const Tensor& history,
                        const Tensor& step_amax, int64_t slot, bool most_recent) override {
    checks::fp8_amax_history(amax, history, step_amax, slot);
    cpu::fp8_amax_history(amax.data<float>(), history.data<float>(), step_amax.data<float>(),
                          history.size(0), history.size(1), history.size(2), slot, most_recent);
  }
  // The fp8 linear ops quantize their operands into scratch copies (cpu/fp8.cpp), then run
  // the linear's GEMMs on them: exact emulation of an fp8 GEMM.
  void fp8_linear_forward(Stream s, const Tensor& out, const Tensor& inp, const Tensor& weight,
                          const Tensor& bias, const Tensor& amax) override {
    checks::fp8_linear(out, inp, weight, bias, amax);
    const float* a = amax.data<float>();
    const Tensor qinp = quantized(inp, a[0], DType::E4M3);
    const Tensor qweight = quantized(weight, a[1], DType::E4M3);
    linear_forward(s, out, qinp, qweight, bias);
  }
  void fp8_linear_backward(Stream s, const Tensor& dinp, const Tensor& dweight,
                           const Tensor& dbias, const Tensor& dout, const Tensor& inp,
                           const Tensor& weight, const Tensor& amax) override {
    checks::fp8_linear_backward(dinp, dweight, dbias, dout, inp, weight, amax);
    const float* a = amax.data<float>();
    if (dbias) linear_backward(s, Tensor(), Tensor(), dbias, dout, inp, weight);
    if (!dinp && !dweight) return;
    const Tensor qdout = quantized(dout, a[2], DType::E5M2);
    const Tensor qinp = dweight ? quantized(inp, a[0], DType::E4M3) : inp;
    const Tensor qweight = dinp ? quantized(weight, a[1], DType::E4M3) : weight;
    linear_backward(s, dinp, dweight, Tensor(), qdout, qinp, qweight);
  }

  void attention_forward(Stream, const Tensor& out, const Tensor& lse, const Tensor& qkv,
                         const AttentionShape& shape, const DropoutSpec& dropout) override {
    const auto a = dims(checks::attention(out, lse, qkv, shape), shape);
    attention(out, lse, qkv, a, cpu::key_windows(a.B, a.T, a.T, a.causal, nullptr), dropout);
  }
  void attention_backward(Stream, const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                          const Tensor& out, const Tensor& lse, const AttentionShape& shape,
                          const DropoutSpec& dropout) override {
    const auto a = dims(checks::attention_backward(dqkv, dout, qkv, out, lse, shape), shape);
    attention_grad(dqkv, dout, qkv, out, lse, a,
                   cpu::key_windows(a.B, a.T, a.T, a.causal, nullptr), dropout);
  }
  void attention_varlen_forward(Stream, const Tensor& out, const Tensor& lse, const Tensor& qkv,
                                const Tensor& cu_seqlens, const AttentionShape& shape,
                                const DropoutSpec& dropout) override {
    const auto a = dims(checks::attention_varlen(out, lse, qkv, cu_seqlens, shape), shape);
    const auto docs = documents(cu_seqlens, a.B * a.T, a.T, 0, 0, "attention_varlen_forward");
    attention(out, lse, qkv, a, cpu::key_windows(a.B, a.T, a.T, a.causal, &docs), dropout);
  }
  void attention_varlen_backward(Stream, const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                                 const Tensor& out, const Tensor& lse, const Tensor& cu_seqlens,
                                 const AttentionShape& shape, const DropoutSpec& dropout) override {
    const auto a = dims(
        checks::attention_varlen_backward(dqkv, dout, qkv, out, lse, cu_seqlens, shape), shape);
    const auto docs = documents(cu_seqlens, a.B * a.T, a.T, 0, 0, "attention_varlen_backward");
    attention_grad(dqkv, dout, qkv, out, lse, a,
                   cpu::key_windows(a.B, a.T, a.T, a.causal, &docs), dropout);
  }
  void attention_tile_forward(Stream, const Tensor& out_acc, const Tensor& lse, const Tensor& qkv,
                              const Tensor& kv, const Tensor& cu_seqlens,
                              const AttentionShape& shape, const AttentionTile& tile) override {
    const auto d = checks::attention_tile(out_acc, lse, qkv, kv, cu_seqlens, shape, tile);
    const auto a = dims(d.a, shape);
    const cpu::KeyWindows w = tile_windows(a.B, tile, cu_seqlens, "attention_tile_forward");
    cpu::dispatch_float(qkv.dtype(), "attention_tile", [&](auto x) {
      using T = decltype(x);
      cpu::attention_tile_forward(p<float>(out_acc), p<float>(lse), p<T>(qkv), p<T>(kv), a, d.Tk,
                                  tile, w);
    });
  }
  void attention_tile_backward(Stream, const Tensor& dq, const Tensor& dkv, const Tensor& dout,
                               const Tensor& qkv, const Tensor& kv, const Tensor& out,
                               const Tensor& lse, const Tensor& cu_seqlens,
                               const AttentionShape& shape, const AttentionTile& tile) override {
    const auto d = checks::attention_tile_backward(dq, dkv, dout, qkv, kv, out, lse, cu_seqlens,
                                                   shape, tile);
    const auto a = dims(d.a, shape);
    const cpu::KeyWindows w = tile_windows(a.B, tile, cu_seqlens, "attention_tile_backward");
    cpu::dispatch_float(qkv.dtype(), "attention_tile_backward", [&](auto x) {
      using T = decltype(x);
      cpu::attention_tile_backward(p<float>(dq), p<float>(dkv), p<T>(dout), p<T>(qkv), p<T>(kv),
                                   p<T>(out), p<float>(lse), a, d.Tk, tile, w);
    });
  }
  void copy_columns(Stream, const Tensor& dst, const Tensor& src, int64_t dst_col, int64_t src_col,
                    int64_t ncols) override {
    const auto d = checks::copy_columns(dst, src, dst_col, src_col, ncols);
    cpu::dispatch_float(dst.dtype(), "copy_columns", [&](auto x) {
      using D = decltype(x);
      cpu::dispatch_float(src.dtype(), "copy_columns", [&](auto y) {
        using S = decltype(y);
        cpu::copy_columns(p<D>(dst) + dst_col, d.Wd, p<S>(src) + src_col, d.Ws, d.N, ncols);
      });
    });
  }
  void attention_decode(Stream, const Tensor& out, const Tensor& k_cache, const Tensor& v_cache,
                        const Tensor& qkv, int64_t past, const AttentionShape& shape) override {
    const auto d = checks::attention_decode(out, k_cache, v_cache, qkv, past, shape);
    const cpu::AttnDims a{d.B, d.T, d.NH, d.NKV, d.HD, true};
    cpu::dispatch_float(qkv.dtype(), "attention_decode", [&](auto x) {
      using T = decltype(x);
      cpu::attention_decode(p<T>(out), p<T>(k_cache), p<T>(v_cache), p<T>(qkv), a, d.Tmax, past);
    });
  }
  void rope_forward(Stream, const Tensor& qkv, const Tensor& positions,
                    const AttentionShape& shape, const RopeSpec& rope) override {
    rope_apply(qkv, positions, shape, rope, 1.f, "rope");
  }
  void rope_backward(Stream, const Tensor& dqkv, const Tensor& positions,
                     const AttentionShape& shape, const RopeSpec& rope) override {
    rope_apply(dqkv, positions, shape, rope, -1.f, "rope_backward");
  }

  void swiglu_forward(Stream, const Tensor& out, const Tensor& inp) override {
    const auto d = checks::swiglu(out, inp);
    cpu::dispatch_float(inp.dtype(), "swiglu", [&](auto x) {
      using T = decltype(x);
      cpu::swiglu_forward(p<T>(out), p<T>(inp), d.N, d.H);
    });
  }
  void swiglu_backward(Stream, const Tensor& dinp, const Tensor& dout,
                       const Tensor& inp) override {
    const auto d = checks::swiglu(dout, inp);
    checks::same_size(dinp, inp, "swiglu_backward dinp");
    cpu::dispatch_float(inp.dtype(), "swiglu_backward", [&](auto x) {
      using T = decltype(x);
      cpu::swiglu_backward(p<T>(dinp), p<T>(dout), p<T>(inp), d.N, d.H);
    });
  }

  void gelu_forward(Stream, const Tensor& out, const Tensor& inp) override {
    checks::same_size(out, inp, "gelu");
    cpu::dispatch_float(inp.dtype(), "gelu", [&](auto x) {
      using T = decltype(x);
      cpu::gelu_forward(p<T>(out), p<T>(inp), inp.numel());
    });
  }
  void gelu_backward(Stream, const Tensor& dinp, const Tensor& dout, const Tensor& inp) override {
    checks::same_size(dinp, inp, "gelu_backward");
    checks::same_size(dout, inp, "gelu_backward");
    cpu::dispatch_float(inp.dtype(), "gelu_backward", [&](auto x) {
      using T = decltype(x);
      cpu::gelu_backward(p<T>(dinp), p<T>(dout), p<T>(inp), inp.numel());
    });
  }
  void silu_forward(Stream, const Tensor& out, const Tensor& inp) override {
    checks::same_size(out, inp, "silu");
    cpu::dispatch_float(inp.dtype(), "silu", [&](auto x) {
      using T = decltype(x);
      cpu::silu_forward(p<T>(out), p<T>(inp), inp.numel());
    });
  }
  void silu_backward(Stream, const Tensor& dinp, const Tensor& dout, const Tensor& inp) override {
    checks::same_size(dinp, inp, "silu_backward");
    checks::same_size(dout, inp, "silu_backward");
    cpu::dispatch_float(inp.dtype(), "silu_backward", [&](auto x) {
      using T = decltype(x);
      cpu::silu_backward(p<T>(dinp), p<T>(dout), p<T>(inp), inp.numel());
    });
  }
  void modulate(Stream, const Tensor& out, const Tensor& x, const Tensor& mod, int scale_index,
                int shift_index, float scale_offset) override {
    const auto d = checks::modulate(out, x, mod, scale_index, shift_index);
    cpu::dispatch_float(x.dtype(), "modulate", [&](auto e) {
      using T = decltype(e);
      cpu::modulate(p<T>(out), p<T>(x), p<T>(mod), d.B, d.T, d.C, d.M, scale_index, shift_index,
                    scale_offset);
    });
  }
  void modulate_backward(Stream, const Tensor& dx, const Tensor& dmod, const Tensor& dout,
                         const Tensor& x, const Tensor& mod, int scale_index, int shift_index,
                         float scale_offset) override {
    const auto d = checks::modulate_backward(dx, dmod, dout, x, mod, scale_index, shift_index);
    cpu::dispatch_float(x.dtype(), "modulate_backward", [&](auto e) {
      using T = decltype(e);
      cpu::modulate_backward(p<T>(dx), p<T>(dmod), p<T>(dout), p<T>(x), p<T>(mod), d.B, d.T, d.C,
                             d.M, scale_index, shift_index, scale_offset);
    });
  }
  void add(Stream, const Tensor& out, const Tensor& a, const Tensor& b) override {
    checks::same_size(out, a, "add");
    checks::same_size(out, b, "add");
    cpu::dispatch_float(out.dtype(), "add", [&](auto x) {
      using T = decltype(x);
      cpu::add(p<T>(out), p<T>(a), p<T>(b), out.numel());
    });
  }
  void add_columns(Stream, const Tensor& out, const Tensor& src, int64_t out_col,
                   float alpha) override {
    const auto d = checks::add_columns(out, src, out_col);
    cpu::dispatch_float(out.dtype(), "add_columns", [&](auto x) {
      using T = decltype(x);
      cpu::add_columns(p<T>(out) + out_col, d.Wd, p<T>(src), d.Ws, d.N, alpha);
    });
  }
  void dropout_forward(Stream, const Tensor& out, const Tensor& inp,
                       const DropoutSpec& spec) override {
    checks::same_size(out, inp, "dropout");
    cpu::dispatch_float(inp.dtype(), "dropout", [&](auto x) {
      using T = decltype(x);
      cpu::dropout(p<T>(out), p<T>(inp), inp.numel(), spec);
    });
  }
  void dropout_backward(Stream, const Tensor& dinp, const Tensor& dout,
                        const DropoutSpec& spec) override {
    checks::same_size(dinp, dout, "dropout_backward");
    cpu::dispatch_float(dout.dtype(), "dropout_backward", [&](auto x) {
      using T = decltype(x);
      cpu::dropout(p<T>(dinp), p<T>(dout), dout.numel(), spec);
    });
  }

  void softmax_cross_entropy(Stream, const Tensor& losses, const Tensor& dlogits,
                             const Tensor& logits, const Tensor& targets, int vocab_size,
                             int ignore_index, float grad_scale) override {
    const auto d = checks::cross_entropy(losses, dlogits, logits, targets, vocab_size);
    cpu::dispatch_float(logits.dtype(), "softmax_cross_entropy", [&](auto x) {
      using T = decltype(x);
      cpu::softmax_cross_entropy(p<float>(losses), p<T>(dlogits), p<T>(logits),
                                 targets.data<int32_t>(), d.N, d.Vp, vocab_size, ignore_index,
                                 grad_scale);
    });
  }

  void cross_entropy_shard_stats(Stream, const Tensor& stats, const Tensor& logits,
                                 const Tensor& targets, int64_t vocab_begin, int valid) override {
    const auto d = checks::cross_entropy_shard(stats, Tensor(), logits, targets, Tensor(),
                                               vocab_begin, valid);
    cpu::dispatch_float(logits.dtype(), "cross_entropy_shard_stats", [&](auto x) {
      using T = decltype(x);
      cpu::cross_entropy_shard_stats(p<float>(stats), p<T>(logits), targets.data<int32_t>(), d.N,
                                     d.Vp, vocab_begin, valid);
    });
  }
  void cross_entropy_shard_backward(Stream, const Tensor& dlogits, const Tensor& logits,
                                    const Tensor& targets, const Tensor& lse, int64_t vocab_begin,
                                    int valid, int ignore_index, float grad_scale) override {
    const auto d = checks::cross_entropy_shard(Tensor(), dlogits, logits, targets, lse,
                                               vocab_begin, valid);
    cpu::dispatch_float(logits.dtype(), "cross_entropy_shard_backward", [&](auto x) {
      using T = decltype(x);
      cpu::cross_entropy_shard_backward(p<T>(dlogits), p<T>(logits), targets.data<int32_t>(),
                                        p<float>(lse), d.N, d.Vp, vocab_begin, valid,
                                        ignore_index, grad_scale);
    });
  }
  void shard_ids(Stream, const Tensor& out, const Tensor& ids, int64_t begin,
                 int64_t count) override {
    checks::shard_ids(out, ids, begin, count);
    cpu::shard_ids(out.data<int32_t>(), ids.data<int32_t>(), ids.numel(), begin, count);
  }

  void patchify(Stream, const Tensor& out, const Tensor& images, int patch) override {
    checks::patchify(out, images, patch);
    cpu::dispatch_float(out.dtype(), "patchify", [&](auto x) {
      using T = decltype(x);
      cpu::patchify(p<T>(out), images.data<float>(), images.size(0), images.size(1),
                    images.size(2), images.size(3), patch, out.size(1));
    });
  }

  void unpatchify(Stream, const Tensor& images, const Tensor& patches, int patch) override {
    checks::unpatchify(images, patches, patch);
    cpu::dispatch_float(patches.dtype(), "unpatchify", [&](auto x) {
      using T = decltype(x);
      cpu::unpatchify(images.data<float>(), p<T>(patches), images.size(0), images.size(1),
                      images.size(2), images.size(3), patch, patches.size(1));
    });
  }

  void rectified_flow_inputs(Stream, const Tensor& xt, const Tensor& target, const Tensor& images,
                             const Tensor& noise, const Tensor& t) override {
    const auto d = checks::rectified_flow_inputs(xt, target, images, noise, t);
    cpu::rectified_flow_inputs(xt.data<float>(), target.data<float>(), images.data<float>(),
                               noise.data<float>(), t.data<float>(), d.B, d.n);
  }
  void mse_loss(Stream, const Tensor& losses, const Tensor& dpred, const Tensor& pred,
                const Tensor& target, float grad_scale) override {
    const auto d = checks::mse_loss(losses, dpred, pred, target);
    cpu::dispatch_float(pred.dtype(), "mse_loss", [&](auto x) {
      using T = decltype(x);
      cpu::mse_loss(losses.data<float>(), p<T>(dpred), p<T>(pred), target.data<float>(), d.B, d.n,
                    grad_scale);
    });
  }

  void accumulate_loss(Stream, const Tensor& acc, const Tensor& losses,
                       const Tensor& targets) override {
    const int64_t n = checks::accumulate_loss(acc, losses, targets);
    cpu::accumulate_loss(acc.data<double>(), losses.data<float>(), targets.data<int32_t>(), n);
  }
  void cross_entropy_shard_combine(Stream, const Tensor& lse, const Tensor& acc,
                                   const Tensor& stats, const Tensor& targets) override {
    const auto d = checks::cross_entropy_shard_combine(lse, acc, stats, targets);
    cpu::cross_entropy_shard_combine(lse.data<float>(), acc.data<double>(), stats.data<float>(),
                                     targets.data<int32_t>(), d.N, d.Vp);
  }
  void clip_coefficient(Stream, const Tensor& coef, const Tensor& sumsq, const Tensor& check,
                        double max_norm, float loss_scale) override {
    checks::clip_coefficient(coef, sumsq, check, loss_scale);
    coef.data<float>()[0] = cpu::clip_coefficient(sumsq.data<double>()[0],
                                                  check ? check.data<double>()[0] : 0.0,
                                                  max_norm, loss_scale);
  }
  void adamw_step(Stream, const Tensor& param, const Tensor& grad, const Tensor& m,
                  const Tensor& v, const Tensor& scale, const AdamWParams& hp) override {
    KILN_CHECK(grad.numel() == param.numel(), "adamw: grad {} vs param {}", grad.str(), param.str());
    checks::same_size(m, param, "adamw m");
    checks::same_size(v, param, "adamw v");
    checks::adamw_scale(scale);
    AdamWParams h = hp;
    if (scale) {
      const float c = scale.data<float>()[0];
      if (!std::isfinite(c)) return;  // a skipped update
      h.grad_scale = hp.grad_scale * c;
    }
    cpu::dispatch_float(grad.dtype(), "adamw", [&](auto x) {
      using G = decltype(x);
      cpu::adamw(p<float>(param), p<G>(grad), p<float>(m), p<float>(v), param.numel(), h);
    });
  }

  // One tensor after another (the CPU has no launches to save).
  void adamw_multi_step(Stream s, std::span<const AdamWTensor> tensors, const Tensor& scale,
                        const AdamWParams& hp) override {
    checks::adamw_multi(tensors, scale);
    if (scale && !std::isfinite(scale.data<float>()[0])) return;  // a skipped update
    for (const AdamWTensor& t : tensors) adamw_tensor_step(*this, s, t, scale, hp);
  }

  void ema_update(Stream, const Tensor& ema, const Tensor& param, float decay) override {
    checks::ema_update(ema, param, decay);
    cpu::dispatch_float(param.dtype(), "ema_update", [&](auto x) {
      using P = decltype(x);
      cpu::ema_update(p<float>(ema), p<P>(param), param.numel(), decay);
    });
  }

  void moe_router_forward(Stream, const Tensor& scores, const Tensor& expert_idx,
                          const Tensor& expert_weight, const Tensor& logits, const Tensor& bias,
                          const MoeRouterSpec& spec) override {
    const auto d = checks::moe_router(scores, expert_idx, expert_weight, logits, bias, spec);
    cpu::moe_router_forward(scores.data<float>(), expert_idx.data<int32_t>(),
                            expert_weight.data<float>(), logits.data<float>(), p<float>(bias),
                            d.N, d.E, spec);
  }
  void moe_router_backward(Stream, const Tensor& dlogits, const Tensor& dexpert_weight,
                           const Tensor& dscores, const Tensor& scores, const Tensor& expert_idx,
                           const MoeRouterSpec& spec) override {
    const auto d =
        checks::moe_router_backward(dlogits, dexpert_weight, dscores, scores, expert_idx, spec);
    cpu::moe_router_backward(dlogits.data<float>(), dexpert_weight.data<float>(),
                             p<float>(dscores), scores.data<float>(), expert_idx.data<int32_t>(),
                             d.N, d.E, spec);
  }
  void moe_balance_stats(Stream, const Tensor& load, const Tensor& prob, const Tensor& z,
                         const Tensor& logits, const Tensor& expert_idx, MoeScoring scoring,
                         float prob_scale, float z_scale) override {
    const auto d = checks::moe_balance_stats(load, prob, z, logits, expert_idx);
    cpu::moe_balance_stats(p<float>(load), p<float>(prob), p<float>(z), logits.data<float>(),
                           expert_idx.data<int32_t>(), d.N, d.E, d.k, scoring, prob_scale,
                           z_scale);
  }
  void moe_balance_backward(Stream, const Tensor& dlogits, const Tensor& logits,
                            const Tensor& load, MoeScoring scoring, float aux_scale,
                            float z_scale) override {
    const auto d = checks::moe_balance_backward(dlogits, logits, load);
    cpu::moe_balance_backward(dlogits.data<float>(), logits.data<float>(), p<float>(load), d.N,
                              d.E, scoring, aux_scale, z_scale);
  }
  void moe_permute_plan(Stream, const Tensor& offsets, const Tensor& rows,
                        const Tensor& expert_idx, int64_t capacity) override {
    const auto d = checks::moe_permute_plan(offsets, rows, expert_idx, capacity);
    cpu::moe_permute_plan(offsets.data<int32_t>(), rows.data<int32_t>(),
                          expert_idx.data<int32_t>(), d.N, d.k, d.E, capacity);
  }
  void moe_permute(Stream, const Tensor& out, const Tensor& inp, const Tensor& rows) override {
    const auto d = checks::moe_permute(inp, out, rows, "moe_permute");
    moe_rows("moe_permute", d, rows, inp.dtype(), [&](auto x) {
      using T = decltype(x);
      cpu::moe_scatter_rows(p<T>(out), p<T>(inp), nullptr, rows.data<int32_t>(), d.N, d.k, d.C);
    });
  }
  void moe_permute_backward(Stream, const Tensor& dinp, const Tensor& dout,
                            const Tensor& rows) override {
    const auto d = checks::moe_permute(dinp, dout, rows, "moe_permute_backward");
    moe_rows("moe_permute_backward", d, rows, dout.dtype(), [&](auto x) {
      using T = decltype(x);
      cpu::moe_gather_rows(p<T>(dinp), p<T>(dout), nullptr, rows.data<int32_t>(), d.N, d.k, d.C);
    });
  }
  void moe_unpermute(Stream, const Tensor& out, const Tensor& expert_out,
                     const Tensor& expert_weight, const Tensor& rows) override {
    const auto d = checks::moe_unpermute(out, expert_out, expert_weight, rows);
    moe_rows("moe_unpermute", d, rows, out.dtype(), [&](auto x) {
      using T = decltype(x);
      cpu::moe_gather_rows(p<T>(out), p<T>(expert_out), expert_weight.data<float>(),
                           rows.data<int32_t>(), d.N, d.k, d.C);
    });
  }
  void moe_unpermute_backward(Stream, const Tensor& dexpert_out, const Tensor& dexpert_weight,
                              const Tensor& dout, const Tensor& expert_out,
                              const Tensor& expert_weight, const Tensor& rows) override {
    const auto d = checks::moe_unpermute_backward(dexpert_out, dexpert_weight, dout, expert_out,
                                                  expert_weight, rows);
    moe_rows("moe_unpermute_backward", d, rows, dout.dtype(), [&](auto x) {
      using T = decltype(x);
      const int32_t* r = rows.data<int32_t>();
      if (dexpert_out)
        cpu::moe_scatter_rows(p<T>(dexpert_out), p<T>(dout), expert_weight.data<float>(), r, d.N,
                              d.k, d.C);
      if (dexpert_weight)
        cpu::moe_row_dots(dexpert_weight.data<float>(), p<T>(dout), p<T>(expert_out), r, d.N,
                          d.k, d.C);
    });
  }
  void grouped_linear_forward(Stream, const Tensor& out, const Tensor& inp, const Tensor& weight,
                              const Tensor& offsets) override {
    const auto d = checks::grouped_linear(out, inp, weight, offsets);
    cpu::dispatch_float(inp.dtype(), "grouped_linear_forward", [&](auto x) {
      using T = decltype(x);
      cpu::grouped_linear_forward(gemm_, p<T>(out), p<T>(inp), p<T>(weight),
                                  offsets.data<int32_t>(), d.M, d.I, d.O, d.E);
    });
  }
  void grouped_linear_backward(Stream, const Tensor& dinp, const Tensor& dweight,
                               const Tensor& dout, const Tensor& inp, const Tensor& weight,
                               const Tensor& offsets) override {
    const auto d = checks::grouped_linear_backward(dinp, dweight, dout, inp, weight, offsets);
    const DType gdt = dweight ? dweight.dtype() : DType::F32;
    dispatch_tg(inp.dtype(), gdt, "grouped_linear_backward", [&](auto t, auto g) {
      using T = decltype(t);
      using G = decltype(g);
      cpu::grouped_linear_backward(gemm_, p<T>(dinp), p<G>(dweight), p<T>(dout), p<T>(inp),
                                   p<T>(weight), offsets.data<int32_t>(), d.M, d.I, d.O, d.E);
    });
  }

 protected:
  bool runs(Op op, DType dtype) const override { return cpu_supports(op, dtype); }

 private:
  // The permutation ops' common part: rows checked to be a permutation, then f(T{}) for
  // the activations' dtype T.
  template <class F>
  static void moe_rows(const char* op, const checks::MoePermuteDims& d, const Tensor& rows,
                       DType dtype, F&& f) {
    cpu::check_moe_rows(rows.data<int32_t>(), d.N, d.k, op);
    cpu::dispatch_float(dtype, op, std::forward<F>(f));
  }
  // x quantized to `format` at amax's scale, in a scratch tensor of x's shape and dtype.
  Tensor quantized(const Tensor& x, float amax, DType format) {
    const Tensor q = empty(x.shape(), x.dtype(), MemCategory::Temporaries);
    cpu::dispatch_float(x.dtype(), "fp8 quantize", [&](auto t) {
      using T = decltype(t);
      cpu::fp8_quantize(p<T>(q), p<T>(x), x.numel(), amax, format);
    });
    return q;
  }
  // Attention over the keys of each query's window (attention_windows.h).
  static void attention(const Tensor& out, const Tensor& lse, const Tensor& qkv,
                        const cpu::AttnDims& a, const cpu::KeyWindows& w,
                        const DropoutSpec& dropout) {
    cpu::dispatch_float(qkv.dtype(), "attention", [&](auto x) {
      using T = decltype(x);
      cpu::attention_forward(p<T>(out), p<float>(lse), p<T>(qkv), a, w, dropout);
    });
  }
  static void attention_grad(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                             const Tensor& out, const Tensor& lse, const cpu::AttnDims& a,
                             const cpu::KeyWindows& w, const DropoutSpec& dropout) {
    cpu::dispatch_float(qkv.dtype(), "attention_backward", [&](auto x) {
      using T = decltype(x);
      cpu::attention_backward(p<T>(dqkv), p<T>(dout), p<T>(qkv), p<T>(out), p<float>(lse), a, w,
                              dropout);
    });
  }
  // cu_seqlens over `total` tokens in sequences of S, checked; rows at q_pos and k_pos.
  static cpu::DocumentRows documents(const Tensor& cu_seqlens, int64_t total, int64_t S,
                                     int64_t q_pos, int64_t k_pos, const char* op) {
    const cpu::DocumentRows docs{p<int32_t>(cu_seqlens), cu_seqlens.numel(), S, q_pos, k_pos};
    cpu::check_cu_seqlens(docs.cu, docs.count, total, op);
    return docs;
  }
  // A tile's windows: its causal diagonal, and with cu_seqlens its queries' documents.
  static cpu::KeyWindows tile_windows(int64_t B, const AttentionTile& t, const Tensor& cu_seqlens,
                                      const char* op) {
    if (!cu_seqlens) return cpu::key_windows(B, t.q_len, t.k_len, t.causal, nullptr);
    const auto docs = documents(cu_seqlens, B * t.seq_len, t.seq_len, t.q_pos, t.k_pos, op);
    return cpu::key_windows(B, t.q_len, t.k_len, t.causal, &docs);
  }
  static cpu::AttnDims dims(const checks::AttentionDims& d, const AttentionShape& shape) {
    return {d.B, d.T, d.NH, d.NKV, d.HD, shape.causal};
  }
  void rope_apply(const Tensor& qkv, const Tensor& positions, const AttentionShape& shape,
                  const RopeSpec& rope, float sign, const char* op) {
    const auto d = checks::rope(qkv, positions, shape);
    const std::vector<float> inv_freq = rope_inv_freq(rope, d.HD);
    cpu::dispatch_float(qkv.dtype(), op, [&](auto x) {
      using T = decltype(x);
      cpu::rope(p<T>(qkv), p<int32_t>(positions), inv_freq.data(), d.B, d.T, d.NH, d.NKV, d.HD,
                sign);
    });
  }

  HostAllocator alloc_;
  cpu::Gemm gemm_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace kiln
