// The report's mixture-of-experts section: what a MoE run's metrics records add (the
// trainer's add_moe_record, src/train/metrics_record.cpp). Internal to kiln_report.
#pragma once

#include "report/report.h"

#include <string>

namespace kiln::report {

/// The "Mixture of experts" section, or "" when no record has a MoE key (a dense run's
/// page is unchanged). Reads per record: "moe_aux_loss", "moe_z_loss" (numbers, the
/// balancing losses with their coefficients applied), "moe_tokens_per_expert" {"min",
/// "mean", "max"} over every MoE layer and expert, "moe_tokens_per_expert_by_layer" (per
/// MoE layer [min, mean, max], or {"min", "mean", "max"}), with the auxiliary-loss-free
/// bias "moe_expert_bias" {"min", "max"} and with token dropping "moe_dropped_fraction".
/// Draws the balancing losses, the load imbalance (max / mean and min / mean tokens per
/// expert), the bias range and the dropped fraction over steps, per rank;
/// tabulates each MoE layer's load at the last record that has them (the lowest rank's).
std::string moe_section(const RunData& run);

}  // namespace kiln::report
