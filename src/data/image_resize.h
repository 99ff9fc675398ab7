// Resizing 8-bit images for the image-text path (`kiln prepare --format llava --image-size`):
// PIL's Image.resize with Image.BILINEAR (Pillow's ImagingResample), separable: each
// output pixel x (center x + 0.5 in output coordinates) is the weighted mean of the input
// pixels j around its center c = (x + 0.5) * s, s = in / out, with the triangle kernel
// w = max(0, 1 - |j + 0.5 - c| / f), f = max(s, 1) (so a downscale averages over its whole
// footprint: antialiased), weights normalised over the pixels inside the image; rows first,
// then columns, in double, each pass rounded to nearest (halves up) and clamped to [0, 255]
// as Pillow's 8-bit passes are. Pillow computes in fixed point: a value may differ from it
// by one where the exact mean falls next to a half.
#pragma once

#include "data/image_shard.h"

#include <cstdint>
#include <vector>

namespace kiln::data {

/// `pixels` [from.height, from.width, C] resized to [height, width, C] (C = from.channels).
/// Throws kiln::Error on an empty size or a pixel count other than from.pixels().
std::vector<uint8_t> resize_bilinear(const std::vector<uint8_t>& pixels, const ImageShape& from,
                                     int height, int width);

}  // namespace kiln::data
