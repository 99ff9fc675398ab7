#include "report/report.h"

#include "core/error.h"
#include "report/charts.h"
#include "report/blend_section.h"
#include "report/moe_section.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <map>
#include <fstream>
#include <limits>
#include <regex>
#include <set>
#include <sstream>

#include <unistd.h>

namespace kiln::report {

namespace fs = std::filesystem;

namespace {

// A colour-blind friendly palette (Okabe & Ito 2008) plus greys.
constexpr const char* kPalette[] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00",
                                    "#56B4E9", "#000000", "#F0E442", "#999999", "#882255"};
constexpr int kPaletteSize = sizeof(kPalette) / sizeof(kPalette[0]);

// "Nice" tick step for a range (1, 2 or 5 times a power of ten), about `target` ticks.
double nice_step(double range, int target) {
  if (!(range > 0)) return 1.0;
  const double raw = range / target;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / p;
  return (f < 1.5 ? 1.0 : f < 3.5 ? 2.0 : f < 7.5 ? 5.0 : 10.0) * p;
}

std::string tick_label(double v, double step) {
  if (std::fabs(v) < step * 1e-6) return "0";  // a sum of steps that crossed zero: ~1e-18
  const double a = std::fabs(v);
  if (a >= 1e5 || a < 1e-3) return fmt::format("{:.2g}", v);
  const int decimals = std::max(0, static_cast<int>(-std::floor(std::log10(step) + 1e-9)));
  return fmt::format("{:.{}f}", v, std::min(decimals, 6));
}

std::string num(double v) { return fmt::format("{:.1f}", v); }

void write_atomically(const fs::path& path, const std::string& text) {
  const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  const fs::path tmp = dir / fmt::format(".{}.tmp.{}", path.filename().string(), ::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    KILN_CHECK(out.good(), "report: cannot write {}", path.string());
    out << text;
    out.flush();
    KILN_CHECK(out.good(), "report: cannot write {} (disk full?)", path.string());
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    KILN_FAIL("report: cannot write {}: rename failed", path.string());
  }
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

std::string html_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string svg_line_chart(const std::vector<Series>& input, const ChartOptions& o) {
  // Clean and thin the series.
  std::vector<Series> series;
  for (const Series& s : input) {
    Series c = s;
    c.points.clear();
    for (const Point& p : s.points)
      if (std::isfinite(p.x) && std::isfinite(p.y)) c.points.push_back(p);
    std::stable_sort(c.points.begin(), c.points.end(),
                     [](const Point& a, const Point& b) { return a.x < b.x; });
    if (o.max_points > 1 && static_cast<int>(c.points.size()) > o.max_points) {
      std::vector<Point> thin;
      const double stride = static_cast<double>(c.points.size() - 1) / (o.max_points - 1);
      for (int i = 0; i < o.max_points; ++i)
        thin.push_back(c.points[static_cast<size_t>(std::llround(i * stride))]);
      c.points = std::move(thin);
    }
    series.push_back(std::move(c));
  }
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  for (const Series& s : series)
    for (const Point& p : s.points) {
      x0 = std::min(x0, p.x), x1 = std::max(x1, p.x);
      y0 = std::min(y0, p.y), y1 = std::max(y1, p.y);
    }
  const bool empty = !(x0 <= x1);
  if (empty) x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  if (x1 == x0) x0 -= 0.5, x1 += 0.5;
  if (y1 == y0) {
    const double d = y0 == 0 ? 1.0 : std::fabs(y0) * 0.1;
    y0 -= d, y1 += d;
  }
  const double ystep = nice_step(y1 - y0, 5), xstep = nice_step(x1 - x0, 6);
  y0 = std::floor(y0 / ystep) * ystep, y1 = std::ceil(y1 / ystep) * ystep;

  // Geometry: margins for ticks and labels, the legend in rows below the plot.
  const int W = o.width, H = o.height;
  const double L = 64, R = 16, Tm = 28, Bm = 44;
  const double pw = W - L - R, ph = H - Tm - Bm;
  const int legend_cols = std::max(1, static_cast<int>((W - L) / 190));
  int n_legend = 0;
  for (const Series& s : series) n_legend += !s.points.empty();
  const int legend_rows = (n_legend + legend_cols - 1) / legend_cols;
  const int total_h = H + legend_rows * 18 + (legend_rows > 0 ? 6 : 0);
  auto X = [&](double x) { return L + (x - x0) / (x1 - x0) * pw; };
  auto Y = [&](double y) { return Tm + (1.0 - (y - y0) / (y1 - y0)) * ph; };

  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" width=\"{}\" height=\"{}\" "
      "viewBox=\"0 0 {} {}\" role=\"img\" aria-label=\"{}\">\n",
      W, total_h, W, total_h, html_escape(o.title));
  svg += fmt::format("<rect x=\"0\" y=\"0\" width=\"{}\" height=\"{}\" fill=\"#ffffff\"/>\n", W, total_h);
  svg += fmt::format("<text x=\"{}\" y=\"18\" font-size=\"14\" font-weight=\"bold\" "
                     "fill=\"#222\">{}</text>\n", L, html_escape(o.title));
  // Grid and ticks.
  for (double y = y0; y <= y1 + ystep * 1e-6; y += ystep) {
    svg += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#e3e3e3\"/>\n",
                       num(L), num(Y(y)), num(L + pw), num(Y(y)));
    svg += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"11\" text-anchor=\"end\" "
                       "fill=\"#444\">{}</text>\n", num(L - 6), num(Y(y) + 4), tick_label(y, ystep));
  }
  for (double x = std::ceil(x0 / xstep) * xstep; x <= x1 + xstep * 1e-6; x += xstep) {
    svg += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#eeeeee\"/>\n",
                       num(X(x)), num(Tm), num(X(x)), num(Tm + ph));
    svg += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"11\" text-anchor=\"middle\" "
                       "fill=\"#444\">{}</text>\n", num(X(x)), num(Tm + ph + 15), tick_label(x, xstep));
  }
  svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" "
                     "stroke=\"#888\"/>\n", num(L), num(Tm), num(pw), num(ph));
  svg += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"12\" text-anchor=\"middle\" "
                     "fill=\"#222\">{}</text>\n", num(L + pw / 2), num(Tm + ph + 34),
                     html_escape(o.x_label));
  svg += fmt::format("<text x=\"14\" y=\"{}\" font-size=\"12\" text-anchor=\"middle\" fill=\"#222\" "
                     "transform=\"rotate(-90 14 {})\">{}</text>\n", num(Tm + ph / 2),
                     num(Tm + ph / 2), html_escape(o.y_label));
  if (empty)
    svg += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"14\" text-anchor=\"middle\" "
                       "fill=\"#999\">no data</text>\n", num(L + pw / 2), num(Tm + ph / 2));
  // Series.
  int k = 0;
  for (const Series& s : series) {
    if (s.points.empty()) continue;
    const char* color = kPalette[k % kPaletteSize];
    std::string pts;
    for (const Point& p : s.points) pts += fmt::format("{},{} ", num(X(p.x)), num(Y(p.y)));
    if (!pts.empty()) pts.pop_back();
    svg += fmt::format("<polyline class=\"series\" data-series=\"{}\" fill=\"none\" stroke=\"{}\" "
                       "stroke-width=\"2\" stroke-linejoin=\"round\"{} points=\"{}\"/>\n",
                       html_escape(s.name), color,
                       s.dashed ? " stroke-dasharray=\"6 4\"" : "", pts);
    if (s.markers || s.points.size() < 2)
      for (const Point& p : s.points)
        svg += fmt::format("<circle cx=\"{}\" cy=\"{}\" r=\"3\" fill=\"{}\"/>\n", num(X(p.x)),
                           num(Y(p.y)), color);
    // Legend entry.
    const int row = k / legend_cols, col = k % legend_cols;
    const double lx = L + col * 190, ly = H + 4 + row * 18;
    svg += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\" "
                       "stroke-width=\"3\"{}/>\n", num(lx), num(ly), num(lx + 22), num(ly), color,
                       s.dashed ? " stroke-dasharray=\"6 4\"" : "");
    svg += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"11\" fill=\"#222\">{}</text>\n",
                       num(lx + 28), num(ly + 4), html_escape(s.name));
    ++k;
  }
  svg += "</svg>\n";
  return svg;
}

namespace {
std::vector<RunData::Checkpoint> list_checkpoints(const fs::path& root) {
  std::vector<RunData::Checkpoint> out;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return out;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_directory() || name.rfind("step_", 0) != 0) continue;
    RunData::Checkpoint c{name, 0, fs::exists(entry.path() / "manifest.json", ec)};
    for (const auto& f : fs::recursive_directory_iterator(entry.path(), ec))
      if (f.is_regular_file(ec)) c.bytes += static_cast<int64_t>(f.file_size(ec));
    out.push_back(std::move(c));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  return out;
}
}  // namespace

RunData load_run(const fs::path& run_dir) {
  KILN_CHECK(fs::is_directory(run_dir), "report: {} is not a directory", run_dir.string());
  RunData run;
  run.dir = run_dir;
  std::vector<fs::path> metric_files, summaries, traces;
  for (const auto& entry : fs::directory_iterator(run_dir)) {
    if (!entry.is_regular_file()) continue;
    const std::string name = entry.path().filename().string();
    if (name.rfind("metrics", 0) == 0 && entry.path().extension() == ".jsonl")
      metric_files.push_back(entry.path());
    else if (name.size() > 12 && name.substr(name.size() - 12) == ".summary.txt")
      summaries.push_back(entry.path());
    else if (entry.path().extension() == ".json" && name.find("trace") != std::string::npos)
      traces.push_back(entry.path());
  }
  std::sort(metric_files.begin(), metric_files.end());
  std::sort(summaries.begin(), summaries.end());
  std::sort(traces.begin(), traces.end());
  KILN_CHECK(!metric_files.empty(), "report: {} has no metrics.jsonl", run_dir.string());
  static const std::regex rank_re("rank[_-]?([0-9]+)");
  for (const fs::path& f : metric_files) {
    int file_rank = 0;
    std::smatch m;
    const std::string fname = f.filename().string();
    if (std::regex_search(fname, m, rank_re)) file_rank = std::stoi(m[1].str());
    std::ifstream in(f);
    std::string line;
    int lineno = 0;
    std::vector<int> unread;  // line numbers
    while (std::getline(in, line)) {
      ++lineno;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      try {
        nlohmann::json j = nlohmann::json::parse(line);
        if (!j.is_object()) throw std::runtime_error("not an object");
        const int rank = j.contains("rank") && j["rank"].is_number_integer() ? j["rank"].get<int>()
                                                                             : file_rank;
        run.records[rank].push_back(std::move(j));
      } catch (const std::exception&) {
        unread.push_back(lineno);
      }
    }
    if (!unread.empty())
      run.warnings.push_back(fmt::format(
          "{}: {}: {} (not JSON objects: a torn last line after a crash, or two runs writing "
          "into one run directory)", fname,
          unread.size() == 1 ? "skipped a malformed line" : "skipped malformed lines",
          fmt::join(unread, ", ")));
  }
  if (fs::exists(run_dir / "config.toml")) run.config_toml = read_text(run_dir / "config.toml");
  run.checkpoints = list_checkpoints(run_dir / "ckpt");
  for (const auto& p : summaries) run.summaries.emplace_back(p.filename().string(), read_text(p));
  for (const auto& p : traces) run.traces.push_back(p.filename().string());
  if (fs::is_directory(run_dir / "samples")) {
    std::vector<fs::path> pngs;
    for (const auto& entry : fs::directory_iterator(run_dir / "samples"))
      if (entry.is_regular_file() && entry.path().extension() == ".png") pngs.push_back(entry.path());
    if (!pngs.empty()) {
      const fs::path newest = *std::max_element(pngs.begin(), pngs.end());
      run.sample_name = "samples/" + newest.filename().string();
      run.sample_png = read_text(newest);
    }
  }
  return run;
}

namespace {

// RFC 4648 base64 (for an inline data: URI).
std::string base64(const std::string& bytes) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t v = static_cast<uint8_t>(bytes[i]) << 16;
    if (i + 1 < bytes.size()) v |= static_cast<uint8_t>(bytes[i + 1]) << 8;
    if (i + 2 < bytes.size()) v |= static_cast<uint8_t>(bytes[i + 2]);
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < bytes.size() ? kAlphabet[(v >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? kAlphabet[v & 63] : '=';
  }
  return out;
}

struct Stat {
  double first = NAN, last = NAN, min = NAN, max = NAN, mean = NAN;
  int64_t n = 0;
};
Stat stat_of(const std::vector<nlohmann::json>& recs, const std::string& key, bool skip_first) {
  Stat s;
  double sum = 0;
  bool skipped = !skip_first;
  for (const auto& r : recs) {
    if (!r.contains(key) || !r[key].is_number()) continue;
    const double v = r[key].get<double>();
    if (!std::isfinite(v)) continue;
    if (!skipped) {  // the first logged step includes warm-up (allocation, first touch)
      skipped = true;
      continue;
    }
    if (s.n == 0) s.first = v, s.min = v, s.max = v;
    s.last = v;
    s.min = std::min(s.min, v);
    s.max = std::max(s.max, v);
    sum += v;
    ++s.n;
  }
  if (s.n > 0) s.mean = sum / static_cast<double>(s.n);
  return s;
}

std::string fmt_or_dash(double v, const char* f) {
  return std::isfinite(v) ? fmt::format(fmt::runtime(f), v) : "-";
}

std::string utc_time(double unix_s) {
  const auto t = static_cast<std::time_t>(unix_s);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

// One process's share of the run (its start, or a resume): from the records'
// "session_start", "session_first_step" and "time".
struct Session {
  double start = 0.0, last = 0.0;  // unix seconds: began training, last record
  int64_t first_step = 0;          // the update it began at
};

std::vector<Session> sessions_of(const RunData& run) {
  std::map<double, Session> by_start;
  for (const auto& [rank, recs] : run.records)
    for (const auto& r : recs) {
      if (!r.contains("session_start") || !r["session_start"].is_number() || !r.contains("time") ||
          !r["time"].is_number())
        continue;
      const double start = r["session_start"].get<double>();
      const int64_t first = r.contains("session_first_step") && r["session_first_step"].is_number_integer()
                                ? r["session_first_step"].get<int64_t>()
                                : 0;
      Session& s = by_start.try_emplace(start, Session{start, start, first}).first->second;
      s.last = std::max(s.last, r["time"].get<double>());
    }
  std::vector<Session> out;
  for (const auto& [start, s] : by_start) out.push_back(s);
  return out;
}

// The run at a glance: wall time, tokens, sessions, checkpoints.
std::string run_section(const RunData& run, const std::vector<Session>& sessions) {
  double elapsed = 0.0, tokens = NAN;
  for (const Session& s : sessions) elapsed += s.last - s.start;
  for (const auto& [rank, recs] : run.records)
    for (const auto& r : recs)
      if (r.contains("tokens") && r["tokens"].is_number())
        tokens = std::isfinite(tokens) ? std::max(tokens, r["tokens"].get<double>()) : r["tokens"].get<double>();
  std::string wall = "-";
  if (!sessions.empty())
    wall = elapsed < 120.0 ? fmt::format("{:.1f} s", elapsed)
                           : fmt::format("{:.1f} min ({:.0f} s)", elapsed / 60.0, elapsed);
  std::string h = "<h2>Run</h2>\n<table>\n";
  h += fmt::format("<tr><td>elapsed wall time (training, over its sessions)</td><td>{}</td></tr>\n", wall);
  h += fmt::format("<tr><td>tokens seen</td><td>{}</td></tr>\n", fmt_or_dash(tokens, "{:.0f}"));
  h += fmt::format("<tr><td>sessions (the start, then each resume)</td><td>{}</td></tr>\n",
                   sessions.empty() ? std::string("-") : std::to_string(sessions.size()));
  h += fmt::format("<tr><td>checkpoints</td><td>{}</td></tr>\n</table>\n", run.checkpoints.size());
  return h;
}

// Starts, resumes and rollbacks, by step: what explains a dip in throughput.
std::string events_section(const RunData& run, const std::vector<Session>& sessions) {
  std::vector<std::pair<int64_t, std::string>> events;
  for (const Session& s : sessions)
    events.emplace_back(s.first_step, fmt::format("{} at update {} ({})",
                                                  s.first_step == 0 ? "start" : "resume",
                                                  s.first_step, utc_time(s.start)));
  for (const auto& [rank, recs] : run.records)
    for (const auto& r : recs)
      if (r.value("event", std::string()) == "rollback" && r.contains("step") && r["step"].is_number_integer())
        events.emplace_back(r["step"].get<int64_t>(),
                            fmt::format("rollback to update {}: resumed from {}, abandoned {}",
                                        r["step"].get<int64_t>(), r.value("resumed_from", std::string("?")),
                                        r.contains("abandoned_steps") ? r["abandoned_steps"].dump() : "?"));
  std::stable_sort(events.begin(), events.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::string h = "<h2>Events</h2>\n";
  if (events.empty()) return h + "<div>no session records (metrics written before kiln recorded them)</div>\n";
  h += "<table>\n<tr><th>update</th><th>event</th></tr>\n";
  for (const auto& [step, what] : events)
    h += fmt::format("<tr><td>{}</td><td>{}</td></tr>\n", step, html_escape(what));
  return h + "</table>\n";
}

// The samples the trainer drew during training (sample.every).
std::string text_samples_section(const RunData& run) {
  std::string rows;
  for (const auto& [rank, recs] : run.records)
    for (const auto& r : recs)
      if (r.value("event", std::string()) == "sample" && r.contains("text") && r["text"].is_string())
        rows += fmt::format("<tr><td>{}</td><td><pre>{}</pre></td></tr>\n",
                            r.contains("step") ? r["step"].dump() : "?",
                            html_escape(r["text"].get<std::string>()));
  if (rows.empty()) return {};
  return "<h2>Samples during training</h2>\n<table>\n<tr><th>update</th><th>sample</th></tr>\n" +
         rows + "</table>\n";
}

std::string checkpoints_section(const RunData& run) {
  std::string h = "<h2>Checkpoints</h2>\n";
  if (run.checkpoints.empty()) return h + "<div>none in ckpt/</div>\n";
  h += "<table>\n<tr><th>checkpoint</th><th>MiB</th><th>complete</th></tr>\n";
  for (const auto& c : run.checkpoints)
    h += fmt::format("<tr><td>ckpt/{}</td><td>{:.1f}</td><td>{}</td></tr>\n", html_escape(c.name),
                     static_cast<double>(c.bytes) / (1024.0 * 1024.0),
                     c.complete ? "yes" : "<span class=\"warn\">no (no manifest.json: not resumable)</span>");
  return h + "</table>\n";
}

// The unigram baseline as a dashed level line over the steps the loss series span
// (`loss` not empty).
Series baseline_series(const RunData& run, const std::vector<Series>& loss) {
  Series base{run.baseline_name, {}, /*dashed=*/true};
  double lo = loss[0].points[0].x, hi = lo;
  for (const auto& s : loss)
    for (const auto& p : s.points) lo = std::min(lo, p.x), hi = std::max(hi, p.x);
  base.points = {{lo, run.baseline_loss}, {hi, run.baseline_loss}};
  return base;
}

}  // namespace

std::string render_report(const RunData& run) {
  std::string h;
  const std::string title = fmt::format("kiln run report: {}", run.dir.filename().empty()
                                                                  ? run.dir.string()
                                                                  : run.dir.filename().string());
  h += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  h += fmt::format("<title>{}</title>\n", html_escape(title));
  h += "<style>\n"
       "body{font-family:-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;margin:24px;"
       "color:#222;background:#fafafa}\n"
       "h1{font-size:22px;margin:0 0 4px 0}h2{font-size:17px;margin:28px 0 8px 0}\n"
       ".sub{color:#666;font-size:13px;margin-bottom:16px}\n"
       ".grid{display:flex;flex-wrap:wrap;gap:16px}\n"
       ".card{background:#fff;border:1px solid #ddd;border-radius:6px;padding:8px}\n"
       "table{border-collapse:collapse;font-size:13px;background:#fff}\n"
       "td,th{border:1px solid #ddd;padding:4px 10px;text-align:right}\n"
       "th{background:#f0f0f0}td:first-child,th:first-child{text-align:left}\n"
       "pre{background:#fff;border:1px solid #ddd;padding:10px;font-size:12px;overflow:auto}\n"
       ".warn{color:#a33}\n"
       "</style>\n</head>\n<body>\n";
  h += fmt::format("<h1>{}</h1>\n", html_escape(title));
  h += fmt::format("<div class=\"sub\">{} &middot; {} rank{} &middot; generated by kiln report "
                   "(self-contained: inline SVG, no scripts)</div>\n",
                   html_escape(fs::absolute(run.dir).string()), run.records.size(),
                   run.records.size() == 1 ? "" : "s");
  for (const auto& w : run.warnings) h += fmt::format("<div class=\"warn\">{}</div>\n", html_escape(w));

  // Summary table, one row per rank.
  h += "<h2>Summary</h2>\n<table>\n<tr><th>rank</th><th>records</th><th>steps</th>"
       "<th>last loss</th><th>best val loss</th><th>mean tokens/s</th><th>mean MFU</th>"
       "<th>mean step ms</th><th>peak memory MiB</th></tr>\n";
  for (const auto& [rank, recs] : run.records) {
    const Stat step = stat_of(recs, "step", false), loss = stat_of(recs, "loss", false),
               val = stat_of(recs, "val_loss", false), tps = stat_of(recs, "tokens_per_s", true),
               mfu = stat_of(recs, "mfu", true), st = stat_of(recs, "step_time_s", true),
               mem = stat_of(recs, "peak_mem_bytes", false);
    h += fmt::format(
        "<tr><td>{}</td><td>{}</td><td>{} &ndash; {}</td><td>{}</td><td>{}</td><td>{}</td>"
        "<td>{}</td><td>{}</td><td>{}</td></tr>\n",
        rank, recs.size(), fmt_or_dash(step.min, "{:.0f}"), fmt_or_dash(step.max, "{:.0f}"),
        fmt_or_dash(loss.last, "{:.4f}"), fmt_or_dash(val.min, "{:.4f}"),
        fmt_or_dash(tps.mean, "{:.0f}"),
        fmt_or_dash(mfu.mean * 100, "{:.2f}%") +
            (mfu.max > 1.0 ? " <span class=\"warn\">(above 100% at times: the run's GEMM peak "
                             "was stale; set log.peak_tflops)</span>"
                           : ""),
        fmt_or_dash(st.mean * 1e3, "{:.1f}"), fmt_or_dash(mem.max / (1024.0 * 1024.0), "{:.1f}"));
  }
  h += "</table>\n";
  const std::vector<Session> sessions = sessions_of(run);
  h += run_section(run, sessions);
  h += events_section(run, sessions);

  // Charts.
  h += "<h2>Training curves</h2>\n<div class=\"grid\">\n";
  auto card = [&](const std::vector<Series>& s, const std::string& t, const std::string& y) {
    h += chart_card(s, t, y);
  };
  {
    std::vector<Series> loss = per_rank(run, "loss", "train loss");
    for (auto& s : per_rank(run, "val_loss", "val loss", 1.0, true, true)) loss.push_back(std::move(s));
    if (std::isfinite(run.baseline_loss) && !loss.empty()) loss.push_back(baseline_series(run, loss));
    card(loss, "Loss", "nats per token");
  }
  if (auto acc = per_rank(run, "val_accuracy", "val accuracy", 100.0, true, true); !acc.empty())
    card(acc, "Validation accuracy (classifiers)", "% top-1");
  card(per_rank(run, "lr", "learning rate"), "Learning rate", "lr");
  card(per_rank(run, "grad_norm", "gradient norm"), "Gradient norm (before clipping)", "L2 norm");
  card(per_rank(run, "tokens_per_s", "tokens/s"), "Throughput", "tokens/s");
  card(per_rank(run, "mfu", "MFU", 100.0), "Model FLOPs utilisation", "% of peak");
  card(per_rank(run, "step_time_s", "step time", 1e3), "Step time", "ms");
  if (auto w = per_rank(run, "comm_wait_s", "communication wait", 1e3); !w.empty())
    card(w, "Time waiting for collectives", "ms per step");
  h += "</div>\n";
  h += moe_section(run);
  h += blend_section(run);

  // Memory by category (MiB), one chart per rank. Sources: the trainer's
  // "mem_by_rank" array (every rank's bytes by category, logged by rank 0 in a
  // data-parallel run) and, for ranks it does not cover, each record's own
  // mem_<category>_bytes keys ("mem_peak_*" are peaks, not charted as categories).
  constexpr double kMiB = 1024.0 * 1024.0;
  std::map<int, std::map<std::string, Series>> mem;  // rank -> category -> series
  auto add_point = [&](int rank, const std::string& cat, double step, double bytes) {
    Series& one = mem[rank][cat];
    if (one.name.empty()) {
      one.name = fmt::format("{} (rank {})", cat, rank);
      one.dashed = cat == "peak total";
    }
    one.points.push_back({step, bytes / kMiB});
  };
  std::set<int> from_array;
  for (const auto& [rank, recs] : run.records)
    for (const auto& r : recs) {
      if (!r.contains("step") || !r["step"].is_number() || !r.contains("mem_by_rank") ||
          !r["mem_by_rank"].is_array())
        continue;
      const double step = r["step"].get<double>();
      const auto& arr = r["mem_by_rank"];
      for (size_t i = 0; i < arr.size(); ++i) {
        if (!arr[i].is_object()) continue;
        from_array.insert(static_cast<int>(i));
        for (const auto& [k, v] : arr[i].items()) {
          if (!v.is_number()) continue;
          if (k == "peak") add_point(static_cast<int>(i), "peak total", step, v.get<double>());
          else if (k.rfind("peak", 0) != 0) add_point(static_cast<int>(i), k, step, v.get<double>());
        }
      }
    }
  for (const auto& [rank, recs] : run.records) {
    if (from_array.count(rank)) continue;
    for (const auto& r : recs) {
      if (!r.contains("step") || !r["step"].is_number()) continue;
      const double step = r["step"].get<double>();
      for (const auto& [k, v] : r.items()) {
        if (!v.is_number() || k.rfind("mem_", 0) != 0 || k.rfind("mem_peak_", 0) == 0 ||
            k.size() <= 10 || k.substr(k.size() - 6) != "_bytes")
          continue;
        add_point(rank, k.substr(4, k.size() - 10), step, v.get<double>());
      }
      if (r.contains("peak_mem_bytes") && r["peak_mem_bytes"].is_number())
        add_point(rank, "peak total", step, r["peak_mem_bytes"].get<double>());
    }
  }
  h += "<h2>Memory by category</h2>\n<div class=\"grid\">\n";
  if (mem.empty()) h += "<div>no memory keys (mem_&lt;category&gt;_bytes) in the metrics</div>\n";
  for (auto& [rank, cats] : mem) {
    std::vector<Series> s;
    Series peak;
    for (auto& [cat, one] : cats) {
      bool any = false;
      for (const auto& p : one.points) any |= p.y != 0.0;
      if (cat == "peak total") peak = std::move(one);
      else if (any) s.push_back(std::move(one));
    }
    if (!peak.points.empty()) s.push_back(std::move(peak));
    card(s, fmt::format("Memory, rank {}", rank), "MiB");
  }
  h += "</div>\n";

  if (!run.summaries.empty() || !run.traces.empty()) {
    h += "<h2>Profile</h2>\n";
    for (const auto& t : run.traces)
      h += fmt::format("<div>Trace <code>{}</code>: open it in https://ui.perfetto.dev or "
                       "chrome://tracing.</div>\n", html_escape(t));
    for (const auto& [name, text] : run.summaries)
      h += fmt::format("<h3>{}</h3>\n<pre>{}</pre>\n", html_escape(name), html_escape(text));
  }

  if (!run.sample_rows.empty()) {
    h += fmt::format("<h2>Samples</h2>\n<div class=\"sub\">{}</div>\n<table>\n"
                     "<tr><th>prompt</th><th>samples</th></tr>\n", html_escape(run.sample_name));
    for (const auto& [prompt, png] : run.sample_rows)
      h += fmt::format("<tr><td>{}</td><td><img alt=\"{}\" src=\"data:image/png;base64,{}\" "
                       "style=\"image-rendering:pixelated;width:min(100%,{}px)\"></td></tr>\n",
                       html_escape(prompt.empty() ? "(the empty caption)" : prompt),
                       html_escape(prompt), base64(png), 480);
    h += "</table>\n";
  } else if (!run.sample_png.empty()) {
    h += "<h2>Samples</h2>\n";
    h += fmt::format("<div class=\"card\"><img alt=\"{0}\" src=\"data:image/png;base64,{1}\" "
                     "style=\"image-rendering:pixelated;width:min(100%,{2}px)\"><div class=\"sub\">"
                     "{0}</div></div>\n", html_escape(run.sample_name), base64(run.sample_png), 640);
  }

  h += text_samples_section(run);
  h += checkpoints_section(run);

  h += "<h2>Configuration</h2>\n";
  if (run.config_toml.empty())
    h += "<div class=\"warn\">no config.toml in the run directory</div>\n";
  else
    h += fmt::format("<pre class=\"config\">{}</pre>\n", html_escape(run.config_toml));
  h += "</body>\n</html>\n";
  return h;
}

fs::path write_report(const fs::path& run_dir, const fs::path& out) {
  const RunData run = load_run(run_dir);
  const fs::path path = out.empty() ? run_dir / "report.html" : out;
  write_atomically(path, render_report(run));
  return path;
}

}  // namespace kiln::report
