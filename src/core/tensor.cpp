#include "core/tensor.h"

#include <fmt/format.h>

namespace kiln {

Shape::Shape(std::initializer_list<int64_t> dims) {
  for (int64_t d : dims) push_back(d);
}

int64_t Shape::operator[](int i) const {
  const int j = i < 0 ? i + ndim_ : i;
  KILN_CHECK(j >= 0 && j < ndim_, "dimension {} out of range for shape {}", i, str());
  return dims_[j];
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim_; ++i) n *= dims_[i];
  return n;
}

void Shape::push_back(int64_t d) {
  KILN_CHECK(ndim_ < kMaxDims, "tensor rank above {} is not supported", kMaxDims);
  KILN_CHECK(d >= 0, "negative dimension {}", d);
  dims_[ndim_++] = d;
}

bool Shape::operator==(const Shape& o) const {
  if (ndim_ != o.ndim_) return false;
  for (int i = 0; i < ndim_; ++i)
    if (dims_[i] != o.dims_[i]) return false;
  return true;
}

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < ndim_; ++i) s += (i ? ", " : "") + std::to_string(dims_[i]);
  return s + "]";
}

Storage::Storage(Allocator& alloc, size_t bytes, MemCategory category)
    : alloc_(alloc), ptr_(alloc.allocate(bytes, category)), bytes_(bytes), category_(category) {}

Storage::~Storage() { alloc_.deallocate(ptr_, bytes_, category_); }

Tensor Tensor::empty(Allocator& alloc, const Shape& shape, DType dtype, MemCategory category) {
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.device_ = alloc.device();
  t.storage_ = std::make_shared<Storage>(alloc, t.nbytes(), category);
  t.ptr_ = t.storage_->data();
  return t;
}

Tensor Tensor::view(void* ptr, const Shape& shape, DType dtype, Device device) {
  Tensor t;
  t.ptr_ = ptr;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.device_ = device;
  return t;
}

Tensor Tensor::reshape(const Shape& shape) const {
  KILN_CHECK(shape.numel() == numel(), "cannot reshape {} to {}", str(), shape.str());
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::slice_rows(int64_t begin, int64_t end) const {
  KILN_CHECK(ndim() >= 1 && begin >= 0 && begin <= end && end <= size(0),
             "rows [{}, {}) out of range for {}", begin, end, str());
  Shape s;
  s.push_back(end - begin);
  for (int i = 1; i < ndim(); ++i) s.push_back(size(i));
  const int64_t row = ndim() > 1 ? numel() / std::max<int64_t>(size(0), 1) : 1;
  return view_at(begin * row, s);
}

Tensor Tensor::view_at(int64_t offset, const Shape& shape) const {
  KILN_CHECK(offset >= 0 && offset + shape.numel() <= numel(), "view [{}, +{}) out of range for {}",
             offset, shape.numel(), str());
  Tensor t = *this;
  t.shape_ = shape;
  t.ptr_ = static_cast<char*>(ptr_) + offset * static_cast<int64_t>(dtype_size(dtype_));
  return t;
}

std::string Tensor::str() const {
  return fmt::format("{}{}@{}", dtype_name(dtype_), shape_.str(), device_.str());
}

void check_shape(const Tensor& t, const Shape& expected, const char* what) {
  KILN_CHECK(t.shape() == expected, "{}: expected shape {}, got {}", what, expected.str(),
             t.shape().str());
}

void check_dtype(const Tensor& t, DType expected, const char* what) {
  KILN_CHECK(t.dtype() == expected, "{}: expected dtype {}, got {}", what, dtype_name(expected),
             dtype_name(t.dtype()));
}

}  // namespace kiln
