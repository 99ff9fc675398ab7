// Small POSIX file helpers shared by the checkpoint code (internal to kiln_checkpoint).
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::checkpoint::detail {

/// Writes `contents` to `path` atomically: a temporary file in the same directory, fsync,
/// rename over `path`, fsync of the directory. Throws kiln::Error naming the file.
void atomic_write_file(const std::filesystem::path& path, std::string_view contents);
/// Writes raw bytes to `path` atomically (as atomic_write_file) from several pieces.
void atomic_write_pieces(const std::filesystem::path& path,
                         const std::vector<std::string_view>& pieces);
/// The whole file as a string. Throws kiln::Error naming the file.
std::string read_file(const std::filesystem::path& path);
/// fsync of a directory (makes renames and creations inside it durable). Errors ignored
/// only where the file system cannot fsync directories; others throw.
void fsync_dir(const std::filesystem::path& dir);
/// strerror(errno) as a string.
std::string errno_text();

}  // namespace kiln::checkpoint::detail
