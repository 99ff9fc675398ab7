// AdamW over a list of parameter segments, with weight decay chosen per parameter.
//
// A segment is a contiguous element range [begin, end) of one named parameter, with
// views of its values and gradients wherever they live: the whole model's flat buffers
// for a single process or ZeRO stage 0, one rank's shard under ZeRO-1/2/3. The first
// and second moments m and v (fp32, OptimizerState) are stored for the segments only.
// Mixed precision: when a segment's parameter is bf16/fp16, the optimizer keeps an fp32
// master copy (counted as OptimizerState, as in the ZeRO paper's 16 bytes per parameter:
// 2 + 2 + 4 master + 4 + 4), updates the master, and writes the parameter back rounded
// to nearest even (Micikevicius et al. 2018, "Mixed Precision Training").
// With ema_decay > 0 it also keeps an exponential moving average of the weights (fp32,
// OptimizerState, same offsets as m and v), updated after every step from the master (or
// fp32 parameter) values: kept for the segments only, so sharded like the masters under
// ZeRO.
// An update is one Backend::adamw_multi_step over every segment (the masters' rounding
// to the parameters in the same pass), unless bf16 parameters take stochastic rounding
// or AdamWConfig::multi_tensor is off (optim.multi_tensor = false): then adamw_step and a
// copy per segment, bitwise the same results in more launches.
// Math: Loshchilov & Hutter 2019 as torch.optim.AdamW (see AdamWParams in backend.h).
#pragma once

#include "backend/backend.h"
#include "nn/parameter.h"

#include <vector>

namespace kiln {

struct AdamWConfig {
  float lr = 6e-4f;
  double beta1 = 0.9;  // doubles, as PyTorch's (bias corrections are computed in double)
  double beta2 = 0.95;
  float eps = 1e-8f;
  float weight_decay = 0.1f;  // applied to parameters with ParamSpec::weight_decay
  /// bf16 parameters written back from the fp32 masters with stochastic rounding
  /// (Backend::copy_stochastic_round) instead of round-to-nearest. The random bits of
  /// update t for element g (row-major in the full, unsharded tensor) of the parameter
  /// numbered k in the whole model (ParamSpec::init_stream) are Philox(seed, stream
  /// t * 2^20 + k) word g: the same wherever the element lives (a tp shard, a ZeRO
  /// piece, a pipeline stage's tied copy), independent across elements and parameters,
  /// and replayed by a resumed run.
  bool stochastic_rounding = false;
  uint64_t seed = 0;
  /// Exponential moving average of the weights (train.ema_decay): after every step,
  /// ema = ema_decay * ema + (1 - ema_decay) * weights (Backend::ema_update); 0 = none kept.
  float ema_decay = 0.f;
  /// One Backend::adamw_multi_step over every segment (optim.multi_tensor); false: one
  /// adamw_step and one copy per segment. Bitwise the same results either way.
  bool multi_tensor = true;
};

struct AdamWSegment {
  ParamSpec spec;          // the parameter (name, global shape, tp slice, decay)
  int64_t begin = 0;       // first element covered, row-major in the rank's tensor (its
                           // tp slice, spec.local_shape(); the global tensor unless sharded)
  int64_t end = 0;         // one past the last
  Tensor param, grad;      // [end - begin] views of its values and gradient
  int64_t size() const { return end - begin; }
};

/// One copy_stochastic_round of a segment: its elements [offset, offset + n) (from the
/// segment's first) and where they sit in the full tensor.
struct RoundingBlock {
  int64_t offset = 0, n = 0;
  GlobalIndices at;
};

/// The segment's elements as blocks of equal global runs at a constant distance, in
/// order: one block per piece of a tp slice (q, k, v; gate, up) and at most two more
/// where a ZeRO boundary cuts a row. A row-parallel shard is one block of many rows.
std::vector<RoundingBlock> rounding_blocks(const AdamWSegment& s);

/// Segments covering every trainable parameter whole, in flat buffers laid out by
/// `params` (a gradient at its parameter's offset); frozen parameters have none.
std::vector<AdamWSegment> whole_segments(const std::vector<ParamSpec>& params,
                                         const Tensor& param_buffer, const Tensor& grad_buffer);

class AdamW {
 public:
  AdamW(Backend& backend, std::vector<AdamWSegment> segments, const AdamWConfig& config);
  /// Every trainable parameter of flat buffers laid out by `params` (single process,
  /// ZeRO-0).
  AdamW(Backend& backend, const std::vector<ParamSpec>& params, const Tensor& param_buffer,
        const Tensor& grad_buffer, const AdamWConfig& config);

  /// One update with learning rate `lr`; gradients are multiplied by grad_scale first
  /// (gradient clipping, loss unscaling) and, when `scale` (fp32 [1] on the backend's
  /// device, e.g. Backend::clip_coefficient's) is given, by scale[0], read there: a
  /// non-finite scale[0] leaves every parameter and moment unchanged (Backend::
  /// adamw_step). Increments step_count() either way.
  void step(float lr, float grad_scale = 1.f, const Tensor& scale = {});
  /// Master weights <- the (low-precision) parameters, after they were initialised or
  /// loaded without masters (no-op for fp32 parameters); then reset_ema().
  void sync_master_from_params();
  /// Segment i's weights <- host fp32 [segments()[i].size()] at full precision: its
  /// master (or its fp32 parameter) takes them as they are, a low-precision parameter
  /// their rounding to nearest from the master, so that a fine-tune from fp32 weights
  /// keeps their low bits. Call reset_ema() after the last segment.
  void set_weights(size_t i, const float* host);
  /// Segment i's fp32 master weights, or an empty Tensor when its parameter is fp32.
  Tensor master(size_t i) const;
  /// The moving average <- the weights (the masters, or the fp32 parameters), as at the
  /// start of training. No-op without an EMA. The constructor does it once (whatever the
  /// parameters hold then); sync_master_from_params() again.
  void reset_ema();
  /// Segment i's moving average of the weights, fp32 [segments()[i].size()], or an empty
  /// Tensor when config().ema_decay is 0.
  Tensor ema(size_t i) const;

  int64_t step_count() const { return step_; }
  void set_step_count(int64_t s) { step_ = s; }
  const AdamWConfig& config() const { return config_; }
  Backend& backend() const { return backend_; }
  const std::vector<AdamWSegment>& segments() const { return segments_; }
  /// Moments of segment i, fp32 [segments()[i].size()].
  Tensor m(size_t i) const;
  Tensor v(size_t i) const;

 private:
  Backend& backend_;
  AdamWConfig config_;
  std::vector<AdamWSegment> segments_;
  std::vector<int64_t> state_offset_;  // of each segment within m_ / v_
  Tensor m_, v_;
  Tensor master_;  // fp32 masters of the low-precision segments (same offsets as m_)
  Tensor ema_;     // fp32 moving average of every segment's weights (same offsets as m_)
  std::vector<AdamWTensor> multi_;  // every non-empty segment, for adamw_multi_step; empty
                                    // when each segment is updated by itself
  std::vector<std::vector<RoundingBlock>> rounding_;  // per segment, when rounded stochastically
  int64_t step_ = 0;
};

/// Scale for clipping to max_norm (torch.nn.utils.clip_grad_norm_): min(1, max_norm /
/// (norm + 1e-6)); 1 when max_norm <= 0 (clipping off).
float clip_scale(double norm, double max_norm);

}  // namespace kiln
