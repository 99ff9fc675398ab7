// ProfilingBackend: a Backend that forwards every call to a wrapped Backend and, while
// the tracer is enabled, records one complete trace event per op call, with the op's
// FLOPs and bytes moved computed from the tensor shapes. The model needs no change:
// build it on a ProfilingBackend instead of the real one. When profiling is off the
// trainer does not wrap its backend at all, so there is no cost; while wrapped but
// outside the profiled window, each call costs one relaxed atomic load.
//
// Events: name = the Backend method ("linear_forward", "linear_backward", "adamw_step",
// "copy_from_host", ...), category "forward" (*_forward, attention_decode, add),
// "backward" (*_backward), "loss" (softmax_cross_entropy, which also writes the
// gradient), "optimizer" (adamw_step, sum_squares) or "memory" (copy*, fill), args
// flops, bytes and shape. On an asynchronous backend (CUDA) each op is followed by a
// synchronize() of its stream when `synchronize_ops` is true (the default), so that
// durations are the op's own; on the CPU ops complete before returning anyway.
//
// FLOPs and bytes (op_cost()): FLOPs count a multiply-add as 2; element-wise
// transcendental functions (exp, tanh, sqrt) count as 1. Bytes count every operand
// once: inputs read, outputs written, accumulated (+=) outputs read and written; es is
// the element size of the activation dtype, fp32 statistics (mean, rstd, lse, losses)
// and int32 tokens 4 bytes. Shapes: N = rows (B*T), C channels, IC/OC features, NH
// heads, HD = C/NH, V vocabulary, Vp padded vocabulary, n elements.
//   embedding_forward    flops N*C (the position add)       bytes tokens 4N + wte rows N*C*es + wpe T*C*es + out N*C*es
//   embedding_backward   flops 2*N*C                        bytes dout N*C*es + tokens 4N + dwte rows 2*N*C*es + dwpe 2*T*C*es
//   layernorm_forward    flops 8*N*C                        bytes (2*N*C + 2*C)*es + mean, rstd 8N
//   layernorm_backward   flops 14*N*C                       bytes (4*N*C + 5*C)*es + 8N  (dout, inp, dinp r+w, w, dw/db r+w)
//   linear_forward       flops 2*N*IC*OC (+ N*OC bias)      bytes (N*IC + OC*IC + N*OC (+ OC))*es
//   linear_backward      flops 2*N*IC*OC dweight (+ 2*N*IC*OC dinp) (+ N*OC dbias)
//                        bytes (N*OC + N*IC + 2*OC*IC (+ OC*IC + N*IC with dinp) (+ 2*OC))*es
//   attention_forward    flops 2*B*C*T*(T+1): QK^T and PV over the T(T+1)/2 causal
//                        (query, key) pairs per head, 2*HD FLOPs each, times NH heads
//                        (softmax not counted)         bytes qkv 3*B*T*C*es + out B*T*C*es + lse 4*B*NH*T
//   attention_backward   flops 5*B*C*T*(T+1): the recomputed QK^T plus dV, dP, dQ, dK
//                        (FlashAttention's 2.5x the forward matmuls)
//                        bytes (qkv 3 + out 1 + dout 1 + dqkv 3)*B*T*C*es + lse 4*B*NH*T
//   attention_decode     flops 4*B*C*P, P = Tq*past + Tq*(Tq+1)/2 (query, key) pairs
//                        bytes (3*B*Tq*C + 2*B*(past+Tq)*C + 2*B*Tq*C + B*Tq*C)*es
//   gelu_forward         flops 8n                           bytes 2n*es
//   gelu_backward        flops 16n                          bytes 3n*es
//   add                  flops n                            bytes 3n*es
//   dropout_forward/bwd  flops n                            bytes 2n*es
//   softmax_cross_entropy flops 3*N*V (max, exp, sum) + 2*N*V with dlogits
//                        bytes N*Vp*es (+ N*Vp*es dlogits) + 8N (targets, losses)
//   adamw_step           flops 14n                          bytes 2n*es (param r+w) + n*es_grad + 16n (m, v r+w fp32)
//   sum_squares          flops 2n                           bytes n*es
//   copy, copy_from_host, copy_to_host  bytes 2 * nbytes (read + write, as measure_copy_bandwidth)
//   fill                 bytes nbytes
// These are the FLOPs the kernels execute (causal attention halved), not the model
// FLOPs of MFU (GPT2Config::flops_per_token counts attention without the halving).
#pragma once

#include "backend/backend.h"
#include "profile/tracer.h"

#include <memory>
#include <string>

namespace kiln::profile {

/// The work of one op call.
struct OpCost {
  double flops = 0.0;
  double bytes = 0.0;
  std::string shape;  // "N=256 IC=768 OC=2304"
};

class ProfilingBackend final : public Backend {
 public:
  /// Wraps `inner` (not owned; must outlive this backend).
  explicit ProfilingBackend(Backend& inner, Tracer& tracer = Tracer::global(),
                            bool synchronize_ops = true);
  /// Wraps and owns `inner`.
  explicit ProfilingBackend(std::unique_ptr<Backend> inner, Tracer& tracer = Tracer::global(),
                            bool synchronize_ops = true);

  Backend& inner() const { return inner_; }
  Tracer& tracer() const { return tracer_; }

  // ---- Backend: everything forwards to inner() --------------------------------------
  std::string name() const override { return inner_.name(); }
  std::string gemm_path(DType dtype) const override { return inner_.gemm_path(dtype); }
  Device device() const override { return inner_.device(); }
  Allocator& allocator() override { return inner_.allocator(); }
  Stream default_stream() override { return inner_.default_stream(); }
  void synchronize(Stream stream) override { inner_.synchronize(stream); }
  bool supports(Op op, DType dtype) const override { return inner_.supports(op, dtype); }

  void copy_from_host(Stream s, const Tensor& dst, const void* src) override;
  void copy_to_host(Stream s, void* dst, const Tensor& src) override;
  void copy(Stream s, const Tensor& dst, const Tensor& src) override;
  void copy_stochastic_round(Stream s, const Tensor& dst, const Tensor& src, uint64_t seed,
                             uint64_t stream) override;
  void fill(Stream s, const Tensor& t, float value) override;
  double sum_squares(Stream s, const Tensor& t) override;

  void embedding_forward(Stream s, const Tensor& out, const Tensor& tokens, const Tensor& wte,
                         const Tensor& wpe) override;
  void embedding_backward(Stream s, const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                          const Tensor& tokens) override;
  void layernorm_forward(Stream s, const Tensor& out, const Tensor& mean, const Tensor& rstd,
                         const Tensor& inp, const Tensor& weight, const Tensor& bias,
                         float eps) override;
  void layernorm_backward(Stream s, const Tensor& dinp, const Tensor& dweight,
                          const Tensor& dbias, const Tensor& dout, const Tensor& inp,
                          const Tensor& weight, const Tensor& mean, const Tensor& rstd) override;
  void linear_forward(Stream s, const Tensor& out, const Tensor& inp, const Tensor& weight,
                      const Tensor& bias) override;
  void linear_backward(Stream s, const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                       const Tensor& dout, const Tensor& inp, const Tensor& weight) override;
  void attention_forward(Stream s, const Tensor& out, const Tensor& lse, const Tensor& qkv,
                         int n_head, const DropoutSpec& dropout) override;
  void attention_backward(Stream s, const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                          const Tensor& out, const Tensor& lse, int n_head,
                          const DropoutSpec& dropout) override;
  void attention_decode(Stream s, const Tensor& out, const Tensor& k_cache,
                        const Tensor& v_cache, const Tensor& qkv, int64_t past,
                        int n_head) override;
  void gelu_forward(Stream s, const Tensor& out, const Tensor& inp) override;
  void gelu_backward(Stream s, const Tensor& dinp, const Tensor& dout, const Tensor& inp) override;
  void add(Stream s, const Tensor& out, const Tensor& a, const Tensor& b) override;
  void dropout_forward(Stream s, const Tensor& out, const Tensor& inp,
                       const DropoutSpec& spec) override;
  void dropout_backward(Stream s, const Tensor& dinp, const Tensor& dout,
                        const DropoutSpec& spec) override;
  void softmax_cross_entropy(Stream s, const Tensor& losses, const Tensor& dlogits,
                             const Tensor& logits, const Tensor& targets, int vocab_size,
                             int ignore_index, float grad_scale) override;
  void adamw_step(Stream s, const Tensor& param, const Tensor& grad, const Tensor& m,
                  const Tensor& v, const AdamWParams& hp) override;

 private:
  void finish(const char* name, const char* category, Stream s, Clock::time_point t0,
              const OpCost& cost);

  std::unique_ptr<Backend> owned_;
  Backend& inner_;
  Tracer& tracer_;
  bool sync_;
};

// The cost formulas above, one function per op (exposed for tests and tools).
namespace cost {
OpCost embedding_forward(const Tensor& out, const Tensor& tokens);
OpCost embedding_backward(const Tensor& dout, const Tensor& tokens);
OpCost layernorm_forward(const Tensor& inp);
OpCost layernorm_backward(const Tensor& inp);
OpCost linear_forward(const Tensor& inp, const Tensor& weight, const Tensor& bias);
OpCost linear_backward(const Tensor& dinp, const Tensor& dbias, const Tensor& inp,
                       const Tensor& weight);
OpCost attention_forward(const Tensor& qkv, int n_head);
OpCost attention_backward(const Tensor& qkv, int n_head);
OpCost attention_decode(const Tensor& qkv, int64_t past);
OpCost gelu_forward(const Tensor& inp);
OpCost gelu_backward(const Tensor& inp);
OpCost add(const Tensor& out);
OpCost dropout(const Tensor& t);
OpCost softmax_cross_entropy(const Tensor& logits, const Tensor& dlogits, int vocab_size);
OpCost adamw_step(const Tensor& param, const Tensor& grad);
OpCost sum_squares(const Tensor& t);
OpCost copy(size_t nbytes);
OpCost fill(const Tensor& t);
}  // namespace cost

}  // namespace kiln::profile
