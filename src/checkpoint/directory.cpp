// Directory policy: which step directories count as checkpoints, the newest usable one,
// pruning, and moving abandoned checkpoints aside.
#include "checkpoint/internal.h"

#include "checkpoint/file_util.h"
#include "core/error.h"

#include <fmt/format.h>

#include <algorithm>
#include <iostream>

namespace kiln::checkpoint {

namespace fs = std::filesystem;
using namespace internal;


void verify_checkpoint(const fs::path& dir, Verify verify) { CheckpointReader r(dir, verify); }

std::vector<fs::path> list_checkpoint_dirs(const fs::path& ckpt_root) {
  std::vector<std::pair<int64_t, fs::path>> found;
  std::error_code ec;
  if (!fs::is_directory(ckpt_root, ec)) return {};
  for (const auto& entry : fs::directory_iterator(ckpt_root, ec)) {
    if (!entry.is_directory(ec)) continue;
    if (auto step = parse_checkpoint_dir_name(entry.path().filename().string()))
      found.emplace_back(*step, entry.path());
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second > b.second;
  });
  std::vector<fs::path> out;
  for (auto& [step, p] : found) out.push_back(std::move(p));
  return out;
}

std::optional<fs::path> find_latest_checkpoint(const fs::path& ckpt_root) {
  for (const fs::path& dir : list_checkpoint_dirs(ckpt_root)) {
    try {
      verify_checkpoint(dir, Verify::Full);
      return dir;
    } catch (const std::exception& e) {
      std::cerr << fmt::format("kiln: warning: skipping checkpoint {}: {}\n", dir.string(), e.what())
                << std::flush;
    }
  }
  return std::nullopt;
}

std::vector<fs::path> prune_checkpoints(const fs::path& ckpt_root, int keep) {
  std::vector<fs::path> removed;
  auto remove = [&](const fs::path& p) {
    detail::remove_tree(p);
    removed.push_back(p);
  };
  if (keep > 0) {
    int kept = 0;
    for (const fs::path& dir : list_checkpoint_dirs(ckpt_root)) {
      if (kept == keep) {  // older than the newest `keep` valid ones
        remove(dir);
        continue;
      }
      try {
        verify_checkpoint(dir, Verify::Full);
        ++kept;
      } catch (const std::exception& e) {
        std::cerr << fmt::format("kiln: warning: removing damaged checkpoint {}: {}\n",
                                 dir.string(), e.what())
                  << std::flush;
        remove(dir);
      }
    }
  }
  std::error_code ec;
  if (fs::is_directory(ckpt_root, ec)) {
    std::vector<fs::path> stale;
    for (const auto& entry : fs::directory_iterator(ckpt_root, ec)) {
      if (entry.is_directory(ec) && entry.path().filename().string().starts_with(".tmp_"))
        stale.push_back(entry.path());
    }
    for (const auto& p : stale) remove(p);
  }
  return removed;
}

std::vector<std::pair<fs::path, fs::path>> move_checkpoints_aside(const fs::path& ckpt_root,
                                                                  int64_t resumed_step) {
  std::vector<fs::path> newer;
  for (const fs::path& dir : list_checkpoint_dirs(ckpt_root))
    if (parse_checkpoint_dir_name(dir.filename().string()).value_or(-1) > resumed_step)
      newer.push_back(dir);
  std::vector<std::pair<fs::path, fs::path>> moved;
  if (newer.empty()) return moved;
  const std::string base = "from_" + checkpoint_dir_name(resumed_step);
  fs::path dest = ckpt_root / kAbandonedDirName / base;
  std::error_code ec;
  for (int i = 1; fs::exists(dest, ec); ++i)
    dest = ckpt_root / kAbandonedDirName / fmt::format("{}.{}", base, i);
  detail::make_dirs(dest);
  for (const fs::path& dir : newer) {
    const fs::path to = dest / dir.filename();
    detail::rename_path(dir, to);
    moved.emplace_back(dir, to);
  }
  detail::fsync_dir(dest);
  detail::fsync_dir(ckpt_root);
  return moved;
}

}  // namespace kiln::checkpoint
