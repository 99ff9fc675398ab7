// Image layout ops: patchify (images to rows of flattened patches) and unpatchify.
#pragma once

#include "backend/cuda/common.h"

namespace kiln::cuda {

/// Backend::patchify: images fp32 [B,H,W,C] (channels last), out [B, T_rows, C*P*P] of
/// element type e, rows [0, (H/P)(W/P)) of each image written, element c*P*P + dy*P + dx
/// of row py*(W/P) + px = images[b, py*P + dy, px*P + dx, c].
void patchify(cudaStream_t s, Elem e, void* out, const float* images, int64_t B, int64_t H,
              int64_t W, int64_t C, int64_t P, int64_t T_rows);
/// Backend::unpatchify: the inverse, images fp32 [B,H,W,C] from rows [0, (H/P)(W/P)) of
/// patches [B, T_rows, C*P*P] of element type e.
void unpatchify(cudaStream_t s, Elem e, float* images, const void* patches, int64_t B, int64_t H,
                int64_t W, int64_t C, int64_t P, int64_t T_rows);

}  // namespace kiln::cuda
