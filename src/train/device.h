// train.device: the one place where a backend is chosen for training, evaluation,
// sampling, export and `kiln bench` (and what `kiln memplan` plans for).
#pragma once

#include "backend/backend.h"
#include "train/config.h"

#include <memory>
#include <string>

namespace kiln {

/// The backend of `device` (train.device: "cpu" | "cuda") for this process. cuda takes
/// GPU local_rank % device_count, local_rank from the launcher (mpirun/srun; 0 alone).
/// Throws a one-line kiln::Error naming train.device when the device is unknown, CUDA is
/// not compiled into this build, or no GPU is visible.
std::unique_ptr<Backend> make_device_backend(const std::string& device);

/// The dtype whose measured GEMM peak MFU is taken against (when log.peak_tflops is
/// not set): on cuda the compute dtype (bf16 or fp16 tensor cores, fp32); on the CPU
/// fp32, whose GEMMs low precision runs on where the CPU has no bf16/fp16 matrix
/// instructions (and which the CPU figures in the README are quoted against).
DType mfu_peak_dtype(const TrainConfig& config);

}  // namespace kiln
