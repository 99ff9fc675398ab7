// A compositional scene set for vision-language models (`kiln scenes`, issue 41): canvases
// of 2 to 4 Fashion-MNIST items (Xiao et al. 2017; Debian's dataset-fashion-mnist) in a
// 2x2 grid, with questions a model can answer only by looking at the image and binding
// what it sees to where: what is in a cell, how many items of a class there are, whether a
// class is present, and a description. Written as LLaVA image-text pairs (data/llava.h):
// one 8-bit gray PNG per scene and a JSONL of records, so the data path a user's LLaVA
// files take is the one the scenes take.
//
// Scene i of a split is a function of (seed, split, i) alone (std::mt19937_64 seeded with
// both), so the set is reproducible and a longer set extends a shorter one. Per scene:
//   items   k uniform in {2, 3, 4}; k distinct cells of the grid (reading order: top left,
//           top right, bottom left, bottom right); for each an item drawn uniformly from
//           the split's images (train scenes from the train images, val scenes from the
//           t10k ones: a val item is never seen in training);
//   canvas  [2*28, 2*28] gray, each item's 28x28 pixels in its cell, empty cells black;
//   turns   six rounds, each a human question and the gpt answer, in this order:
//     position  "<image>\nWhat is in the <cell>?" for a uniform cell -> "A sandal." /
//               "Nothing." (the <image> opens the first question, as in LLaVA's files);
//     presence  "Is there <a class>?" -> "Yes." / "No.";
//     count     "How many <plural> are there?" -> "None." / "One." .. "Four.";
//     presence, count  again;
//     describe  "Describe the image." -> the items in reading order, e.g. "A sandal in
//               the top left, a bag in the top right and a coat in the bottom right.".
//           Presence and count each ask about a class no earlier answer or question named
//           (so no answer can be read off the conversation): one of the scene's items with
//           probability 1/2, else a class the scene lacks (the other kind when one kind is
//           used up).
// Each record also holds "kinds" (each round's kind, in turn order) and "cells" (the class
// index in each cell, -1 for empty), which LLaVA readers ignore and an evaluation reads.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace kiln::data {

/// The class names of Fashion-MNIST's labels 0..9 as the scenes' text says them, one and
/// several.
inline constexpr const char* kFashionNames[10] = {
    "t-shirt", "pair of trousers", "pullover", "dress", "coat", "sandal", "shirt", "sneaker",
    "bag", "ankle boot"};
inline constexpr const char* kFashionPlurals[10] = {
    "t-shirts", "pairs of trousers", "pullovers", "dresses", "coats", "sandals", "shirts",
    "sneakers", "bags", "ankle boots"};

struct SceneOptions {
  std::filesystem::path fashion_mnist;  // a folder with the four IDX files (.gz or plain)
  std::filesystem::path out;            // written: images/<split>/<i>.png, <split>.jsonl
  int64_t train = 10000, val = 1000;    // scenes per split
  uint64_t seed = 0;
};

/// Writes both splits (train from train-images/-labels, val from t10k-images/-labels).
/// Throws kiln::Error naming the file when an IDX file is missing or is not 28x28 images
/// with matching labels (labels 0..9), when `out` already holds scenes (train.jsonl or an
/// images/ folder: a smaller set would leave stale images), or when a file cannot be
/// written. Each JSONL is written atomically (a temporary, then renamed).
void write_scenes(const SceneOptions& options);

}  // namespace kiln::data
