#include "optim/adamw.h"

#include <algorithm>

namespace kiln {

namespace {
// Stochastic rounding's Philox streams: update t of parameter k is stream t * 2^20 + k.
constexpr uint64_t kParamStreams = uint64_t{1} << 20;
}  // namespace

std::vector<AdamWSegment> whole_segments(const std::vector<ParamSpec>& params,
                                         const Tensor& param_buffer, const Tensor& grad_buffer) {
  std::vector<AdamWSegment> out;
  for (const ParamSpec& p : params) {
    if (!p.trainable) continue;  // frozen: no gradient, no optimizer state
    const int64_t n = p.local_shape().numel();
    out.push_back({p, 0, n, param_buffer.view_at(p.offset, Shape{n}),
                   grad_buffer.view_at(p.offset, Shape{n})});
  }
  return out;
}

std::vector<RoundingBlock> rounding_blocks(const AdamWSegment& s) {
  std::vector<RoundingBlock> out;
  for (const auto& run : s.spec.slice.global_runs(s.spec.shape, s.begin, s.end)) {
    const int64_t len = run.global_end - run.global_begin;
    if (!out.empty()) {  // another row of the last block?
      RoundingBlock& b = out.back();
      const int64_t row_len = b.at.row_len == 0 ? b.n : b.at.row_len, rows = b.n / row_len;
      const int64_t stride = rows == 1 ? run.global_begin - b.at.begin : b.at.stride;
      if (len == row_len && run.global_begin == b.at.begin + rows * stride) {
        b.at.row_len = row_len;
        b.at.stride = stride;
        b.n += len;
        continue;
      }
    }
    out.push_back({run.local_begin - s.begin, len, GlobalIndices{run.global_begin, 0, 0}});
  }
  return out;
}

AdamW::AdamW(Backend& backend, std::vector<AdamWSegment> segments, const AdamWConfig& config)
    : backend_(backend), config_(config), segments_(std::move(segments)) {
  int64_t total = 0;
  bool low_precision = false;
  for (const AdamWSegment& s : segments_) {
    KILN_CHECK(s.begin >= 0 && s.begin <= s.end && s.end <= s.spec.local_shape().numel() &&
                   s.param.numel() == s.size() && s.grad.numel() == s.size(),
               "AdamW: bad segment [{}, {}) of {}", s.begin, s.end, s.spec.name);
    state_offset_.push_back(total);
    total += s.size();
    low_precision |= s.param.dtype() != DType::F32;
  }
  KILN_CHECK(config_.ema_decay >= 0.f && config_.ema_decay < 1.f,
             "AdamW: ema_decay {} must be in [0, 1)", config_.ema_decay);
  if (config_.ema_decay > 0.f)
    ema_ = backend_.empty(Shape{total}, DType::F32, MemCategory::OptimizerState);
  if (low_precision)
    master_ = backend_.empty(Shape{total}, DType::F32, MemCategory::OptimizerState);
  sync_master_from_params();
  m_ = backend_.empty(Shape{total}, DType::F32, MemCategory::OptimizerState);
  v_ = backend_.empty(Shape{total}, DType::F32, MemCategory::OptimizerState);
  backend_.fill(backend_.default_stream(), m_, 0.f);
  backend_.fill(backend_.default_stream(), v_, 0.f);
  bool multi = config_.multi_tensor;
  for (const AdamWSegment& s : segments_) {
    const bool stochastic = config_.stochastic_rounding && s.param.dtype() == DType::BF16;
    KILN_CHECK(!stochastic || s.spec.init_stream < kParamStreams,
               "AdamW: parameter {} is number {} of the model; stochastic rounding keys at "
               "most {}", s.spec.name, s.spec.init_stream, kParamStreams);
    rounding_.push_back(stochastic ? rounding_blocks(s) : std::vector<RoundingBlock>{});
    multi &= !stochastic;
  }
  for (size_t i = 0; multi && i < segments_.size(); ++i) {
    const AdamWSegment& s = segments_[i];
    if (s.size() == 0) continue;
    multi_.push_back({s.param, master(i), s.grad, m(i), v(i),
                      s.spec.weight_decay ? config_.weight_decay : 0.f});
  }
}

AdamW::AdamW(Backend& backend, const std::vector<ParamSpec>& params, const Tensor& param_buffer,
             const Tensor& grad_buffer, const AdamWConfig& config)
    : AdamW(backend, whole_segments(params, param_buffer, grad_buffer), config) {}

Tensor AdamW::master(size_t i) const {
  if (!master_ || segments_[i].param.dtype() == DType::F32) return Tensor();
  return master_.view_at(state_offset_[i], Shape{segments_[i].size()});
}

void AdamW::sync_master_from_params() {
  for (size_t i = 0; i < segments_.size(); ++i)
    if (Tensor mw = master(i)) backend_.copy(backend_.default_stream(), mw, segments_[i].param);
  reset_ema();
}

void AdamW::set_weights(size_t i, const float* host) {
  const AdamWSegment& seg = segments_.at(i);
  const Tensor mw = master(i);
  upload_f32(backend_, mw ? mw : seg.param, host);
  if (mw) backend_.copy(backend_.default_stream(), seg.param, mw);
}

Tensor AdamW::ema(size_t i) const {
  if (!ema_) return Tensor();
  return ema_.view_at(state_offset_[i], Shape{segments_[i].size()});
}

void AdamW::reset_ema() {
  if (!ema_) return;
  for (size_t i = 0; i < segments_.size(); ++i) {
    const Tensor mw = master(i);
    backend_.copy(backend_.default_stream(), ema(i), mw ? mw : segments_[i].param);
  }
}

Tensor AdamW::m(size_t i) const { return m_.view_at(state_offset_[i], Shape{segments_[i].size()}); }
Tensor AdamW::v(size_t i) const { return v_.view_at(state_offset_[i], Shape{segments_[i].size()}); }

void AdamW::step(float lr, float grad_scale, const Tensor& scale) {
  ++step_;
  const Stream s = backend_.default_stream();
  AdamWParams hp;
  hp.lr = lr;
  hp.beta1 = config_.beta1;
  hp.beta2 = config_.beta2;
  hp.eps = config_.eps;
  hp.grad_scale = grad_scale;
  hp.step = step_;
  if (!multi_.empty()) backend_.adamw_multi_step(s, multi_, scale, hp);
  for (size_t i = 0; multi_.empty() && i < segments_.size(); ++i) {
    const AdamWSegment& seg = segments_[i];
    if (seg.size() == 0) continue;
    hp.weight_decay = seg.spec.weight_decay ? config_.weight_decay : 0.f;
    if (Tensor mw = master(i)) {
      backend_.adamw_step(s, mw, seg.grad, m(i), v(i), scale, hp);
      // Round the updated master to the parameter dtype.
      if (rounding_[i].empty()) backend_.copy(s, seg.param, mw);
      const uint64_t stream = static_cast<uint64_t>(step_) * kParamStreams + seg.spec.init_stream;
      for (const RoundingBlock& b : rounding_[i])
        backend_.copy_stochastic_round(s, seg.param.view_at(b.offset, Shape{b.n}),
                                       mw.view_at(b.offset, Shape{b.n}), config_.seed, stream,
                                       b.at);
    } else {
      backend_.adamw_step(s, seg.param, seg.grad, m(i), v(i), scale, hp);
    }
  }
  // The average follows the fp32 weights (the master, not its rounded copy).
  for (size_t i = 0; ema_ && i < segments_.size(); ++i) {
    if (segments_[i].size() == 0) continue;
    const Tensor mw = master(i);
    backend_.ema_update(s, ema(i), mw ? mw : segments_[i].param, config_.ema_decay);
  }
}

float clip_scale(double norm, double max_norm) {
  if (max_norm <= 0.0) return 1.f;
  return static_cast<float>(std::min(1.0, max_norm / (norm + 1e-6)));
}

}  // namespace kiln
