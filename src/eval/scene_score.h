// Scoring a text-to-image model on kiln scenes (data/scenes.h: 2x2 canvases of
// Fashion-MNIST items), the measure of `kiln score-scenes`: each scene's caption (its last
// answer, "A sandal in the top left, a bag in the top right and a coat in the bottom
// right.") is sampled (sampling/image_sampler.h), every canvas is cut into its four cells,
// and a cell reads as empty when its mean pixel is below `empty_below` (of 255: an item of
// Fashion-MNIST averages about 70, an empty cell 0), else as the class an image classifier
// (kiln's Fashion-MNIST ViT, 28x28) gives it. A cell is right when it reads as the scene's
// ("cells": the class, -1 empty), a canvas when its four cells are.
#pragma once

#include "data/image_shard.h"
#include "models/model.h"

#include <array>
#include <cstdint>
#include <filesystem>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kiln {

/// One scene of a `kiln scenes` JSONL: its caption, its cells and its image path (relative
/// to the JSONL's folder).
struct SceneRecord {
  std::string caption, image;
  std::array<int, 4> cells{};
  int64_t line = 0;  // in its file, from 1
};

/// The question whose answer is a scene's caption (its last round).
inline constexpr std::string_view kDescribeQuestion = "Describe the image.";

/// The scenes of a `kiln scenes` JSONL (at most `max_records`; 0: all). Throws kiln::Error
/// naming FILE:LINE for a line that is not a scene record (no "cells" of four classes in
/// [-1, 9], a last round other than kDescribeQuestion and its answer).
std::vector<SceneRecord> read_scene_records(const std::filesystem::path& path, int64_t max_records);

struct SceneTally {
  int64_t canvases = 0, canvases_right = 0, cells = 0, cells_right = 0;
  double canvas_accuracy() const { return canvases ? double(canvases_right) / canvases : 0.0; }
  double cell_accuracy() const { return cells ? double(cells_right) / cells : 0.0; }
  void add(const SceneTally& o);
};

/// Reads canvases uint8 [n, 2S, 2S, 1] (S = the classifier's image side) into their cells'
/// classes (-1 empty), n x 4 in reading order, classifying the non-empty cells with
/// `classifier` (an ImageClassifier of [S, S, 1] images, pixels scaled to [-1, 1]) in
/// batches of `batch`. Throws kiln::Error when the classifier's images are not [S, S, 1]
/// or the canvases not twice their side.
std::vector<std::array<int, 4>> read_canvases(Model& classifier, const data::ImageShape& shape,
                                              std::span<const uint8_t> pixels, double empty_below,
                                              int batch);

/// The tally of readings against what the scenes asked for (expected[i] per canvas i).
SceneTally tally_scenes(std::span<const std::array<int, 4>> read,
                        std::span<const std::array<int, 4>> expected);

}  // namespace kiln
