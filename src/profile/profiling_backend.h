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
// flops, bytes and shape; ops issued inside an OpRegion (core/op_region.h) carry
// its name: "linear_forward [classifier]". Timing (OpTiming): on an asynchronous backend
// (CUDA) each op is by default followed by a synchronize() of its stream, so that
// durations are the op's own but the device idles between ops; DeviceEvents instead
// records a device marker (Backend::record_marker, a CUDA event) before and after each
// op and reads them in flush() after the step, so the step runs as unprofiled and each
// op's duration is its device time. On the CPU ops complete before returning anyway.
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
//   rmsnorm_forward      flops 4*N*C                        bytes (2*N*C + C)*es + 4N
//   rmsnorm_backward     flops 8*N*C                        bytes (4*N*C + 3*C)*es + 4N
//   linear_forward       flops 2*N*IC*OC (+ N*OC bias)      bytes (N*IC + OC*IC + N*OC (+ OC))*es
//   linear_backward      flops 2*N*IC*OC dweight (+ 2*N*IC*OC dinp) (+ N*OC dbias)
//                        bytes (N*OC + N*IC + 2*OC*IC (+ OC*IC + N*IC with dinp) (+ 2*OC))*es
//   attention_forward    flops 4*B*C*P: QK^T and PV over P (query, key) pairs per head,
//                        P = T(T+1)/2 causal or T*T bidirectional, 2*HD FLOPs each, times
//                        NH heads, C = NH*HD (softmax not counted)
//                        bytes (qkv W + out C)*B*T*es + lse 4*B*NH*T, W = (NH+2NKV)*HD
//   attention_backward   flops 10*B*C*P: the recomputed QK^T plus dV, dP, dQ, dK
//                        (FlashAttention's 2.5x the forward matmuls)
//                        bytes (qkv W + out C + dout C + dqkv W)*B*T*es + lse 4*B*NH*T
//   attention_decode     flops 4*B*C*P, P = Tq*past + Tq*(Tq+1)/2 (query, key) pairs
//                        bytes (W*B*Tq + 2*B*(past+Tq)*KV + 2*B*Tq*KV + B*Tq*C)*es, KV = NKV*HD
//   rope_forward/bwd     flops 3*B*T*(NH+NKV)*HD (6 per rotated pair)
//                        bytes 2*B*T*(NH+NKV)*HD*es (+ positions 4*B*T)
//   swiglu_forward       flops 5*N*H                        bytes 3*N*H*es
//   swiglu_backward      flops 10*N*H                       bytes 5*N*H*es
//   gelu_forward         flops 8n                           bytes 2n*es
//   gelu_backward        flops 16n                          bytes 3n*es
//   add                  flops n                            bytes 3n*es
//   dropout_forward/bwd  flops n                            bytes 2n*es
//   softmax_cross_entropy flops 3*N*V (max, exp, sum) + 2*N*V with dlogits
//                        bytes N*Vp*es (+ N*Vp*es dlogits) + 8N (targets, losses)
//   adamw_step           flops 14n                          bytes 2n*es (param r+w) + n*es_grad + 16n (m, v r+w fp32)
//   adamw_multi_step     adamw_step's per tensor; with a master, param written (n*es)
//                        and the master read and written (8n) instead of param r+w
//   sum_squares          flops 2n                           bytes n*es
//   accumulate_loss      flops N                            bytes 8N (losses, targets)
//   cross_entropy_shard_combine flops 3*tp*N               bytes 12*tp*N + 12N
//   clip_coefficient     flops 4                            bytes 20
//   copy, copy_from_host, copy_to_host  bytes 2 * nbytes (read + write, as measure_copy_bandwidth)
//   fill                 bytes nbytes
// These are the FLOPs the kernels execute (causal attention halved), not the model
// FLOPs of MFU (GPT2Config::flops_per_token counts attention without the halving).
#pragma once

#include "backend/backend.h"
#include "backend/op_list.h"
#include "profile/tracer.h"

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::profile {

/// The work of one op call.
struct OpCost {
  double flops = 0.0;
  double bytes = 0.0;
  std::string shape;  // "N=256 IC=768 OC=2304"
};

/// How ProfilingBackend times an op.
enum class OpTiming {
  Synchronize,   // host clock around the op and a synchronize() of its stream
  Launch,        // host clock around the call only (on CUDA: the launch)
  DeviceEvents,  // device markers around the op, read by flush(); where the backend has
                 // none (record_marker() = -1, the CPU), as Launch
};

class ProfilingBackend final : public Backend {
 public:
  /// Wraps `inner` (not owned; must outlive this backend).
  explicit ProfilingBackend(Backend& inner, Tracer& tracer = Tracer::global(),
                            OpTiming timing = OpTiming::Synchronize);
  /// Wraps and owns `inner`.
  explicit ProfilingBackend(std::unique_ptr<Backend> inner, Tracer& tracer = Tracer::global(),
                            OpTiming timing = OpTiming::Synchronize);

  /// DeviceEvents: waits for the ops marked since the last flush and records them, each
  /// at its device start placed on the host clock from the first one's launch, then
  /// releases the markers. Call between steps (every few hundred ops at least: each
  /// op holds two markers until then). No-op in the other modes.
  void flush();

  Backend& inner() const { return inner_; }
  Tracer& tracer() const { return tracer_; }

  // ---- Backend: everything forwards to inner() --------------------------------------
  std::string name() const override { return inner_.name(); }
  std::string gemm_path(DType dtype) const override { return inner_.gemm_path(dtype); }
  Device device() const override { return inner_.device(); }
  Allocator& allocator() override { return inner_.allocator(); }
  Allocator& staging_allocator() override { return inner_.staging_allocator(); }
  Stream default_stream() override { return inner_.default_stream(); }
  void synchronize(Stream stream) override { inner_.synchronize(stream); }
  int64_t record_marker(Stream s) override { return inner_.record_marker(s); }
  double marker_elapsed_ms(int64_t from, int64_t to) override {
    return inner_.marker_elapsed_ms(from, to);
  }
  void release_markers() override { inner_.release_markers(); }

  void copy_from_host(Stream s, const Tensor& dst, const void* src) override;
  void copy_to_host(Stream s, void* dst, const Tensor& src) override;
  void copy(Stream s, const Tensor& dst, const Tensor& src) override;
  void copy_stochastic_round(Stream s, const Tensor& dst, const Tensor& src, uint64_t seed,
                             uint64_t stream, const GlobalIndices& at) override;
  void fill(Stream s, const Tensor& t, float value) override;

  // Every op of backend/op_list.h: forwarded, and timed with its cost while enabled.
#define KILN_PROFILE_DECLARE(Call, method, family, category, params, args) \
  void method(Stream s, KILN_PARAMS params) override;
  KILN_BACKEND_OPS(KILN_PROFILE_DECLARE)
#undef KILN_PROFILE_DECLARE

 protected:
  /// As the wrapped backend answers.
  bool runs(Op op, DType dtype) const override { return inner_.supports(op, dtype); }

 private:
  // An op marked on the device, waiting for flush().
  struct Pending {
    std::string name;
    const char* category;
    OpCost cost;
    Clock::time_point launched;
    int64_t begin, end;  // markers
    uint32_t tid;
  };
  int64_t start_marker(Stream s) {
    return timing_ == OpTiming::DeviceEvents ? inner_.record_marker(s) : -1;
  }
  void finish(const char* name, const char* category, Stream s, Clock::time_point t0,
              int64_t marker, const OpCost& cost);

  std::unique_ptr<Backend> owned_;
  Backend& inner_;
  Tracer& tracer_;
  OpTiming timing_;
  std::vector<Pending> pending_;
};

/// The [profile] timing key's value: "sync" (OpTiming::Synchronize) or "events"
/// (DeviceEvents); else kiln::Error naming the key.
OpTiming op_timing(std::string_view timing);
/// `inner` wrapped in a ProfilingBackend on the global tracer, timed by op_timing(timing).
std::unique_ptr<ProfilingBackend> profiled(std::unique_ptr<Backend> inner,
                                           std::string_view timing);

// The cost formulas above, one function per op of backend/op_list.h with the op's
// parameters (exposed for tests and tools), and for the hand-written calls.
namespace cost {
#define KILN_COST_DECLARE(Call, method, family, category, params, args) \
  OpCost method(KILN_PARAMS params);
KILN_BACKEND_OPS(KILN_COST_DECLARE)
#undef KILN_COST_DECLARE
OpCost copy(size_t nbytes);
OpCost fill(const Tensor& t);
}  // namespace cost

}  // namespace kiln::profile
