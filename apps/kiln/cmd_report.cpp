// kiln report RUN_DIR [--out FILE]: one self-contained report.html (inline SVG charts of
// loss, learning rate, gradient norm, throughput, MFU and memory per rank, the resolved
// config, profiler summaries, an image generator's samples). See src/report/report.h and
// docs/profiling.md.
#include "apps/kiln/commands.h"
#include "checkpoint/checkpoint.h"
#include "models/registry.h"
#include "report/report.h"
#include "train/device.h"
#include "train/image_sampler.h"
#include "train/model_io.h"

#include <fmt/format.h>

namespace kiln::app {

namespace {

// An image generator's run: RUN_DIR/samples/<checkpoint>.png, a grid of its latest
// checkpoint's samples (every class a row of 8, 25 Euler steps, guidance scale 2, the EMA
// weights when saved), unless it is there already.
void render_latest_samples(const std::filesystem::path& run_dir) {
  const auto latest = checkpoint::find_latest_checkpoint(run_dir / "ckpt");
  if (!latest) return;
  checkpoint::CheckpointReader reader(*latest);
  if (!model_arch(checkpoint_arch(reader.state())).generates_images) return;
  const auto png = run_dir / "samples" / (latest->filename().string() + ".png");
  if (std::filesystem::exists(png)) return;
  auto backend = make_device_backend("cpu");
  const auto model = make_model(checkpoint_model_options(reader), *backend);
  load_model_weights(reader, *model, checkpoint_has_ema(reader));
  ImageSampleOptions o;
  for (int k = 0; k < model->vocab_size(); ++k) o.classes.push_back(k);
  o.per_class = 8;
  o.steps = 25;
  o.cfg_scale = 2.0;
  std::filesystem::create_directories(png.parent_path());
  write_image_grid(png, sample_images(*model, o), o.per_class);
  fmt::print("kiln report: sampled {}\n", png.string());
}

}  // namespace

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
    render_latest_samples(a->run_dir);
    const auto path = report::write_report(a->run_dir, a->out);
    fmt::print("kiln report: {}\n", path.string());
  });
}

}  // namespace kiln::app
