// Durable POSIX file operations for checkpoints (internal to kiln_checkpoint, and used by
// the models' own file formats, src/models/gpt2/formats.cpp).
//
// Every operation that changes the disk goes through one of these functions; each is one
// numbered file operation for fault injection (checkpoint/fault.h). Every failure throws
// kiln::Error with one line naming the file and the system's reason, e.g.
// "ckpt/.tmp_step_00000004/rank_00001.safetensors.tmp.81.0: write failed: No space left on device".
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::checkpoint::detail {

/// Creates (truncates) `path` for writing: the file descriptor. `exclusive`: fail if it exists.
int create_file(const std::filesystem::path& path, bool exclusive = false);
/// Writes a file's contents, in pieces, as ONE file operation (however many pieces and
/// write(2) calls it takes): construct with the total size, append() every piece, finish().
/// Under fault injection the operation fails at the first append() (ENOSPC/EIO), or, with
/// kill_mid, stops after half of `total_bytes` and kills the process.
class FileWrite {
 public:
  FileWrite(int fd, std::string path, uint64_t total_bytes);
  ~FileWrite();
  FileWrite(const FileWrite&) = delete;
  FileWrite& operator=(const FileWrite&) = delete;
  void append(const void* data, size_t n);
  /// Ends the operation (a kill:K plan for it fires here).
  void finish();

 private:
  int fd_;
  std::string path_;
  uint64_t total_, written_ = 0;
  bool open_ = true, kill_mid_ = false;
  int injected_ = 0;
};
/// One whole write: FileWrite(fd, path, n).append(data, n), finish().
void write_all(int fd, const void* data, size_t n, const std::string& path);
/// fsync(2), then close(2) (the descriptor is closed even when fsync fails).
void fsync_and_close(int fd, const std::string& path);
/// rename(2): `to` is replaced atomically when it is a file or an empty directory.
void rename_path(const std::filesystem::path& from, const std::filesystem::path& to);
/// Swaps two existing paths atomically (renameat2 RENAME_EXCHANGE). false, changing
/// nothing, where the file system does not support it.
bool exchange_paths(const std::filesystem::path& a, const std::filesystem::path& b);
/// mkdir -p.
void make_dirs(const std::filesystem::path& dir);
/// rm -rf (nothing to do when `path` does not exist).
void remove_tree(const std::filesystem::path& path);
/// fsync of a directory (makes renames and creations inside it durable). Errors ignored
/// only where the file system cannot fsync directories; others throw.
void fsync_dir(const std::filesystem::path& dir);

/// Writes `contents` to `path` atomically: a temporary file in the same directory, fsync,
/// rename over `path`, fsync of the directory.
void atomic_write_file(const std::filesystem::path& path, std::string_view contents);
/// Writes raw bytes to `path` atomically (as atomic_write_file) from several pieces.
void atomic_write_pieces(const std::filesystem::path& path,
                         const std::vector<std::string_view>& pieces);
/// A unique temporary name next to `path`: "<path>.tmp.<pid>.<counter>".
std::string temp_name_for(const std::filesystem::path& path);
/// Removes what an interrupted writer of `path` left beside it: entries named
/// temp_name_for(path) of a process that no longer runs (a Ctrl-C'd export; a process
/// that still runs keeps its own). Best effort: never throws, not a numbered operation.
void remove_stale_temps(const std::filesystem::path& path);
/// The whole file as a string. Throws kiln::Error naming the file.
std::string read_file(const std::filesystem::path& path);
/// strerror(errno) as a string.
std::string errno_text();

}  // namespace kiln::checkpoint::detail
