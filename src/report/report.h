// kiln report: one self-contained HTML page about a training run.
//
// Input, all from RUN_DIR:
//   metrics.jsonl       one JSON object per logged step, as the trainer writes it (see
//                       train/metrics.h): step, loss, lr, grad_norm, tokens_per_s, mfu,
//                       step_time_s, peak_mem_bytes, mem_<category>_bytes, val_loss (on
//                       evaluation steps), comm_wait_s, mem_by_rank (an array with
//                       every rank's bytes by category, logged by rank 0 of a
//                       data-parallel run), optionally "rank", and for a mixture of
//                       experts moe_aux_loss, moe_z_loss, moe_tokens_per_expert{,_by_layer}
//                       and moe_expert_bias (report/moe_section.h).
//   metrics*.jsonl      further files (e.g. metrics_rank1.jsonl): records without a
//                       "rank" key take the number after "rank" in the file name, else 0.
//                       The trainer's records also carry "time", "session_start" and
//                       "session_first_step" (the run's elapsed wall time and its
//                       sessions: start and each resume), and events: {"event":
//                       "rollback"} and {"event": "sample", "text"} (in-training samples).
//   config.toml         the resolved config, shown verbatim.
//   ckpt/step_*/        the checkpoints, listed with their size and completeness.
//   *.summary.txt       profiler summaries (profile/summary.h), shown verbatim; trace
//                       files (*.json with "trace" in the name) are listed.
//   samples/*.png       image samples: the newest by name is shown, inline (a data: URI);
//                       `kiln report` shows an image generator's latest checkpoint's
//                       samples instead, sampled afresh (RunData::sample_png).
// Output: report.html with no external resource (no script, font or stylesheet): inline
// CSS and one inline SVG line chart per quantity, a series per rank (train and val
// loss, learning rate, gradient norm, tokens/s, MFU, step time, time waiting for
// collectives, memory by category per rank; for a mixture of experts the balancing losses,
// the load imbalance, the selection bias range and a per-layer load table),
// a summary table and the config. Every series is an SVG <polyline> whose
// data-series attribute names it (e.g. "train loss (rank 0)").
#pragma once

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kiln::report {

struct Point {
  double x = 0.0, y = 0.0;
};

struct Series {
  std::string name;
  std::vector<Point> points;  // any order of x; drawn sorted by x
  bool dashed = false;
  bool markers = false;  // a dot at every point (always drawn for series of < 2 points)
};

struct ChartOptions {
  std::string title;
  std::string x_label = "step";
  std::string y_label;
  int width = 540;
  int height = 300;  // of the plot area plus axes; the legend adds rows below
  int max_points = 2000;  // longer series are thinned evenly (the last point is kept)
};

/// An SVG line chart (a complete <svg> element): axes with "nice" ticks, one polyline
/// per non-empty series in a fixed palette, a legend. Non-finite points are dropped.
/// An empty chart (no points at all) says "no data".
std::string svg_line_chart(const std::vector<Series>& series, const ChartOptions& options);

/// Escapes &, <, >, " and ' for HTML text and attribute values.
std::string html_escape(const std::string& s);

/// Everything the report shows, read from a run directory.
struct RunData {
  std::filesystem::path dir;
  std::map<int, std::vector<nlohmann::json>> records;  // by rank, in file order
  std::string config_toml;                              // "" when absent
  std::vector<std::pair<std::string, std::string>> summaries;  // file name, text
  std::vector<std::string> traces;                             // trace file names
  std::string sample_name, sample_png;  // the newest samples/*.png: its name and bytes
  /// A text-to-image run's samples instead: each row's prompt and its PNG.
  std::vector<std::pair<std::string, std::string>> sample_rows;
  std::vector<std::string> warnings;                           // e.g. unparsable lines
  struct Checkpoint {
    std::string name;      // e.g. "step_00000400"
    int64_t bytes = 0;     // its files together
    bool complete = false; // has its manifest.json (written last)
  };
  std::vector<Checkpoint> checkpoints;  // RUN_DIR/ckpt/step_*, by name
  double baseline_loss = NAN;           // a flat line on the loss chart (NAN: none), e.g.
  std::string baseline_name;            //   "unigram baseline (val)" from `kiln report`
};

/// Reads RUN_DIR. Throws kiln::Error when the directory does not exist or has no
/// metrics*.jsonl file. Malformed lines are skipped with one warning per file naming
/// their line numbers (a crash can leave a torn last line; `kiln report` prints it).
RunData load_run(const std::filesystem::path& run_dir);

/// The HTML page.
std::string render_report(const RunData& run);

/// load_run + render_report, written atomically to `out` (default RUN_DIR/report.html).
/// Returns the path written.
std::filesystem::path write_report(const std::filesystem::path& run_dir,
                                   const std::filesystem::path& out = {});

}  // namespace kiln::report
