// kiln scenes --fashion-mnist DIR --out DIR: the compositional scene set of data/scenes.h,
// LLaVA image-text pairs (PNG files and one JSONL per split) generated from Fashion-MNIST
// for vision-language training and its evaluation.
#include "apps/kiln/commands.h"
#include "data/scenes.h"

#include <fmt/format.h>

#include <memory>

namespace kiln::app {

void register_scenes(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "scenes", "Generate 2x2 Fashion-MNIST scenes with questions and answers as LLaVA pairs");
  auto o = std::make_shared<data::SceneOptions>();
  o->fashion_mnist = "/usr/share/datasets/fashion-mnist";
  cmd->add_option("--fashion-mnist", o->fashion_mnist,
                  "The folder of the four IDX files (Debian's dataset-fashion-mnist; default "
                  "/usr/share/datasets/fashion-mnist)");
  cmd->add_option("--out", o->out, "Where to write images/<split>/*.png, train.jsonl, val.jsonl")
      ->required();
  cmd->add_option("--train", o->train, "Train scenes (train-split items; default 10000)");
  cmd->add_option("--val", o->val, "Val scenes (t10k-split items only; default 1000)");
  cmd->add_option("--seed", o->seed, "Scene i of a split is a function of (seed, split, i)");
  cmd->callback([o] {
    data::write_scenes(*o);
    fmt::print("kiln scenes: {} train and {} val scenes (seed {}) in {}\n", o->train, o->val,
               o->seed, o->out.string());
  });
}

}  // namespace kiln::app
