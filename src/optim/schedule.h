// Learning-rate schedules over optimizer updates: linear warmup, then cosine (Loshchilov &
// Hutter 2017, "SGDR", without restarts), constant, or warmup-stable-decay (WSD: Hu et al.
// 2024, "MiniCPM"). docs/config.md gives the formulas; the config keys map onto
// LrSchedule in config/config.cpp (lr_schedule_of).
#pragma once

#include <cstdint>
#include <string_view>

namespace kiln {

struct LrSchedule {
  enum class Kind { Cosine, Constant, Wsd };
  Kind kind = Kind::Cosine;
  double lr = 0.0;              // peak
  double min_lr = 0.0;          // final (cosine, wsd)
  int64_t warmup_steps = 0;     // W
  int64_t total_steps = 0;      // S
  double decay_fraction = 0.2;  // wsd: the last round(decay_fraction * S) updates decay
};

/// "cosine" | "constant" | "wsd"; throws kiln::Error otherwise.
LrSchedule::Kind parse_lr_schedule_kind(std::string_view s);

/// The learning rate of update `step` (counting from 0):
///   step < W:  lr * (step + 1) / W
///   cosine:    min_lr + (lr - min_lr) (1 + cos(pi (step - W) / (S - W))) / 2, min_lr from S
///   constant:  lr
///   wsd:       lr until D = max(W, S - round(decay_fraction S)), then linear to min_lr at S
/// Throws kiln::Error for step < 0.
double learning_rate(const LrSchedule& s, int64_t step);

}  // namespace kiln
