// Sharded training checkpoints: named GLOBAL tensors stored as SLICES.
//
// A checkpoint is a directory `step_XXXXXXXX/` holding
//   manifest.json            format version, every file with its size and crc32, every
//                            tensor (global shape, dtype, slices), the trainer's `state`
//                            object (step, data-loader position, RNG state, ...) and the
//                            names of the extra files
//   rank_XXXXX.safetensors   one data file per writing rank: each slice of that rank as
//                            one safetensors tensor (the slice's box, row-major)
//   extra files              e.g. config.toml, tokenizer files (checksummed too)
//
// A slice is an N-d box of a global tensor: offset[] and extent[] per dimension. Because
// the manifest names global tensors, a checkpoint written under one layout (world size,
// ZeRO stage, tensor/pipeline parallel split) can be read under any other: a reader asks
// for any flat range of a global tensor and gets it assembled from whatever slices cover
// it. ZeRO shards are flat ranges of a flat parameter buffer; add_flat_range() turns a
// row-major flat range into at most 2 * ndim - 1 boxes.
//
// Saving (no MPI here; the caller provides the barrier):
//   every rank:   CheckpointWriter w(dir, rank, world); w.add_flat_range(...)...;
//                 w.write_rank_files();     // into the sibling temp dir `.tmp_<dirname>`
//   all ranks:    barrier
//   rank 0:       w.commit(state, extra_files);  // manifest.json, then rename to `dir`
// A checkpoint is complete exactly when `dir/manifest.json` exists: everything is written
// and fsynced in the temp directory, the manifest last, and the directory is renamed to
// its final name in one rename(2). A single process is world_size 1 and needs no barrier.
//
// Loading: CheckpointReader verifies every file (exists, size, crc32) when opened, then
// reads ranges through a read-only memory map, touching only the bytes it needs.
#pragma once

#include "core/dtype.h"
#include "core/tensor.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace kiln::checkpoint {

/// Version written to manifest.json's "format_version". Version rule: a build reads every
/// version from kOldestFormatVersion to kFormatVersion; the version grows when a reader of
/// the previous version would misread a new manifest or miss a check it must make.
///   1  the original layout
///   2  adds "manifest_crc32", the checksum of the manifest's own content (checked on
///      every load; version 1 manifests load without that check)
inline constexpr int kFormatVersion = 2;
inline constexpr int kOldestFormatVersion = 1;
/// Name of the manifest inside a checkpoint directory.
inline constexpr const char* kManifestName = "manifest.json";

/// An N-d box of a tensor: for each dimension d, indices [offset[d], offset[d] + extent[d]).
/// A 0-d (scalar) tensor has one box with empty vectors.
struct Box {
  std::vector<int64_t> offset;
  std::vector<int64_t> extent;
  /// Number of elements (product of extents; 1 for a 0-d box).
  int64_t numel() const;
  bool operator==(const Box&) const = default;
};

/// The boxes whose union is the row-major flat range [flat_begin, flat_end) of a tensor of
/// `shape`, in increasing flat order; each box is itself a contiguous flat range, so the
/// boxes' data laid end to end is the range's data. At most 2 * ndim - 1 boxes (a partial
/// row, full rows, a partial row, recursively); none for an empty range. Throws
/// kiln::Error for a range outside [0, numel].
std::vector<Box> flat_range_to_boxes(const Shape& shape, int64_t flat_begin, int64_t flat_end);

/// "step_%08d" (more digits past 99,999,999).
std::string checkpoint_dir_name(int64_t step);
/// The step of a directory name "step_<digits>", or nullopt for any other name.
std::optional<int64_t> parse_checkpoint_dir_name(const std::string& name);

/// "rank_%05d".
std::string rank_file_stem(int rank);

/// crc32 (zlib's, the IEEE 802.3 polynomial) of a whole file, read in chunks. Throws
/// kiln::Error naming the file when it cannot be read.
uint32_t file_crc32(const std::filesystem::path& path);
/// crc32 of a byte buffer (same polynomial), continuing from `crc` (0 to start).
uint32_t buffer_crc32(const void* data, size_t bytes, uint32_t crc = 0);

/// Writes one rank's slices of a checkpoint and, on rank 0, commits the whole checkpoint.
class CheckpointWriter {
 public:
  /// `dir` is the final checkpoint directory (e.g. ckpt_root/step_00001000); files go to
  /// the sibling temporary directory `.tmp_<dirname>` until commit(). 0 <= rank < world_size.
  CheckpointWriter(std::filesystem::path dir, int rank, int world_size);
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  const std::filesystem::path& dir() const { return dir_; }
  /// The temporary directory `.tmp_<dirname>` next to dir().
  const std::filesystem::path& tmp_dir() const { return tmp_dir_; }

  /// Adds the box (offset, extent) of global tensor `name` (of `global_shape` and `dtype`).
  /// `host_data` holds the box's elements, row-major over `extent`, in `dtype`. The memory
  /// is BORROWED: it must stay alive and unchanged until write_rank_files() returns.
  /// Throws kiln::Error naming the tensor for a box outside the shape, an empty box, or a
  /// shape/dtype that differs from an earlier slice of the same name.
  void add_box(const std::string& name, const Shape& global_shape, DType dtype,
               const std::vector<int64_t>& offset, const std::vector<int64_t>& extent,
               const void* host_data);
  /// Adds the row-major flat range [flat_begin, flat_end) of global tensor `name`, whose
  /// elements (flat_end - flat_begin of them, in `dtype`) are at `host_data` (borrowed, as
  /// add_box). The range is stored as the boxes of flat_range_to_boxes(); an empty range
  /// adds nothing.
  void add_flat_range(const std::string& name, const Shape& global_shape, DType dtype,
                      int64_t flat_begin, int64_t flat_end, const void* host_data);
  /// Adds the whole tensor (one box), data borrowed as add_box.
  void add_tensor(const std::string& name, const Shape& global_shape, DType dtype,
                  const void* host_data);

  /// Removes what an interrupted earlier save left in tmp_dir(). Rank 0 only, before the
  /// barrier that precedes every rank's write_rank_files().
  void discard_stale_tmp_dir();

  /// Writes and fsyncs this rank's data file `rank_XXXXX.safetensors` (skipped when the
  /// rank has no slices) and its part file `rank_XXXXX.json` (its slices, the data file's
  /// size and crc32) in tmp_dir(). Call once, on every rank, before the barrier.
  void write_rank_files();

  /// Rank 0 only, after write_rank_files() on every rank and a barrier: merges the part
  /// files of ranks 0..world_size-1 into manifest.json (checking that every tensor's
  /// slices agree on shape and dtype, do not overlap and cover the tensor; the same box
  /// written by several ranks, a replicated tensor, is kept once, from the lowest rank —
  /// better add replicated tensors on one rank only, the copies still cost disk space),
  /// writes the `extra_files` (relative path -> contents, e.g. "config.toml" or
  /// "tokenizer/vocab.json"; no ".", ".." or hidden components; not manifest.json or
  /// rank_*) with their checksums, stores `state` in the manifest (sealed with its own
  /// checksum), fsyncs everything and renames tmp_dir() to dir(). When dir() already
  /// exists (the same step saved again) the two are exchanged atomically
  /// (renameat2 RENAME_EXCHANGE) and the old one removed: the name never lacks a complete
  /// checkpoint.
  /// Throws kiln::Error naming the file, rank or tensor at fault; the temporary directory
  /// is left in place then (prune_checkpoints removes it).
  void commit(const nlohmann::json& state,
              const std::map<std::string, std::string>& extra_files = {});

 private:
  struct Slice;
  struct TensorMeta;
  std::filesystem::path dir_;
  std::filesystem::path tmp_dir_;
  int rank_;
  int world_size_;
  bool rank_files_written_ = false;
  std::vector<Slice> slices_;
  std::map<std::string, TensorMeta> tensors_;
};

/// How much CheckpointReader checks when it opens a checkpoint.
enum class Verify {
  Full,      // every file exists, has its size and its crc32 (reads every byte once)
  SizeOnly,  // every file exists and has its size
};

/// A complete checkpoint opened for reading. Reads are const; the reader is movable.
class CheckpointReader {
 public:
  /// Opens `dir`: reads manifest.json (missing = incomplete checkpoint), checks the
  /// manifest's own checksum (format version 2) and verifies every file it lists. Throws kiln::Error naming the file at fault: missing, truncated (wrong
  /// size) or checksum mismatch, or a bad manifest.
  explicit CheckpointReader(std::filesystem::path dir, Verify verify = Verify::Full);
  ~CheckpointReader();
  CheckpointReader(CheckpointReader&&) noexcept;
  CheckpointReader& operator=(CheckpointReader&&) noexcept;

  const std::filesystem::path& dir() const { return dir_; }
  /// The whole manifest.
  const nlohmann::json& manifest() const { return manifest_; }
  /// The `state` object given to commit().
  const nlohmann::json& state() const { return manifest_.at("state"); }

  /// Names of all tensors, sorted.
  std::vector<std::string> names() const;
  bool has(const std::string& name) const;
  /// Global shape / stored dtype of `name`; throw kiln::Error naming an unknown tensor.
  Shape global_shape(const std::string& name) const;
  DType dtype(const std::string& name) const;

  /// Reads the row-major flat range [flat_begin, flat_end) of global tensor `name` into
  /// `dst` (flat_end - flat_begin elements of `dst_dtype`), assembling it from whatever
  /// slices were written, converting between floating dtypes (int32 reads as int32 only).
  /// Touches only the bytes of the range. Throws kiln::Error naming the tensor for an
  /// unknown name, a range outside the tensor or elements no slice covers.
  void read_flat_range(const std::string& name, int64_t flat_begin, int64_t flat_end,
                       void* dst, DType dst_dtype) const;
  /// Reads the whole tensor into `dst` (numel elements of `dst_dtype`).
  void read(const std::string& name, void* dst, DType dst_dtype) const;
  /// Reads the whole tensor into a host tensor with the same number of elements.
  void read(const std::string& name, const Tensor& dst) const;
  /// The whole tensor as fp32.
  std::vector<float> read_f32(const std::string& name) const;

  /// Names of the extra files given to commit(), sorted.
  std::vector<std::string> extra_file_names() const;
  bool has_extra_file(const std::string& name) const;
  /// Contents of an extra file (verified at open under Verify::Full). Throws kiln::Error
  /// naming an unknown file.
  std::string extra_file(const std::string& name) const;

 private:
  struct Impl;
  std::filesystem::path dir_;
  nlohmann::json manifest_;
  std::unique_ptr<Impl> impl_;
};

/// Checks that a checkpoint directory is complete and intact (as CheckpointReader's
/// constructor) without keeping it open. Throws kiln::Error naming the file at fault.
void verify_checkpoint(const std::filesystem::path& dir, Verify verify = Verify::Full);

/// The `step_XXXXXXXX` directories under ckpt_root (complete or not), newest step first.
std::vector<std::filesystem::path> list_checkpoint_dirs(const std::filesystem::path& ckpt_root);

/// The newest `step_XXXXXXXX` directory under ckpt_root that verifies fully; nullopt when
/// there is none (or ckpt_root does not exist). A newer incomplete or corrupt checkpoint
/// is skipped with one warning line on stderr naming it and the reason.
std::optional<std::filesystem::path> find_latest_checkpoint(const std::filesystem::path& ckpt_root);

/// Keeps the newest `keep` checkpoints under ckpt_root that verify fully (every file
/// present with its size and crc32, and the manifest's own checksum) and deletes every
/// other `step_XXXXXXXX` directory: older ones, and damaged or incomplete ones newer than
/// the oldest kept (each damaged one with a warning line on stderr); so the newest valid
/// checkpoint is never removed. keep <= 0 keeps every step directory unverified. Stale
/// `.tmp_*` directories (interrupted saves) are deleted in every case. Call when no save
/// is in progress. Returns the removed paths.
std::vector<std::filesystem::path> prune_checkpoints(const std::filesystem::path& ckpt_root,
                                                     int keep);

/// Name of the folder under ckpt_root that holds abandoned checkpoints.
inline constexpr const char* kAbandonedDirName = "abandoned";

/// A rollback: every `step_XXXXXXXX` directory under ckpt_root newer than `resumed_step`
/// (the abandoned trajectory, valid or not) moves, by rename, into
/// `ckpt_root/abandoned/from_step_XXXXXXXX[.N]/` (XXXXXXXX = resumed_step, .N the first
/// free suffix). Nothing is deleted, and nothing there is ever listed, chosen or pruned.
/// Returns (old path, new path) per moved directory, newest first. Throws kiln::Error
/// naming the path that cannot be moved.
std::vector<std::pair<std::filesystem::path, std::filesystem::path>> move_checkpoints_aside(
    const std::filesystem::path& ckpt_root, int64_t resumed_step);

}  // namespace kiln::checkpoint
