#include "checkpoint/checkpoint.h"

#include "checkpoint/file_util.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <mutex>
#include <set>
#include <unordered_map>

namespace kiln::checkpoint {

namespace fs = std::filesystem;
using nlohmann::json;

// ---------------------------------------------------------------------------------------
// Boxes and names

int64_t Box::numel() const {
  int64_t n = 1;
  for (int64_t e : extent) n *= e;
  return n;
}

namespace {

std::vector<int64_t> dims_of(const Shape& s) {
  std::vector<int64_t> d(static_cast<size_t>(s.ndim()));
  for (int i = 0; i < s.ndim(); ++i) d[static_cast<size_t>(i)] = s[i];
  return d;
}

// Decomposes [b, e) of the sub-tensor spanned by dims[dim..] (the earlier dims fixed at
// `prefix`, extent 1) into boxes, appended to `out` in flat order.
void decompose(const std::vector<int64_t>& dims, size_t dim, std::vector<int64_t>& prefix,
               int64_t b, int64_t e, std::vector<Box>& out) {
  if (b >= e) return;
  const size_t n = dims.size();
  auto emit = [&](int64_t row_begin, int64_t row_count) {
    Box box;
    box.offset = prefix;
    box.extent.assign(prefix.size(), 1);
    box.offset.push_back(row_begin);
    box.extent.push_back(row_count);
    for (size_t d = dim + 1; d < n; ++d) {
      box.offset.push_back(0);
      box.extent.push_back(dims[d]);
    }
    out.push_back(std::move(box));
  };
  if (dim + 1 == n) {
    emit(b, e - b);
    return;
  }
  int64_t R = 1;  // elements per index of dimension `dim`
  for (size_t d = dim + 1; d < n; ++d) R *= dims[d];
  int64_t rb = b / R;
  const int64_t re = e / R;
  const int64_t b_rem = b % R, e_rem = e % R;
  if (b_rem == 0 && e_rem == 0) {
    emit(rb, re - rb);
    return;
  }
  if (rb == (e - 1) / R) {  // inside one row
    prefix.push_back(rb);
    decompose(dims, dim + 1, prefix, b_rem, e - rb * R, out);
    prefix.pop_back();
    return;
  }
  if (b_rem != 0) {  // partial first row
    prefix.push_back(rb);
    decompose(dims, dim + 1, prefix, b_rem, R, out);
    prefix.pop_back();
    ++rb;
  }
  if (re > rb) emit(rb, re - rb);  // full rows
  if (e_rem != 0) {                // partial last row
    prefix.push_back(re);
    decompose(dims, dim + 1, prefix, 0, e_rem, out);
    prefix.pop_back();
  }
}

std::string vec_str(const std::vector<int64_t>& v) { return fmt::format("[{}]", fmt::join(v, ", ")); }

std::string box_str(const Box& b) {
  std::string s = "[";
  for (size_t d = 0; d < b.offset.size(); ++d) {
    if (d) s += ", ";
    s += fmt::format("{}:{}", b.offset[d], b.offset[d] + b.extent[d]);
  }
  return s + "]";
}

// Row-major strides of `dims`.
std::vector<int64_t> strides_of(const std::vector<int64_t>& dims) {
  std::vector<int64_t> st(dims.size(), 1);
  for (size_t d = dims.size(); d-- > 1;) st[d - 1] = st[d] * dims[d];
  return st;
}

bool boxes_overlap(const Box& a, const Box& b) {
  for (size_t d = 0; d < a.offset.size(); ++d) {
    if (a.offset[d] >= b.offset[d] + b.extent[d] || b.offset[d] >= a.offset[d] + a.extent[d])
      return false;
  }
  return true;
}

void check_box_in_shape(const std::vector<int64_t>& dims, const Box& box, const std::string& what) {
  KILN_CHECK(box.offset.size() == dims.size() && box.extent.size() == dims.size(),
             "{}: slice has {} offsets and {} extents for a tensor of {} dimensions", what,
             box.offset.size(), box.extent.size(), dims.size());
  for (size_t d = 0; d < dims.size(); ++d) {
    KILN_CHECK(box.extent[d] > 0 && box.offset[d] >= 0 && box.offset[d] + box.extent[d] <= dims[d],
               "{}: slice {} lies outside the shape {}", what, box_str(box), vec_str(dims));
  }
}

// Slices of one tensor must lie in its shape, not overlap and cover it exactly.
// `label(i)` names slice i (its file or rank) in messages.
template <class Label>
void validate_slices(const std::string& what, const std::vector<int64_t>& dims,
                     const std::vector<const Box*>& boxes, Label label) {
  int64_t numel = 1;
  for (int64_t d : dims) numel *= d;
  int64_t total = 0;
  for (const Box* b : boxes) {
    check_box_in_shape(dims, *b, what);
    total += b->numel();
  }
  std::vector<size_t> order(boxes.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  if (!dims.empty()) {
    std::sort(order.begin(), order.end(),
              [&](size_t a, size_t b) { return boxes[a]->offset[0] < boxes[b]->offset[0]; });
  }
  for (size_t i = 0; i < order.size(); ++i) {
    const Box& a = *boxes[order[i]];
    for (size_t j = i + 1; j < order.size(); ++j) {
      const Box& b = *boxes[order[j]];
      if (!dims.empty() && b.offset[0] >= a.offset[0] + a.extent[0]) break;
      KILN_CHECK(!boxes_overlap(a, b), "{}: slices {} ({}) and {} ({}) overlap", what, box_str(a),
                 label(order[i]), box_str(b), label(order[j]));
    }
  }
  KILN_CHECK(total == numel, "{}: slices cover {} of the {} elements of shape {}", what, total,
             numel, vec_str(dims));
}

Box box_from_json(const json& slice, const std::string& what) {
  Box b;
  KILN_CHECK(slice.is_object() && slice.contains("offset") && slice.contains("extent") &&
                 slice["offset"].is_array() && slice["extent"].is_array(),
             "{}: slice without offset/extent arrays", what);
  b.offset = slice["offset"].get<std::vector<int64_t>>();
  b.extent = slice["extent"].get<std::vector<int64_t>>();
  return b;
}

std::vector<int64_t> shape_from_json(const json& j, const std::string& what) {
  KILN_CHECK(j.is_array() && j.size() <= static_cast<size_t>(Shape::kMaxDims),
             "{}: bad shape (an array of at most {} sizes expected)", what, Shape::kMaxDims);
  std::vector<int64_t> dims = j.get<std::vector<int64_t>>();
  for (int64_t d : dims) KILN_CHECK(d >= 0, "{}: negative size in shape {}", what, vec_str(dims));
  return dims;
}

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

}  // namespace

std::vector<Box> flat_range_to_boxes(const Shape& shape, int64_t flat_begin, int64_t flat_end) {
  const int64_t numel = shape.numel();
  KILN_CHECK(0 <= flat_begin && flat_begin <= flat_end && flat_end <= numel,
             "flat range [{}, {}) outside a tensor of shape {} ({} elements)", flat_begin, flat_end,
             shape.str(), numel);
  std::vector<Box> out;
  if (flat_begin == flat_end) return out;
  if (shape.ndim() == 0) {
    out.push_back(Box{});
    return out;
  }
  std::vector<int64_t> prefix;
  decompose(dims_of(shape), 0, prefix, flat_begin, flat_end, out);
  return out;
}

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

uint32_t buffer_crc32(const void* data, size_t bytes, uint32_t crc) {
  const auto* p = static_cast<const Bytef*>(data);
  uLong c = crc;
  while (bytes > 0) {
    const size_t n = std::min<size_t>(bytes, size_t{1} << 30);
    c = ::crc32(c, p, static_cast<uInt>(n));
    p += n;
    bytes -= n;
  }
  return static_cast<uint32_t>(c);
}

uint32_t file_crc32(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  KILN_CHECK(fd >= 0, "{}: cannot open: {}", path.string(), detail::errno_text());
  std::vector<unsigned char> buf(size_t{4} << 20);
  uint32_t crc = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      const std::string why = detail::errno_text();
      ::close(fd);
      KILN_FAIL("{}: read failed: {}", path.string(), why);
    }
    if (n == 0) break;
    crc = buffer_crc32(buf.data(), static_cast<size_t>(n), crc);
  }
  ::close(fd);
  return crc;
}

// ---------------------------------------------------------------------------------------
// Writer

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

void CheckpointWriter::write_rank_files() {
  KILN_CHECK(!rank_files_written_, "checkpoint {}: write_rank_files() called twice on rank {}",
             dir_.string(), rank_);
  std::error_code ec;
  fs::create_directories(tmp_dir_, ec);
  KILN_CHECK(!ec, "{}: cannot create directory: {}", tmp_dir_.string(), ec.message());

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
                    [&](size_t i) { return fmt::format("rank {}", t.ranks[i]); });
    tensors[name] = {{"shape", t.shape}, {"dtype", t.dtype}, {"slices", std::move(t.slices)}};
  }

  json extra_names = json::array();
  for (const auto& [name, contents] : extra_files) {
    KILN_CHECK(valid_extra_name(name),
               "checkpoint {}: bad extra file name '{}' (a relative path without '.', '..' or "
               "hidden components, not manifest.json, not rank_*)", dir_.string(), name);
    if (name.find('/') != std::string::npos) {
      std::error_code ec;
      fs::create_directories((tmp_dir_ / name).parent_path(), ec);
      KILN_CHECK(!ec, "{}: cannot create directory: {}", (tmp_dir_ / name).parent_path().string(),
                 ec.message());
    }
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
  for (const auto& entry : fs::directory_iterator(tmp_dir_)) {
    if (!referenced.count(entry.path().filename().string())) {
      std::error_code ec;
      fs::remove_all(entry.path(), ec);
    }
  }
  detail::atomic_write_file(tmp_dir_ / kManifestName, manifest.dump(1));
  detail::fsync_dir(tmp_dir_);

  std::error_code ec;
  const fs::path parent = dir_.has_parent_path() ? dir_.parent_path() : fs::path(".");
  if (fs::exists(dir_, ec)) {
    const fs::path old = tmp_sibling(dir_, ".tmp_old_");
    fs::remove_all(old, ec);
    fs::rename(dir_, old, ec);
    KILN_CHECK(!ec, "{}: cannot move the existing checkpoint aside: {}", dir_.string(), ec.message());
    fs::rename(tmp_dir_, dir_, ec);
    KILN_CHECK(!ec, "{}: cannot rename {} to it: {}", dir_.string(), tmp_dir_.string(), ec.message());
    detail::fsync_dir(parent);
    fs::remove_all(old, ec);
  } else {
    fs::rename(tmp_dir_, dir_, ec);
    KILN_CHECK(!ec, "{}: cannot rename {} to it: {}", dir_.string(), tmp_dir_.string(), ec.message());
  }
  detail::fsync_dir(parent);
}

// ---------------------------------------------------------------------------------------
// Reader

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
  KILN_CHECK(m.is_object() && m.value("format", "") == "kiln-checkpoint",
             "{}: not a kiln checkpoint manifest", mpath.string());
  KILN_CHECK(m.value("format_version", -1) == kFormatVersion,
             "{}: format version {} (this build reads version {})", mpath.string(),
             m.value("format_version", -1), kFormatVersion);
  for (const char* key : {"files", "tensors", "state"})
    KILN_CHECK(m.contains(key) && m[key].is_object(), "{}: no '{}' object", mpath.string(), key);
  KILN_CHECK(m.contains("extra_files") && m["extra_files"].is_array(), "{}: no 'extra_files' array",
             mpath.string());
  return m;
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
      impl_->files[name] = {f.at("size").get<uint64_t>(), f.at("crc32").get<uint32_t>()};
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

// ---------------------------------------------------------------------------------------
// Directory-level operations

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
  int kept = 0;
  auto remove = [&](const fs::path& p) {
    std::error_code ec;
    fs::remove_all(p, ec);
    KILN_CHECK(!ec, "{}: cannot remove: {}", p.string(), ec.message());
    removed.push_back(p);
  };
  for (const fs::path& dir : list_checkpoint_dirs(ckpt_root)) {
    bool complete = false;
    if (keep <= 0 || kept < keep) {
      try {
        verify_checkpoint(dir, Verify::SizeOnly);
        complete = true;
      } catch (const std::exception&) {
      }
    }
    if (complete) {
      ++kept;
    } else {
      remove(dir);
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

}  // namespace kiln::checkpoint
