#include "profile/summary.h"

#include "core/error.h"
#include "profile/profiling_backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>

namespace kiln::profile {

std::string op_kind(std::string_view name, std::string_view category) {
  auto starts = [&](std::string_view p) { return name.substr(0, p.size()) == p; };
  if (name.find("[classifier]") != std::string_view::npos || starts("softmax_cross_entropy") ||
      starts("cross_entropy") || starts("accumulate_loss") || starts("mse_loss"))
    return "classifier";
  if (category == "comm") return "communication";
  if (starts("linear_")) return "gemm";
  if (starts("attention_")) return "attention";
  if (starts("layernorm_") || starts("rmsnorm_")) return "norms";
  if (starts("adamw") || starts("ema_update") || starts("sum_squares") ||
      starts("clip_coefficient"))
    return "optimizer";
  if (starts("copy") || starts("fill")) return "memory";
  return "elementwise";
}

namespace {
// The time inside the step intervals that no op interval covers (ops clipped to each
// step, overlapping ops counted once).
double uncovered_ns(std::vector<std::pair<int64_t, int64_t>> steps,
                    std::vector<std::pair<int64_t, int64_t>> ops) {
  std::sort(ops.begin(), ops.end());
  double idle = 0.0;
  for (const auto& [a, b] : steps) {
    int64_t t = a;  // covered up to t
    for (const auto& [s, e] : ops) {
      if (e <= t || s >= b) continue;
      if (s > t) idle += static_cast<double>(s - t);
      t = std::max(t, std::min(e, b));
    }
    if (b > t) idle += static_cast<double>(b - t);
  }
  return idle;
}
}  // namespace

Summary summarize(const std::vector<TraceEvent>& events) {
  Summary s;
  std::map<std::string, OpStats> ops, phases, kinds;
  std::vector<std::pair<int64_t, int64_t>> step_spans, op_spans;
  int64_t first = std::numeric_limits<int64_t>::max(), last = std::numeric_limits<int64_t>::min();
  for (const auto& e : events) {
    if (e.phase != 'X') continue;
    first = std::min(first, e.ts_ns);
    last = std::max(last, e.ts_ns + e.dur_ns);
    if (e.category == "step") {
      ++s.steps;
      s.step_ns += static_cast<double>(e.dur_ns);
      step_spans.emplace_back(e.ts_ns, e.ts_ns + e.dur_ns);
      continue;
    }
    // Adds e to the row `name` of `table`.
    auto add = [&e](std::map<std::string, OpStats>& table, const std::string& name) {
      OpStats& o = table[name];
      if (o.calls == 0) o.name = name, o.category = e.category;
      ++o.calls;
      o.total_ns += static_cast<double>(e.dur_ns);
      o.flops += e.flops;
      o.bytes += e.bytes;
    };
    if (e.category == "phase") {
      add(phases, e.name);
      continue;
    }
    add(ops, e.name);
    add(kinds, op_kind(e.name, e.category));
    s.op_ns += static_cast<double>(e.dur_ns);
    op_spans.emplace_back(e.ts_ns, e.ts_ns + e.dur_ns);
  }
  if (s.steps == 0 && last > first) {
    s.step_ns = static_cast<double>(last - first);
    step_spans.emplace_back(first, last);
  }
  s.idle_ns = uncovered_ns(std::move(step_spans), std::move(op_spans));
  auto sorted = [](std::map<std::string, OpStats>& m) {
    std::vector<OpStats> v;
    for (auto& [k, o] : m) v.push_back(std::move(o));
    std::stable_sort(v.begin(), v.end(),
                     [](const OpStats& a, const OpStats& b) { return a.total_ns > b.total_ns; });
    return v;
  };
  s.ops = sorted(ops);
  s.kinds = sorted(kinds);
  s.phases = sorted(phases);
  return s;
}

std::string format_summary(const Summary& s, const Peaks& peaks) {
  std::string out;
  const double step = s.step_ns > 0 ? s.step_ns : 1.0;
  out += fmt::format("profile: {} step{}, {:.1f} ms per step; ops {:.1f} ms ({:.1f}% of the "
                     "step); peaks {} GFLOP/s, {} GB/s\n",
                     s.steps, s.steps == 1 ? "" : "s",
                     s.steps > 0 ? s.step_ns / 1e6 / static_cast<double>(s.steps) : s.step_ns / 1e6,
                     s.op_ns / 1e6, 100.0 * s.op_ns / step,
                     peaks.flops > 0 ? fmt::format("{:.1f}", peaks.flops / 1e9) : "?",
                     peaks.bandwidth > 0 ? fmt::format("{:.1f}", peaks.bandwidth / 1e9) : "?");
  size_t w = 24;  // the name column: as wide as the longest op name
  for (const auto& o : s.ops) w = std::max(w, o.name.size());
  out += fmt::format("{:<{}} {:>7} {:>10} {:>7} {:>9} {:>8} {:>7} {:>7}\n", "op", w, "calls",
                     "total ms", "% step", "GFLOP/s", "GB/s", "bound", "% peak");
  for (const auto& o : s.ops) {
    const double sec = o.total_ns / 1e9;
    const double gflops = sec > 0 ? o.flops / sec / 1e9 : 0.0;
    const double gbs = sec > 0 ? o.bytes / sec / 1e9 : 0.0;
    std::string bound = "-", pct = "-";
    const double t_flops = peaks.flops > 0 ? o.flops / peaks.flops : 0.0;
    const double t_bytes = peaks.bandwidth > 0 ? o.bytes / peaks.bandwidth : 0.0;
    if ((t_flops > 0 || t_bytes > 0) && sec > 0) {
      const bool compute = t_flops >= t_bytes;
      bound = compute ? "flops" : "memory";
      pct = fmt::format("{:.1f}%", 100.0 * std::max(t_flops, t_bytes) / sec);
    }
    out += fmt::format("{:<{}} {:>7} {:>10.2f} {:>6.1f}% {:>9} {:>8} {:>7} {:>7}\n", o.name, w,
                       o.calls, o.total_ns / 1e6, 100.0 * o.total_ns / step,
                       o.flops > 0 ? fmt::format("{:.1f}", gflops) : "-",
                       o.bytes > 0 ? fmt::format("{:.2f}", gbs) : "-", bound, pct);
  }
  if (!s.kinds.empty()) {
    const double per = s.steps > 0 ? static_cast<double>(s.steps) : 1.0;
    out += fmt::format("{:<{}} {:>7} {:>10} {:>7} {:>9} {:>8}\n", "kind", w, "calls", "ms/step",
                       "% step", "GFLOP/s", "GB/s");
    for (const auto& k : s.kinds) {
      const double sec = k.total_ns / 1e9;
      out += fmt::format("{:<{}} {:>7} {:>10.2f} {:>6.1f}% {:>9} {:>8}\n", k.name, w, k.calls,
                         k.total_ns / 1e6 / per, 100.0 * k.total_ns / step,
                         k.flops > 0 && sec > 0 ? fmt::format("{:.1f}", k.flops / sec / 1e9) : "-",
                         k.bytes > 0 && sec > 0 ? fmt::format("{:.2f}", k.bytes / sec / 1e9) : "-");
    }
    const double idle = s.idle_ns;
    out += fmt::format("{:<{}} {:>7} {:>10.2f} {:>6.1f}%\n", "idle", w, "-", idle / 1e6 / per,
                       100.0 * idle / step);
  }
  if (!s.phases.empty()) {
    out += fmt::format("{:<{}} {:>7} {:>10} {:>7}\n", "phase", w, "calls", "total ms", "% step");
    for (const auto& p : s.phases)
      out += fmt::format("{:<{}} {:>7} {:>10.2f} {:>6.1f}%\n", p.name, w, p.calls, p.total_ns / 1e6,
                         100.0 * p.total_ns / step);
  }
  return out;
}

ProfileWindow::ProfileWindow(std::vector<int64_t> steps, std::filesystem::path trace_path,
                             Peaks peaks, Tracer& tracer, bool print)
    : steps_(std::move(steps)), trace_path_(std::move(trace_path)), peaks_(peaks),
      tracer_(tracer), print_(print) {
  KILN_CHECK(steps_.empty() || (steps_.size() == 2 && steps_[0] >= 0 && steps_[0] < steps_[1]),
             "profile.steps must be [] or [a, b] with 0 <= a < b");
}

ProfileWindow::~ProfileWindow() {
  try {
    finish();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln: profile: %s\n", e.what());
  }
}

void ProfileWindow::begin_step(int64_t step) {
  if (!configured() || done_) return;
  step_ = step;
  if (!recording_ && step >= steps_[0] && step < steps_[1]) {
    tracer_.clear();
    tracer_.set_thread_name("main");
    tracer_.enable();
    recording_ = true;
  }
  if (recording_) step_start_ = Clock::now();
}

void ProfileWindow::set_backend(ProfilingBackend* backend) {
  backend_ = backend;
  allocator_ = backend ? &backend->allocator() : nullptr;
}

void ProfileWindow::end_step() {
  if (!recording_) return;
  if (backend_) backend_->flush();
  tracer_.record_complete(fmt::format("step {}", step_), "step", step_start_, Clock::now());
  if (allocator_) {
    const MemoryStats m = allocator_->stats();
    std::vector<std::pair<std::string, double>> v;
    for (int c = 0; c < kNumMemCategories; ++c)
      v.emplace_back(std::string(mem_category_name(static_cast<MemCategory>(c))),
                     static_cast<double>(m.current[static_cast<size_t>(c)]));
    tracer_.record_counter("memory_bytes", std::move(v));
  }
  if (step_ + 1 >= steps_[1]) finish();
}

void ProfileWindow::finish() {
  if (!recording_) return;
  tracer_.disable();
  recording_ = false;
  done_ = true;
  const auto events = tracer_.events();
  summary_text_ = format_summary(summarize(events), peaks_);
  tracer_.write_trace(trace_path_);
  std::filesystem::path txt = trace_path_;
  txt.replace_extension(".summary.txt");
  std::ofstream(txt) << summary_text_;
  if (print_) {
    std::fputs(summary_text_.c_str(), stdout);
    std::printf("kiln: profile: trace %s (%zu events; open in https://ui.perfetto.dev), "
                "summary %s\n",
                trace_path_.string().c_str(), events.size(), txt.string().c_str());
    std::fflush(stdout);
  }
}

}  // namespace kiln::profile
