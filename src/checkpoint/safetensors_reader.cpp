// safetensors::Reader: the header parsed and checked as the reference implementation
// does, tensors read with positioned reads (checkpoint/safetensors.h).
#include "checkpoint/safetensors.h"
#include "checkpoint/safetensors_detail.h"

#include "checkpoint/file_util.h"
#include "core/error.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <set>
#include <utility>

namespace kiln::safetensors {

using checkpoint::detail::errno_text;
using detail::checked_nbytes;

namespace {

bool is_float(StDType t) {
  return t == StDType::F32 || t == StDType::F16 || t == StDType::BF16 || t == StDType::F64;
}

using json = nlohmann::json;

// Parses the header, rejecting duplicate keys in any object (nlohmann keeps the last).
json parse_header(const std::string& text, const std::string& path) {
  std::vector<std::set<std::string>> seen;
  std::string duplicate;
  auto cb = [&](int /*depth*/, json::parse_event_t ev, json& parsed) {
    switch (ev) {
      case json::parse_event_t::object_start: seen.emplace_back(); break;
      case json::parse_event_t::object_end:
        if (!seen.empty()) seen.pop_back();
        break;
      case json::parse_event_t::key:
        if (!seen.empty() && parsed.is_string()) {
          const auto& k = parsed.get_ref<const std::string&>();
          if (!seen.back().insert(k).second && duplicate.empty()) duplicate = k;
        }
        break;
      default: break;
    }
    return true;
  };
  json j;
  try {
    j = json::parse(text, cb, /*allow_exceptions=*/true);
  } catch (const json::exception& e) {
    KILN_FAIL("{}: safetensors header is not valid JSON: {}", path, e.what());
  }
  KILN_CHECK(duplicate.empty(), "{}: safetensors header has the key '{}' twice", path, duplicate);
  KILN_CHECK(j.is_object(), "{}: safetensors header is not a JSON object", path);
  return j;
}

uint64_t json_u64(const json& v, bool* ok) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return static_cast<uint64_t>(v.get<int64_t>());
  *ok = false;
  return 0;
}

}  // namespace

Reader::Reader(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  KILN_CHECK(fd_ >= 0, "{}: cannot open safetensors file: {}", path_, errno_text());
  try {
    struct stat st {};
    KILN_CHECK(::fstat(fd_, &st) == 0, "{}: cannot stat: {}", path_, errno_text());
    KILN_CHECK(S_ISREG(st.st_mode), "{}: not a regular file", path_);
    file_size_ = static_cast<uint64_t>(st.st_size);
    KILN_CHECK(file_size_ >= 8,
               "{}: not a safetensors file: {} bytes, too short for the 8-byte header length",
               path_, file_size_);

    unsigned char len_bytes[8];
    read_at(0, len_bytes, 8, "header length");
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
    KILN_CHECK(n <= kMaxHeaderBytes,
               "{}: safetensors header length {} exceeds the limit of {} bytes (corrupt file?)",
               path_, n, kMaxHeaderBytes);
    KILN_CHECK(n <= file_size_ - 8,
               "{}: safetensors header length {} runs past the end of the {}-byte file "
               "(truncated file?)",
               path_, n, file_size_);
    KILN_CHECK(n >= 2, "{}: safetensors header length {} is too short for a JSON object", path_,
               n);
    data_offset_ = 8 + n;

    header_text_.resize(n);
    read_at(8, header_text_.data(), n, "header");
    KILN_CHECK(header_text_[0] == '{', "{}: safetensors header does not start with '{{'", path_);

    const json j = parse_header(header_text_, path_);
    const uint64_t data_size = file_size_ - data_offset_;
    for (auto it = j.begin(); it != j.end(); ++it) {
      const std::string& name = it.key();
      const json& v = it.value();
      if (name == kMetadataKey) {
        KILN_CHECK(v.is_object() || v.is_null(), "{}: '__metadata__' is not a JSON object",
                   path_);
        if (v.is_null()) continue;
        for (auto m = v.begin(); m != v.end(); ++m) {
          KILN_CHECK(m.value().is_string(), "{}: metadata value of '{}' is not a string", path_,
                     m.key());
          metadata_[m.key()] = m.value().get<std::string>();
        }
        continue;
      }
      KILN_CHECK(v.is_object(), "{}: tensor '{}': header entry is not a JSON object", path_, name);
      KILN_CHECK(v.contains("dtype") && v.contains("shape") && v.contains("data_offsets"),
                 "{}: tensor '{}': header entry lacks dtype, shape or data_offsets", path_, name);
      TensorInfo info;
      info.name = name;
      const json& jd = v["dtype"];
      KILN_CHECK(jd.is_string(), "{}: tensor '{}': dtype is not a string", path_, name);
      const auto dt = parse_st_dtype(jd.get_ref<const std::string&>());
      KILN_CHECK(dt.has_value(), "{}: tensor '{}': unknown dtype '{}'", path_, name,
                 jd.get<std::string>());
      info.dtype = *dt;
      const json& js = v["shape"];
      KILN_CHECK(js.is_array(), "{}: tensor '{}': shape is not an array", path_, name);
      for (const json& d : js) {
        bool ok = true;
        const uint64_t x = json_u64(d, &ok);
        KILN_CHECK(ok && x <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
                   "{}: tensor '{}': shape {} has an entry that is not a non-negative integer",
                   path_, name, js.dump());
        info.shape.push_back(static_cast<int64_t>(x));
      }
      const json& jo = v["data_offsets"];
      KILN_CHECK(jo.is_array() && jo.size() == 2,
                 "{}: tensor '{}': data_offsets is not an array of two integers", path_, name);
      bool ok = true;
      info.begin = json_u64(jo[0], &ok);
      info.end = json_u64(jo[1], &ok);
      KILN_CHECK(ok, "{}: tensor '{}': data_offsets {} are not non-negative integers", path_, name,
                 jo.dump());
      KILN_CHECK(info.begin <= info.end, "{}: tensor '{}': data_offsets [{}, {}] are reversed",
                 path_, name, info.begin, info.end);
      KILN_CHECK(info.end <= data_size,
                 "{}: tensor '{}': data_offsets [{}, {}] run past the end of the data section "
                 "({} bytes; truncated file?)",
                 path_, name, info.begin, info.end, data_size);
      const auto nbytes = checked_nbytes(info.shape, info.dtype);
      KILN_CHECK(nbytes.has_value(), "{}: tensor '{}': shape {} overflows", path_, name,
                 info.shape_str());
      KILN_CHECK(*nbytes == info.end - info.begin,
                 "{}: tensor '{}': {} {} needs {} bytes but data_offsets [{}, {}] hold {}", path_,
                 name, st_dtype_name(info.dtype), info.shape_str(), *nbytes, info.begin, info.end,
                 info.end - info.begin);
      tensors_.push_back(std::move(info));
    }

    std::stable_sort(tensors_.begin(), tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    uint64_t pos = 0;
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const TensorInfo& t = tensors_[i];
      KILN_CHECK(t.begin >= pos, "{}: tensor '{}' (bytes [{}, {}]) overlaps tensor '{}'", path_,
                 t.name, t.begin, t.end, tensors_[i - 1].name);
      KILN_CHECK(t.begin == pos,
                 "{}: tensor '{}' starts at byte {} of the data section, leaving a hole after "
                 "byte {}",
                 path_, t.name, t.begin, pos);
      pos = t.end;
      index_.emplace(t.name, i);
    }
    KILN_CHECK(pos == data_size,
               "{}: the data section has {} bytes but its tensors end at byte {} (trailing "
               "bytes or corrupt offsets)",
               path_, data_size, pos);
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

Reader::~Reader() {
  if (fd_ >= 0) ::close(fd_);
}

Reader::Reader(Reader&& o) noexcept
    : path_(std::move(o.path_)),
      fd_(std::exchange(o.fd_, -1)),
      file_size_(o.file_size_),
      data_offset_(o.data_offset_),
      header_text_(std::move(o.header_text_)),
      tensors_(std::move(o.tensors_)),
      index_(std::move(o.index_)),
      metadata_(std::move(o.metadata_)) {}

Reader& Reader::operator=(Reader&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(o.path_);
    fd_ = std::exchange(o.fd_, -1);
    file_size_ = o.file_size_;
    data_offset_ = o.data_offset_;
    header_text_ = std::move(o.header_text_);
    tensors_ = std::move(o.tensors_);
    index_ = std::move(o.index_);
    metadata_ = std::move(o.metadata_);
  }
  return *this;
}

void Reader::read_at(uint64_t offset, void* dst, size_t bytes, std::string_view what) const {
  auto* p = static_cast<char*>(dst);
  while (bytes > 0) {
    const size_t chunk = std::min<size_t>(bytes, size_t{1} << 30);
    const ssize_t r = ::pread(fd_, p, chunk, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    KILN_CHECK(r >= 0, "{}: reading {}: {}", path_, what, errno_text());
    KILN_CHECK(r > 0, "{}: reading {}: unexpected end of file at byte {} (truncated file?)", path_,
               what, offset);
    p += r;
    offset += static_cast<uint64_t>(r);
    bytes -= static_cast<size_t>(r);
  }
}

std::vector<std::string> Reader::names() const {
  std::vector<std::string> v;
  v.reserve(tensors_.size());
  for (const auto& t : tensors_) v.push_back(t.name);
  return v;
}

bool Reader::contains(std::string_view name) const {
  return index_.find(std::string(name)) != index_.end();
}

const TensorInfo& Reader::info(std::string_view name) const {
  auto it = index_.find(std::string(name));
  KILN_CHECK(it != index_.end(), "{}: no tensor '{}' in this safetensors file", path_, name);
  return tensors_[it->second];
}

const std::string& Reader::metadata(std::string_view key) const {
  auto it = metadata_.find(std::string(key));
  KILN_CHECK(it != metadata_.end(), "{}: no metadata key '{}'", path_, key);
  return it->second;
}

void Reader::read_raw(std::string_view name, void* dst, size_t dst_bytes) const {
  const TensorInfo& t = info(name);
  KILN_CHECK(dst_bytes == t.nbytes(), "{}: tensor '{}' has {} bytes; destination has {}", path_,
             name, t.nbytes(), dst_bytes);
  if (dst_bytes == 0) return;
  read_at(data_offset_ + t.begin, dst, dst_bytes, fmt::format("tensor '{}'", name));
}

std::vector<std::byte> Reader::read_bytes(std::string_view name) const {
  const TensorInfo& t = info(name);
  std::vector<std::byte> v(t.nbytes());
  read_raw(name, v.data(), v.size());
  return v;
}

void Reader::read_into(std::string_view name, const Tensor& dst, bool allow_reshape) const {
  const TensorInfo& t = info(name);
  KILN_CHECK(dst.device().is_cpu(), "{}: tensor '{}': destination {} is not in host memory",
             path_, name, dst.str());
  if (allow_reshape) {
    KILN_CHECK(dst.numel() == t.numel(),
               "{}: tensor '{}': {} elements in the file, {} in the destination {}", path_, name,
               t.numel(), dst.numel(), dst.str());
  } else {
    KILN_CHECK(static_cast<int>(t.shape.size()) <= Shape::kMaxDims && dst.shape() == t.kiln_shape(),
               "{}: tensor '{}': shape {} in the file, {} expected", path_, name, t.shape_str(),
               dst.shape().str());
  }
  const size_t n = static_cast<size_t>(t.numel());
  const auto kt = to_kiln_dtype(t.dtype);
  if (kt && *kt == dst.dtype()) {
    read_raw(name, dst.raw(), dst.nbytes());
    return;
  }
  const bool dst_float = dst.dtype() != DType::I32;
  KILN_CHECK(dst_float && is_float(t.dtype),
             "{}: tensor '{}': cannot read {} into a {} tensor", path_, name,
             st_dtype_name(t.dtype), dtype_name(dst.dtype()));
  if (t.dtype == StDType::F64) {
    std::vector<double> tmp(n);
    read_raw(name, tmp.data(), t.nbytes());
    std::vector<float> f(n);
    for (size_t i = 0; i < n; ++i) f[i] = static_cast<float>(tmp[i]);
    convert(f.data(), DType::F32, dst.raw(), dst.dtype(), n);
    return;
  }
  std::vector<std::byte> tmp(t.nbytes());
  read_raw(name, tmp.data(), tmp.size());
  convert(tmp.data(), *kt, dst.raw(), dst.dtype(), n);
}

Tensor Reader::read(std::string_view name, std::optional<DType> as, Allocator& alloc,
                    MemCategory category) const {
  const TensorInfo& t = info(name);
  DType dt;
  if (as) {
    dt = *as;
  } else {
    const auto kt = to_kiln_dtype(t.dtype);
    KILN_CHECK(kt.has_value(), "{}: tensor '{}' has dtype {}, which kiln tensors do not have",
               path_, name, st_dtype_name(t.dtype));
    dt = *kt;
  }
  KILN_CHECK(alloc.device().is_cpu(), "{}: tensor '{}': Reader::read needs a host allocator",
             path_, name);
  Tensor out = Tensor::empty(alloc, t.kiln_shape(), dt, category);
  read_into(name, out);
  return out;
}

namespace {
template <class T>
void widen(const std::vector<std::byte>& raw, size_t n, auto&& sink) {
  for (size_t i = 0; i < n; ++i) {
    T x;
    std::memcpy(&x, raw.data() + i * sizeof(T), sizeof(T));
    sink(i, x);
  }
}
}  // namespace

std::vector<float> Reader::read_f32(std::string_view name) const {
  const TensorInfo& t = info(name);
  const size_t n = static_cast<size_t>(t.numel());
  std::vector<float> out(n);
  if (t.dtype == StDType::F32) {
    read_raw(name, out.data(), t.nbytes());
    return out;
  }
  const auto raw = read_bytes(name);
  auto put = [&](size_t i, auto x) { out[i] = static_cast<float>(x); };
  switch (t.dtype) {
    case StDType::F16:
    case StDType::BF16: convert(raw.data(), *to_kiln_dtype(t.dtype), out.data(), DType::F32, n); break;
    case StDType::F64: widen<double>(raw, n, put); break;
    case StDType::BOOL:
    case StDType::U8: widen<uint8_t>(raw, n, put); break;
    case StDType::I8: widen<int8_t>(raw, n, put); break;
    case StDType::I16: widen<int16_t>(raw, n, put); break;
    case StDType::U16: widen<uint16_t>(raw, n, put); break;
    case StDType::I32: widen<int32_t>(raw, n, put); break;
    case StDType::U32: widen<uint32_t>(raw, n, put); break;
    case StDType::I64: widen<int64_t>(raw, n, put); break;
    case StDType::U64: widen<uint64_t>(raw, n, put); break;
    default:
      KILN_FAIL("{}: tensor '{}': cannot convert {} to fp32", path_, name, st_dtype_name(t.dtype));
  }
  return out;
}

void Reader::read_f32_range(std::string_view name, int64_t begin, int64_t end, float* dst) const {
  const TensorInfo& t = info(name);
  KILN_CHECK(0 <= begin && begin <= end && end <= t.numel(),
             "{}: tensor '{}': range [{}, {}) outside its {} elements", path_, name, begin, end,
             t.numel());
  KILN_CHECK(is_float(t.dtype), "{}: tensor '{}' has dtype {}, not F32, F16, BF16 or F64", path_, name,
             st_dtype_name(t.dtype));
  const size_t n = static_cast<size_t>(end - begin), es = st_dtype_size(t.dtype);
  if (n == 0) return;
  const uint64_t at = data_offset_ + t.begin + static_cast<uint64_t>(begin) * es;
  const std::string what = fmt::format("tensor '{}'", name);
  if (t.dtype == StDType::F32) {
    read_at(at, dst, n * es, what);
    return;
  }
  std::vector<std::byte> raw(n * es);
  read_at(at, raw.data(), raw.size(), what);
  if (t.dtype == StDType::F64) {
    widen<double>(raw, n, [&](size_t i, double x) { dst[i] = static_cast<float>(x); });
  } else {
    convert(raw.data(), *to_kiln_dtype(t.dtype), dst, DType::F32, n);
  }
}

std::vector<int32_t> Reader::read_i32(std::string_view name) const {
  const TensorInfo& t = info(name);
  const size_t n = static_cast<size_t>(t.numel());
  std::vector<int32_t> out(n);
  if (t.dtype == StDType::I32) {
    read_raw(name, out.data(), t.nbytes());
    return out;
  }
  const auto raw = read_bytes(name);
  auto put = [&](size_t i, auto x) {
    using X = decltype(x);
    bool fits;
    if constexpr (std::is_signed_v<X>) {
      fits = x >= std::numeric_limits<int32_t>::min() && x <= std::numeric_limits<int32_t>::max();
    } else {
      fits = static_cast<uint64_t>(x) <= static_cast<uint64_t>(std::numeric_limits<int32_t>::max());
    }
    KILN_CHECK(fits, "{}: tensor '{}': element {} = {} does not fit in int32", path_, name, i,
               x);
    out[i] = static_cast<int32_t>(x);
  };
  switch (t.dtype) {
    case StDType::BOOL:
    case StDType::U8: widen<uint8_t>(raw, n, put); break;
    case StDType::I8: widen<int8_t>(raw, n, put); break;
    case StDType::I16: widen<int16_t>(raw, n, put); break;
    case StDType::U16: widen<uint16_t>(raw, n, put); break;
    case StDType::U32: widen<uint32_t>(raw, n, put); break;
    case StDType::I64: widen<int64_t>(raw, n, put); break;
    case StDType::U64: widen<uint64_t>(raw, n, put); break;
    default:
      KILN_FAIL("{}: tensor '{}': cannot read {} as int32", path_, name, st_dtype_name(t.dtype));
  }
  return out;
}

}  // namespace kiln::safetensors
