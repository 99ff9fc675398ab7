// kiln report RUN_DIR [--out FILE]: one self-contained report.html (inline SVG charts of
// loss with the data's unigram baseline, learning rate, gradient norm, throughput, MFU and
// memory per rank, the run's wall time, tokens, sessions and events, the in-training
// samples, the checkpoints, the resolved config, profiler summaries, an image
// generator's samples). See src/report/report.h and
// docs/profiling.md.
#include "apps/kiln/commands.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/file_util.h"
#include "config/config.h"
#include "data/image_dataset.h"
#include "data/llava.h"
#include "data/tokenizer.h"
#include "data/unigram.h"
#include "model_io/model_io.h"
#include "models/registry.h"
#include "report/report.h"
#include "sampling/image_sampler.h"
#include "train/device.h"

#include <fmt/format.h>

#include <unistd.h>

namespace kiln::app {

namespace {

// The bytes of a PNG grid of `images`, `columns` per row.
std::string grid_png(const SampledImages& images, int columns) {
  namespace fs = std::filesystem;
  const fs::path png =
      fs::temp_directory_path() / fmt::format("kiln-report-{}.png", static_cast<long>(::getpid()));
  write_image_grid(png, images, columns);
  std::string bytes = checkpoint::detail::read_file(png);
  fs::remove(png);
  return bytes;
}

// A text-to-image run's prompts: the captions (each record's last answer) of the first n
// val records of its data.dir, as ids and as text.
std::vector<std::pair<std::vector<int32_t>, std::string>> val_prompts(
    const report::RunData& run, const data::Tokenizer& tok, int n) {
  const TrainConfig config =
      load_config_string(run.config_toml, {}, (run.dir / "config.toml").string());
  data::ImageLoader loader(config.data.dir, "val", 0, /*shuffle=*/false);
  n = static_cast<int>(std::min<int64_t>(n, loader.samples_per_epoch()));
  std::vector<uint8_t> pixels(static_cast<size_t>(n * loader.meta().shape.pixels()));
  std::vector<data::CaptionTokens> captions;
  loader.next_pairs(pixels.data(), captions, n);
  std::vector<std::pair<std::vector<int32_t>, std::string>> out;
  for (const data::CaptionTokens& c : captions) {
    const auto answer = data::llava_last_answer(c, tok.eot_id());
    KILN_CHECK(answer, "{}: a val record without a whole last answer", config.data.dir);
    const auto [begin, end] = *answer;
    std::vector<int32_t> ids(c.ids.begin() + static_cast<ptrdiff_t>(begin),
                             c.ids.begin() + static_cast<ptrdiff_t>(end));
    // The text without the end-of-text and the space an answer's piece starts with.
    std::string text = tok.decode(std::span<const int32_t>(ids.data(), ids.size() - 1));
    if (text.starts_with(' ')) text.erase(0, 1);
    out.emplace_back(ids, text);
  }
  return out;
}

// An image generator's run: its latest checkpoint's samples (a row of 8 per class, or per
// prompt: the first 8 val captions of its data; 25 Euler steps, guidance scale 2, the EMA
// weights when saved), sampled afresh (nothing is written to the run directory). A
// failure is a warning in the report.
void sample_latest(report::RunData& run) {
  try {
    const auto latest = checkpoint::find_latest_checkpoint(run.dir / "ckpt");
    if (!latest) return;
    checkpoint::CheckpointReader reader(*latest);
    if (!model_arch(checkpoint_arch(reader.state())).generates_images) return;
    auto backend = make_device_backend("cpu");
    const auto model = make_model(checkpoint_model_options(reader), *backend);
    const FlowModel& flow = as_flow_model(*model, latest->string());
    const bool ema = checkpoint_has_ema(reader);
    load_model_weights(reader, *model, ema);
    ImageSampleOptions o;
    o.per_row = 8;
    o.steps = 25;
    o.cfg_scale = 2.0;
    const std::string how = fmt::format("{}: {} weights, 25 Euler steps, guidance scale 2 (kiln "
                                        "sample-images)", latest->filename().string(),
                                        ema ? "EMA" : "raw");
    if (flow.caption_tokens() == 0) {
      for (int k = 0; k < flow.num_classes(); ++k) o.classes.push_back(k);
      run.sample_png = grid_png(sample_images(*model, o), o.per_row);
      run.sample_name = how + ", a row of 8 per class";
      return;
    }
    const auto prompts = val_prompts(run, *load_checkpoint_tokenizer(reader), 8);
    for (const auto& p : prompts) o.captions.push_back(p.first);
    const SampledImages images = sample_images(*model, o);
    for (size_t r = 0; r < prompts.size(); ++r)
      run.sample_rows.emplace_back(
          prompts[r].second,
          grid_png(images.slice(static_cast<int64_t>(r) * o.per_row, o.per_row), o.per_row));
    run.sample_name = how + ", a row of 8 per prompt (the first val captions of data.dir)";
  } catch (const std::exception& e) {
    run.warnings.push_back(fmt::format("samples of the latest checkpoint: {}", e.what()));
  }
}

// A language model's run: the unigram baseline of its data (kiln unigram) as a line on
// the loss chart. A data set that cannot be read is a warning in the report.
void add_unigram_baseline(report::RunData& run) {
  if (run.config_toml.empty()) return;
  try {
    const TrainConfig config = load_config_string(run.config_toml, {}, (run.dir / "config.toml").string());
    if (config.data.dir.empty() || model_arch(config.model.arch).takes_images) return;
    const data::UnigramLoss u = data::unigram_val_loss(config.data.dir);
    run.baseline_loss = u.nats_per_token;
    run.baseline_name = fmt::format("unigram baseline (val, {:.3f})", u.nats_per_token);
  } catch (const std::exception& e) {
    run.warnings.push_back(fmt::format("unigram baseline: {}", e.what()));
  }
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
    report::RunData run = report::load_run(a->run_dir);
    sample_latest(run);
    add_unigram_baseline(run);
    for (const std::string& w : run.warnings) fmt::print(stderr, "kiln report: warning: {}\n", w);
    const std::filesystem::path path =
        a->out.empty() ? std::filesystem::path(a->run_dir) / "report.html" : std::filesystem::path(a->out);
    checkpoint::detail::atomic_write_file(path, report::render_report(run));
    fmt::print("kiln report: {}\n", path.string());
  });
}

}  // namespace kiln::app
