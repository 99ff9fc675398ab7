// The NCCL communicator: kiln's Communicator over NVIDIA's collective library, for
// tensors on CUDA devices (built with KILN_CUDA when NCCL is found; see docs/cuda.md).
// The class lives in nccl_communicator.cpp so that no header of kiln includes nccl.h.
//
// Bootstrap. NCCL needs one ncclUniqueId shared by all ranks: rank 0 creates it and a
// bootstrap Communicator (MPI under mpirun, or a LocalCommunicator for one process)
// broadcasts it as a host tensor; then every rank calls ncclCommInitRank. Sub-groups
// (new_group, split) bootstrap the same way over the bootstrap's own sub-group, so they
// follow the Communicator rules (new_group: members only; split: every rank).
//
// Streams and overlap. Collectives run on the communicator's own stream: the call
// records an event on the caller's Stream (the backend's cudaStream_t) and the
// communication stream waits for it, so the collective sees every kernel queued before
// it, while kernels queued after it on the caller's stream run concurrently with the
// transfer. Work::wait() blocks the host until the collective is done (polling its
// event), as the interface says; Work::is_completed() never blocks.
//
// Host tensors (e.g. the trainer's small metric exchanges) go to the bootstrap
// communicator instead; device tensors must be on this communicator's device.
//
// Failures. While a wait polls, ncclCommGetAsyncError is checked; an NCCL error, or the
// timeout (Communicator::set_timeout, the trainer's parallel.timeout_s; default 60 s)
// passing, aborts the communicator with ncclCommAbort and then the job with abort_all(),
// naming the collective and the rank.
//
// Point to point: NCCL matches send/recv by order per peer, not by tag; tags are checked
// for range only, so a pair of ranks must issue their sends and recvs in the same order.
// NVTX ranges name every collective when the toolkit has nvtx3.
#pragma once

#include "comm/communicator.h"

#include <memory>

namespace kiln {

/// An NCCL communicator over the ranks of `bootstrap` (which it takes over: host-tensor
/// collectives and sub-group bootstraps go through it), on CUDA device `device`
/// (-1: the current device). Collective over `bootstrap`. Throws kiln::Error when NCCL
/// fails to initialise.
std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<Communicator> bootstrap,
                                                     int device = -1);

/// make_world_communicator() (MPI under mpirun, else local) wrapped in NCCL, on the
/// device launcher_local_rank() % visible devices.
std::unique_ptr<Communicator> make_nccl_world_communicator();

/// NCCL's version, e.g. "2.27.7".
std::string nccl_version();

}  // namespace kiln
