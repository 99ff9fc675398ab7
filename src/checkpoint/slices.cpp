// Boxes: flat ranges as N-d boxes, and the checks that a tensor's slices tile it.
#include "checkpoint/internal.h"

#include "core/error.h"
#include "core/json_util.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

namespace kiln::checkpoint {

using nlohmann::json;

// Boxes and names

int64_t Box::numel() const {
  int64_t n = 1;
  for (int64_t e : extent) n *= e;
  return n;
}

namespace internal {

std::vector<int64_t> dims_of(const Shape& s) {
  std::vector<int64_t> d(static_cast<size_t>(s.ndim()));
  for (int i = 0; i < s.ndim(); ++i) d[static_cast<size_t>(i)] = s[i];
  return d;
}

namespace {

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

bool boxes_overlap(const Box& a, const Box& b) {
  for (size_t d = 0; d < a.offset.size(); ++d) {
    if (a.offset[d] >= b.offset[d] + b.extent[d] || b.offset[d] >= a.offset[d] + a.extent[d])
      return false;
  }
  return true;
}

}  // namespace

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

void check_box_in_shape(const std::vector<int64_t>& dims, const Box& box, const std::string& what) {
  KILN_CHECK(box.offset.size() == dims.size() && box.extent.size() == dims.size(),
             "{}: slice has {} offsets and {} extents for a tensor of {} dimensions", what,
             box.offset.size(), box.extent.size(), dims.size());
  for (size_t d = 0; d < dims.size(); ++d) {
    KILN_CHECK(box.extent[d] > 0 && box.offset[d] >= 0 && box.offset[d] + box.extent[d] <= dims[d],
               "{}: slice {} lies outside the shape {}", what, box_str(box), vec_str(dims));
  }
}

void validate_slices(const std::string& what, const std::vector<int64_t>& dims,
                     const std::vector<const Box*>& boxes,
                     const std::function<std::string(size_t)>& label) {
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
  b.offset = json_integers(slice["offset"], what, "offset");
  b.extent = json_integers(slice["extent"], what, "extent");
  return b;
}

std::vector<int64_t> shape_from_json(const json& j, const std::string& what) {
  KILN_CHECK(j.is_array() && j.size() <= static_cast<size_t>(Shape::kMaxDims),
             "{}: bad shape (an array of at most {} sizes expected)", what, Shape::kMaxDims);
  std::vector<int64_t> dims = json_integers(j, what, "shape");
  for (int64_t d : dims) KILN_CHECK(d >= 0, "{}: negative size in shape {}", what, vec_str(dims));
  // The element count must not wrap (2^40 x 2^40 would count 0 elements).
  int64_t numel = 1;
  for (int64_t d : dims) {
    KILN_CHECK(d == 0 || numel <= (int64_t{1} << 62) / d, "{}: shape {} has more than 2^62 elements",
               what, vec_str(dims));
    numel *= d;
  }
  return dims;
}

}  // namespace internal

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
  internal::decompose(internal::dims_of(shape), 0, prefix, flat_begin, flat_end, out);
  return out;
}

}  // namespace kiln::checkpoint
