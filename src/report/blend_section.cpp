#include "report/blend_section.h"

#include "report/charts.h"

#include <fmt/format.h>

#include <cmath>
#include <set>

namespace kiln::report {

namespace {

using nlohmann::json;

// The lowest rank's records that have "tokens_by_data"; null when none has.
const std::vector<json>* blend_records(const RunData& run) {
  for (const auto& [rank, recs] : run.records)
    for (const auto& r : recs)
      if (r.contains("tokens_by_data") && r["tokens_by_data"].is_object()) return &recs;
  return nullptr;
}

// r[key][name] as a number, NAN when absent.
double field(const json& r, const char* key, const std::string& name) {
  if (!r.contains(key) || !r[key].is_object() || !r[key].contains(name) || !r[key][name].is_number())
    return NAN;
  return r[key][name].get<double>();
}

// data set `name`'s share of all tokens seen, in percent.
double share(const json& r, const std::string& name) {
  double total = 0;
  if (!r.contains("tokens_by_data") || !r["tokens_by_data"].is_object()) return NAN;
  for (const auto& [k, v] : r["tokens_by_data"].items())
    if (v.is_number()) total += v.get<double>();
  return total > 0 ? 100.0 * field(r, "tokens_by_data", name) / total : NAN;
}

// One series of `metric` per data set over the records' steps.
std::vector<Series> per_dataset(const std::vector<json>& recs, const std::set<std::string>& names,
                                double (*metric)(const json&, const std::string&), bool markers) {
  std::vector<Series> out;
  for (const auto& name : names) {
    Series s;
    s.name = name;
    s.markers = markers;
    for (const auto& r : recs) {
      const double v = metric(r, name);
      if (r.contains("step") && r["step"].is_number() && std::isfinite(v))
        s.points.push_back({r["step"].get<double>(), v});
    }
    if (!s.points.empty()) out.push_back(std::move(s));
  }
  return out;
}

double val_loss(const json& r, const std::string& name) { return field(r, "val_loss_by_data", name); }

}  // namespace

std::string blend_section(const RunData& run) {
  const std::vector<json>* recs = blend_records(run);
  if (recs == nullptr) return {};
  std::set<std::string> names;
  for (const auto& r : *recs)
    if (r.contains("tokens_by_data") && r["tokens_by_data"].is_object())
      for (const auto& [k, v] : r["tokens_by_data"].items()) names.insert(k);
  std::string h = "<h2>Data blend</h2>\n<div class=\"sub\">data.blend: each data set's share of "
                  "the tokens seen so far (it follows the weights within one sample) and its own "
                  "validation loss.</div>\n<div class=\"grid\">\n";
  h += chart_card(per_dataset(*recs, names, share, false), "Share of the tokens seen", "% of tokens");
  if (auto v = per_dataset(*recs, names, val_loss, true); !v.empty())
    h += chart_card(v, "Validation loss by data set", "nats per token");
  h += "</div>\n<table>\n<tr><th>data set</th><th>tokens seen</th><th>share</th><th>last val loss</th></tr>\n";
  for (const auto& name : names) {
    double tokens = NAN, pct = NAN, val = NAN;
    for (const auto& r : *recs) {
      if (std::isfinite(field(r, "tokens_by_data", name))) {
        tokens = field(r, "tokens_by_data", name);
        pct = share(r, name);
      }
      if (std::isfinite(val_loss(r, name))) val = val_loss(r, name);
    }
    h += fmt::format("<tr><td>{}</td><td>{:.0f}</td><td>{:.2f}%</td><td>{}</td></tr>\n", html_escape(name), tokens,
                     pct, std::isfinite(val) ? fmt::format("{:.4f}", val) : "-");
  }
  return h + "</table>\n";
}

}  // namespace kiln::report
