// CudaBackend: validates each call with op_checks (the same messages as every backend),
// picks the element type, and launches the op's kernels (one .cu per op) on the
// caller's stream. See cuda_backend.h for the conventions and docs/cuda.md.
#include "backend/cuda/cuda_backend.h"

#include "backend/cuda/adamw.h"
#include "backend/cuda/add.h"
#include "backend/cuda/allocator.h"
#include "backend/cuda/attention.h"
#include "backend/cuda/attention_decode.h"
#include "backend/cuda/common.h"
#include "backend/cuda/cross_entropy.h"
#include "backend/cuda/dropout.h"
#include "backend/cuda/embedding.h"
#include "backend/cuda/gelu.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/layernorm.h"
#include "backend/cuda/linear.h"
#include "backend/cuda/memory.h"
#include "backend/cuda/nvtx.h"
#include "backend/op_checks.h"
#include "core/dtype.h"
#include "core/error.h"

#include <cmath>
#include <cstdlib>
#include <cstring>

namespace kiln {

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

std::string cuda_unavailable_reason() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return std::string("no GPU visible (") + cudaGetErrorString(e) + ")";
  }
  return n > 0 ? "" : "no GPU visible";
}

namespace {

using cuda::Elem;

constexpr size_t kGemmWorkspace = 32u << 20;

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : device_(device) {
    KILN_CUDA_CHECK(cudaSetDevice(device));
    KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    KILN_CUDA_CHECK(cudaEventCreateWithFlags(&scratch_event_, cudaEventDisableTiming));
    alloc_ = std::make_unique<cuda::CudaAllocator>(device, stream_);
    gemm_ = std::make_unique<cuda::Gemm>();
    workspace_ = empty({static_cast<int64_t>(kGemmWorkspace / 4)}, DType::I32,
                       MemCategory::Temporaries);
    gemm_->set_workspace(workspace_.raw(), kGemmWorkspace);
    if (const char* v = std::getenv("KILN_CUDA_TF32")) gemm_->set_allow_tf32(std::strcmp(v, "1") == 0);
    cudaDeviceProp prop{};
    KILN_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    device_name_ = prop.name;
  }

  ~CudaBackend() override {
    (void)cudaStreamSynchronize(stream_);
    workspace_ = Tensor();
    gemm_.reset();
    (void)cudaStreamSynchronize(stream_);
    alloc_.reset();
    cudaEventDestroy(scratch_event_);
    cudaStreamDestroy(stream_);
  }

  std::string name() const override { return "cuda"; }
  std::string gemm_path(DType dtype) const override {
    return fmt::format("{} GEMMs: cuBLASLt", dtype_name(dtype));
  }
  Device device() const override { return Device::cuda(device_); }
  Allocator& allocator() override { return *alloc_; }
  Stream default_stream() override { return Stream{stream_}; }
  void synchronize(Stream s) override { KILN_CUDA_CHECK(cudaStreamSynchronize(st(s))); }
  bool supports(Op, DType dtype) const override {
    return dtype == DType::F32 || dtype == DType::BF16;
  }

  // ---- memory -------------------------------------------------------------------------
  void copy_from_host(Stream s, const Tensor& dst, const void* src) override {
    if (!dst.nbytes()) return;
    on_device(dst, "copy_from_host");
    KILN_CUDA_CHECK(cudaMemcpyAsync(dst.raw(), src, dst.nbytes(), cudaMemcpyHostToDevice, st(s)));
  }
  void copy_to_host(Stream s, void* dst, const Tensor& src) override {
    if (!src.nbytes()) return;
    on_device(src, "copy_to_host");
    KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src.raw(), src.nbytes(), cudaMemcpyDeviceToHost, st(s)));
    KILN_CUDA_CHECK(cudaStreamSynchronize(st(s)));
  }
  void copy(Stream s, const Tensor& dst, const Tensor& src) override {
    KILN_CHECK(dst.numel() == src.numel(), "copy: {} and {} differ in size", dst.str(), src.str());
    if (!src.numel()) return;
    on_device(dst, "copy");
    on_device(src, "copy");
    if (dst.dtype() == src.dtype()) {
      if (dst.raw() == src.raw()) return;
      KILN_CUDA_CHECK(
          cudaMemcpyAsync(dst.raw(), src.raw(), src.nbytes(), cudaMemcpyDeviceToDevice, st(s)));
      return;
    }
    // Different float dtypes: convert (round to nearest even, NaN/Inf kept), e.g. the
    // optimizer's fp32 master weights into bf16 parameters.
    cuda::convert(st(s), dst.raw(), float_kind(dst, "copy"), src.raw(), float_kind(src, "copy"),
                  src.numel());
  }
  void copy_stochastic_round(Stream s, const Tensor& dst, const Tensor& src, uint64_t seed,
                             uint64_t stream) override {
    KILN_CHECK(dst.numel() == src.numel() && dst.dtype() == DType::BF16 &&
                   src.dtype() == DType::F32,
               "copy_stochastic_round: {} <- {} (bf16 <- fp32 of one size)", dst.str(), src.str());
    on_device(dst, "copy_stochastic_round");
    on_device(src, "copy_stochastic_round");
    cuda::stochastic_round_bf16(st(s), dst.raw(), static_cast<const float*>(src.raw()),
                                src.numel(), seed, stream);
  }
  void fill(Stream s, const Tensor& t, float value) override {
    if (!t.numel()) return;
    on_device(t, "fill");
    switch (t.dtype()) {
      case DType::F32: cuda::fill_u32(st(s), t.raw(), f32_bits(value), t.numel()); break;
      case DType::I32: {
        const int32_t i = static_cast<int32_t>(value);
        uint32_t u;
        std::memcpy(&u, &i, 4);
        cuda::fill_u32(st(s), t.raw(), u, t.numel());
        break;
      }
      case DType::BF16: cuda::fill_u16(st(s), t.raw(), f32_to_bf16(value), t.numel()); break;
      case DType::F16: cuda::fill_u16(st(s), t.raw(), f32_to_f16(value), t.numel()); break;
    }
  }
  double sum_squares(Stream s, const Tensor& t) override {
    if (!t.numel()) return 0.0;
    const Elem e = elem(t, "sum_squares");
    Scratch scratch(*this, st(s), cuda::sum_squares_scratch_bytes(t.numel()) + sizeof(double));
    auto* partial = scratch.ptr();
    auto* result = reinterpret_cast<double*>(static_cast<char*>(partial) +
                                             cuda::sum_squares_scratch_bytes(t.numel()));
    cuda::sum_squares(st(s), e, t.raw(), t.numel(), partial, result);
    double host = 0.0;
    KILN_CUDA_CHECK(cudaMemcpyAsync(&host, result, sizeof(double), cudaMemcpyDeviceToHost, st(s)));
    KILN_CUDA_CHECK(cudaStreamSynchronize(st(s)));
    return host;
  }

  // ---- ops ------------------------------------------------------------------------------
  void embedding_forward(Stream s, const Tensor& out, const Tensor& tokens, const Tensor& wte,
                         const Tensor& wpe) override {
    cuda::NvtxRange r("embedding_forward");
    const auto d = checks::embedding(out, tokens, wte, wpe);
    const Elem e = elem(out, "embedding", {&wte, &wpe});
    cuda::embedding_forward(st(s), e, out.raw(), tokens.data<int32_t>(), wte.raw(), wpe.raw(), d.B,
                            d.T, d.C, d.Vp);
  }
  void embedding_backward(Stream s, const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                          const Tensor& tokens) override {
    cuda::NvtxRange r("embedding_backward");
    const auto d = checks::embedding(dout, tokens, dwte, dwpe);
    const Elem e = elem(dout, "embedding_backward");
    const Elem g = grad_elem(dwte, e, "embedding_backward dwte", {&dwpe});
    const size_t bytes = cuda::embedding_backward_scratch_bytes(d.B * d.T);
    Scratch scratch(*this, st(s), bytes);
    cuda::embedding_backward(st(s), e, g, dwte.raw(), dwpe.raw(), dout.raw(), tokens.data<int32_t>(),
                             d.B, d.T, d.C, d.Vp, scratch.ptr(), bytes);
  }

  void layernorm_forward(Stream s, const Tensor& out, const Tensor& mean, const Tensor& rstd,
                         const Tensor& inp, const Tensor& weight, const Tensor& bias,
                         float eps) override {
    cuda::NvtxRange r("layernorm_forward");
    const auto d = checks::layernorm(out, mean, rstd, inp, weight, bias);
    const Elem e = elem(inp, "layernorm", {&out, &weight, &bias});
    cuda::layernorm_forward(st(s), e, out.raw(), mean.data<float>(), rstd.data<float>(), inp.raw(),
                            weight.raw(), bias.raw(), d.N, d.C, eps);
  }
  void layernorm_backward(Stream s, const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                          const Tensor& dout, const Tensor& inp, const Tensor& weight,
                          const Tensor& mean, const Tensor& rstd) override {
    cuda::NvtxRange r("layernorm_backward");
    const auto d =
        checks::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd);
    const Elem e = elem(inp, "layernorm_backward", {&dinp, &dout, &weight});
    const Elem g = grad_elem(dweight, e, "layernorm_backward dweight", {&dbias});
    Scratch scratch(*this, st(s), cuda::layernorm_backward_scratch_bytes(d.N, d.C));
    cuda::layernorm_backward(st(s), e, g, dinp.raw(), dweight.raw(), dbias.raw(), dout.raw(),
                             inp.raw(), weight.raw(), mean.data<float>(), rstd.data<float>(), d.N,
                             d.C, scratch.ptr());
  }

  void linear_forward(Stream s, const Tensor& out, const Tensor& inp, const Tensor& weight,
                      const Tensor& bias) override {
    cuda::NvtxRange r("linear_forward");
    const auto d = checks::linear(out, inp, weight, bias);
    const Elem e = bias ? elem(inp, "linear", {&out, &weight, &bias})
                        : elem(inp, "linear", {&out, &weight});
    if (d.N == 0 || d.OC == 0) return;
    if (d.IC == 0) {
      fill(s, out, 0.f);
      if (bias) cuda::add_bias(st(s), e, out.raw(), bias.raw(), d.N, d.OC);
      return;
    }
    // Row-major out[N,OC] = inp[N,IC] W[OC,IC]^T is column-major out^T = W^T' inp^T:
    // m = OC, n = N, k = IC, A = W (transposed, lda IC), B = inp (ldb IC).
    cuda::GemmArgs g;
    g.trans_a = true;
    g.m = d.OC, g.n = d.N, g.k = d.IC;
    g.a = weight.raw(), g.lda = d.IC;
    g.b = inp.raw(), g.ldb = d.IC;
    g.c = out.raw(), g.ldc = d.OC;
    g.elem = e;
    if (bias) {
      g.epilogue = cuda::Epilogue::Bias;
      g.bias = bias.raw();
    }
    if (!gemm_->run(st(s), g)) {  // no fused-bias algorithm: GEMM, then a bias kernel
      g.epilogue = cuda::Epilogue::None;
      g.bias = nullptr;
      gemm_->run(st(s), g);
      cuda::add_bias(st(s), e, out.raw(), bias.raw(), d.N, d.OC);
    }
  }
  void linear_backward(Stream s, const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                       const Tensor& dout, const Tensor& inp, const Tensor& weight) override {
    cuda::NvtxRange r("linear_backward");
    const auto d = checks::linear_backward(dinp, dweight, dbias, dout, inp, weight);
    const Elem e = elem(inp, "linear_backward", {&dout, &weight, &dinp});
    // Parameter gradients in fp32 (mixed precision) or the activations' dtype, as the CPU.
    const Elem g = dweight ? grad_elem(dweight, e, "linear_backward dweight", {&dbias})
                 : dbias   ? grad_elem(dbias, e, "linear_backward dbias")
                           : e;
    if (d.N == 0) {
      if (dinp) fill(s, dinp, 0.f);
      return;
    }
    if (dinp) {
      if (d.OC == 0) {
        fill(s, dinp, 0.f);
      } else {
        // dinp[N,IC] = dout[N,OC] W[OC,IC]: column-major dinp^T = W^T dout^T.
        cuda::GemmArgs g;
        g.m = d.IC, g.n = d.N, g.k = d.OC;
        g.a = weight.raw(), g.lda = d.IC;
        g.b = dout.raw(), g.ldb = d.OC;
        g.c = dinp.raw(), g.ldc = d.IC;
        g.elem = e;
        gemm_->run(st(s), g);
      }
    }
    if (dweight && d.IC > 0 && d.OC > 0) {
      // dW[OC,IC] += dout^T inp: column-major dW^T[IC,OC] += inp^T dout. With bf16
      // activations and fp32 gradients: bf16 A/B, fp32 C, accumulated with beta = 1.
      cuda::GemmArgs gw;
      gw.trans_b = true;
      gw.m = d.IC, gw.n = d.OC, gw.k = d.N;
      gw.a = inp.raw(), gw.lda = d.IC;
      gw.b = dout.raw(), gw.ldb = d.OC;
      gw.c = dweight.raw(), gw.ldc = d.IC;
      gw.beta = 1.f;
      gw.elem = e;
      gw.c_elem = g;
      gemm_->run(st(s), gw);
    }
    if (dbias) {
      Scratch scratch(*this, st(s), cuda::bias_backward_scratch_bytes(d.N, d.OC));
      cuda::bias_backward(st(s), e, g, dbias.raw(), dout.raw(), d.N, d.OC, scratch.ptr());
    }
  }

  void attention_forward(Stream s, const Tensor& out, const Tensor& lse, const Tensor& qkv,
                         int n_head, const DropoutSpec& dropout) override {
    cuda::NvtxRange r("attention_forward");
    const auto d = checks::attention(out, lse, qkv, n_head);
    const Elem e = elem(qkv, "attention", {&out});
    head_dim_ok(d.HD, "attention");
    cuda::attention_forward(st(s), e, out.raw(), lse.data<float>(), qkv.raw(),
                            {d.B, d.T, d.C, d.NH, d.HD}, drop(dropout));
  }
  void attention_backward(Stream s, const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                          const Tensor& out, const Tensor& lse, int n_head,
                          const DropoutSpec& dropout) override {
    cuda::NvtxRange r("attention_backward");
    const auto d = checks::attention(out, lse, qkv, n_head);
    checks::same_size(dqkv, qkv, "attention_backward dqkv");
    checks::same_size(dout, out, "attention_backward dout");
    const Elem e = elem(qkv, "attention_backward", {&out, &dout, &dqkv});
    head_dim_ok(d.HD, "attention_backward");
    const cuda::AttnShape shape{d.B, d.T, d.C, d.NH, d.HD};
    Scratch scratch(*this, st(s), cuda::attention_backward_scratch_bytes(shape));
    cuda::attention_backward(st(s), e, dqkv.raw(), dout.raw(), qkv.raw(), out.raw(),
                             lse.data<float>(), shape, drop(dropout), scratch.ptr());
  }

  void attention_decode(Stream s, const Tensor& out, const Tensor& k_cache, const Tensor& v_cache,
                        const Tensor& qkv, int64_t past, int n_head) override {
    cuda::NvtxRange r("attention_decode");
    const auto d = checks::attention_decode(out, k_cache, v_cache, qkv, past, n_head);
    const Elem e = elem(qkv, "attention_decode", {&out, &k_cache, &v_cache});
    cuda::attention_decode(st(s), e, out.raw(), k_cache.raw(), v_cache.raw(), qkv.raw(), d.B, d.T,
                           d.Tmax, d.C, d.NH, past);
  }

  void gelu_forward(Stream s, const Tensor& out, const Tensor& inp) override {
    cuda::NvtxRange r("gelu_forward");
    checks::same_size(out, inp, "gelu");
    cuda::gelu_forward(st(s), elem(inp, "gelu"), out.raw(), inp.raw(), inp.numel());
  }
  void gelu_backward(Stream s, const Tensor& dinp, const Tensor& dout, const Tensor& inp) override {
    cuda::NvtxRange r("gelu_backward");
    checks::same_size(dinp, inp, "gelu_backward");
    checks::same_size(dout, inp, "gelu_backward");
    cuda::gelu_backward(st(s), elem(inp, "gelu_backward"), dinp.raw(), dout.raw(), inp.raw(),
                        inp.numel());
  }
  void add(Stream s, const Tensor& out, const Tensor& a, const Tensor& b) override {
    cuda::NvtxRange r("add");
    checks::same_size(out, a, "add");
    checks::same_size(out, b, "add");
    cuda::add(st(s), elem(out, "add"), out.raw(), a.raw(), b.raw(), out.numel());
  }
  void dropout_forward(Stream s, const Tensor& out, const Tensor& inp,
                       const DropoutSpec& spec) override {
    cuda::NvtxRange r("dropout_forward");
    checks::same_size(out, inp, "dropout");
    run_dropout(s, out, inp, spec, "dropout");
  }
  void dropout_backward(Stream s, const Tensor& dinp, const Tensor& dout,
                        const DropoutSpec& spec) override {
    cuda::NvtxRange r("dropout_backward");
    checks::same_size(dinp, dout, "dropout_backward");
    run_dropout(s, dinp, dout, spec, "dropout_backward");
  }

  void softmax_cross_entropy(Stream s, const Tensor& losses, const Tensor& dlogits,
                             const Tensor& logits, const Tensor& targets, int vocab_size,
                             int ignore_index, float grad_scale) override {
    cuda::NvtxRange r("softmax_cross_entropy");
    const auto d = checks::cross_entropy(losses, dlogits, logits, targets, vocab_size);
    const Elem e = dlogits ? elem(logits, "softmax_cross_entropy", {&dlogits})
                           : elem(logits, "softmax_cross_entropy");
    cuda::softmax_cross_entropy(st(s), e, losses.data<float>(), dlogits ? dlogits.raw() : nullptr,
                                logits.raw(), targets.data<int32_t>(), d.N, d.Vp, vocab_size,
                                ignore_index, grad_scale);
  }

  void adamw_step(Stream s, const Tensor& param, const Tensor& grad, const Tensor& m,
                  const Tensor& v, const AdamWParams& hp) override {
    cuda::NvtxRange r("adamw_step");
    KILN_CHECK(grad.numel() == param.numel(), "adamw: grad {} vs param {}", grad.str(),
               param.str());
    KILN_CHECK(m.numel() == param.numel() && v.numel() == param.numel(),
               "adamw: m {} and v {} must have the {} elements of param {}", m.str(), v.str(),
               param.numel(), param.str());
    check_dtype(m, DType::F32, "adamw m");
    check_dtype(v, DType::F32, "adamw v");
    const Elem e = elem(param, "adamw");
    // fp32 master weights with fp32 or bf16 gradients, or parameter and gradient alike.
    const Elem g = elem(grad, "adamw grad");
    const double bc1 = 1.0 - std::pow(hp.beta1, static_cast<double>(hp.step));
    const double bc2 = 1.0 - std::pow(hp.beta2, static_cast<double>(hp.step));
    cuda::AdamWArgs a{};
    a.lr = hp.lr;
    a.beta1 = static_cast<float>(hp.beta1);
    a.beta2 = static_cast<float>(hp.beta2);
    a.eps = hp.eps;
    a.grad_scale = hp.grad_scale;
    // The CPU backend's arithmetic (bias corrections in double), so that the two agree.
    a.step_size = static_cast<float>(static_cast<double>(hp.lr) / bc1);
    a.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
    a.decay = 1.f - hp.lr * hp.weight_decay;
    cuda::adamw(st(s), e, g, param.raw(), grad.raw(), m.data<float>(), v.data<float>(), param.numel(),
                a);
  }

 private:
  // Scratch memory for one op (Temporaries). Freed on the backend's stream; when the op
  // ran on another stream, the backend's stream first waits for that stream's work.
  class Scratch {
   public:
    Scratch(CudaBackend& be, cudaStream_t s, size_t bytes) : be_(be), s_(s) {
      const int64_t words = static_cast<int64_t>((bytes + 3) / 4);
      t_ = be.empty({words > 0 ? words : 1}, DType::I32, MemCategory::Temporaries);
    }
    ~Scratch() {
      if (s_ != be_.stream_) {
        (void)cudaEventRecord(be_.scratch_event_, s_);
        (void)cudaStreamWaitEvent(be_.stream_, be_.scratch_event_, 0);
      }
    }
    void* ptr() const { return t_.raw(); }

   private:
    CudaBackend& be_;
    cudaStream_t s_;
    Tensor t_;
  };

  cudaStream_t st(Stream s) const {
    return s.handle ? static_cast<cudaStream_t>(s.handle) : stream_;
  }

  static void on_device(const Tensor& t, const char* op) {
    KILN_CHECK(t.device().type == DeviceType::CUDA, "{}: tensor {} is not on a CUDA device", op,
               t.str());
  }

  // The element type of `t` (fp32 or bf16; else kiln::Error), checking that the other
  // floating tensors of the op (empty ones skipped) have the same dtype.
  static Elem elem(const Tensor& t, const char* op, std::initializer_list<const Tensor*> same = {}) {
    KILN_CHECK(t.dtype() == DType::F32 || t.dtype() == DType::BF16,
               "{}: the cuda backend does not support {}", op, dtype_name(t.dtype()));
    on_device(t, op);
    for (const Tensor* o : same)
      if (*o)
        KILN_CHECK(o->dtype() == t.dtype(), "{}: tensor {} must be {} like {}", op, o->str(),
                   dtype_name(t.dtype()), t.str());
    return t.dtype() == DType::F32 ? Elem::F32 : Elem::BF16;
  }

  // The element type of a parameter gradient: fp32 (with bf16 activations e) or e itself
  // (checks::grad_of's rule); `same` (empty ones skipped) must have the same dtype.
  static Elem grad_elem(const Tensor& g, Elem e, const char* op,
                        std::initializer_list<const Tensor*> same = {}) {
    on_device(g, op);
    const DType act = e == Elem::F32 ? DType::F32 : DType::BF16;
    KILN_CHECK(g.dtype() == DType::F32 || g.dtype() == act,
               "{}: gradients in {} with activations in {} are not supported", op,
               dtype_name(g.dtype()), dtype_name(act));
    for (const Tensor* o : same)
      if (*o)
        KILN_CHECK(o->dtype() == g.dtype(), "{}: tensor {} must be {} like {}", op, o->str(),
                   dtype_name(g.dtype()), g.str());
    return g.dtype() == DType::F32 ? Elem::F32 : Elem::BF16;
  }

  static cuda::FloatKind float_kind(const Tensor& t, const char* op) {
    switch (t.dtype()) {
      case DType::F32: return cuda::FloatKind::F32;
      case DType::BF16: return cuda::FloatKind::BF16;
      case DType::F16: return cuda::FloatKind::F16;
      default: break;
    }
    KILN_FAIL("{}: cannot convert {} (float dtypes only)", op, t.str());
  }

  static void head_dim_ok(int64_t hd, const char* op) {
    KILN_CHECK(hd <= cuda::kMaxHeadDim, "{}: the cuda backend supports head sizes up to {}, got {}",
               op, cuda::kMaxHeadDim, hd);
  }

  static cuda::AttnDropout drop(const DropoutSpec& d) {
    cuda::AttnDropout a;
    if (d.enabled()) {
      a.p = d.p;
      a.scale = 1.f / (1.f - d.p);
      a.seed = d.seed;
      a.stream = d.stream;
    }
    return a;
  }

  void run_dropout(Stream s, const Tensor& out, const Tensor& inp, const DropoutSpec& spec,
                   const char* op) {
    const Elem e = elem(inp, op);
    if (!spec.enabled()) {
      copy(s, out, inp);
      return;
    }
    cuda::dropout(st(s), e, out.raw(), inp.raw(), inp.numel(), spec.p, 1.f / (1.f - spec.p),
                  spec.seed, spec.stream);
  }

  int device_;
  std::string device_name_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t scratch_event_ = nullptr;
  std::unique_ptr<cuda::CudaAllocator> alloc_;
  std::unique_ptr<cuda::Gemm> gemm_;
  Tensor workspace_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int device) {
  const int n = cuda_device_count();
  KILN_CHECK(device >= 0 && device < n, "cuda: device {} requested but {} visible ({})", device, n,
             n == 0 ? cuda_unavailable_reason() : "use CUDA_VISIBLE_DEVICES to choose");
  return std::make_unique<CudaBackend>(device);
}

}  // namespace kiln
