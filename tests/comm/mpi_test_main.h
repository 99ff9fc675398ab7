// A GoogleTest main for tests that run on every rank of an MPI job (or alone, as a world
// of one). The world communicator is made once; rank 0 prints the usual report, other
// ranks print only their failures, and every rank exits with the same status (failed
// anywhere = failed everywhere), so that mpirun reports the result of the whole job.
// `--timeout-s S` (after the GoogleTest flags) sets the world's timeout (timeout_flag.h).
#pragma once

#include "comm/communicator.h"

namespace kiln::testing {

/// The world communicator of this test process.
Communicator& world();

}  // namespace kiln::testing
