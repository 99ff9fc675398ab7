// kiln sample-images: a flow model's samples as a PNG grid, a row per class (DiT) or per
// prompt (MMDiT), the rows in a JSON file beside it, and the samples as an image data set
// that kiln classify can score.
#include "apps/kiln/commands.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/file_util.h"
#include "core/error.h"
#include "data/image_dataset.h"
#include "data/llava.h"
#include "data/tokenizer.h"
#include "models/registry.h"
#include "train/device.h"
#include "sampling/image_sampler.h"
#include "model_io/model_io.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <fstream>

namespace kiln::app {

namespace {

namespace fs = std::filesystem;

// The prompts of --prompts FILE: one per line, blank lines skipped.
std::vector<std::string> read_prompts(const std::string& path) {
  std::ifstream in(path);
  KILN_CHECK(in, "{}: cannot read (--prompts names a text file, one prompt per line)", path);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") != std::string::npos) out.push_back(line);
  }
  KILN_CHECK(!out.empty(), "{}: no prompt in it (one per line)", path);
  return out;
}

// PATH with its extension replaced by `ext` (".json", ".samples").
std::string beside(const std::string& path, const std::string& ext) {
  const fs::path p(path);
  return (p.parent_path() / (p.stem().string() + ext)).string();
}

}  // namespace

void register_sample_images(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "sample-images", "Images from a flow model's checkpoint (dit, mmdit): a PNG grid, a class "
                       "or prompt per row");
  struct Args {
    std::string checkpoint, out, samples, rows_json, classes, prompts_file, device = "cpu",
        weights = "auto";
    std::vector<std::string> prompts;
    int per_row = 8, steps = 50, batch = 100;
    double cfg_scale = 1.0, shift = 1.0;
    uint64_t seed = 0;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--checkpoint", a->checkpoint, "A checkpoint directory (ckpt/step_XXXXXXXX)")
      ->required();
  cmd->add_option("--out", a->out, "The PNG grid to write")->required();
  cmd->add_option("--classes", a->classes,
                  "A class-conditional model's classes, a row each: 0-9, 3, 1,4,7 (default: "
                  "every class)");
  cmd->add_option("--prompt", a->prompts,
                  "A text-conditioned model's prompt, a row each (repeatable); \"\" is the empty "
                  "caption: the unconditional model");
  cmd->add_option("--prompts", a->prompts_file,
                  "A file of prompts, one per line (blank lines skipped), a row each after the "
                  "--prompt ones");
  cmd->add_option("--per-row,--per-class", a->per_row, "Samples per row (grid columns)")
      ->capture_default_str()
      ->check(CLI::Range(1, 10000));
  cmd->add_option("--cfg-scale", a->cfg_scale,
                  "Classifier-free guidance scale (1: none, the conditional model alone)")
      ->check(CLI::Range(0.0, 100.0))
      ->capture_default_str();
  cmd->add_option("--steps", a->steps, "Euler steps from noise to image")->check(CLI::Range(1, 100000))
      ->capture_default_str();
  cmd->add_option("--shift", a->shift,
                  "Time shift of the steps (SD3's): t = s u / (1 + (s - 1) u) over uniform u; "
                  "> 1 puts more steps at high noise")
      ->check(CLI::Range(0.01, 100.0))
      ->capture_default_str();
  cmd->add_option("--seed", a->seed, "Seed of the initial noise")
      ->capture_default_str();
  cmd->add_option("--batch", a->batch, "Images per model call")->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--samples", a->samples,
                  "Also write the samples as an image data set here (default: OUT without "
                  ".png, plus .samples, replaced when it holds earlier samples; labels: the "
                  "row's class (a DiT's, for kiln classify --data), or its prompt's index)");
  cmd->add_option("--rows", a->rows_json,
                  "The rows (classes or prompts) and settings as JSON (default: OUT without "
                  ".png, plus .json)");
  cmd->add_option("--weights", a->weights,
                  "auto: the checkpoint's EMA of the weights when it has one, else the weights; "
                  "ema: the EMA (an error without one); params: the weights")
      ->check(CLI::IsMember({"auto", "ema", "params"}))
      ->capture_default_str();
  cmd->add_option("--device", a->device, "Where to run (as train.device): cpu or cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->callback([a] {
    ImageSampleOptions o;
    o.per_row = a->per_row;
    o.cfg_scale = a->cfg_scale;
    o.shift = a->shift;
    o.steps = a->steps;
    o.seed = a->seed;
    o.batch = a->batch;
    std::vector<std::string> prompts = a->prompts;
    if (!a->prompts_file.empty())
      for (std::string& p : read_prompts(a->prompts_file)) prompts.push_back(std::move(p));
    const std::string samples = a->samples.empty() ? beside(a->out, ".samples") : a->samples;
    const std::string rows_json = a->rows_json.empty() ? beside(a->out, ".json") : a->rows_json;
    const fs::path out_parent = fs::path(a->out).parent_path();
    KILN_CHECK(!fs::exists(a->out) || fs::is_regular_file(a->out),
               "{}: exists and is not a regular file (--out names the PNG to write)", a->out);
    KILN_CHECK(out_parent.empty() || fs::is_directory(out_parent),
               "{}: no such directory for --out", out_parent.string());
    // The default folder, like the PNG and the JSON, is rewritten; a given one must be new.
    const bool replace = a->samples.empty() && fs::is_directory(samples) &&
                         fs::exists(fs::path(samples) / "meta.json");
    KILN_CHECK(replace || !fs::exists(samples) || (fs::is_directory(samples) && fs::is_empty(samples)),
               "{}: exists and is not an empty folder (--samples names the data set folder to "
               "write; remove it or choose another)", samples);
    KILN_CHECK(!fs::is_directory(rows_json), "{}: is a folder (--rows names the JSON file to "
               "write)", rows_json);
    const auto rows_parent = fs::path(rows_json).parent_path();
    KILN_CHECK(rows_parent.empty() || fs::is_directory(rows_parent),
               "{}: no such directory for --rows", rows_parent.string());
    KILN_CHECK(fs::weakly_canonical(samples) != fs::weakly_canonical(a->out) &&
                   fs::weakly_canonical(rows_json) != fs::weakly_canonical(a->out) &&
                   fs::weakly_canonical(rows_json) != fs::weakly_canonical(samples),
               "--samples, --rows and --out name the same path");
    checkpoint::CheckpointReader reader(a->checkpoint);
    auto backend = make_device_backend(a->device);
    const auto model = make_model(checkpoint_model_options(reader), *backend);
    const FlowModel& flow = as_flow_model(*model, a->checkpoint);
    nlohmann::json rows = nlohmann::json::array();
    if (!prompts.empty()) {
      KILN_CHECK(a->classes.empty(), "sample-images: --classes and --prompt at once");
      KILN_CHECK(flow.caption_tokens() > 0, "sample-images: {} is conditioned on classes, not "
                 "text (give --classes)", a->checkpoint);
      const auto tok = load_checkpoint_tokenizer(reader);
      for (const std::string& p : prompts) {
        o.captions.push_back(data::llava_caption(*tok, p));
        rows.push_back({{"prompt", p}, {"tokens", o.captions.back().size()}});
      }
    } else if (flow.num_classes() > 0 || !a->classes.empty()) {
      o.classes = a->classes.empty() ? parse_class_list(fmt::format("0-{}", flow.num_classes() - 1), "")
                                     : parse_class_list(a->classes, "--classes");
      for (int c : o.classes) rows.push_back({{"class", c}});
    }
    const bool ema = a->weights == "ema" || (a->weights == "auto" && checkpoint_has_ema(reader));
    load_model_weights(reader, *model, ema);
    const SampledImages images = sample_images(*model, o);
    write_image_grid(a->out, images, o.per_row);
    const int labels = o.captions.empty() ? flow.num_classes() : static_cast<int>(o.captions.size());
    if (replace) fs::remove_all(samples);
    write_sample_dataset(samples, images, labels, {});
    const nlohmann::json settings{{"checkpoint", a->checkpoint}, {"weights", ema ? "ema" : "params"},
                                  {"steps", o.steps}, {"shift", o.shift},
                                  {"cfg_scale", o.cfg_scale},
                                  {"seed", o.seed}, {"per_row", o.per_row}, {"grid", a->out},
                                  {"samples", samples}, {"rows", rows}};
    checkpoint::detail::atomic_write_file(rows_json, settings.dump(2) + "\n");
    fmt::print("kiln sample-images: {} images ({} rows x {}), {} steps, cfg scale {}, {} "
               "weights -> {}, {} and {}\n", images.count(), rows.size(), o.per_row, o.steps,
               o.cfg_scale, ema ? "EMA" : "raw", a->out, rows_json, samples);
  });
}

}  // namespace kiln::app
