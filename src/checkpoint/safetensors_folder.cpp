#include "checkpoint/safetensors_folder.h"

#include "checkpoint/file_util.h"
#include "core/error.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <set>

namespace kiln::safetensors {

namespace fs = std::filesystem;
namespace io = checkpoint::detail;

FolderReader::~FolderReader() = default;
FolderReader::FolderReader(FolderReader&&) noexcept = default;
FolderReader& FolderReader::operator=(FolderReader&&) noexcept = default;

FolderReader::FolderReader(const fs::path& dir) {
  const bool file = fs::is_regular_file(dir);
  const fs::path index = dir / kIndexFile, single = file ? dir : dir / kSingleFile;
  if (file || !fs::exists(index)) {
    KILN_CHECK(fs::exists(single), "{}: no {} nor {}", dir.string(), kIndexFile, kSingleFile);
    path_ = single.string();
    files_.push_back(std::make_unique<Reader>(path_));
    for (const TensorInfo& t : files_.back()->tensors()) shard_of_.emplace(t.name, 0);
    return;
  }
  path_ = index.string();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(io::read_file(index));
  } catch (const nlohmann::json::exception& e) {
    KILN_FAIL("{}: not valid JSON ({})", path_, e.what());
  }
  KILN_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
             "{}: no \"weight_map\" object", path_);
  std::map<std::string, size_t> file_index;
  std::vector<std::pair<std::string, size_t>> mapped;
  for (const auto& [name, file] : j["weight_map"].items()) {
    KILN_CHECK(file.is_string(), "{}: weight_map[\"{}\"] is not a file name", path_, name);
    const std::string f = file.get<std::string>();
    KILN_CHECK(!f.empty() && f.find('/') == std::string::npos && f != "." && f != "..",
               "{}: weight_map[\"{}\"] = '{}' is not a file name in the folder", path_, name, f);
    auto [it, added] = file_index.emplace(f, files_.size());
    if (added) {
      KILN_CHECK(fs::exists(dir / f), "{}: shard '{}' (holding '{}') does not exist", path_, f,
                 name);
      files_.push_back(std::make_unique<Reader>((dir / f).string()));
    }
    mapped.emplace_back(name, it->second);
  }
  for (const auto& [name, k] : mapped)
    KILN_CHECK(files_[k]->contains(name), "{}: no tensor '{}' ({} maps it there)",
               files_[k]->path(), name, kIndexFile);
  for (size_t k = 0; k < files_.size(); ++k)
    for (const TensorInfo& t : files_[k]->tensors()) {
      auto [it, added] = shard_of_.emplace(t.name, k);
      KILN_CHECK(added, "{}: tensor '{}' is also in {}", files_[k]->path(), t.name,
                 files_[it->second]->path());
    }
}

bool FolderReader::contains(std::string_view name) const { return shard_of_.find(name) != shard_of_.end(); }

std::vector<std::string> FolderReader::names() const {
  std::vector<std::string> out;
  for (const auto& [name, k] : shard_of_) out.push_back(name);
  return out;
}

const Reader& FolderReader::file_of(std::string_view name) const {
  auto it = shard_of_.find(name);
  KILN_CHECK(it != shard_of_.end(), "{}: no tensor '{}'", path_, name);
  return *files_[it->second];
}

std::vector<std::string> shard_file_names(int n) {
  if (n == 1) return {std::string(kSingleFile)};
  std::vector<std::string> out;
  for (int i = 1; i <= n; ++i) out.push_back(fmt::format("model-{:05d}-of-{:05d}.safetensors", i, n));
  return out;
}

namespace {
// The first entry of `dir` that a model folder's export would not have written (its
// own names: shards, index, `files`, and every Hugging Face tokenizer/config file), or
// "" when there is none: only then may the folder be replaced whole, so that a re-export
// never deletes a user's own files.
std::string foreign_entry(const fs::path& dir, const std::map<std::string, std::string>& files) {
  static const std::set<std::string> known = {
      "config.json", "generation_config.json", std::string(kSingleFile), std::string(kIndexFile),
      "tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json",
      "vocab.json", "merges.txt"};
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    const bool shard = name.starts_with("model-") && name.ends_with(".safetensors");
    if (!e.is_regular_file() || !(known.count(name) || files.count(name) || shard)) return name;
  }
  return "";
}
}  // namespace

void write_folder(const fs::path& dir, const std::vector<FolderTensor>& tensors,
                  uint64_t shard_bytes, const std::map<std::string, std::string>& metadata,
                  const std::map<std::string, std::string>& files) {
  KILN_CHECK(shard_bytes > 0, "{}: the shard size must be positive", dir.string());
  const bool exists = fs::exists(dir);
  KILN_CHECK(!exists || fs::is_directory(dir), "{}: exists and is not a directory: choose another "
             "output", dir.string());
  if (exists) {
    const std::string foreign = foreign_entry(dir, files);
    KILN_CHECK(foreign.empty(), "{}: exists and holds '{}', which is not a model folder's file: "
               "the export replaces the folder whole, so choose another output (or remove it)",
               dir.string(), foreign);
  }
  // Shards: consecutive tensors while they fit.
  std::vector<std::vector<const FolderTensor*>> shards;
  uint64_t in_shard = 0, total = 0;
  for (const FolderTensor& t : tensors) {
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    const uint64_t bytes = static_cast<uint64_t>(numel) * st_dtype_size(t.dtype);
    if (shards.empty() || (in_shard > 0 && in_shard + bytes > shard_bytes)) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(&t);
    in_shard += bytes;
    total += bytes;
  }
  if (shards.empty()) shards.emplace_back();
  const auto names = shard_file_names(static_cast<int>(shards.size()));

  const fs::path parent = dir.has_parent_path() ? dir.parent_path() : fs::path(".");
  io::make_dirs(parent);
  io::remove_stale_temps(dir);  // an earlier export's, interrupted
  const fs::path tmp = io::temp_name_for(dir);
  io::make_dirs(tmp);
  try {
    nlohmann::json weight_map = nlohmann::json::object();
    for (size_t s = 0; s < shards.size(); ++s) {
      Writer w((tmp / names[s]).string());
      for (const auto& [k, v] : metadata) w.set_metadata(k, v);
      for (const FolderTensor* t : shards[s]) {
        w.add_produced(t->name, t->dtype, t->shape, t->produce);
        weight_map[t->name] = names[s];
      }
      w.write();
    }
    if (shards.size() > 1) {
      const nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
      io::atomic_write_file(tmp / kIndexFile, index.dump(2) + "\n");
    }
    for (const auto& [name, contents] : files) io::atomic_write_file(tmp / name, contents);
    io::fsync_dir(tmp);
    if (!exists) {
      io::rename_path(tmp, dir);
    } else if (io::exchange_paths(tmp, dir)) {
      io::remove_tree(tmp);  // the old folder, now at tmp
    } else {
      const fs::path old = io::temp_name_for(dir);
      io::rename_path(dir, old);
      io::rename_path(tmp, dir);
      io::remove_tree(old);
    }
    io::fsync_dir(parent);
  } catch (...) {
    std::error_code ec;  // tmp: the partial output (or, after the exchange, the old folder)
    fs::remove_all(tmp, ec);
    throw;
  }
}

}  // namespace kiln::safetensors
