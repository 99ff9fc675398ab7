#include "report/moe_section.h"

#include "report/charts.h"

#include <fmt/format.h>

#include <cmath>
#include <optional>
#include <vector>

namespace kiln::report {

namespace {

using nlohmann::json;

// Tokens per expert ((token, choice) slots) over a set of experts.
struct Load {
  double min = NAN, mean = NAN, max = NAN;
};

double number_or_nan(const json& j) { return j.is_number() ? j.get<double>() : NAN; }

// r[key][name] as a number, NAN when absent.
double field(const json& r, const char* key, const char* name) {
  if (!r.contains(key) || !r[key].is_object() || !r[key].contains(name)) return NAN;
  return number_or_nan(r[key][name]);
}

// A load written as {"min", "mean", "max"} (the summary) or [min, mean, max] (per layer).
std::optional<Load> load_of(const json& j) {
  if (j.is_object() && j.contains("min") && j.contains("mean") && j.contains("max"))
    return Load{number_or_nan(j["min"]), number_or_nan(j["mean"]), number_or_nan(j["max"])};
  if (j.is_array() && j.size() == 3)
    return Load{number_or_nan(j[0]), number_or_nan(j[1]), number_or_nan(j[2])};
  return std::nullopt;
}

// The summary's `which` ("min" or "max") over its mean: 1 is balanced (NAN without a positive mean).
Metric load_ratio(const char* which) {
  return [which](const json& r) {
    const double mean = field(r, "moe_tokens_per_expert", "mean");
    return mean > 0 ? field(r, "moe_tokens_per_expert", which) / mean : NAN;
  };
}

// The selection bias's `which` ("min" or "max") over every MoE layer's experts.
Metric bias_bound(const char* which) {
  return [which](const json& r) { return field(r, "moe_expert_bias", which); };
}

bool has_moe_keys(const RunData& run) {
  for (const auto& [rank, recs] : run.records)
    for (const auto& r : recs)
      if (r.contains("moe_aux_loss") || r.contains("moe_tokens_per_expert")) return true;
  return false;
}

// The last record with a per-layer load array, of the lowest rank that has one; null when none.
const json* last_by_layer_record(const RunData& run) {
  for (const auto& [rank, recs] : run.records)
    for (auto it = recs.rbegin(); it != recs.rend(); ++it)
      if (it->contains("moe_tokens_per_expert_by_layer") &&
          (*it)["moe_tokens_per_expert_by_layer"].is_array())
        return &*it;
  return nullptr;
}

std::string ratio_text(double part, double mean) {
  return mean > 0 && std::isfinite(part) ? fmt::format("{:.3f}", part / mean) : "-";
}

std::string load_row(const std::string& name, const Load& l) {
  return fmt::format("<tr><td>{}</td><td>{:.6g}</td><td>{:.6g}</td><td>{:.6g}</td><td>{}</td>"
                     "<td>{}</td></tr>\n",
                     name, l.min, l.mean, l.max, ratio_text(l.max, l.mean),
                     ratio_text(l.min, l.mean));
}

// The losses and the bias at the table's update, one line.
std::string last_values_line(const json& r) {
  const std::string step = r.contains("step") ? r["step"].dump() : "?";
  const double aux = r.contains("moe_aux_loss") ? number_or_nan(r["moe_aux_loss"]) : NAN;
  const double z = r.contains("moe_z_loss") ? number_or_nan(r["moe_z_loss"]) : NAN;
  std::string line = fmt::format("At update {}: aux loss {:.4g}, z-loss {:.4g}", step, aux, z);
  if (r.contains("moe_expert_bias"))
    line += fmt::format(", selection bias from {:.4g} to {:.4g}",
                        field(r, "moe_expert_bias", "min"), field(r, "moe_expert_bias", "max"));
  if (r.contains("moe_dropped_fraction"))
    line += fmt::format(", {:.4g}% of the slots dropped",
                        100.0 * number_or_nan(r["moe_dropped_fraction"]));
  return "<div>" + line + ".</div>\n";
}

// Each MoE layer's load at the last logged update, then all layers together.
std::string layer_table(const json& r) {
  std::string h = "<table>\n<tr><th>MoE layer (MoE blocks only, from 0)</th>"
                   "<th>min tokens per expert</th><th>mean</th><th>max</th><th>max / mean</th>"
                   "<th>min / mean</th></tr>\n";
  const json& layers = r["moe_tokens_per_expert_by_layer"];
  for (size_t i = 0; i < layers.size(); ++i)
    if (const auto l = load_of(layers[i])) h += load_row(std::to_string(i), *l);
  if (r.contains("moe_tokens_per_expert"))
    if (const auto all = load_of(r["moe_tokens_per_expert"])) h += load_row("all", *all);
  return h + "</table>\n";
}

}  // namespace

std::string moe_section(const RunData& run) {
  if (!has_moe_keys(run)) return {};
  std::string h = "<h2>Mixture of experts</h2>\n"
                  "<div class=\"sub\">Tokens per expert: the (token, choice) slots an expert "
                  "received in the update's global batch. Load max / mean is 1 when balanced and "
                  "at most experts / top_k (one expert takes every token); the LM loss is on the "
                  "Loss chart, apart from the balancing losses.</div>\n<div class=\"grid\">\n";
  std::vector<Series> losses = per_rank(run, "moe_aux_loss", "aux loss");
  for (auto& s : per_rank(run, "moe_z_loss", "z-loss")) losses.push_back(std::move(s));
  h += chart_card(losses, "MoE balancing losses (coefficients applied)", "loss");
  std::vector<Series> load = per_rank(run, load_ratio("max"), "max / mean");
  for (auto& s : per_rank(run, load_ratio("min"), "min / mean", true)) load.push_back(std::move(s));
  if (!load.empty())
    h += chart_card(load, "Expert load imbalance (all MoE layers)", "tokens per expert / mean");
  std::vector<Series> bias = per_rank(run, bias_bound("max"), "bias max");
  for (auto& s : per_rank(run, bias_bound("min"), "bias min", true)) bias.push_back(std::move(s));
  if (!bias.empty())
    h += chart_card(bias, "Expert selection bias range (auxiliary-loss-free)", "bias");
  const std::vector<Series> dropped = per_rank(run, "moe_dropped_fraction", "dropped fraction");
  if (!dropped.empty())
    h += chart_card(dropped, "Slots dropped past the expert capacity (all MoE layers)",
                    "fraction of slots");
  h += "</div>\n";
  if (const json* r = last_by_layer_record(run)) {
    h += "<h3>Expert load by MoE layer at the last logged update</h3>\n";
    h += last_values_line(*r) + layer_table(*r);
  }
  return h;
}

}  // namespace kiln::report
