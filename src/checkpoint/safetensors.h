// Reading and writing Hugging Face's safetensors format.
//
// Layout of a file (https://github.com/huggingface/safetensors, "Format"):
//   8 bytes   N, the header length, unsigned 64-bit little-endian
//   N bytes   a UTF-8 JSON object: {"<tensor name>": {"dtype": "F32", "shape": [2, 3],
//             "data_offsets": [begin, end]}, ..., "__metadata__": {"key": "value"}}
//             (the metadata object is optional and maps strings to strings); the JSON
//             may be padded at its end with spaces (0x20)
//   the rest  the data section: each tensor's raw little-endian bytes, row-major, at
//             [begin, end) relative to the start of the data section
//
// The reader accepts exactly what the reference implementation accepts: a header that
// starts with '{' and is at most 100 MB, no duplicate names, known dtypes, offsets with
// end - begin = numel * dtype size, and tensors that tile the data section with no
// overlap and no hole (so the data section ends where the last tensor ends). Every
// error is a kiln::Error naming the file and, where one is at fault, the tensor.
//
// The writer places the data section at an 8-byte-aligned offset (the header is padded
// with spaces), lays tensors out by decreasing element size so that every tensor is
// naturally aligned, writes to a temporary file in the same directory, fsyncs it and
// renames it over the destination (then fsyncs the directory): a crash leaves either the
// old file or the new one, never a torn one.
//
// Tensors are read with positioned reads, one tensor at a time, so a file much larger
// than memory can be read piecewise; the writer can likewise take tensors as callbacks
// that produce their bytes on demand (e.g. a copy from a GPU) while it streams the file.
#pragma once

#include "core/allocator.h"
#include "core/dtype.h"
#include "core/tensor.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kiln::safetensors {

/// Every dtype of the format. Names as in the file: "BOOL", "U8", "I8", "F8_E5M2",
/// "F8_E4M3", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "F64", "I64", "U64".
enum class StDType : uint8_t {
  BOOL, U8, I8, F8_E5M2, F8_E4M3, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64,
};

/// Bytes per element (BOOL is one byte).
size_t st_dtype_size(StDType t);
/// The name used in the file ("F32").
std::string_view st_dtype_name(StDType t);
/// The dtype of a file name ("F32"); nullopt for an unknown name.
std::optional<StDType> parse_st_dtype(std::string_view name);
/// kiln dtype -> file dtype (F32, BF16, F16, I32).
StDType to_st_dtype(DType t);
/// File dtype -> kiln dtype, nullopt for dtypes kiln's tensors do not have.
std::optional<DType> to_kiln_dtype(StDType t);

/// Maximum header length accepted (as the reference implementation: 100,000,000 bytes).
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;
/// Name of the optional metadata entry of the header.
inline constexpr std::string_view kMetadataKey = "__metadata__";

/// One tensor of a file.
struct TensorInfo {
  std::string name;
  StDType dtype = StDType::F32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // data_offsets, relative to the data section
  uint64_t end = 0;

  int64_t numel() const;
  uint64_t nbytes() const { return end - begin; }
  /// The shape as a kiln Shape; throws kiln::Error above Shape::kMaxDims dimensions.
  Shape kiln_shape() const;
  std::string shape_str() const;  // "[4, 32]"
};

/// A safetensors file opened for reading. The header is read and validated by the
/// constructor; tensor data is read on request. Reads are const and thread-safe.
class Reader {
 public:
  /// Opens and validates `path`. Throws kiln::Error naming the file (and the tensor) on
  /// any problem: missing file, short file, bad header length, bad JSON, bad entries,
  /// offsets out of range, overlapping or leaving holes.
  explicit Reader(std::string path);
  ~Reader();
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;
  Reader(Reader&&) noexcept;
  Reader& operator=(Reader&&) noexcept;

  const std::string& path() const { return path_; }
  /// Tensors in the order of their data offsets.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  /// Tensor names in the order of their data offsets.
  std::vector<std::string> names() const;
  bool contains(std::string_view name) const;
  /// The entry of `name`; throws kiln::Error naming the file and the tensor when absent.
  const TensorInfo& info(std::string_view name) const;
  /// The "__metadata__" map (empty when the file has none).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// A metadata value; throws kiln::Error naming the file and key when absent.
  const std::string& metadata(std::string_view key) const;
  /// The header JSON text exactly as stored (padding included).
  const std::string& header_text() const { return header_text_; }
  /// Offset of the data section in the file (8 + header length).
  uint64_t data_offset() const { return data_offset_; }
  /// Size of the whole file in bytes.
  uint64_t file_size() const { return file_size_; }

  /// Reads the raw bytes of `name` into dst, which has room for `dst_bytes` bytes;
  /// dst_bytes must equal the tensor's byte size.
  void read_raw(std::string_view name, void* dst, size_t dst_bytes) const;
  /// The raw bytes of `name`.
  std::vector<std::byte> read_bytes(std::string_view name) const;
  /// Reads `name` into a host tensor `dst` of the same number of elements (its shape
  /// must equal the file's unless allow_reshape), converting between floating dtypes
  /// (F32, F16, BF16, F64 in the file; F32, F16, BF16 in dst). I32 reads into I32 only.
  void read_into(std::string_view name, const Tensor& dst, bool allow_reshape = false) const;
  /// A new host tensor holding `name` in its own dtype (F32, BF16, F16 or I32), or
  /// converted to `as` when given (floating dtypes only, as read_into).
  Tensor read(std::string_view name, std::optional<DType> as = std::nullopt,
              Allocator& alloc = host_allocator(),
              MemCategory category = MemCategory::Temporaries) const;
  /// `name` converted to fp32: any floating dtype (F8 excluded) or integer dtype whose
  /// values fit (integers are converted exactly below 2^24).
  std::vector<float> read_f32(std::string_view name) const;
  /// Elements [begin, end) of `name` (row-major, flat) converted to fp32 into `dst`
  /// (end - begin floats): F32, F16, BF16 or F64 in the file. Reads only those bytes.
  /// Throws kiln::Error naming the file and tensor for another dtype or a bad range.
  void read_f32_range(std::string_view name, int64_t begin, int64_t end, float* dst) const;
  /// `name` as int32: I32, or I64/I16/I8/U8/U16/U32 whose values fit in int32.
  std::vector<int32_t> read_i32(std::string_view name) const;

 private:
  void read_at(uint64_t offset, void* dst, size_t bytes, std::string_view what) const;

  std::string path_;
  int fd_ = -1;
  uint64_t file_size_ = 0;
  uint64_t data_offset_ = 0;
  std::string header_text_;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

/// Builds a safetensors file and writes it atomically with write().
class Writer {
 public:
  /// Produces a tensor's bytes into `dst` (exactly the tensor's byte size) when the
  /// writer streams it out.
  using Producer = std::function<void(void* dst)>;

  explicit Writer(std::string path);

  const std::string& path() const { return path_; }
  /// Adds (or replaces) a metadata entry.
  void set_metadata(std::string key, std::string value);
  /// Adds a tensor, copying `nbytes` = numel * dtype size bytes from `data` now.
  void add(std::string name, StDType dtype, std::vector<int64_t> shape, const void* data,
           size_t nbytes);
  /// Adds a tensor whose bytes the caller keeps alive and unchanged until write().
  void add_borrowed(std::string name, StDType dtype, std::vector<int64_t> shape,
                    const void* data, size_t nbytes);
  /// Adds a tensor whose bytes `produce` writes when the file is written.
  void add_produced(std::string name, StDType dtype, std::vector<int64_t> shape,
                    Producer produce);
  /// Adds a host tensor (copied now), in its own dtype.
  void add(std::string name, const Tensor& host_tensor);
  /// Convenience: a float vector as F32 of `shape` (numel must match).
  void add_f32(std::string name, std::vector<int64_t> shape, const std::vector<float>& values);
  void add_i32(std::string name, std::vector<int64_t> shape, const std::vector<int32_t>& values);

  /// Number of tensors added.
  size_t size() const { return entries_.size(); }
  /// The header JSON this writer will write (unpadded), for inspection and tests.
  std::string header_json() const;
  /// Writes the file: temporary file in the same directory, fsync, rename, fsync of the
  /// directory. Throws kiln::Error naming the file; the temporary file is removed then.
  void write() const;

 private:
  struct Entry {
    std::string name;
    StDType dtype = StDType::F32;
    std::vector<int64_t> shape;
    uint64_t nbytes = 0;
    std::vector<std::byte> owned;
    const void* borrowed = nullptr;
    Producer produce;
  };
  void add_entry(Entry e);
  /// Entries in data order, with their [begin, end) offsets.
  std::vector<std::pair<const Entry*, std::pair<uint64_t, uint64_t>>> layout() const;

  std::string path_;
  std::vector<Entry> entries_;
  std::unordered_map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace kiln::safetensors
