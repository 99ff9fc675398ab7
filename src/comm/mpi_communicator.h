// The MPI communicator (built when KILN_MPI is ON). The class lives in
// mpi_communicator.cpp so that no header of kiln includes mpi.h.
//
// Threading. MPI's non-blocking collectives progress only while some thread is inside
// the MPI library, so a communication thread per communicator starts the queued
// operations, in submission order, as MPI non-blocking calls (MPI_Iallreduce,
// MPI_Ireduce_scatter_block, MPI_Iallgather, MPI_Ibcast, MPI_Isend/Irecv, MPI_Ibarrier)
// and polls them with MPI_Test until they complete, then completes their Work. Several
// operations may be in flight at once (a send and a recv posted in either order never
// deadlock). kiln asks MPI_Init_thread for MPI_THREAD_MULTIPLE and, by what it gets:
//   MULTIPLE    one communication thread per communicator (world and each sub-group);
//   SERIALIZED  one communication thread for the process, shared by all communicators
//               (every MPI call after MPI_Init is made from it, one at a time);
//   FUNNELED or SINGLE: no thread; operations start on the calling thread and progress
//               while it waits (Work::wait() polls MPI_Test), so overlap is lost. Waits
//               must then come from the thread that initialised MPI.
// KILN_MPI_THREADS=multiple|serialized|inline selects a lower mode than MPI provided
// (for tests and for MPI libraries whose MULTIPLE mode is slow).
//
// Buffers must be host tensors (an NCCL communicator will take device tensors).
#pragma once

#include "comm/communicator.h"

#include <memory>

namespace kiln {

/// Initialises MPI (once per process) and returns its MPI_COMM_WORLD communicator.
/// Installs a std::terminate handler that turns an uncaught exception on any rank into
/// abort_all(), so that one rank's failure ends every rank.
std::unique_ptr<Communicator> make_mpi_world_communicator();

}  // namespace kiln
