// kiln score-scenes: a text-to-image model (mmdit) scored on kiln scenes by an image
// classifier (eval/scene_score.h): the share of canvases whose four cells all hold what
// their caption asked for, and of cells, for held-out captions (a combination of cells no
// training scene has) and seen ones, per guidance scale; the training captions' score
// (memorisation) and the real canvases' (the classifier's ceiling) beside them.
#include "apps/kiln/commands.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/file_util.h"
#include "core/error.h"
#include "data/image_folder.h"
#include "data/llava.h"
#include "data/tokenizer.h"
#include "eval/scene_score.h"
#include "model_io/model_io.h"
#include "models/capabilities.h"
#include "models/registry.h"
#include "sampling/image_sampler.h"
#include "train/device.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <set>

namespace kiln::app {

namespace {

namespace fs = std::filesystem;

std::unique_ptr<Model> load_checkpoint_model(const std::string& dir, Backend& be, const std::string& weights) {
  checkpoint::CheckpointReader reader(dir);
  auto model = make_model(checkpoint_model_options(reader), be);
  load_model_weights(reader, *model, weights == "ema" || (weights == "auto" && checkpoint_has_ema(reader)));
  return model;
}

// The real canvases of `scenes` (their PNGs, beside `file`) read by the classifier.
SceneTally score_real(Model& classifier, const fs::path& file, const std::vector<SceneRecord>& scenes,
                      double empty_below) {
  data::ImageShape shape, first;
  std::vector<uint8_t> pixels;
  std::vector<std::array<int, 4>> expected;
  for (const SceneRecord& s : scenes) {
    const fs::path path = file.parent_path() / s.image;
    const auto px = data::read_png(path, 1, &shape);
    if (expected.empty()) first = shape;
    KILN_CHECK(shape.height == first.height && shape.width == first.width,
               "{}: {}x{}, the first scene's image is {}x{}", path.string(), shape.height,
               shape.width, first.height, first.width);
    pixels.insert(pixels.end(), px.begin(), px.end());
    expected.push_back(s.cells);
  }
  return tally_scenes(read_canvases(classifier, shape, pixels, empty_below, 256), expected);
}

// The captions of `scenes` (of `file`) as the model reads them. Throws kiln::Error naming
// FILE:LINE for one longer than its caption slots.
std::vector<std::vector<int32_t>> scene_captions(const FlowModel& model, const data::Tokenizer& tok,
                                                 const std::string& file,
                                                 const std::vector<SceneRecord>& scenes) {
  std::vector<std::vector<int32_t>> out;
  for (const SceneRecord& s : scenes) {
    out.push_back(data::llava_caption(tok, s.caption));
    KILN_CHECK(static_cast<int>(out.back().size()) <= model.caption_tokens(),
               "{}:{}: the caption is {} tokens, more than the model's {} (model.caption_tokens)",
               file, s.line, out.back().size(), model.caption_tokens());
  }
  return out;
}

// Samples `per_prompt` canvases of each caption and reads them: one reading per sample, in
// caption order.
std::vector<std::array<int, 4>> sample_and_read(Model& generator, Model& classifier,
                                                std::vector<std::vector<int32_t>> captions,
                                                ImageSampleOptions o, double empty_below) {
  o.captions = std::move(captions);
  const SampledImages images = sample_images(generator, o);
  return read_canvases(classifier, images.shape, images.pixels, empty_below, 256);
}

// The accuracies of an empty group are null (JSON) and n/a (printed), not 0.
nlohmann::json tally_json(const SceneTally& t) {
  auto share = [&](double x) { return t.canvases ? nlohmann::json(x) : nlohmann::json(nullptr); };
  return {{"canvases", t.canvases}, {"canvases_right", t.canvases_right},
          {"canvas_accuracy", share(t.canvas_accuracy())}, {"cells", t.cells},
          {"cells_right", t.cells_right}, {"cell_accuracy", share(t.cell_accuracy())}};
}

void print_tally(const std::string& what, const SceneTally& t) {
  auto share = [&](double x) { return t.canvases ? fmt::format("{:6.2f}%", 100 * x) : "   n/a "; };
  fmt::print("  {:<44} canvases {} ({} of {})   cells {}\n", what, share(t.canvas_accuracy()),
             t.canvases_right, t.canvases, share(t.cell_accuracy()));
}

}  // namespace

void register_score_scenes(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "score-scenes", "Score a text-to-image model (mmdit) on kiln scenes: sample each scene's "
                      "caption and check every cell with an image classifier");
  struct Args {
    std::string model, classifier, scenes, train_scenes, json, weights = "auto", device = "cpu";
    std::vector<double> cfg_scales{1.0};
    int64_t max_records = 200;
    int per_prompt = 1, steps = 25, batch = 100;
    uint64_t seed = 0;
    double empty_below = 16.0, shift = 1.0;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--model", a->model, "The text-to-image model's checkpoint")->required();
  cmd->add_option("--classifier", a->classifier,
                  "An image classifier's checkpoint for the cells (the ViT of "
                  "configs/vit-fashion-mnist.toml)")->required();
  cmd->add_option("--scenes", a->scenes, "A kiln scenes JSONL of held-out scenes (val.jsonl)")
      ->required();
  cmd->add_option("--train-scenes", a->train_scenes,
                  "The training scenes (train.jsonl): their combinations tell held-out captions "
                  "from seen ones, and their first captions are scored too");
  cmd->add_option("--max-records", a->max_records, "Scenes scored per file (0: all)")
      ->capture_default_str()->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  cmd->add_option("--per-prompt", a->per_prompt, "Samples per caption")->capture_default_str()
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--cfg-scale", a->cfg_scales, "Guidance scales, each scored (repeatable)")
      ->capture_default_str()->check(CLI::Range(0.0, 100.0));
  cmd->add_option("--steps", a->steps, "Euler steps")->capture_default_str()->check(CLI::Range(1, 100000));
  cmd->add_option("--shift", a->shift, "Time shift of the steps (as sample-images --shift)")
      ->capture_default_str()->check(CLI::Range(0.01, 100.0));
  cmd->add_option("--seed", a->seed, "Seed of the initial noise")->capture_default_str();
  cmd->add_option("--batch", a->batch, "Images per model call")->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--empty-below", a->empty_below,
                  "A cell whose mean pixel (0-255) is below this reads as empty")
      ->capture_default_str()->check(CLI::Range(0.0, 255.0));
  cmd->add_option("--weights", a->weights, "The model's weights: auto (the EMA when saved), ema, params")
      ->check(CLI::IsMember({"auto", "ema", "params"}))->capture_default_str();
  cmd->add_option("--json", a->json, "Also write the results as JSON to this file");
  cmd->add_option("--device", a->device, "Where to run (as train.device): cpu or cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->callback([a] {
    if (!a->json.empty()) {
      const fs::path dir = fs::path(a->json).parent_path();
      KILN_CHECK(dir.empty() || fs::is_directory(dir), "--json {}: no folder {}", a->json,
                 dir.string());
    }
    auto backend = make_device_backend(a->device);
    const auto generator = load_checkpoint_model(a->model, *backend, a->weights);
    const FlowModel& flow = as_flow_model(*generator, a->model);
    KILN_CHECK(flow.caption_tokens() > 0, "{}: model.arch '{}' is not a text-to-image model "
               "(mmdit)", a->model, generator->arch());
    const auto classifier = load_checkpoint_model(a->classifier, *backend, "params");
    const auto tok = load_checkpoint_tokenizer(checkpoint::CheckpointReader(a->model));
    const std::vector<SceneRecord> val = read_scene_records(a->scenes, a->max_records);
    const auto val_captions = scene_captions(flow, *tok, a->scenes, val);
    std::set<std::array<int, 4>> seen;
    std::vector<SceneRecord> train;
    if (!a->train_scenes.empty()) {
      for (const SceneRecord& s : read_scene_records(a->train_scenes, 0)) {
        seen.insert(s.cells);
        if (a->max_records <= 0 || static_cast<int64_t>(train.size()) < a->max_records) train.push_back(s);
      }
    }
    const auto train_captions = scene_captions(flow, *tok, a->train_scenes, train);
    nlohmann::json out{{"model", a->model}, {"classifier", a->classifier}, {"scenes", a->scenes},
                       {"train_scenes", a->train_scenes}, {"per_prompt", a->per_prompt},
                       {"steps", a->steps}, {"shift", a->shift}, {"seed", a->seed},
                       {"empty_below", a->empty_below},
                       {"by_cfg_scale", nlohmann::json::array()}};
    const SceneTally real = score_real(*classifier, a->scenes, val, a->empty_below);
    fmt::print("kiln score-scenes: {} held-out scenes{}\n", val.size(),
               train.empty() ? "" : fmt::format(", {} training scenes", train.size()));
    print_tally("the real canvases (the classifier's ceiling)", real);
    out["real"] = tally_json(real);
    ImageSampleOptions o;
    o.per_row = a->per_prompt;
    o.steps = a->steps;
    o.shift = a->shift;
    o.seed = a->seed;
    o.batch = a->batch;
    for (const double cfg : a->cfg_scales) {
      o.cfg_scale = cfg;
      fmt::print("guidance scale {}:\n", cfg);
      const auto read = sample_and_read(*generator, *classifier, val_captions, o, a->empty_below);
      SceneTally held_out, in_training;
      for (size_t i = 0; i < read.size(); ++i) {
        const SceneRecord& s = val[i / static_cast<size_t>(a->per_prompt)];
        const SceneTally t = tally_scenes(std::span(read).subspan(i, 1), std::span(&s.cells, 1));
        (seen.count(s.cells) ? in_training : held_out).add(t);
      }
      nlohmann::json row{{"cfg_scale", cfg}, {"held_out", tally_json(held_out)}};
      print_tally(seen.empty() ? "held-out scenes" : "held-out captions (an unseen combination)",
                  held_out);
      if (!seen.empty()) {
        print_tally("held-out captions of a seen combination", in_training);
        row["seen_combination"] = tally_json(in_training);
        const auto train_read =
            sample_and_read(*generator, *classifier, train_captions, o, a->empty_below);
        std::vector<std::array<int, 4>> expected;
        for (const SceneRecord& s : train) expected.insert(expected.end(), a->per_prompt, s.cells);
        const SceneTally t = tally_scenes(train_read, expected);
        print_tally("training captions", t);
        row["training"] = tally_json(t);
      }
      out["by_cfg_scale"].push_back(row);
    }
    if (!a->json.empty()) checkpoint::detail::atomic_write_file(a->json, out.dump(2) + "\n");
  });
}

}  // namespace kiln::app
