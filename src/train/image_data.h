// Image data sets as TrainData (train/train_data.h has the kinds): labelled images for an
// image model, and image-text pairs laid out as the model reads them (PairLayout).
#pragma once

#include "train/train_data.h"

#include <filesystem>
#include <memory>
#include <string>

namespace kiln {

/// Split `split` of the image data set in `dir` (data/image_dataset.h; pairs when it has
/// captions), shuffled per epoch under `seed` when `shuffle`. seq_len: the model's
/// sequence (a vision-language model's pairs). Throws kiln::Error naming the file when the
/// data set is missing or malformed.
std::unique_ptr<TrainData> open_image_data(const std::filesystem::path& dir,
                                           const std::string& split, int seq_len, uint64_t seed,
                                           bool shuffle, const PairLayout& pairs);

}  // namespace kiln
