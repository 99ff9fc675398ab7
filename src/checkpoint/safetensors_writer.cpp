// safetensors::Writer: entries laid out by decreasing element size, the file written
// through the checkpoint's durable file operations (checkpoint/safetensors.h).
#include "checkpoint/safetensors.h"
#include "checkpoint/safetensors_detail.h"

#include "checkpoint/file_util.h"
#include "core/error.h"

#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <utility>

namespace kiln::safetensors {

using detail::checked_nbytes;
using detail::shape_string;

Writer::Writer(std::string path) : path_(std::move(path)) {}

void Writer::set_metadata(std::string key, std::string value) {
  metadata_[std::move(key)] = std::move(value);
}

void Writer::add_entry(Entry e) {
  KILN_CHECK(e.name != kMetadataKey, "{}: '{}' is reserved and cannot name a tensor", path_,
             e.name);
  const auto nbytes = checked_nbytes(e.shape, e.dtype);
  KILN_CHECK(nbytes.has_value(), "{}: tensor '{}': shape {} is invalid or overflows", path_,
             e.name, shape_string(e.shape));
  e.nbytes = *nbytes;
  auto it = index_.find(e.name);
  if (it != index_.end()) {
    entries_[it->second] = std::move(e);
  } else {
    index_.emplace(e.name, entries_.size());
    entries_.push_back(std::move(e));
  }
}

void Writer::add(std::string name, StDType dtype, std::vector<int64_t> shape, const void* data,
                 size_t nbytes) {
  const auto need = checked_nbytes(shape, dtype);
  KILN_CHECK(need && *need == nbytes, "{}: tensor '{}': {} {} needs {} bytes, {} given", path_,
             name, st_dtype_name(dtype), shape_string(shape), need.value_or(0), nbytes);
  Entry e;
  e.name = std::move(name);
  e.dtype = dtype;
  e.shape = std::move(shape);
  e.owned.resize(nbytes);
  if (nbytes) std::memcpy(e.owned.data(), data, nbytes);
  add_entry(std::move(e));
}

void Writer::add_borrowed(std::string name, StDType dtype, std::vector<int64_t> shape,
                          const void* data, size_t nbytes) {
  const auto need = checked_nbytes(shape, dtype);
  KILN_CHECK(need && *need == nbytes, "{}: tensor '{}': {} {} needs {} bytes, {} given", path_,
             name, st_dtype_name(dtype), shape_string(shape), need.value_or(0), nbytes);
  Entry e;
  e.name = std::move(name);
  e.dtype = dtype;
  e.shape = std::move(shape);
  e.borrowed = data;
  add_entry(std::move(e));
}

void Writer::add_produced(std::string name, StDType dtype, std::vector<int64_t> shape,
                          Producer produce) {
  KILN_CHECK(static_cast<bool>(produce), "{}: tensor '{}': empty producer", path_, name);
  Entry e;
  e.name = std::move(name);
  e.dtype = dtype;
  e.shape = std::move(shape);
  e.produce = std::move(produce);
  add_entry(std::move(e));
}

void Writer::add(std::string name, const Tensor& t) {
  KILN_CHECK(t.device().is_cpu(), "{}: tensor '{}': {} is not in host memory", path_, name,
             t.str());
  std::vector<int64_t> shape;
  for (int i = 0; i < t.ndim(); ++i) shape.push_back(t.size(i));
  add(std::move(name), to_st_dtype(t.dtype()), std::move(shape), t.raw(), t.nbytes());
}

void Writer::add_f32(std::string name, std::vector<int64_t> shape, const std::vector<float>& v) {
  add(std::move(name), StDType::F32, std::move(shape), v.data(), v.size() * sizeof(float));
}

void Writer::add_i32(std::string name, std::vector<int64_t> shape,
                     const std::vector<int32_t>& v) {
  add(std::move(name), StDType::I32, std::move(shape), v.data(), v.size() * sizeof(int32_t));
}

std::vector<std::pair<const Writer::Entry*, std::pair<uint64_t, uint64_t>>> Writer::layout()
    const {
  std::vector<const Entry*> order;
  for (const auto& e : entries_) order.push_back(&e);
  // Larger elements first: with an 8-aligned data section every tensor is then aligned
  // to its element size, with no padding between tensors (the format allows none).
  std::stable_sort(order.begin(), order.end(), [](const Entry* a, const Entry* b) {
    return st_dtype_size(a->dtype) > st_dtype_size(b->dtype);
  });
  std::vector<std::pair<const Entry*, std::pair<uint64_t, uint64_t>>> out;
  uint64_t pos = 0;
  for (const Entry* e : order) {
    out.push_back({e, {pos, pos + e->nbytes}});
    pos += e->nbytes;
  }
  return out;
}

std::string Writer::header_json() const {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  if (!metadata_.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata_) m[k] = v;
    j[std::string(kMetadataKey)] = m;
  }
  const auto lay = layout();
  std::unordered_map<const Entry*, std::pair<uint64_t, uint64_t>> off;
  for (const auto& [e, o] : lay) off[e] = o;
  for (const auto& e : entries_) {
    const auto [b, en] = off[&e];
    j[e.name] = {{"dtype", std::string(st_dtype_name(e.dtype))},
                 {"shape", e.shape},
                 {"data_offsets", {b, en}}};
  }
  return j.dump();
}

void Writer::write() const {
  std::string header = header_json();
  // Pad with spaces so that the data section starts at a multiple of 8 bytes.
  header.append((8 - (8 + header.size()) % 8) % 8, ' ');
  KILN_CHECK(header.size() <= kMaxHeaderBytes, "{}: header of {} bytes exceeds the limit of {}",
             path_, header.size(), kMaxHeaderBytes);

  // Through the checkpoint's durable file operations (numbered for fault injection).
  namespace io = checkpoint::detail;
  const std::string tmp = io::temp_name_for(path_);
  const int fd = io::create_file(tmp, /*exclusive=*/true);
  try {
    unsigned char len_bytes[8];
    uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<unsigned char>(n >> (8 * i));
    uint64_t total = 8 + header.size();
    for (const auto& [e, off] : layout()) total += e->nbytes;
    io::FileWrite out(fd, tmp, total);  // the whole file is one file operation
    out.append(len_bytes, 8);
    out.append(header.data(), header.size());
    std::vector<std::byte> buf;
    for (const auto& [e, off] : layout()) {
      if (e->nbytes == 0) continue;
      const void* src = nullptr;
      if (e->produce) {
        buf.assign(e->nbytes, std::byte{0});
        e->produce(buf.data());
        src = buf.data();
      } else if (e->borrowed) {
        src = e->borrowed;
      } else {
        src = e->owned.data();
      }
      out.append(src, e->nbytes);
    }
    out.finish();
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  try {
    io::fsync_and_close(fd, tmp);
    io::rename_path(tmp, path_);
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  const auto slash = path_.find_last_of('/');
  io::fsync_dir(slash == std::string::npos ? std::string(".") : slash == 0 ? std::string("/") : path_.substr(0, slash));
}

}  // namespace kiln::safetensors
