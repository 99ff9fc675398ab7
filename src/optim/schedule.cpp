#include "optim/schedule.h"

#include "core/error.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace kiln {

LrSchedule::Kind parse_lr_schedule_kind(std::string_view s) {
  if (s == "cosine") return LrSchedule::Kind::Cosine;
  if (s == "constant") return LrSchedule::Kind::Constant;
  if (s == "wsd") return LrSchedule::Kind::Wsd;
  KILN_FAIL("schedule kind must be cosine, constant or wsd, got '{}'", s);
}

double learning_rate(const LrSchedule& s, int64_t step) {
  KILN_CHECK(step >= 0, "learning_rate: step must be >= 0, got {}", step);
  const double lr = s.lr, min_lr = s.min_lr;
  const int64_t warmup = s.warmup_steps, steps = s.total_steps;
  if (step < warmup) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  if (s.kind == LrSchedule::Kind::Constant) return lr;
  if (step >= steps) return min_lr;
  if (s.kind == LrSchedule::Kind::Cosine) {
    double t = static_cast<double>(step - warmup) / static_cast<double>(steps - warmup);
    return min_lr + (lr - min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * t));
  }
  auto decay = static_cast<int64_t>(std::llround(s.decay_fraction * static_cast<double>(steps)));
  int64_t start = std::max(warmup, steps - decay);
  if (step < start) return lr;
  return lr + (min_lr - lr) * static_cast<double>(step - start) / static_cast<double>(steps - start);
}

}  // namespace kiln
