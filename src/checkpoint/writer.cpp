// CheckpointWriter: every rank's slices into the temporary directory, and rank 0's
// commit (part files merged into manifest.json, the directory renamed into place).
#include "checkpoint/internal.h"

#include "checkpoint/file_util.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"

#include <fmt/format.h>

#include <set>

namespace kiln::checkpoint {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace internal;

struct CheckpointWriter::Slice {
  std::string name;
  Box box;
  DType dtype;
  const void* data;
};

struct CheckpointWriter::TensorMeta {
  Shape shape;
  DType dtype;
};

CheckpointWriter::CheckpointWriter(fs::path dir, int rank, int world_size)
    : dir_(std::move(dir)), rank_(rank), world_size_(world_size) {
  KILN_CHECK(world_size >= 1 && rank >= 0 && rank < world_size,
             "checkpoint {}: bad rank {} of world size {}", dir_.string(), rank, world_size);
  if (!dir_.has_filename()) dir_ = dir_.parent_path();
  KILN_CHECK(!dir_.filename().empty(), "checkpoint directory '{}' has no name", dir_.string());
  tmp_dir_ = tmp_sibling(dir_, ".tmp_");
}

CheckpointWriter::~CheckpointWriter() = default;

void CheckpointWriter::add_box(const std::string& name, const Shape& global_shape, DType dtype,
                               const std::vector<int64_t>& offset,
                               const std::vector<int64_t>& extent, const void* host_data) {
  KILN_CHECK(!rank_files_written_, "checkpoint {}: tensor '{}' added after write_rank_files()",
             dir_.string(), name);
  KILN_CHECK(!name.empty(), "checkpoint {}: empty tensor name", dir_.string());
  const std::string what = fmt::format("checkpoint {}: tensor '{}'", dir_.string(), name);
  Box box{offset, extent};
  check_box_in_shape(dims_of(global_shape), box, what);
  KILN_CHECK(host_data != nullptr, "{}: null data", what);
  auto [it, inserted] = tensors_.try_emplace(name, TensorMeta{global_shape, dtype});
  if (!inserted) {
    KILN_CHECK(it->second.shape == global_shape && it->second.dtype == dtype,
               "{}: added as {} {} and as {} {}", what, dtype_name(it->second.dtype),
               it->second.shape.str(), dtype_name(dtype), global_shape.str());
  }
  slices_.push_back(Slice{name, std::move(box), dtype, host_data});
}

void CheckpointWriter::add_flat_range(const std::string& name, const Shape& global_shape,
                                      DType dtype, int64_t flat_begin, int64_t flat_end,
                                      const void* host_data) {
  std::vector<Box> boxes;
  try {
    boxes = flat_range_to_boxes(global_shape, flat_begin, flat_end);
  } catch (const Error& e) {
    KILN_FAIL("checkpoint {}: tensor '{}': {}", dir_.string(), name, e.what());
  }
  const auto* p = static_cast<const std::byte*>(host_data);
  for (const Box& b : boxes) {
    add_box(name, global_shape, dtype, b.offset, b.extent, p);
    p += static_cast<size_t>(b.numel()) * dtype_size(dtype);
  }
}

void CheckpointWriter::add_tensor(const std::string& name, const Shape& global_shape, DType dtype,
                                  const void* host_data) {
  std::vector<int64_t> offset(static_cast<size_t>(global_shape.ndim()), 0);
  add_box(name, global_shape, dtype, offset, dims_of(global_shape), host_data);
}

void CheckpointWriter::discard_stale_tmp_dir() { detail::remove_tree(tmp_dir_); }

void CheckpointWriter::write_rank_files() {
  KILN_CHECK(!rank_files_written_, "checkpoint {}: write_rank_files() called twice on rank {}",
             dir_.string(), rank_);
  detail::make_dirs(tmp_dir_);

  const std::string stem = rank_file_stem(rank_);
  json part;
  part["format_version"] = kFormatVersion;
  part["rank"] = rank_;
  part["world_size"] = world_size_;
  part["file"] = nullptr;
  json tensors = json::object();
  for (const auto& [name, meta] : tensors_)
    tensors[name] = {{"shape", dims_of(meta.shape)}, {"dtype", dtype_name(meta.dtype)}};
  part["tensors"] = std::move(tensors);
  json slices = json::array();

  if (!slices_.empty()) {
    const std::string file_name = stem + ".safetensors";
    const fs::path data_path = tmp_dir_ / file_name;
    safetensors::Writer w(data_path.string());
    w.set_metadata("format", "kiln-checkpoint-slices");
    for (size_t i = 0; i < slices_.size(); ++i) {
      const Slice& s = slices_[i];
      const std::string key = fmt::format("{}#{}", s.name, i);
      const size_t nbytes = static_cast<size_t>(s.box.numel()) * dtype_size(s.dtype);
      w.add_borrowed(key, safetensors::to_st_dtype(s.dtype), s.box.extent, s.data, nbytes);
      slices.push_back({{"name", s.name}, {"key", key}, {"offset", s.box.offset},
                        {"extent", s.box.extent}});
    }
    w.write();
    const uint64_t size = file_size_or_fail(data_path, " (just written)");
    part["file"] = {{"name", file_name}, {"size", size}, {"crc32", file_crc32(data_path)}};
  }
  part["slices"] = std::move(slices);
  detail::atomic_write_file(tmp_dir_ / (stem + ".json"), part.dump(1));
  rank_files_written_ = true;
}

void CheckpointWriter::commit(const json& state, const std::map<std::string, std::string>& extra_files) {
  KILN_CHECK(rank_ == 0, "checkpoint {}: commit() must run on rank 0 only (called on rank {})",
             dir_.string(), rank_);
  KILN_CHECK(rank_files_written_, "checkpoint {}: commit() before write_rank_files()",
             dir_.string());
  KILN_CHECK(state.is_object() || state.is_null(), "checkpoint {}: state must be a JSON object",
             dir_.string());

  json files = json::object();
  struct MergedTensor {
    std::vector<int64_t> shape;
    std::string dtype;
    int first_rank;
    std::vector<Box> boxes;
    std::vector<int> ranks;
    std::set<std::pair<std::vector<int64_t>, std::vector<int64_t>>> seen;
    json slices = json::array();
  };
  std::map<std::string, MergedTensor> merged;
  std::set<std::string> referenced = {kManifestName};  // top-level names to keep

  for (int r = 0; r < world_size_; ++r) {
    const fs::path part_path = tmp_dir_ / (rank_file_stem(r) + ".json");
    std::error_code ec;
    KILN_CHECK(fs::exists(part_path, ec),
               "{}: missing: rank {} has not written its part of the checkpoint (every rank "
               "must call write_rank_files(), then a barrier, before commit())",
               part_path.string(), r);
    json part;
    try {
      part = json::parse(detail::read_file(part_path));
    } catch (const json::exception& e) {
      KILN_FAIL("{}: bad JSON: {}", part_path.string(), e.what());
    }
    try {
      KILN_CHECK(part.value("format_version", -1) == kFormatVersion && part.value("rank", -1) == r &&
                     part.value("world_size", -1) == world_size_,
                 "{}: written for rank {} of world size {} (format {}), expected rank {} of {}",
                 part_path.string(), part.value("rank", -1), part.value("world_size", -1),
                 part.value("format_version", -1), r, world_size_);
      std::string file_name;
      if (!part["file"].is_null()) {
        const json& f = part["file"];
        file_name = f.at("name").get<std::string>();
        const fs::path data_path = tmp_dir_ / file_name;
        const uint64_t size = file_size_or_fail(data_path, fmt::format(" (data file of rank {})", r));
        KILN_CHECK(size == f.at("size").get<uint64_t>(),
                   "{}: truncated or wrong size: {} bytes, rank {} wrote {}", data_path.string(),
                   size, r, f.at("size").get<uint64_t>());
        files[file_name] = {{"size", size}, {"crc32", f.at("crc32")}};
        referenced.insert(file_name);
      }
      for (const auto& [name, t] : part.at("tensors").items()) {
        auto shape = t.at("shape").get<std::vector<int64_t>>();
        auto dtype = t.at("dtype").get<std::string>();
        auto [it, inserted] = merged.try_emplace(name);
        if (inserted) {
          it->second.shape = shape;
          it->second.dtype = dtype;
          it->second.first_rank = r;
        } else {
          KILN_CHECK(it->second.shape == shape && it->second.dtype == dtype,
                     "checkpoint {}: tensor '{}' is {} {} on rank {} but {} {} on rank {}",
                     dir_.string(), name, it->second.dtype, vec_str(it->second.shape),
                     it->second.first_rank, dtype, vec_str(shape), r);
        }
      }
      for (const json& s : part.at("slices")) {
        const std::string name = s.at("name").get<std::string>();
        auto it = merged.find(name);
        KILN_CHECK(it != merged.end(), "{}: slice of undeclared tensor '{}'", part_path.string(), name);
        KILN_CHECK(!file_name.empty(), "{}: slices but no data file", part_path.string());
        Box box = box_from_json(s, part_path.string());
        // The same box from several ranks (a replicated tensor): keep the lowest rank's.
        if (!it->second.seen.emplace(box.offset, box.extent).second) continue;
        it->second.boxes.push_back(std::move(box));
        it->second.ranks.push_back(r);
        it->second.slices.push_back({{"file", file_name}, {"key", s.at("key")},
                                     {"offset", s.at("offset")}, {"extent", s.at("extent")}});
      }
    } catch (const json::exception& e) {
      KILN_FAIL("{}: bad part file: {}", part_path.string(), e.what());
    }
  }

  json tensors = json::object();
  for (auto& [name, t] : merged) {
    std::vector<const Box*> boxes;
    for (const Box& b : t.boxes) boxes.push_back(&b);
    validate_slices(fmt::format("checkpoint {}: tensor '{}'", dir_.string(), name), t.shape, boxes,
                    [&ranks = t.ranks](size_t i) { return fmt::format("rank {}", ranks[i]); });
    tensors[name] = {{"shape", t.shape}, {"dtype", t.dtype}, {"slices", std::move(t.slices)}};
  }

  json extra_names = json::array();
  for (const auto& [name, contents] : extra_files) {
    KILN_CHECK(valid_extra_name(name),
               "checkpoint {}: bad extra file name '{}' (a relative path without '.', '..' or "
               "hidden components, not manifest.json, not rank_*)", dir_.string(), name);
    if (name.find('/') != std::string::npos) detail::make_dirs((tmp_dir_ / name).parent_path());
    detail::atomic_write_file(tmp_dir_ / name, contents);
    files[name] = {{"size", contents.size()},
                   {"crc32", buffer_crc32(contents.data(), contents.size())}};
    extra_names.push_back(name);
    referenced.insert(top_component(name));
  }

  json manifest;
  manifest["format"] = "kiln-checkpoint";
  manifest["format_version"] = kFormatVersion;
  manifest["world_size"] = world_size_;
  manifest["files"] = std::move(files);
  manifest["extra_files"] = std::move(extra_names);
  manifest["tensors"] = std::move(tensors);
  manifest["state"] = state.is_null() ? json::object() : state;

  // Drop what the manifest does not name: part files, leftovers of an earlier attempt.
  std::vector<fs::path> unreferenced;
  for (const auto& entry : fs::directory_iterator(tmp_dir_))
    if (!referenced.count(entry.path().filename().string())) unreferenced.push_back(entry.path());
  for (const fs::path& p : unreferenced) detail::remove_tree(p);
  detail::atomic_write_file(tmp_dir_ / kManifestName, seal_manifest(std::move(manifest)));
  detail::fsync_dir(tmp_dir_);

  // Into place. A checkpoint already under the final name (the same step saved again:
  // after a rollback, or replacing a damaged one) is swapped with the new one in one
  // atomic exchange, so that step's name always holds a complete checkpoint; the old one
  // then sits in the temporary directory and is removed.
  std::error_code ec;
  const fs::path parent = dir_.has_parent_path() ? dir_.parent_path() : fs::path(".");
  if (fs::exists(dir_, ec)) {
    if (!detail::exchange_paths(tmp_dir_, dir_)) {
      // No RENAME_EXCHANGE on this file system: two renames. A crash between them leaves
      // no directory under the final name (the older checkpoints are then chosen).
      const fs::path old = tmp_sibling(dir_, ".tmp_old_");
      detail::remove_tree(old);
      detail::rename_path(dir_, old);
      detail::rename_path(tmp_dir_, dir_);
      detail::fsync_dir(parent);
      detail::remove_tree(old);
      return;
    }
    detail::fsync_dir(parent);
    detail::remove_tree(tmp_dir_);
    return;
  }
  detail::rename_path(tmp_dir_, dir_);
  detail::fsync_dir(parent);
}

}  // namespace kiln::checkpoint
