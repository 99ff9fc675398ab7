#include "report/charts.h"

#include <fmt/format.h>

#include <cmath>

namespace kiln::report {

Metric metric_key(const std::string& key, double scale) {
  return [key, scale](const nlohmann::json& r) {
    return r.contains(key) && r[key].is_number() ? r[key].get<double>() * scale : NAN;
  };
}

std::vector<Series> per_rank(const RunData& run, const Metric& metric, const std::string& label,
                             bool dashed, bool markers) {
  std::vector<Series> out;
  for (const auto& [rank, recs] : run.records) {
    Series s;
    s.name = fmt::format("{} (rank {})", label, rank);
    s.dashed = dashed;
    s.markers = markers;
    for (const auto& r : recs) {
      if (!r.contains("step") || !r["step"].is_number()) continue;
      const double v = metric(r);
      if (!std::isnan(v)) s.points.push_back({r["step"].get<double>(), v});
    }
    if (!s.points.empty()) out.push_back(std::move(s));
  }
  return out;
}

std::vector<Series> per_rank(const RunData& run, const std::string& key, const std::string& label,
                             double scale, bool dashed, bool markers) {
  return per_rank(run, metric_key(key, scale), label, dashed, markers);
}

std::string chart_card(const std::vector<Series>& series, const std::string& title,
                       const std::string& y_label) {
  ChartOptions o;
  o.title = title;
  o.y_label = y_label;
  return "<div class=\"card\">\n" + svg_line_chart(series, o) + "</div>\n";
}

}  // namespace kiln::report
