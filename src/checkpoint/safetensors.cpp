// The safetensors dtypes and TensorInfo, and the helpers the reader and the writer share
// (checkpoint/safetensors_detail.h).
#include "checkpoint/safetensors.h"
#include "checkpoint/safetensors_detail.h"

#include "core/error.h"

#include <bit>
#include <limits>

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; kiln supports little-endian hosts only");

namespace kiln::safetensors {

namespace {

struct DTypeRow {
  StDType t;
  std::string_view name;
  size_t size;
};
constexpr DTypeRow kDTypes[] = {
    {StDType::BOOL, "BOOL", 1},       {StDType::U8, "U8", 1},   {StDType::I8, "I8", 1},
    {StDType::F8_E5M2, "F8_E5M2", 1}, {StDType::F8_E4M3, "F8_E4M3", 1},
    {StDType::I16, "I16", 2},         {StDType::U16, "U16", 2}, {StDType::F16, "F16", 2},
    {StDType::BF16, "BF16", 2},       {StDType::I32, "I32", 4}, {StDType::U32, "U32", 4},
    {StDType::F32, "F32", 4},         {StDType::F64, "F64", 8}, {StDType::I64, "I64", 8},
    {StDType::U64, "U64", 8},
};

const DTypeRow& row(StDType t) {
  for (const auto& r : kDTypes)
    if (r.t == t) return r;
  KILN_FAIL("safetensors: invalid dtype code {}", static_cast<int>(t));
}

}  // namespace

namespace detail {

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::optional<int64_t> checked_numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d) return std::nullopt;
    n *= d;
  }
  return n;
}

std::optional<uint64_t> checked_nbytes(const std::vector<int64_t>& shape, StDType t) {
  auto n = checked_numel(shape);
  if (!n) return std::nullopt;
  const uint64_t sz = st_dtype_size(t);
  if (static_cast<uint64_t>(*n) > std::numeric_limits<uint64_t>::max() / sz) return std::nullopt;
  return static_cast<uint64_t>(*n) * sz;
}

}  // namespace detail

// ---- dtypes ---------------------------------------------------------------------------

size_t st_dtype_size(StDType t) { return row(t).size; }
std::string_view st_dtype_name(StDType t) { return row(t).name; }

std::optional<StDType> parse_st_dtype(std::string_view name) {
  for (const auto& r : kDTypes)
    if (r.name == name) return r.t;
  return std::nullopt;
}

StDType to_st_dtype(DType t) {
  switch (t) {
    case DType::F32: return StDType::F32;
    case DType::BF16: return StDType::BF16;
    case DType::F16: return StDType::F16;
    case DType::I32: return StDType::I32;
    case DType::F64:   // device statistics only: never stored
    case DType::E4M3:  // fp8: compute operands only (train.fp8), never stored
    case DType::E5M2: break;
  }
  KILN_FAIL("safetensors: no file dtype for kiln dtype {}", static_cast<int>(t));
}

std::optional<DType> to_kiln_dtype(StDType t) {
  switch (t) {
    case StDType::F32: return DType::F32;
    case StDType::BF16: return DType::BF16;
    case StDType::F16: return DType::F16;
    case StDType::I32: return DType::I32;
    default: return std::nullopt;
  }
}

// ---- TensorInfo ----------------------------------------------------------------------

int64_t TensorInfo::numel() const { return detail::checked_numel(shape).value_or(-1); }

Shape TensorInfo::kiln_shape() const {
  KILN_CHECK(static_cast<int>(shape.size()) <= Shape::kMaxDims,
             "tensor '{}' has {} dimensions; kiln tensors have at most {}", name, shape.size(),
             Shape::kMaxDims);
  return Shape(shape.begin(), shape.end());
}

std::string TensorInfo::shape_str() const { return detail::shape_string(shape); }

}  // namespace kiln::safetensors
