// Helpers shared by the safetensors reader and writer (internal to kiln_checkpoint).
#pragma once

#include "checkpoint/safetensors.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kiln::safetensors::detail {

/// "[2, 3]".
std::string shape_string(const std::vector<int64_t>& shape);
/// The number of elements of `shape`; nullopt for a negative dimension or int64 overflow.
std::optional<int64_t> checked_numel(const std::vector<int64_t>& shape);
/// Bytes of `shape` elements of dtype `t`; nullopt on overflow (as checked_numel).
std::optional<uint64_t> checked_nbytes(const std::vector<int64_t>& shape, StDType t);

}  // namespace kiln::safetensors::detail
