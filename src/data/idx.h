// IDX files: the MNIST format (LeCun et al., "The MNIST database"; Fashion-MNIST, Xiao et
// al. 2017, uses it unchanged), plain or gzip-compressed:
//
//   bytes 0-1  zero
//   byte  2    element type: 0x08 unsigned byte (the only one images and labels use)
//   byte  3    number of dimensions d (1 for labels, 3 for [count, rows, cols] images)
//   then d big-endian uint32 sizes, then the elements, row-major.
//
// Debian's dataset-fashion-mnist installs them under /usr/share/datasets/fashion-mnist/
// (train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-...).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace kiln::data {

struct IdxArray {
  std::vector<int64_t> dims;  // e.g. {60000, 28, 28}
  std::vector<uint8_t> data;  // product(dims) bytes, row-major
};

/// Reads a whole IDX file of unsigned bytes (gzip or plain, told apart by content).
/// Throws kiln::Error naming the file when it is missing or unreadable, is not IDX (bad
/// magic, element type other than unsigned byte, 0 or more than 4 dimensions, a zero
/// size), holds more than 4 GiB, or is truncated or has bytes after its elements.
IdxArray read_idx(const std::filesystem::path& path);

/// Where the IDX file `stem` of `dir` is looked for: `dir`/`stem`.gz when it exists, else
/// `dir`/`stem` (which may not exist either).
std::filesystem::path idx_file(const std::filesystem::path& dir, const std::string& stem);

/// Writes `a` as a plain IDX file (tests, tools). Throws kiln::Error naming the file.
void write_idx(const std::filesystem::path& path, const IdxArray& a);

}  // namespace kiln::data
