// Shared by the libFuzzer harnesses: a per-process scratch file in /dev/shm (or $TMPDIR)
// for the parsers that read a path.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <utility>

namespace kiln::fuzz {

/// A scratch directory of this process, created once and removed at exit.
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    std::filesystem::path base = std::filesystem::exists("/dev/shm") ? "/dev/shm" : std::filesystem::temp_directory_path();
    auto d = base / ("kiln-fuzz-" + std::to_string(getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  // Removed when the fuzzer exits normally (a crash leaves it, beside the crash's input).
  static const bool cleanup = [] {
    return std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }) == 0;
  }();
  (void)cleanup;
  return dir;
}

/// Writes `size` bytes at `data` to scratch_dir()/name and returns its path.
inline std::filesystem::path write_scratch(const std::string& name, const uint8_t* data, size_t size) {
  auto path = scratch_dir() / name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  return path;
}

/// The input split at its first NUL byte: the part before it and the part after it (empty
/// when there is none), for harnesses whose parser takes two texts.
inline std::pair<std::string_view, std::string_view> split_at_nul(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  auto nul = in.find('\0');
  if (nul == std::string_view::npos) return {in, {}};
  return {in.substr(0, nul), in.substr(nul + 1)};
}

/// Writes `bytes` to scratch_dir()/name and returns its path.
inline std::filesystem::path write_scratch(const std::string& name, std::string_view bytes) {
  return write_scratch(name, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
}

}  // namespace kiln::fuzz
