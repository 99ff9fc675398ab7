// CheckpointReader: the manifest and every file verified at open, then ranges of global
// tensors assembled from the slices through read-only memory maps.
#include "checkpoint/internal.h"

#include "checkpoint/file_util.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "core/json_util.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <set>
#include <unordered_map>

namespace kiln::checkpoint {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace internal;

namespace {

struct Mapping {
  void* addr = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (addr && size) ::munmap(addr, size);
  }
};

}  // namespace

struct CheckpointReader::Impl {
  struct SliceRef {
    size_t file;
    std::string key;
    Box box;
  };
  struct TensorEntry {
    std::vector<int64_t> dims;
    DType dtype;
    std::vector<SliceRef> slices;
  };
  struct DataFile {
    std::string name;
    uint64_t size = 0;
    // Filled on first use.
    bool opened = false;
    std::unique_ptr<Mapping> map;
    std::unordered_map<std::string, uint64_t> key_offset;  // absolute byte offset of each key
  };
  struct FileEntry {
    uint64_t size;
    uint32_t crc;
  };

  std::map<std::string, TensorEntry> tensors;
  std::vector<DataFile> data_files;
  std::map<std::string, FileEntry> files;
  std::set<std::string> extra;
  mutable std::mutex mu;

  // The mapped bytes of slice `s`, opened on first use; checks the slice's entry.
  const std::byte* slice_data(const fs::path& dir, const std::string& tensor,
                              const TensorEntry& t, const SliceRef& s) {
    DataFile* df = &data_files[s.file];
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!df->opened) {
        const fs::path path = dir / df->name;
        safetensors::Reader r(path.string());
        KILN_CHECK(r.file_size() == df->size, "{}: truncated or wrong size: {} bytes, manifest says {}",
                   path.string(), r.file_size(), df->size);
        for (const auto& ti : r.tensors()) df->key_offset[ti.name] = r.data_offset() + ti.begin;
        // Check every entry of this file against the manifest before trusting offsets.
        for (const auto& [tname, te] : tensors) {
          for (const SliceRef& sr : te.slices) {
            if (sr.file != s.file) continue;
            KILN_CHECK(r.contains(sr.key), "{}: no tensor '{}' (slice of '{}' in the manifest)",
                       path.string(), sr.key, tname);
            const auto& info = r.info(sr.key);
            KILN_CHECK(info.dtype == safetensors::to_st_dtype(te.dtype) && info.shape == sr.box.extent,
                       "{}: tensor '{}' is {} {} but the manifest says {} {}", path.string(), sr.key,
                       safetensors::st_dtype_name(info.dtype), info.shape_str(),
                       dtype_name(te.dtype), vec_str(sr.box.extent));
          }
        }
        auto m = std::make_unique<Mapping>();
        if (df->size > 0) {
          const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
          KILN_CHECK(fd >= 0, "{}: cannot open: {}", path.string(), detail::errno_text());
          void* a = ::mmap(nullptr, df->size, PROT_READ, MAP_PRIVATE, fd, 0);
          const std::string why = detail::errno_text();
          ::close(fd);
          KILN_CHECK(a != MAP_FAILED, "{}: mmap failed: {}", path.string(), why);
          m->addr = a;
          m->size = df->size;
        }
        df->map = std::move(m);
        df->opened = true;
      }
    }
    auto it = df->key_offset.find(s.key);
    KILN_CHECK(it != df->key_offset.end(), "{}: no tensor '{}' (slice of '{}')",
               (dir / df->name).string(), s.key, tensor);
    return static_cast<const std::byte*>(df->map->addr) + it->second;
  }
};

namespace {

void copy_elements(const std::byte* src, DType src_t, std::byte* dst, DType dst_t, size_t n) {
  if (src_t == dst_t) {
    std::memcpy(dst, src, n * dtype_size(src_t));
  } else {
    convert(src, src_t, dst, dst_t, n);
  }
}
}  // namespace

CheckpointReader::CheckpointReader(fs::path dir, Verify verify)
    : dir_(std::move(dir)), impl_(std::make_unique<Impl>()) {
  manifest_ = load_manifest(dir_);
  const std::string mpath = (dir_ / kManifestName).string();
  try {
    for (const auto& [name, f] : manifest_["files"].items()) {
      KILN_CHECK(valid_relative_path(name) && name != kManifestName, "{}: bad file name '{}'",
                 mpath, name);
      const std::string what = fmt::format("{}: file '{}'", mpath, name);
      impl_->files[name] = {static_cast<uint64_t>(json_integer(f.at("size"), what, "size", 0)),
                            static_cast<uint32_t>(json_integer(f.at("crc32"), what, "crc32", 0, UINT32_MAX))};
    }
    for (const json& n : manifest_["extra_files"]) {
      const std::string name = n.get<std::string>();
      KILN_CHECK(impl_->files.count(name), "{}: extra file '{}' not listed in 'files'", mpath, name);
      impl_->extra.insert(name);
    }
    std::map<std::string, size_t> data_index;
    for (const auto& [name, t] : manifest_["tensors"].items()) {
      const std::string what = fmt::format("{}: tensor '{}'", mpath, name);
      Impl::TensorEntry te;
      te.dims = shape_from_json(t.at("shape"), what);
      try {
        te.dtype = parse_dtype(t.at("dtype").get<std::string>());
      } catch (const Error& e) {
        KILN_FAIL("{}: {}", what, e.what());
      }
      for (const json& s : t.at("slices")) {
        const std::string file = s.at("file").get<std::string>();
        KILN_CHECK(impl_->files.count(file), "{}: slice in file '{}' not listed in 'files'", what, file);
        auto [it, inserted] = data_index.try_emplace(file, impl_->data_files.size());
        if (inserted) {
          Impl::DataFile df;
          df.name = file;
          df.size = impl_->files[file].size;
          impl_->data_files.push_back(std::move(df));
        }
        te.slices.push_back({it->second, s.at("key").get<std::string>(), box_from_json(s, what)});
      }
      std::vector<const Box*> boxes;
      for (const auto& s : te.slices) boxes.push_back(&s.box);
      validate_slices(what, te.dims, boxes,
                      [&](size_t i) { return impl_->data_files[te.slices[i].file].name; });
      impl_->tensors.emplace(name, std::move(te));
    }
  } catch (const json::exception& e) {
    KILN_FAIL("{}: bad manifest: {}", mpath, e.what());
  }

  for (const auto& [name, f] : impl_->files) {
    const fs::path p = dir_ / name;
    const uint64_t size = file_size_or_fail(p, fmt::format(" (listed in {})", mpath));
    KILN_CHECK(size == f.size, "{}: truncated or wrong size: {} bytes, the manifest says {}",
               p.string(), size, f.size);
    if (verify == Verify::Full) {
      const uint32_t crc = file_crc32(p);
      KILN_CHECK(crc == f.crc, "{}: checksum mismatch: crc32 {:08x}, the manifest says {:08x}",
                 p.string(), crc, f.crc);
    }
  }
}

CheckpointReader::~CheckpointReader() = default;
CheckpointReader::CheckpointReader(CheckpointReader&&) noexcept = default;
CheckpointReader& CheckpointReader::operator=(CheckpointReader&&) noexcept = default;

std::vector<std::string> CheckpointReader::names() const {
  std::vector<std::string> out;
  for (const auto& [name, t] : impl_->tensors) out.push_back(name);
  return out;
}

bool CheckpointReader::has(const std::string& name) const { return impl_->tensors.count(name) > 0; }

Shape CheckpointReader::global_shape(const std::string& name) const {
  auto it = impl_->tensors.find(name);
  KILN_CHECK(it != impl_->tensors.end(), "checkpoint {}: no tensor '{}'", dir_.string(), name);
  return Shape(it->second.dims.begin(), it->second.dims.end());
}

DType CheckpointReader::dtype(const std::string& name) const {
  auto it = impl_->tensors.find(name);
  KILN_CHECK(it != impl_->tensors.end(), "checkpoint {}: no tensor '{}'", dir_.string(), name);
  return it->second.dtype;
}

void CheckpointReader::read_flat_range(const std::string& name, int64_t flat_begin,
                                       int64_t flat_end, void* dst, DType dst_dtype) const {
  auto it = impl_->tensors.find(name);
  KILN_CHECK(it != impl_->tensors.end(), "checkpoint {}: no tensor '{}'", dir_.string(), name);
  const Impl::TensorEntry& t = it->second;
  const std::string what = fmt::format("checkpoint {}: tensor '{}'", dir_.string(), name);
  KILN_CHECK((t.dtype == DType::I32) == (dst_dtype == DType::I32),
             "{}: cannot read {} data as {}", what, dtype_name(t.dtype), dtype_name(dst_dtype));
  const Shape shape(t.dims.begin(), t.dims.end());
  std::vector<Box> targets;
  try {
    targets = flat_range_to_boxes(shape, flat_begin, flat_end);
  } catch (const Error& e) {
    KILN_FAIL("{}: {}", what, e.what());
  }
  const size_t n = t.dims.size();
  const std::vector<int64_t> gstride = strides_of(t.dims);
  const size_t src_es = dtype_size(t.dtype), dst_es = dtype_size(dst_dtype);
  auto* out = static_cast<std::byte*>(dst);
  int64_t covered = 0;

  for (const Box& target : targets) {
    for (const Impl::SliceRef& s : t.slices) {
      Box isect{std::vector<int64_t>(n), std::vector<int64_t>(n)};
      bool empty = false;
      for (size_t d = 0; d < n; ++d) {
        const int64_t lo = std::max(target.offset[d], s.box.offset[d]);
        const int64_t hi = std::min(target.offset[d] + target.extent[d], s.box.offset[d] + s.box.extent[d]);
        if (hi <= lo) {
          empty = true;
          break;
        }
        isect.offset[d] = lo;
        isect.extent[d] = hi - lo;
      }
      if (empty) continue;
      const std::byte* src = impl_->slice_data(dir_, name, t, s);
      const std::vector<int64_t> sstride = strides_of(s.box.extent);
      // Dims after j are whole in the slice and in the tensor: runs span dims j..n-1.
      size_t j = n == 0 ? 0 : n - 1;
      while (j > 0 && isect.extent[j] == s.box.extent[j] && isect.extent[j] == t.dims[j]) --j;
      int64_t run = 1;
      for (size_t d = j; d < n; ++d) run *= isect.extent[d];
      std::vector<int64_t> idx(j, 0);  // index over dims 0..j-1 of the intersection
      for (;;) {
        int64_t so = 0, go = 0;
        for (size_t d = 0; d < n; ++d) {
          const int64_t g = isect.offset[d] + (d < j ? idx[d] : 0);
          so += (g - s.box.offset[d]) * sstride[d];
          go += g * gstride[d];
        }
        copy_elements(src + static_cast<size_t>(so) * src_es, t.dtype,
                      out + static_cast<size_t>(go - flat_begin) * dst_es, dst_dtype,
                      static_cast<size_t>(run));
        // Next index over dims 0..j-1, the last fastest.
        int d = static_cast<int>(j) - 1;
        while (d >= 0) {
          if (++idx[static_cast<size_t>(d)] < isect.extent[static_cast<size_t>(d)]) break;
          idx[static_cast<size_t>(d)] = 0;
          --d;
        }
        if (d < 0) break;
      }
      covered += isect.numel();
    }
  }
  KILN_CHECK(covered == flat_end - flat_begin,
             "{}: only {} of the {} elements of flat range [{}, {}) are covered by slices", what,
             covered, flat_end - flat_begin, flat_begin, flat_end);
}

void CheckpointReader::read(const std::string& name, void* dst, DType dst_dtype) const {
  read_flat_range(name, 0, global_shape(name).numel(), dst, dst_dtype);
}

void CheckpointReader::read(const std::string& name, const Tensor& dst) const {
  const Shape shape = global_shape(name);
  KILN_CHECK(dst.device().is_cpu(), "checkpoint {}: tensor '{}': destination {} is not on the host",
             dir_.string(), name, dst.str());
  KILN_CHECK(dst.numel() == shape.numel(),
             "checkpoint {}: tensor '{}' has shape {}, destination is {}", dir_.string(), name,
             shape.str(), dst.str());
  read(name, dst.raw(), dst.dtype());
}

std::vector<float> CheckpointReader::read_f32(const std::string& name) const {
  std::vector<float> out(static_cast<size_t>(global_shape(name).numel()));
  read(name, out.data(), DType::F32);
  return out;
}

std::vector<std::string> CheckpointReader::extra_file_names() const {
  return {impl_->extra.begin(), impl_->extra.end()};
}

bool CheckpointReader::has_extra_file(const std::string& name) const {
  return impl_->extra.count(name) > 0;
}

std::string CheckpointReader::extra_file(const std::string& name) const {
  KILN_CHECK(impl_->extra.count(name), "checkpoint {}: no extra file '{}'", dir_.string(), name);
  const fs::path p = dir_ / name;
  std::string contents = detail::read_file(p);
  const auto& f = impl_->files.at(name);
  KILN_CHECK(contents.size() == f.size && buffer_crc32(contents.data(), contents.size()) == f.crc,
             "{}: checksum mismatch (changed since the checkpoint was written)", p.string());
  return contents;
}
}  // namespace kiln::checkpoint
