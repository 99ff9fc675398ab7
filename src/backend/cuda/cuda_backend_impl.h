// The CudaBackend class (see cuda_backend.h for its conventions), declared here so that
// its methods can live in several files: cuda_backend.cpp (construction, memory, loss,
// optimizer, shared helpers), cuda_ops.cpp (embedding, norms, linear, element-wise ops),
// cuda_dit_ops.cpp (adaLN modulation, rectified-flow inputs, the MSE loss),
// cuda_attention_ops.cpp (attention, ring attention's tiles, KV-cache decode, rotary
// embedding) and
// cuda_moe_ops.cpp (the mixture-of-experts ops: router, permutation, grouped linear) and
// cuda_fp8_ops.cpp (train.fp8's amax and fp8 linear, emulated on the linear's GEMMs). Each op
// validates its arguments with op_checks (the same messages as every backend), picks
// the element type and launches the kernels of its .cu file on the caller's stream.
// Private to this folder.
#pragma once

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/options.h"
#include "backend/cuda/adamw.h"
#include "backend/cuda/allocator.h"
#include "backend/cuda/attention.h"
#include "backend/cuda/common.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/memory.h"

#include <algorithm>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

namespace kiln::cuda {

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, const BackendOptions& options);
  ~CudaBackend() override;

  std::string name() const override { return "cuda"; }
  std::string gemm_path(DType dtype) const override;
  Device device() const override { return Device::cuda(device_); }
  Allocator& allocator() override { return *alloc_; }
  Allocator& staging_allocator() override { return pinned_; }
  Stream default_stream() override { return Stream{stream_}; }
  void synchronize(Stream s) override;
  int64_t record_marker(Stream s) override;
  double marker_elapsed_ms(int64_t from, int64_t to) override;
  void release_markers() override { markers_used_ = 0; }

  // ---- memory (cuda_backend.cpp) --------------------------------------------------------
  void copy_from_host(Stream s, const Tensor& dst, const void* src) override;
  void copy_to_host(Stream s, void* dst, const Tensor& src) override;
  void copy(Stream s, const Tensor& dst, const Tensor& src) override;
  void copy_stochastic_round(Stream s, const Tensor& dst, const Tensor& src, uint64_t seed,
                             uint64_t stream, const GlobalIndices& at) override;
  void fill(Stream s, const Tensor& t, float value) override;

  // ---- ops (cuda_ops.cpp) -----------------------------------------------------------------
  void embedding_forward(Stream s, const Tensor& out, const Tensor& tokens,
                         const Tensor& positions, const Tensor& wte, const Tensor& wpe) override;
  void embedding_backward(Stream s, const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                          const Tensor& tokens, const Tensor& positions) override;
  void layernorm_forward(Stream s, const Tensor& out, const Tensor& mean, const Tensor& rstd,
                         const Tensor& inp, const Tensor& weight, const Tensor& bias,
                         float eps) override;
  void layernorm_backward(Stream s, const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                          const Tensor& dout, const Tensor& inp, const Tensor& weight,
                          const Tensor& mean, const Tensor& rstd) override;
  void rmsnorm_forward(Stream s, const Tensor& out, const Tensor& rstd, const Tensor& inp,
                       const Tensor& weight, float eps) override;
  void rmsnorm_backward(Stream s, const Tensor& dinp, const Tensor& dweight, const Tensor& dout,
                        const Tensor& inp, const Tensor& weight, const Tensor& rstd) override;
  void linear_forward(Stream s, const Tensor& out, const Tensor& inp, const Tensor& weight,
                      const Tensor& bias) override;
  void linear_backward(Stream s, const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                       const Tensor& dout, const Tensor& inp, const Tensor& weight) override;
  void fp8_amax(Stream s, const Tensor& amax, const Tensor& x) override;
  void fp8_amax_history(Stream s, const Tensor& amax, const Tensor& history,
                        const Tensor& step_amax, int64_t slot, bool most_recent) override;
  void fp8_linear_forward(Stream s, const Tensor& out, const Tensor& inp, const Tensor& weight,
                          const Tensor& bias, const Tensor& amax) override;
  void fp8_linear_backward(Stream s, const Tensor& dinp, const Tensor& dweight,
                           const Tensor& dbias, const Tensor& dout, const Tensor& inp,
                           const Tensor& weight, const Tensor& amax) override;
  void gelu_forward(Stream s, const Tensor& out, const Tensor& inp) override;
  void gelu_backward(Stream s, const Tensor& dinp, const Tensor& dout, const Tensor& inp) override;
  void silu_forward(Stream s, const Tensor& out, const Tensor& inp) override;
  void silu_backward(Stream s, const Tensor& dinp, const Tensor& dout, const Tensor& inp) override;
  void swiglu_forward(Stream s, const Tensor& out, const Tensor& inp) override;
  void swiglu_backward(Stream s, const Tensor& dinp, const Tensor& dout,
                       const Tensor& inp) override;
  void add(Stream s, const Tensor& out, const Tensor& a, const Tensor& b) override;
  void add_columns(Stream s, const Tensor& out, const Tensor& src, int64_t out_col,
                   float alpha) override;
  void dropout_forward(Stream s, const Tensor& out, const Tensor& inp,
                       const DropoutSpec& spec) override;
  void dropout_backward(Stream s, const Tensor& dinp, const Tensor& dout,
                        const DropoutSpec& spec) override;

  // ---- DiT ops (cuda_dit_ops.cpp) ---------------------------------------------------------
  void modulate(Stream s, const Tensor& out, const Tensor& x, const Tensor& mod, int scale_index,
                int shift_index, float scale_offset) override;
  void modulate_backward(Stream s, const Tensor& dx, const Tensor& dmod, const Tensor& dout,
                         const Tensor& x, const Tensor& mod, int scale_index, int shift_index,
                         float scale_offset) override;
  void rectified_flow_inputs(Stream s, const Tensor& xt, const Tensor& target,
                             const Tensor& images, const Tensor& noise, const Tensor& t) override;
  void mse_loss(Stream s, const Tensor& losses, const Tensor& dpred, const Tensor& pred,
                const Tensor& target, float grad_scale) override;

  // ---- attention (cuda_attention_ops.cpp) -------------------------------------------------
  void attention_forward(Stream s, const Tensor& out, const Tensor& lse, const Tensor& qkv,
                         const AttentionShape& shape, const DropoutSpec& dropout) override;
  void attention_backward(Stream s, const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                          const Tensor& out, const Tensor& lse, const AttentionShape& shape,
                          const DropoutSpec& dropout) override;
  void attention_varlen_forward(Stream s, const Tensor& out, const Tensor& lse,
                                const Tensor& qkv, const Tensor& cu_seqlens,
                                const AttentionShape& shape, const DropoutSpec& dropout) override;
  void attention_varlen_backward(Stream s, const Tensor& dqkv, const Tensor& dout,
                                 const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                 const Tensor& cu_seqlens, const AttentionShape& shape,
                                 const DropoutSpec& dropout) override;
  // Context parallelism's (ring attention's) ops.
  void attention_tile_forward(Stream s, const Tensor& out_acc, const Tensor& lse,
                              const Tensor& qkv, const Tensor& kv, const Tensor& cu_seqlens,
                              const AttentionShape& shape, const AttentionTile& tile) override;
  void attention_tile_backward(Stream s, const Tensor& dq, const Tensor& dkv, const Tensor& dout,
                               const Tensor& qkv, const Tensor& kv, const Tensor& out,
                               const Tensor& lse, const Tensor& cu_seqlens,
                               const AttentionShape& shape, const AttentionTile& tile) override;
  void copy_columns(Stream s, const Tensor& dst, const Tensor& src, int64_t dst_col,
                    int64_t src_col, int64_t ncols) override;
  void attention_decode(Stream s, const Tensor& out, const Tensor& k_cache, const Tensor& v_cache,
                        const Tensor& qkv, int64_t past, const AttentionShape& shape) override;
  void rope_forward(Stream s, const Tensor& qkv, const Tensor& positions,
                    const AttentionShape& shape, const RopeSpec& rope) override;
  void rope_backward(Stream s, const Tensor& dqkv, const Tensor& positions,
                     const AttentionShape& shape, const RopeSpec& rope) override;

  // ---- mixture of experts (cuda_moe_ops.cpp) -----------------------------------------------
  void moe_router_forward(Stream s, const Tensor& scores, const Tensor& expert_idx,
                          const Tensor& expert_weight, const Tensor& logits, const Tensor& bias,
                          const MoeRouterSpec& spec) override;
  void moe_router_backward(Stream s, const Tensor& dlogits, const Tensor& dexpert_weight,
                           const Tensor& dscores, const Tensor& scores, const Tensor& expert_idx,
                           const MoeRouterSpec& spec) override;
  void moe_balance_stats(Stream s, const Tensor& load, const Tensor& prob, const Tensor& z,
                         const Tensor& logits, const Tensor& expert_idx, MoeScoring scoring,
                         float prob_scale, float z_scale) override;
  void moe_balance_backward(Stream s, const Tensor& dlogits, const Tensor& logits,
                            const Tensor& load, MoeScoring scoring, float aux_scale,
                            float z_scale) override;
  void moe_permute_plan(Stream s, const Tensor& offsets, const Tensor& rows,
                        const Tensor& expert_idx, int64_t capacity) override;
  void moe_permute(Stream s, const Tensor& out, const Tensor& inp, const Tensor& rows) override;
  void moe_permute_backward(Stream s, const Tensor& dinp, const Tensor& dout,
                            const Tensor& rows) override;
  void moe_unpermute(Stream s, const Tensor& out, const Tensor& expert_out,
                     const Tensor& expert_weight, const Tensor& rows) override;
  void moe_unpermute_backward(Stream s, const Tensor& dexpert_out, const Tensor& dexpert_weight,
                              const Tensor& dout, const Tensor& expert_out,
                              const Tensor& expert_weight, const Tensor& rows) override;
  void grouped_linear_forward(Stream s, const Tensor& out, const Tensor& inp, const Tensor& weight,
                              const Tensor& offsets) override;
  void grouped_linear_backward(Stream s, const Tensor& dinp, const Tensor& dweight,
                               const Tensor& dout, const Tensor& inp, const Tensor& weight,
                               const Tensor& offsets) override;

  // ---- loss and optimizer (cuda_backend.cpp) ----------------------------------------------
  void softmax_cross_entropy(Stream s, const Tensor& losses, const Tensor& dlogits,
                             const Tensor& logits, const Tensor& targets, int vocab_size,
                             int ignore_index, float grad_scale) override;
  void cross_entropy_shard_stats(Stream s, const Tensor& stats, const Tensor& logits,
                                 const Tensor& targets, int64_t vocab_begin, int valid) override;
  void cross_entropy_shard_backward(Stream s, const Tensor& dlogits, const Tensor& logits,
                                    const Tensor& targets, const Tensor& lse, int64_t vocab_begin,
                                    int valid, int ignore_index, float grad_scale) override;
  void shard_ids(Stream s, const Tensor& out, const Tensor& ids, int64_t begin,
                 int64_t count) override;
  void patchify(Stream s, const Tensor& out, const Tensor& images, int patch) override;
  void unpatchify(Stream s, const Tensor& images, const Tensor& patches, int patch) override;
  void accumulate_loss(Stream s, const Tensor& acc, const Tensor& losses,
                       const Tensor& targets) override;
  void cross_entropy_shard_combine(Stream s, const Tensor& lse, const Tensor& acc,
                                   const Tensor& stats, const Tensor& targets) override;
  void sum_squares(Stream s, const Tensor& acc, const Tensor& x) override;
  void clip_coefficient(Stream s, const Tensor& coef, const Tensor& sumsq, const Tensor& check,
                        double max_norm, float loss_scale) override;
  void adamw_step(Stream s, const Tensor& param, const Tensor& grad, const Tensor& m,
                  const Tensor& v, const Tensor& scale, const AdamWParams& hp) override;
  void adamw_multi_step(Stream s, std::span<const AdamWTensor> tensors, const Tensor& scale,
                        const AdamWParams& hp) override;
  void ema_update(Stream s, const Tensor& ema, const Tensor& param, float decay) override;

 protected:
  bool runs(Op op, DType dtype) const override { return cuda_supports(op, dtype); }

 private:
  // Scratch memory for one op (Temporaries). On the backend's stream it is the scratch
  // arena: one buffer every op reuses (ops on one stream run in order, so the next op's
  // use follows this one's), grown to the largest request and then kept, so that a
  // step allocates nothing once the first has run. A second Scratch alive at once, or
  // an op on another stream, gets its own allocation, freed on the backend's stream
  // after that stream waits for the other's work.
  class Scratch {
   public:
    Scratch(CudaBackend& be, cudaStream_t s, size_t bytes) : be_(be), s_(s) {
      const int64_t words = std::max<int64_t>(1, static_cast<int64_t>((bytes + 3) / 4));
      if (s == be.stream_ && !be.arena_in_use_) {
        if (be.arena_.numel() < words) {
          be.arena_ = Tensor();  // freed in stream order: earlier ops' uses come first
          be.arena_ = be.empty({words}, DType::I32, MemCategory::Temporaries);
        }
        be.arena_in_use_ = arena_ = true;
        ptr_ = be.arena_.raw();
        return;
      }
      t_ = be.empty({words}, DType::I32, MemCategory::Temporaries);
      ptr_ = t_.raw();
    }
    ~Scratch() {
      if (arena_) be_.arena_in_use_ = false;
      if (s_ != be_.stream_) {
        (void)cudaEventRecord(be_.scratch_event_, s_);
        (void)cudaStreamWaitEvent(be_.stream_, be_.scratch_event_, 0);
      }
    }
    Scratch(const Scratch&) = delete;
    Scratch& operator=(const Scratch&) = delete;
    void* ptr() const { return ptr_; }

   private:
    CudaBackend& be_;
    cudaStream_t s_;
    Tensor t_;
    bool arena_ = false;
    void* ptr_ = nullptr;
  };

  cudaStream_t st(Stream s) const {
    return s.handle ? static_cast<cudaStream_t>(s.handle) : stream_;
  }

  static void on_device(const Tensor& t, const char* op);
  // on_device for each of `ts`, the empty ones skipped.
  static void on_device_all(std::initializer_list<const Tensor*> ts, const char* op);
  // A grouped linear's offsets [E+1] copied to the host (synchronising stream s) and
  // checked as every backend checks them (checks::grouped_linear_offsets).
  std::vector<int32_t> host_offsets(Stream s, const Tensor& offsets, int64_t M, int64_t E,
                                    const char* op);
  // The kernels' AdamW arguments (bias corrections in double, as the CPU backend).
  cuda::AdamWArgs adamw_args(const Tensor& scale, const AdamWParams& hp) const;
  // The element type of `t` (fp32 or bf16; else kiln::Error), checking that the other
  // floating tensors of the op (empty ones skipped) have the same dtype.
  static Elem elem(const Tensor& t, const char* op, std::initializer_list<const Tensor*> same = {});
  // The element type of a parameter gradient: fp32 (with bf16 activations e) or e itself
  // (checks::grad_of's rule); `same` (empty ones skipped) must have the same dtype.
  static Elem grad_elem(const Tensor& g, Elem e, const char* op,
                        std::initializer_list<const Tensor*> same = {});
  static FloatKind float_kind(const Tensor& t, const char* op);
  static void head_dim_ok(int64_t hd, const char* op);
  static AttnDropout drop(const DropoutSpec& d);
  void run_dropout(Stream s, const Tensor& out, const Tensor& inp, const DropoutSpec& spec,
                   const char* op);
  void rope_apply(const Tensor& qkv, const Tensor& positions, const AttentionShape& shape,
                  const RopeSpec& rope, Stream s, float sign, const char* op);

  int device_;
  bool simt_attention_ = false;  // BackendOptions::attention == Simt
  std::string device_name_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t scratch_event_ = nullptr;
  std::vector<cudaEvent_t> markers_;  // timing events, created on demand and reused
  size_t markers_used_ = 0;
  std::unique_ptr<CudaAllocator> alloc_;
  Tensor arena_;  // Scratch's on the backend's stream (released in ~CudaBackend)
  bool arena_in_use_ = false;
  PinnedHostAllocator pinned_;
  std::unique_ptr<Gemm> gemm_;
  Tensor workspace_;
};

}  // namespace kiln::cuda
