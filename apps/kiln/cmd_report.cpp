// kiln report RUN_DIR [--out FILE]: one self-contained report.html (inline SVG charts of
// loss, learning rate, gradient norm, throughput, MFU and memory per rank, the resolved
// config, profiler summaries). See src/report/report.h and docs/profiling.md.
#include "apps/kiln/commands.h"
#include "report/report.h"

#include <fmt/format.h>

namespace kiln::app {

void register_report(CLI::App& app) {
  auto* cmd = app.add_subcommand("report", "Write RUN_DIR/report.html: charts of a run's metrics "
                                           "and its config (no network needed to view it)");
  struct Args {
    std::string run_dir, out;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("run_dir", a->run_dir, "The run directory (run.dir: metrics.jsonl, config.toml)")
      ->required();
  cmd->add_option("--out", a->out, "Output file (default RUN_DIR/report.html)");
  cmd->callback([a] {
    const auto path = report::write_report(a->run_dir, a->out);
    fmt::print("kiln report: {}\n", path.string());
  });
}

}  // namespace kiln::app
