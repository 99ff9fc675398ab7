// Image folders in torchvision's ImageFolder convention (one sub-folder per class, its
// name the class name) and PNG files through libpng's simplified API.
#pragma once

#include "data/image_shard.h"

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace kiln::data {

struct ImageFolderListing {
  std::vector<std::string> classes;  // sorted sub-folder names; label i = classes[i]
  std::vector<std::pair<std::filesystem::path, int>> files;  // (*.png, label), sorted
};

/// The classes and PNG files of `dir` (other files are ignored). Throws kiln::Error naming
/// `dir` when it has no class folder or a class folder without a PNG.
ImageFolderListing list_image_folder(const std::filesystem::path& dir);

/// A PNG as 8-bit pixels [H, W, C]: C = `channels` (1 gray, 3 RGB; libpng converts), or
/// 0 for 1 when the file is grayscale and 3 otherwise (alpha is dropped onto black).
/// Throws kiln::Error naming the file when it is missing or not a valid PNG.
std::vector<uint8_t> read_png(const std::filesystem::path& path, int channels, ImageShape* shape);

/// Writes pixels [H, W, C] (C = 1 or 3) as an 8-bit PNG (tests, tools). Throws kiln::Error.
void write_png(const std::filesystem::path& path, const ImageShape& shape,
               const std::vector<uint8_t>& pixels);

}  // namespace kiln::data
