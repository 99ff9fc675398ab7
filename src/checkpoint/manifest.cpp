// Names of checkpoint directories and files, and manifest.json: its checks and its own
// checksum.
#include "checkpoint/internal.h"

#include "checkpoint/file_util.h"
#include "core/error.h"

#include <fmt/format.h>

namespace kiln::checkpoint {

namespace fs = std::filesystem;
using nlohmann::json;

std::string checkpoint_dir_name(int64_t step) {
  KILN_CHECK(step >= 0, "checkpoint step must be >= 0 (got {})", step);
  return fmt::format("step_{:08d}", step);
}

std::optional<int64_t> parse_checkpoint_dir_name(const std::string& name) {
  if (!name.starts_with("step_") || name.size() < 6 || name.size() > 5 + 18) return std::nullopt;
  int64_t step = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

std::string rank_file_stem(int rank) { return fmt::format("rank_{:05d}", rank); }

namespace internal {

uint64_t file_size_or_fail(const fs::path& p, const std::string& what) {
  std::error_code ec;
  const auto st = fs::status(p, ec);
  KILN_CHECK(!ec && fs::exists(st), "{}: missing{}", p.string(), what);
  KILN_CHECK(fs::is_regular_file(st), "{}: not a regular file{}", p.string(), what);
  const uint64_t size = fs::file_size(p, ec);
  KILN_CHECK(!ec, "{}: cannot read its size: {}", p.string(), ec.message());
  return size;
}

// A relative path of plain components: no empty, ".", ".." or hidden component.
bool valid_relative_path(const std::string& n) {
  if (n.empty() || n.find('\0') != std::string::npos) return false;
  size_t start = 0;
  for (;;) {
    const size_t slash = n.find('/', start);
    const std::string part = n.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
    if (part.empty() || part.front() == '.') return false;
    if (slash == std::string::npos) return true;
    start = slash + 1;
  }
}

std::string top_component(const std::string& n) { return n.substr(0, n.find('/')); }

bool valid_extra_name(const std::string& n) {
  if (!valid_relative_path(n)) return false;
  const std::string top = top_component(n);
  return top != kManifestName && !top.starts_with("rank_");
}

fs::path tmp_sibling(const fs::path& dir, const std::string& tag) {
  fs::path d = dir;
  if (!d.has_filename()) d = d.parent_path();  // "a/b/" -> "a/b"
  return d.parent_path() / (tag + d.filename().string());
}

namespace {
constexpr const char* kChecksumKey = "manifest_crc32";

uint32_t content_crc(const json& m) {
  const std::string text = m.dump();
  return buffer_crc32(text.data(), text.size());
}
}  // namespace

std::string seal_manifest(json manifest) {
  manifest.erase(kChecksumKey);
  manifest[kChecksumKey] = content_crc(manifest);
  return manifest.dump(1);
}

json load_manifest(const fs::path& dir) {
  const fs::path mpath = dir / kManifestName;
  std::error_code ec;
  KILN_CHECK(fs::is_directory(dir, ec), "checkpoint {}: not a directory", dir.string());
  KILN_CHECK(fs::exists(mpath, ec), "checkpoint {}: incomplete: no {}", dir.string(), kManifestName);
  json m;
  try {
    m = json::parse(detail::read_file(mpath));
  } catch (const json::exception& e) {
    KILN_FAIL("{}: bad JSON: {}", mpath.string(), e.what());
  }
  KILN_CHECK(m.is_object() && m.contains("format") && m["format"] == "kiln-checkpoint",
             "{}: not a kiln checkpoint manifest", mpath.string());
  const json& v = m.contains("format_version") ? m["format_version"] : json();
  const int version = v.is_number_integer() ? v.get<int>() : -1;
  KILN_CHECK(version >= kOldestFormatVersion && version <= kFormatVersion,
             "{}: format version {} (this build reads versions {} to {})", mpath.string(),
             v.dump(), kOldestFormatVersion, kFormatVersion);
  if (version >= 2) {  // version 1 manifests carry no checksum of their own
    KILN_CHECK(m.contains(kChecksumKey) && m[kChecksumKey].is_number_unsigned(),
               "{}: no '{}' (a version {} manifest carries the checksum of its own content)",
               mpath.string(), kChecksumKey, version);
    const auto want = m[kChecksumKey].get<uint64_t>();
    json rest = m;
    rest.erase(kChecksumKey);
    const uint32_t got = content_crc(rest);
    KILN_CHECK(got == want,
               "{}: checksum mismatch: its content has crc32 {:08x}, its {} says {:08x} (the "
               "manifest was changed or damaged after it was written)",
               mpath.string(), got, kChecksumKey, want);
  }
  for (const char* key : {"files", "tensors", "state"})
    KILN_CHECK(m.contains(key) && m[key].is_object(), "{}: no '{}' object", mpath.string(), key);
  KILN_CHECK(m.contains("extra_files") && m["extra_files"].is_array(), "{}: no 'extra_files' array",
             mpath.string());
  return m;
}

}  // namespace internal
}  // namespace kiln::checkpoint
