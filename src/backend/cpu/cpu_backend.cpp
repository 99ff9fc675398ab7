// CpuBackend: validates each call (op_checks), then runs the fp32 kernel of kernels.h.
#include "backend/cpu/cpu_backend.h"

#include "backend/cpu/gemm.h"
#include "backend/cpu/kernels.h"
#include "backend/op_checks.h"

#include <cstring>

namespace kiln {

namespace {

float* f(const Tensor& t) { return t ? t.data<float>() : nullptr; }

class CpuBackend final : public Backend {
 public:
  CpuBackend() : gemm_(alloc_) {}

  std::string name() const override { return "cpu"; }
  Device device() const override { return Device::cpu(); }
  Allocator& allocator() override { return alloc_; }
  Stream default_stream() override { return {}; }
  void synchronize(Stream) override {}
  bool supports(Op, DType dtype) const override { return dtype == DType::F32; }

  void copy_from_host(Stream, const Tensor& dst, const void* src) override {
    if (dst.nbytes()) std::memcpy(dst.raw(), src, dst.nbytes());
  }
  void copy_to_host(Stream, void* dst, const Tensor& src) override {
    if (src.nbytes()) std::memcpy(dst, src.raw(), src.nbytes());
  }
  void copy(Stream, const Tensor& dst, const Tensor& src) override {
    checks::same_size(dst, src, "copy");
    if (dst.raw() != src.raw() && src.nbytes()) std::memcpy(dst.raw(), src.raw(), src.nbytes());
  }
  void fill(Stream, const Tensor& t, float value) override {
    if (t.dtype() == DType::I32) {
      std::fill_n(t.data<int32_t>(), t.numel(), static_cast<int32_t>(value));
      return;
    }
    f32(t, "fill");
    cpu::fill(f(t), value, t.numel());
  }
  double sum_squares(Stream, const Tensor& t) override {
    f32(t, "sum_squares");
    return cpu::sum_squares(f(t), t.numel());
  }

  void embedding_forward(Stream, const Tensor& out, const Tensor& tokens, const Tensor& wte,
                         const Tensor& wpe) override {
    const auto d = checks::embedding(out, tokens, wte, wpe);
    f32(out, "embedding");
    cpu::embedding_forward(f(out), tokens.data<int32_t>(), f(wte), f(wpe), d.B, d.T, d.C, d.Vp);
  }
  void embedding_backward(Stream, const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                          const Tensor& tokens) override {
    const auto d = checks::embedding(dout, tokens, dwte, dwpe);
    f32(dout, "embedding_backward");
    cpu::embedding_backward(f(dwte), f(dwpe), f(dout), tokens.data<int32_t>(), d.B, d.T, d.C,
                            d.Vp);
  }

  void layernorm_forward(Stream, const Tensor& out, const Tensor& mean, const Tensor& rstd,
                         const Tensor& inp, const Tensor& weight, const Tensor& bias,
                         float eps) override {
    const auto d = checks::layernorm(out, mean, rstd, inp, weight, bias);
    f32(inp, "layernorm");
    cpu::layernorm_forward(f(out), f(mean), f(rstd), f(inp), f(weight), f(bias), d.N, d.C, eps);
  }
  void layernorm_backward(Stream, const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                          const Tensor& dout, const Tensor& inp, const Tensor& weight,
                          const Tensor& mean, const Tensor& rstd) override {
    const auto d = checks::layernorm(dout, mean, rstd, inp, weight, dbias);
    checks::same_size(dinp, inp, "layernorm_backward dinp");
    checks::same_size(dweight, weight, "layernorm_backward dweight");
    f32(inp, "layernorm_backward");
    cpu::layernorm_backward(f(dinp), f(dweight), f(dbias), f(dout), f(inp), f(weight), f(mean),
                            f(rstd), d.N, d.C);
  }

  void linear_forward(Stream, const Tensor& out, const Tensor& inp, const Tensor& weight,
                      const Tensor& bias) override {
    const auto d = checks::linear(out, inp, weight, bias);
    f32(inp, "linear");
    cpu::linear_forward(gemm_, f(out), f(inp), f(weight), f(bias), d.N, d.IC, d.OC);
  }
  void linear_backward(Stream, const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                       const Tensor& dout, const Tensor& inp, const Tensor& weight) override {
    const auto d = checks::linear(dout, inp, weight, dbias);
    if (dinp) checks::same_size(dinp, inp, "linear_backward dinp");
    if (dweight) checks::same_size(dweight, weight, "linear_backward dweight");
    f32(inp, "linear_backward");
    cpu::linear_backward(gemm_, f(dinp), f(dweight), f(dbias), f(dout), f(inp), f(weight), d.N,
                         d.IC, d.OC);
  }

  void attention_forward(Stream, const Tensor& out, const Tensor& lse, const Tensor& qkv,
                         int n_head, const DropoutSpec& dropout) override {
    const auto d = checks::attention(out, lse, qkv, n_head);
    f32(qkv, "attention");
    cpu::attention_forward(f(out), f(lse), f(qkv), d.B, d.T, d.C, d.NH, dropout);
  }
  void attention_backward(Stream, const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                          const Tensor& out, const Tensor& lse, int n_head,
                          const DropoutSpec& dropout) override {
    const auto d = checks::attention(out, lse, qkv, n_head);
    checks::same_size(dqkv, qkv, "attention_backward dqkv");
    checks::same_size(dout, out, "attention_backward dout");
    f32(qkv, "attention_backward");
    cpu::attention_backward(f(dqkv), f(dout), f(qkv), f(out), f(lse), d.B, d.T, d.C, d.NH,
                            dropout);
  }

  void attention_decode(Stream, const Tensor& out, const Tensor& k_cache, const Tensor& v_cache,
                        const Tensor& qkv, int64_t past, int n_head) override {
    const auto d = checks::attention_decode(out, k_cache, v_cache, qkv, past, n_head);
    f32(qkv, "attention_decode");
    cpu::attention_decode(f(out), f(k_cache), f(v_cache), f(qkv), d.B, d.T, d.Tmax, d.C, d.NH,
                          past);
  }

  void gelu_forward(Stream, const Tensor& out, const Tensor& inp) override {
    checks::same_size(out, inp, "gelu");
    f32(inp, "gelu");
    cpu::gelu_forward(f(out), f(inp), inp.numel());
  }
  void gelu_backward(Stream, const Tensor& dinp, const Tensor& dout, const Tensor& inp) override {
    checks::same_size(dinp, inp, "gelu_backward");
    checks::same_size(dout, inp, "gelu_backward");
    f32(inp, "gelu_backward");
    cpu::gelu_backward(f(dinp), f(dout), f(inp), inp.numel());
  }
  void add(Stream, const Tensor& out, const Tensor& a, const Tensor& b) override {
    checks::same_size(out, a, "add");
    checks::same_size(out, b, "add");
    f32(out, "add");
    cpu::add(f(out), f(a), f(b), out.numel());
  }
  void dropout_forward(Stream, const Tensor& out, const Tensor& inp,
                       const DropoutSpec& spec) override {
    checks::same_size(out, inp, "dropout");
    f32(inp, "dropout");
    cpu::dropout(f(out), f(inp), inp.numel(), spec);
  }
  void dropout_backward(Stream, const Tensor& dinp, const Tensor& dout,
                        const DropoutSpec& spec) override {
    checks::same_size(dinp, dout, "dropout_backward");
    f32(dout, "dropout_backward");
    cpu::dropout(f(dinp), f(dout), dout.numel(), spec);
  }

  void softmax_cross_entropy(Stream, const Tensor& losses, const Tensor& dlogits,
                             const Tensor& logits, const Tensor& targets, int vocab_size,
                             int ignore_index, float grad_scale) override {
    const auto d = checks::cross_entropy(losses, dlogits, logits, targets, vocab_size);
    f32(logits, "softmax_cross_entropy");
    cpu::softmax_cross_entropy(f(losses), f(dlogits), f(logits), targets.data<int32_t>(), d.N,
                               d.Vp, vocab_size, ignore_index, grad_scale);
  }

  void adamw_step(Stream, const Tensor& param, const Tensor& grad, const Tensor& m,
                  const Tensor& v, const AdamWParams& hp) override {
    checks::same_size(grad, param, "adamw grad");
    checks::same_size(m, param, "adamw m");
    checks::same_size(v, param, "adamw v");
    f32(param, "adamw");
    cpu::adamw(f(param), f(grad), f(m), f(v), param.numel(), hp);
  }

 private:
  static void f32(const Tensor& t, const char* op) {
    KILN_CHECK(t.dtype() == DType::F32, "{}: the cpu backend does not support {} yet", op,
               dtype_name(t.dtype()));
  }

  HostAllocator alloc_;
  cpu::Gemm gemm_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace kiln
