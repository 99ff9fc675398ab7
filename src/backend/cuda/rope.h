// Rotary position embedding (Su et al. 2021, "RoFormer"), "rotate half" layout, in place
// on the q and k heads of a packed qkv buffer.
#pragma once

#include "backend/cuda/common.h"

namespace kiln::cuda {

/// Largest HD / 2 the kernel takes (its inverse frequencies travel by value).
inline constexpr int kRopeMaxHalf = 256;
struct RopeFreqs {
  float inv_freq[kRopeMaxHalf];
};

/// qkv [B,T,(NH+2NKV)*HD]: in each of the NH + NKV q and k heads of a row, channel i <
/// HD/2 and i + HD/2 turn by a = float(pos) * inv_freq[i] (sign = 1) or -a (sign = -1,
/// the backward): x[i] = x1 cos a - x2 sin a, x[i+HD/2] = x2 cos a + x1 sin a. pos =
/// positions[b,t], or t when positions is null; a row with a negative position becomes
/// NaN (the CPU throws; a device-side check cannot without a host synchronisation).
void rope(cudaStream_t s, Elem e, void* qkv, const int32_t* positions, const RopeFreqs& f,
          int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HD, float sign);

}  // namespace kiln::cuda
