// The weights of a Hugging Face model folder: one model.safetensors, or shards
// model-00001-of-0000N.safetensors named by model.safetensors.index.json:
//   {"metadata": {"total_size": <bytes of all tensor data>},
//    "weight_map": {"<tensor name>": "<shard file name>", ...}}
// (transformers' save_pretrained layout; the index is what from_pretrained reads first).
//
// FolderReader opens the index (or the single file) and every shard's header; tensor data
// is read on request, one tensor or one element range at a time (safetensors::Reader), so
// a rank reads only the bytes it holds. write_folder writes a whole folder atomically: into
// a temporary directory beside it, then renamed (or exchanged) into place, so `dir` is
// either the old folder or the complete new one, never a half-written one.
#pragma once

#include "checkpoint/safetensors.h"

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::safetensors {

inline constexpr std::string_view kSingleFile = "model.safetensors";
inline constexpr std::string_view kIndexFile = "model.safetensors.index.json";

/// The tensors of a model folder, by name, over all its shards.
class FolderReader {
 public:
  /// Opens dir/model.safetensors.index.json and the shards it names, else
  /// dir/model.safetensors (or, when `dir` is a file, that one safetensors file). Throws kiln::Error naming the file at fault: neither present,
  /// bad index JSON (no weight_map object, a non-string file name, a name with '/'), a
  /// missing or corrupt shard, a tensor the index maps to a shard that lacks it, or a
  /// tensor present in two shards.
  explicit FolderReader(const std::filesystem::path& dir);
  ~FolderReader();
  FolderReader(FolderReader&&) noexcept;
  FolderReader& operator=(FolderReader&&) noexcept;

  /// The index file, or the single file: what error messages name.
  const std::string& path() const { return path_; }
  bool contains(std::string_view name) const;
  /// Every tensor name, sorted.
  std::vector<std::string> names() const;
  /// The shard holding `name`; throws kiln::Error naming path() and the tensor when absent.
  const Reader& file_of(std::string_view name) const;
  const TensorInfo& info(std::string_view name) const { return file_of(name).info(name); }

 private:
  std::string path_;
  std::vector<std::unique_ptr<Reader>> files_;
  std::map<std::string, size_t, std::less<>> shard_of_;
};

/// One tensor to write: `produce` fills its numel * dtype size bytes when its shard is
/// written (so at most one tensor is produced at a time).
struct FolderTensor {
  std::string name;
  StDType dtype = StDType::F32;
  std::vector<int64_t> shape;
  Writer::Producer produce;
};

/// The shard file names of a folder of `n` shards: n == 1: {"model.safetensors"}, else
/// "model-00001-of-0000n.safetensors", ... (five digits, as transformers).
std::vector<std::string> shard_file_names(int n);

/// Writes `tensors`, in order, into shards of at most `shard_bytes` bytes of tensor data
/// each (a tensor larger than that gets a shard of its own; one shard: model.safetensors
/// and no index), each shard with `metadata` (e.g. format=pt), the index when sharded,
/// and `files` (name -> contents, e.g. config.json) into `dir`, atomically. An existing
/// `dir` is replaced only when it is a model folder (holds config.json or
/// model.safetensors) or empty. Throws kiln::Error naming the file at fault.
void write_folder(const std::filesystem::path& dir, const std::vector<FolderTensor>& tensors,
                  uint64_t shard_bytes, const std::map<std::string, std::string>& metadata,
                  const std::map<std::string, std::string>& files);

}  // namespace kiln::safetensors
