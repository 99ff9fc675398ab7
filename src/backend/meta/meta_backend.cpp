#include "backend/meta/meta_backend.h"

#include "backend/op_checks.h"
#include "core/error.h"

#include <cstring>

namespace kiln {

void* MetaAllocator::raw_allocate(size_t bytes) {
  std::lock_guard lock(mu_);
  const uintptr_t p = next_;
  next_ += (bytes + 63) / 64 * 64 + 64;  // a gap, so that no two buffers are adjacent
  return reinterpret_cast<void*>(p);
}

namespace {

class MetaBackend final : public Backend {
 public:
  explicit MetaBackend(MetaBackendOptions o) : opt_(std::move(o)), alloc_(opt_.device) {
    if (opt_.scratch && opt_.scratch->persistent_bytes() > 0)
      persistent_ = bytes(opt_.scratch->persistent_bytes());
  }

  std::string name() const override { return opt_.name; }
  Device device() const override { return opt_.device; }
  Allocator& allocator() override { return alloc_; }
  Stream default_stream() override { return {}; }
  void synchronize(Stream) override {}
  bool supports(Op, DType) const override { return true; }

  void copy_from_host(Stream, const Tensor&, const void*) override {}
  void copy_to_host(Stream, void* dst, const Tensor& src) override {
    if (src.nbytes()) std::memset(dst, 0, src.nbytes());
  }
  void copy(Stream, const Tensor& dst, const Tensor& src) override {
    KILN_CHECK(dst.numel() == src.numel(), "copy: {} and {} differ in size", dst.str(), src.str());
  }
  void copy_stochastic_round(Stream, const Tensor& dst, const Tensor& src, uint64_t,
                             uint64_t) override {
    KILN_CHECK(dst.numel() == src.numel(), "copy_stochastic_round: {} and {} differ in size",
               dst.str(), src.str());
  }
  void fill(Stream, const Tensor&, float) override {}
  double sum_squares(Stream, const Tensor& t) override {
    MetaCallInfo c{MetaCall::SumSquares, t.dtype()};
    c.numel = t.numel();
    Scope sc(*this, c);
    return 0.0;
  }

  void embedding_forward(Stream, const Tensor& out, const Tensor& tokens, const Tensor& wte,
                         const Tensor& wpe) override {
    embedding(MetaCall::EmbeddingForward, checks::embedding(out, tokens, wte, wpe), out.dtype());
  }
  void embedding_backward(Stream, const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                          const Tensor& tokens) override {
    embedding(MetaCall::EmbeddingBackward, checks::embedding(dout, tokens, dwte, dwpe),
              dout.dtype());
  }

  void layernorm_forward(Stream, const Tensor& out, const Tensor& mean, const Tensor& rstd,
                         const Tensor& inp, const Tensor& weight, const Tensor& bias,
                         float) override {
    const auto d = checks::layernorm(out, mean, rstd, inp, weight, bias);
    MetaCallInfo c{MetaCall::LayerNormForward, inp.dtype()};
    c.N = d.N, c.C = d.C;
    Scope sc(*this, c);
  }
  void layernorm_backward(Stream, const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                          const Tensor& dout, const Tensor& inp, const Tensor& weight,
                          const Tensor& mean, const Tensor& rstd) override {
    const auto d =
        checks::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd);
    MetaCallInfo c{MetaCall::LayerNormBackward, inp.dtype()};
    c.N = d.N, c.C = d.C;
    Scope sc(*this, c);
  }

  void linear_forward(Stream, const Tensor& out, const Tensor& inp, const Tensor& weight,
                      const Tensor& bias) override {
    const auto d = checks::linear(out, inp, weight, bias);
    MetaCallInfo c{MetaCall::LinearForward, inp.dtype()};
    c.N = d.N, c.IC = d.IC, c.OC = d.OC;
    c.has_bias = static_cast<bool>(bias);
    Scope sc(*this, c);
  }
  void linear_backward(Stream, const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                       const Tensor& dout, const Tensor& inp, const Tensor& weight) override {
    const auto d = checks::linear_backward(dinp, dweight, dbias, dout, inp, weight);
    MetaCallInfo c{MetaCall::LinearBackward, inp.dtype()};
    c.N = d.N, c.IC = d.IC, c.OC = d.OC;
    c.has_bias = static_cast<bool>(dbias);
    c.has_dinp = static_cast<bool>(dinp);
    c.has_dweight = static_cast<bool>(dweight);
    if (dweight) c.grad_dtype = dweight.dtype();
    Scope sc(*this, c);
  }

  void attention_forward(Stream, const Tensor& out, const Tensor& lse, const Tensor& qkv,
                         int n_head, const DropoutSpec&) override {
    attention(MetaCall::AttentionForward, checks::attention(out, lse, qkv, n_head), qkv.dtype());
  }
  void attention_backward(Stream, const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                          const Tensor& out, const Tensor& lse, int n_head,
                          const DropoutSpec&) override {
    const auto d = checks::attention(out, lse, qkv, n_head);
    checks::same_size(dqkv, qkv, "attention_backward dqkv");
    checks::same_size(dout, out, "attention_backward dout");
    attention(MetaCall::AttentionBackward, d, qkv.dtype());
  }
  void attention_decode(Stream, const Tensor& out, const Tensor& k_cache, const Tensor& v_cache,
                        const Tensor& qkv, int64_t past, int n_head) override {
    const auto d = checks::attention_decode(out, k_cache, v_cache, qkv, past, n_head);
    MetaCallInfo c{MetaCall::AttentionDecode, qkv.dtype()};
    c.B = d.B, c.T = d.T, c.C = d.C, c.NH = d.NH;
    Scope sc(*this, c);
  }

  void gelu_forward(Stream, const Tensor& out, const Tensor& inp) override {
    checks::same_size(out, inp, "gelu");
  }
  void gelu_backward(Stream, const Tensor& dinp, const Tensor& dout, const Tensor& inp) override {
    checks::same_size(dinp, inp, "gelu_backward");
    checks::same_size(dout, inp, "gelu_backward");
  }
  void add(Stream, const Tensor& out, const Tensor& a, const Tensor& b) override {
    checks::same_size(out, a, "add");
    checks::same_size(out, b, "add");
  }
  void dropout_forward(Stream, const Tensor& out, const Tensor& inp, const DropoutSpec&) override {
    checks::same_size(out, inp, "dropout");
  }
  void dropout_backward(Stream, const Tensor& dinp, const Tensor& dout,
                        const DropoutSpec&) override {
    checks::same_size(dinp, dout, "dropout_backward");
  }

  void softmax_cross_entropy(Stream, const Tensor& losses, const Tensor& dlogits,
                             const Tensor& logits, const Tensor& targets, int vocab_size, int,
                             float) override {
    const auto d = checks::cross_entropy(losses, dlogits, logits, targets, vocab_size);
    MetaCallInfo c{MetaCall::SoftmaxCrossEntropy, logits.dtype()};
    c.N = d.N, c.Vp = d.Vp;
    Scope sc(*this, c);
  }

  void adamw_step(Stream, const Tensor& param, const Tensor& grad, const Tensor& m,
                  const Tensor& v, const AdamWParams&) override {
    // Element counts only: with mixed precision the dtypes of param, grad and m/v differ.
    KILN_CHECK(grad.numel() == param.numel() && m.numel() == param.numel() &&
                   v.numel() == param.numel(),
               "adamw: grad {}, m {} and v {} must match param {}", grad.str(), m.str(), v.str(),
               param.str());
    MetaCallInfo c{MetaCall::AdamW, param.dtype()};
    c.numel = param.numel();
    Scope sc(*this, c);
  }

 private:
  Tensor bytes(int64_t n) {
    return Tensor::empty(alloc_, Shape{(n + 3) / 4}, DType::F32, MemCategory::Temporaries);
  }

  // Grows the persistent scratch buffer (free first, as the CPU backend does) and holds
  // the call's transient scratch until the op returns.
  struct Scope {
    Scope(MetaBackend& be, const MetaCallInfo& c) {
      MetaScratchModel* m = be.opt_.scratch.get();
      if (m == nullptr) return;
      const int64_t grow = m->growing_bytes(c);
      if (grow > 0 && static_cast<size_t>(grow) > be.growing_.nbytes()) {
        be.growing_ = Tensor();
        be.growing_ = be.bytes(grow);
      }
      const int64_t t = m->transient_bytes(c);
      if (t > 0) transient = be.bytes(t);
    }
    Tensor transient;
  };

  void embedding(MetaCall call, const checks::EmbeddingDims& d, DType dt) {
    MetaCallInfo c{call, dt};
    c.B = d.B, c.T = d.T, c.C = d.C, c.Vp = d.Vp, c.N = d.B * d.T;
    Scope sc(*this, c);
  }
  void attention(MetaCall call, const checks::AttentionDims& d, DType dt) {
    MetaCallInfo c{call, dt};
    c.B = d.B, c.T = d.T, c.C = d.C, c.NH = d.NH, c.N = d.B * d.T;
    Scope sc(*this, c);
  }

  MetaBackendOptions opt_;
  MetaAllocator alloc_;
  Tensor persistent_;
  Tensor growing_;
};

}  // namespace

std::unique_ptr<Backend> make_meta_backend(const MetaBackendOptions& options) {
  return std::make_unique<MetaBackend>(options);
}

}  // namespace kiln
