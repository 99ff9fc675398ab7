// Sampling a flow model's images (kiln sample-images, kiln report): Euler steps of the
// probability-flow ODE from noise at t = 1 to an image at t = 0 (rectified flow: Liu et
// al. 2023), with classifier-free guidance (Ho & Salimans 2022):
//   v = v(x, t, null) + cfg_scale * (v(x, t, y) - v(x, t, null))   (cfg_scale 1: v(x, t, y))
//   x <- x + (t_{k+1} - t_k) v,   t_k = shift u_k / (1 + (shift - 1) u_k),  u_k = 1 - k / steps
// (shift 1: uniform steps; shift > 1 spends more of them at high noise, where the layout
// is decided: SD3's timestep shift, Esser et al. 2024 section 5.3.2, 3.0 at 1024 pixels)
// y is a row's condition: a class (a class-conditional model, null the null class) or a
// caption (a text-conditioned one, null the empty caption). Sample i of a request starts
// from Philox noise of (seed, i) alone, so a sample is the same whatever the batch size or
// the other rows asked for.
#pragma once

#include "data/image_shard.h"
#include "models/model.h"

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace kiln {

struct ImageSampleOptions {
  /// The grid's rows, in order, of one kind: classes (a class-conditional model), or
  /// captions' token ids (a text-conditioned one: data/llava.h llava_caption; an empty one
  /// is the null caption, the unconditional model).
  std::vector<int> classes;
  std::vector<std::vector<int32_t>> captions;
  int per_row = 8;  // samples per row
  double cfg_scale = 1.0;
  int steps = 50;
  double shift = 1.0;        // the time grid's shift (> 0; 1: uniform)
  uint64_t seed = 0;
  int batch = 100;           // images per model call (twice that with guidance)
};

/// Generated images: pixels uint8 [n, H, W, C] (x in [-1, 1] mapped to round(127.5 (x+1))),
/// labels [n] (row-major: the first row's per_row images first; a row's class, or its
/// caption's index among the captions).
struct SampledImages {
  data::ImageShape shape;
  std::vector<uint8_t> pixels;
  std::vector<int32_t> labels;
  int64_t count() const { return static_cast<int64_t>(labels.size()); }
  /// Images [first, first + n) (e.g. one row of a grid).
  SampledImages slice(int64_t first, int64_t n) const;
};

/// Runs the sampler above on `model` (its FlowModel::predict_velocity). Throws kiln::Error
/// for a model that is not a flow model, rows of the kind the model is not conditioned on
/// (or of both kinds, or none), a class outside [0, num_classes()), a caption longer than
/// caption_tokens() (naming its row) or steps < 1.
SampledImages sample_images(Model& model, const ImageSampleOptions& options);

/// A PNG of the images in a grid, `columns` per row (per_row: a class or caption per row), with a
/// 2-pixel gap; written atomically. Throws kiln::Error naming the file.
void write_image_grid(const std::filesystem::path& path, const SampledImages& images, int columns);

/// The images as a one-split ("val") image data set in `dir` (meta.json + a shard), so that
/// `kiln classify --data dir` scores them; `classes` as the model's. Throws kiln::Error when
/// dir holds a data set already.
void write_sample_dataset(const std::filesystem::path& dir, const SampledImages& images,
                          int classes, const std::vector<std::string>& class_names);

/// "0-9", "3", "1,4,7", "0-2,5" to class numbers. Throws kiln::Error naming `what`.
std::vector<int> parse_class_list(const std::string& spec, const std::string& what);

}  // namespace kiln
