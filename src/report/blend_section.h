// The report's data-blend section: what a run on data.blend adds to its metrics records
// (the trainer's step_record, src/train/metrics_record.cpp). Internal to kiln_report.
#pragma once

#include "report/report.h"

#include <string>

namespace kiln::report {

/// The "Data blend" section, or "" when no record has "tokens_by_data" (a run on one data
/// set is unchanged). Reads per record "tokens_by_data" {dir: tokens seen} and, at
/// evaluations, "val_loss_by_data" {dir: val loss}. Draws, per data set (the lowest rank
/// that logs it; every rank logs the same figures), its share of the tokens seen so far
/// and its val loss over steps, and tabulates both at the last record.
std::string blend_section(const RunData& run);

}  // namespace kiln::report
