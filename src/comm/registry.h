// The communicators of this build, by name (as backend/registry.h is for backends): the
// one place that knows which are compiled in. Built in: "local" (always), "mpi" (with
// KILN_MPI) and "nccl" (with KILN_NCCL); tests and extensions add their own with
// register_communicator(). The trainer picks one through parallel.communicator
// (train/device.h); nothing outside src/comm includes an MPI or NCCL header or tests
// whether one was built.
#pragma once

#include "comm/communicator.h"

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace kiln {

/// Makes a world communicator over the launched processes. `gpu`: the CUDA device a
/// device communicator's collectives run on (-1: the current one); host communicators
/// ignore it.
using CommunicatorFactory = std::function<std::unique_ptr<Communicator>(int gpu)>;

/// Adds (or replaces) the communicator `name`.
void register_communicator(const std::string& name, CommunicatorFactory factory);

/// The registered names, sorted ("local", "mpi", "nccl" where built).
std::vector<std::string> communicator_names();
/// Whether `name` is registered in this build.
bool communicator_registered(const std::string& name);

/// The world communicator `name`, collective over the launched processes:
///   auto   make_world_communicator(): mpi when mpirun/srun launched several processes,
///          else local
///   local  this process alone; a kiln::Error when the launcher started several
///   mpi    MPI's world, even for one process (MPI singleton)
///   nccl   NCCL on CUDA device `gpu`, bootstrapped over make_world_communicator() (host
///          tensors go over that bootstrap)
/// Throws a one-line kiln::Error naming the communicator when it is unknown or not
/// compiled into this build, listing those that are.
std::unique_ptr<Communicator> make_communicator(const std::string& name, int gpu = -1);

}  // namespace kiln
