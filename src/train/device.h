// train.device: the one place where a backend is chosen for training, evaluation,
// sampling, export and `kiln bench` (and what `kiln memplan` plans for), made with the
// [backend] keys, and where the trainer's world communicator is chosen to match it
// (parallel.communicator: MPI or local for cpu, NCCL for cuda; comm/registry.h).
#pragma once

#include "backend/backend.h"
#include "backend/options.h"
#include "comm/communicator.h"
#include "config/config.h"

#include <memory>
#include <string>

namespace kiln {

/// The [backend] keys as the options a backend is made with (backend/options.h).
BackendOptions backend_options(const TrainConfig& config);

/// The backend of `device` (train.device: "cpu" | "cuda") for this process, made with
/// `options`. cuda takes GPU local_rank % device_count, local_rank from the launcher
/// (mpirun/srun; 0 alone). Throws a one-line kiln::Error naming train.device when the
/// device is unknown, CUDA is not compiled into this build, or no GPU is visible.
std::unique_ptr<Backend> make_device_backend(const std::string& device,
                                             const BackendOptions& options = {});

/// The world communicator the trainer's groups are split from, for `device`, by
/// `communicator` (parallel.communicator; comm/registry.h): auto is make_world_
/// communicator() (MPI under mpirun/srun, else local) for cpu and nccl for cuda; nccl
/// runs on the same GPU as make_device_backend, bootstrapped over that world (MPI for
/// several ranks; a single process needs no MPI). NCCL collectives take device tensors;
/// host tensors (metrics, flags, config hashes) go over the bootstrap. Throws a one-line
/// kiln::Error naming train.device when cuda cannot be used or this build has no NCCL,
/// naming parallel.communicator when it does not fit the device, or naming the
/// communicator when this build lacks it. Collective over the launched processes.
std::unique_ptr<Communicator> make_device_world_communicator(const std::string& device,
                                                             const std::string& communicator = "auto");

/// The dtype whose measured GEMM peak MFU is taken against (when log.peak_tflops is
/// not set): on cuda the compute dtype (bf16 or fp16 tensor cores, fp32); on the CPU
/// fp32, whose GEMMs low precision runs on where the CPU has no bf16/fp16 matrix
/// instructions (and which the CPU figures in the README are quoted against).
DType mfu_peak_dtype(const TrainConfig& config);

}  // namespace kiln
