// kiln sample-images: a flow model's (DiT's) samples of chosen classes as a PNG grid, and
// as an image data set that kiln classify can score.
#include "apps/kiln/commands.h"
#include "checkpoint/checkpoint.h"
#include "core/error.h"
#include "data/image_dataset.h"
#include "models/registry.h"
#include "train/device.h"
#include "sampling/image_sampler.h"
#include "model_io/model_io.h"

#include <fmt/format.h>

namespace kiln::app {

void register_sample_images(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "sample-images", "Images from a flow model's checkpoint (dit): a PNG grid, a class per row");
  struct Args {
    std::string checkpoint, out, samples, classes = "0-9", device = "cpu", weights = "auto";
    int per_class = 8, steps = 50, batch = 100;
    double cfg_scale = 1.0;
    uint64_t seed = 0;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--checkpoint", a->checkpoint, "A checkpoint directory (ckpt/step_XXXXXXXX)")
      ->required();
  cmd->add_option("--out", a->out, "The PNG grid to write")->required();
  cmd->add_option("--classes", a->classes, "Classes, one grid row each: 0-9, 3, 1,4,7")
      ->capture_default_str();
  cmd->add_option("--per-class", a->per_class, "Samples per class (grid columns)")
      ->capture_default_str()
      ->check(CLI::Range(1, 10000));
  cmd->add_option("--cfg-scale", a->cfg_scale,
                  "Classifier-free guidance scale (1: none, the conditional model alone)")
      ->check(CLI::Range(0.0, 100.0))
      ->capture_default_str();
  cmd->add_option("--steps", a->steps, "Euler steps from noise to image")->check(CLI::Range(1, 100000))
      ->capture_default_str();
  cmd->add_option("--seed", a->seed, "Seed of the initial noise")
      ->capture_default_str();
  cmd->add_option("--batch", a->batch, "Images per model call")->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--samples", a->samples,
                  "Also write the samples as an image data set here (default: OUT without "
                  ".png, plus .samples), for kiln classify --data");
  cmd->add_option("--weights", a->weights,
                  "auto: the checkpoint's EMA of the weights when it has one, else the weights; "
                  "ema: the EMA (an error without one); params: the weights")
      ->check(CLI::IsMember({"auto", "ema", "params"}))
      ->capture_default_str();
  cmd->add_option("--device", a->device, "Where to run (as train.device): cpu or cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->callback([a] {
    ImageSampleOptions o;
    o.classes = parse_class_list(a->classes, "--classes");
    o.per_class = a->per_class;
    o.cfg_scale = a->cfg_scale;
    o.steps = a->steps;
    o.seed = a->seed;
    o.batch = a->batch;
    std::string samples = a->samples;
    if (samples.empty()) {
      std::filesystem::path p(a->out);
      samples = (p.parent_path() / (p.stem().string() + ".samples")).string();
    }
    namespace fs = std::filesystem;
    const fs::path out_parent = fs::path(a->out).parent_path();
    KILN_CHECK(!fs::exists(a->out) || fs::is_regular_file(a->out),
               "{}: exists and is not a regular file (--out names the PNG to write)", a->out);
    KILN_CHECK(out_parent.empty() || fs::is_directory(out_parent),
               "{}: no such directory for --out", out_parent.string());
    KILN_CHECK(!fs::exists(samples) || (fs::is_directory(samples) && fs::is_empty(samples)),
               "{}: exists and is not an empty folder (--samples names the data set folder to "
               "write; remove it or choose another)", samples);
    KILN_CHECK(fs::weakly_canonical(samples) != fs::weakly_canonical(a->out),
               "--samples and --out are the same path ({})", a->out);
    checkpoint::CheckpointReader reader(a->checkpoint);
    auto backend = make_device_backend(a->device);
    const auto model = make_model(checkpoint_model_options(reader), *backend);
    const bool ema = a->weights == "ema" || (a->weights == "auto" && checkpoint_has_ema(reader));
    load_model_weights(reader, *model, ema);
    const SampledImages images = sample_images(*model, o);
    write_image_grid(a->out, images, o.per_class);
    write_sample_dataset(samples, images, as_flow_model(*model, a->checkpoint).num_classes(), {});
    fmt::print("kiln sample-images: {} images ({} classes x {}), {} steps, cfg scale {}, {} "
               "weights -> {} and {}\n", images.count(), o.classes.size(), o.per_class, o.steps,
               o.cfg_scale, ema ? "EMA" : "raw", a->out, samples);
  });
}

}  // namespace kiln::app
