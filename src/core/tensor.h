// Tensor: a contiguous, row-major N-d array of one dtype on one device.
//
// A Tensor is a cheap value type: a pointer, a shape, a dtype and a device, plus an
// optional shared reference to the Storage it lives in (absent for borrowed views, e.g.
// a parameter inside the model's flat parameter buffer). Tensors never own a stride:
// kiln's ops take contiguous inputs, which keeps every kernel simple and fast.
#pragma once

#include "core/allocator.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>

namespace kiln {

/// Up to 6 dimensions. Sizes are int64.
class Shape {
 public:
  static constexpr int kMaxDims = 6;
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  template <class It>
  Shape(It begin, It end) {
    for (; begin != end; ++begin) push_back(static_cast<int64_t>(*begin));
  }

  int ndim() const { return ndim_; }
  /// Size of dimension i; negative i counts from the end. Throws on a bad index.
  int64_t operator[](int i) const;
  int64_t numel() const;
  void push_back(int64_t d);
  bool operator==(const Shape& o) const;
  std::string str() const;  // "[4, 32, 64]"

 private:
  std::array<int64_t, kMaxDims> dims_{};
  int ndim_ = 0;
};

/// Memory owned by an Allocator and returned to it (with its accounting) on destruction.
class Storage {
 public:
  Storage(Allocator& alloc, size_t bytes, MemCategory category);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  Allocator& alloc_;
  void* ptr_;
  size_t bytes_;
  MemCategory category_;
};

class Tensor {
 public:
  Tensor() = default;

  /// Allocates a new tensor (contents uninitialised). Throws kiln::Error when out of memory.
  static Tensor empty(Allocator& alloc, const Shape& shape, DType dtype, MemCategory category);
  /// A non-owning view of memory that outlives the tensor.
  static Tensor view(void* ptr, const Shape& shape, DType dtype, Device device = Device::cpu());

  explicit operator bool() const { return ptr_ != nullptr; }
  void* raw() const { return ptr_; }
  const Shape& shape() const { return shape_; }
  int ndim() const { return shape_.ndim(); }
  int64_t size(int i) const { return shape_[i]; }
  int64_t numel() const { return shape_.numel(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }

  /// Typed pointer; checks that T matches the dtype (uint16_t for bf16/fp16).
  template <class T>
  T* data() const;

  /// Same memory, new shape with the same number of elements.
  Tensor reshape(const Shape& shape) const;
  /// Rows [begin, end) of the first dimension (a view sharing the storage).
  Tensor slice_rows(int64_t begin, int64_t end) const;
  /// A flat view of elements [offset, offset + shape.numel()) reshaped to `shape`.
  Tensor view_at(int64_t offset, const Shape& shape) const;

  std::string str() const;  // "fp32[4, 32, 64]@cpu"

 private:
  std::shared_ptr<Storage> storage_;
  void* ptr_ = nullptr;
  Shape shape_;
  DType dtype_ = DType::F32;
  Device device_;
};

template <class T>
T* Tensor::data() const {
  if constexpr (std::is_same_v<T, float>) {
    KILN_CHECK(dtype_ == DType::F32, "tensor {} accessed as fp32", str());
  } else if constexpr (std::is_same_v<T, int32_t>) {
    KILN_CHECK(dtype_ == DType::I32, "tensor {} accessed as int32", str());
  } else if constexpr (std::is_same_v<T, double>) {
    KILN_CHECK(dtype_ == DType::F64, "tensor {} accessed as fp64", str());
  } else if constexpr (std::is_same_v<T, uint16_t>) {
    KILN_CHECK(dtype_ == DType::BF16 || dtype_ == DType::F16, "tensor {} accessed as 16-bit", str());
  }
  return static_cast<T*>(ptr_);
}

/// Throws kiln::Error naming `what` unless t has exactly this shape.
void check_shape(const Tensor& t, const Shape& expected, const char* what);
/// Throws kiln::Error naming `what` unless t has this dtype.
void check_dtype(const Tensor& t, DType expected, const char* what);

}  // namespace kiln
