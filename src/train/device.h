// train.device: the one place where a backend is chosen for training, evaluation,
// sampling, export and `kiln bench` (and what `kiln memplan` plans for).
#pragma once

#include "backend/backend.h"

#include <memory>
#include <string>

namespace kiln {

/// The backend of `device` (train.device: "cpu" | "cuda") for this process. cuda takes
/// GPU local_rank % device_count, local_rank from the launcher (mpirun/srun; 0 alone).
/// Throws a one-line kiln::Error naming train.device when the device is unknown, CUDA is
/// not compiled into this build, or no GPU is visible.
std::unique_ptr<Backend> make_device_backend(const std::string& device);

}  // namespace kiln
