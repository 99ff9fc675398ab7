// Fault injection for collectives: compiled in, off unless KILN_COMM_FAULT is set. The
// hang tests (tests/reliability/ledger_test.sh) use it to check that every injected fault
// ends the job with a diagnosis naming the right rank and call site.
//
//   KILN_COMM_FAULT=KIND:SITE:RANK[:N]
// World rank RANK applies KIND to its N-th call (default 1st) whose call site (CommSite,
// ledger.h) starts with SITE; KIND is one of
//   skip   the call is not made (it returns a completed Work)
//   count  all_reduce is called with one element fewer
//   sleep  the rank sleeps twice the communicator's timeout before making the call
//   exit   the rank ends at once (exit status 3, no clean-up) instead of making the call
// MPI communicators only (host tensors); SITE is not empty and holds no ':'. A malformed
// value, a rank outside the world or a one-process run is an error naming KILN_COMM_FAULT;
// a SITE that no call matches does nothing.
#pragma once

namespace kiln {

enum class CommFault { Skip, Count, Sleep, Exit };

/// Whether the call being made now (at CommSite::current(), on this world rank) is the one
/// KILN_COMM_FAULT names for `kind`; true once at most. Throws kiln::Error for a malformed
/// KILN_COMM_FAULT.
bool comm_fault_now(CommFault kind);

/// Checks KILN_COMM_FAULT, when set, against the world: an error when it is malformed,
/// names a rank outside [0, world_size), or the world is one process (faults need MPI
/// ranks). Called once the world communicator exists.
void check_comm_fault(int world_size);

/// Applies the Sleep and Exit faults to the call being made now (`timeout_s`: the
/// communicator's); returns whether the Skip fault applies to it.
bool apply_comm_faults(double timeout_s);

}  // namespace kiln
