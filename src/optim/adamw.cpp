#include "optim/adamw.h"

#include <algorithm>

namespace kiln {

AdamW::AdamW(Backend& backend, const std::vector<ParamSpec>& params, const Tensor& param_buffer,
             const Tensor& grad_buffer, const AdamWConfig& config, int64_t begin, int64_t end)
    : backend_(backend), config_(config), params_(param_buffer), grads_(grad_buffer),
      begin_(begin), end_(end < 0 ? param_buffer.numel() : end) {
  KILN_CHECK(begin_ >= 0 && begin_ <= end_ && end_ <= param_buffer.numel() &&
                 grad_buffer.numel() == param_buffer.numel(),
             "AdamW: range [{}, {}) does not fit buffers {} / {}", begin_, end_, param_buffer.str(),
             grad_buffer.str());
  for (const ParamSpec& p : params) {
    const int64_t a = std::max(begin_, p.offset);
    const int64_t b = std::min(end_, p.offset + p.shape.numel());
    if (a < b) segments_.push_back({a, b - a, p.weight_decay});
  }
  m_ = backend_.empty(Shape{end_ - begin_}, DType::F32, MemCategory::OptimizerState);
  v_ = backend_.empty(Shape{end_ - begin_}, DType::F32, MemCategory::OptimizerState);
  backend_.fill(backend_.default_stream(), m_, 0.f);
  backend_.fill(backend_.default_stream(), v_, 0.f);
}

void AdamW::step(float lr, float grad_scale) {
  ++step_;
  const Stream s = backend_.default_stream();
  for (const Segment& seg : segments_) {
    AdamWParams hp;
    hp.lr = lr;
    hp.beta1 = config_.beta1;
    hp.beta2 = config_.beta2;
    hp.eps = config_.eps;
    hp.weight_decay = seg.decay ? config_.weight_decay : 0.f;
    hp.grad_scale = grad_scale;
    hp.step = step_;
    const Shape shape{seg.length};
    backend_.adamw_step(s, params_.view_at(seg.offset, shape), grads_.view_at(seg.offset, shape),
                        m_.view_at(seg.offset - begin_, shape),
                        v_.view_at(seg.offset - begin_, shape), hp);
  }
}

double grad_sum_squares(Backend& backend, const Tensor& grad_buffer) {
  return backend.sum_squares(backend.default_stream(), grad_buffer);
}

float clip_scale(double norm, double max_norm) {
  if (max_norm <= 0.0) return 1.f;
  return static_cast<float>(std::min(1.0, max_norm / (norm + 1e-6)));
}

}  // namespace kiln
