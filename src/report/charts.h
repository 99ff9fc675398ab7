// The report's chart building blocks, shared by its sections (report.cpp, moe_section.cpp):
// a quantity's series per rank from the run's records, and a chart in a page card.
// Internal to kiln_report.
#pragma once

#include "report/report.h"

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kiln::report {

/// A quantity read from one metrics record; NAN when the record does not have it.
using Metric = std::function<double(const nlohmann::json& record)>;

/// The number at `key` of a record (times `scale`), NAN when absent or not a number.
Metric metric_key(const std::string& key, double scale = 1.0);

/// The series of `metric` per rank over the records' "step", named "<label> (rank r)";
/// records without a numeric "step" or with a NAN metric are skipped, ranks with no point
/// are left out.
std::vector<Series> per_rank(const RunData& run, const Metric& metric, const std::string& label,
                             bool dashed = false, bool markers = false);

/// per_rank of the number at `key`, times `scale`.
std::vector<Series> per_rank(const RunData& run, const std::string& key, const std::string& label,
                             double scale = 1.0, bool dashed = false, bool markers = false);

/// One chart (svg_line_chart with the default size) in a <div class="card">.
std::string chart_card(const std::vector<Series>& series, const std::string& title,
                       const std::string& y_label);

}  // namespace kiln::report
