// AdamW over a model's flat parameter buffer, with weight decay chosen per parameter.
//
// The optimizer state (first and second moments m and v, fp32) covers a contiguous
// range [begin, end) of the flat buffer: the whole buffer for a single process or
// ZeRO stage 0, one rank's shard under ZeRO-1/2/3. Parameters that straddle the range
// are updated on their overlapping part. State is counted as OptimizerState.
// Math: Loshchilov & Hutter 2019 as torch.optim.AdamW (see AdamWParams in backend.h).
#pragma once

#include "backend/backend.h"
#include "nn/parameter.h"

#include <vector>

namespace kiln {

struct AdamWConfig {
  float lr = 6e-4f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;  // applied to parameters with ParamSpec::weight_decay
};

class AdamW {
 public:
  /// params: the layout of `param_buffer`/`grad_buffer` (flat, same length). The
  /// optimizer updates elements [begin, end) (end = -1: to the end of the buffer);
  /// `param_buffer` and `grad_buffer` must cover at least that range at the same offsets.
  AdamW(Backend& backend, const std::vector<ParamSpec>& params, const Tensor& param_buffer,
        const Tensor& grad_buffer, const AdamWConfig& config, int64_t begin = 0,
        int64_t end = -1);

  /// One update with learning rate `lr`; gradients are multiplied by grad_scale first
  /// (gradient clipping). Increments step().
  void step(float lr, float grad_scale = 1.f);

  int64_t step_count() const { return step_; }
  void set_step_count(int64_t s) { step_ = s; }
  const AdamWConfig& config() const { return config_; }
  /// First and second moments over [begin, end), fp32.
  const Tensor& m() const { return m_; }
  const Tensor& v() const { return v_; }
  int64_t begin() const { return begin_; }
  int64_t end() const { return end_; }

 private:
  struct Segment {
    int64_t offset, length;  // within the flat buffer
    bool decay;
  };
  Backend& backend_;
  AdamWConfig config_;
  Tensor params_, grads_;
  Tensor m_, v_;
  int64_t begin_, end_;
  std::vector<Segment> segments_;
  int64_t step_ = 0;
};

/// The global L2 norm of the gradients in `grad_buffer` (sum of squares in double).
/// The caller adds the shards of other ranks (see parallel/) before taking the root.
double grad_sum_squares(Backend& backend, const Tensor& grad_buffer);

/// Scale for clipping to max_norm (torch.nn.utils.clip_grad_norm_): min(1, max_norm /
/// (norm + 1e-6)); 1 when max_norm <= 0 (clipping off).
float clip_scale(double norm, double max_norm);

}  // namespace kiln
