// Fault injection for checkpoint saves: compiled in, off unless KILN_FAULT is set.
//
// Every file operation that changes the disk during a save (create a file, write it,
// fsync it, rename, exchange, create or remove a directory, fsync a directory) goes
// through checkpoint/file_util.h and is numbered 1, 2, 3, ... in the order this process
// issues it. KILN_FAULT picks one of them:
//
//   KILN_FAULT=trace              print every operation to stderr ("kiln: file op N ...")
//   KILN_FAULT=kill:K             SIGKILL this process right after operation K completes
//   KILN_FAULT=kill_mid:K         operation K, when it is a write, writes half its bytes,
//                                 then SIGKILL (any other operation: SIGKILL before it)
//   KILN_FAULT=enospc:K           operation K fails with ENOSPC ("No space left on device")
//   KILN_FAULT=eio:K              operation K fails with EIO ("Input/output error")
//
// An optional ":R" suffix (e.g. kill:5:1) applies it only on world rank R (read from
// OMPI_COMM_WORLD_RANK, PMI_RANK or SLURM_PROCID; 0 without a launcher). A malformed value
// is an error naming KILN_FAULT at the first file operation.
#pragma once

#include <cstdint>
#include <string>

namespace kiln::checkpoint {

enum class FileOp : uint8_t { Create, Write, Fsync, Rename, Exchange, Mkdir, Remove, FsyncDir };
/// "create", "write", "fsync", "rename", "exchange", "mkdir", "remove", "fsync_dir".
const char* file_op_name(FileOp op);

/// Replaces the plan read from KILN_FAULT (same syntax; "" = none) and restarts the
/// operation count at 0. For tests that inject faults in-process. Throws kiln::Error for
/// a malformed spec.
void set_fault_plan(const std::string& spec);

/// Number of file operations issued so far by this process.
int64_t file_op_count();

namespace detail {

/// Numbers the next file operation (`op` on `path`). Returns the errno it must fail with
/// (0 = go ahead). Kills the process first under kill_mid for a non-write operation.
int begin_file_op(FileOp op, const std::string& path);
/// Marks the operation begun last as complete: SIGKILL when the plan says so.
void end_file_op();
/// Under kill_mid, whether the write begun last must stop half-way and kill.
bool kill_mid_write();
/// SIGKILL this process now.
[[noreturn]] void kill_now();

}  // namespace detail
}  // namespace kiln::checkpoint
