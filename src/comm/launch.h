#pragma once
// What the launcher (mpirun, srun, a Slurm batch script) says about a job's processes,
// gathered once at start-up so that rank 0 can log it: docs/distributed.md, "Slurm".

#include "comm/communicator.h"

#include <string>

namespace kiln {

/// One line naming who launched the job and where each rank runs, e.g.
/// "4 ranks launched by srun --mpi=pmix in Slurm job 12 step 0; vm: ranks 0-3, local
/// ranks 0-3". Hosts are listed in rank order of their first rank; ranks and local ranks
/// are compressed into ranges. Collective over `world` (an all_gather of each rank's host
/// name, cut at 63 bytes, and launcher_local_rank()); every rank returns the same line;
/// "" for a single process started by hand outside Slurm.
/// Throws kiln::Error, naming the host and the ranks, when two ranks of one host report
/// the same local rank (a launcher that does not set OMPI_COMM_WORLD_LOCAL_RANK,
/// SLURM_LOCALID or MPI_LOCALRANKID consistently would put them on one GPU).
std::string launch_summary(Communicator& world);

}  // namespace kiln
