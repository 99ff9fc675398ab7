// Helpers shared by the checkpoint's translation units (internal to kiln_checkpoint):
// box arithmetic and checks (slices.cpp), names and the manifest (manifest.cpp).
#pragma once

#include "checkpoint/checkpoint.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace kiln::checkpoint::internal {

/// The sizes of a shape as a vector.
std::vector<int64_t> dims_of(const Shape& s);
/// "[1, 2, 3]".
std::string vec_str(const std::vector<int64_t>& v);
/// "[0:4, 2:3]".
std::string box_str(const Box& b);
/// Row-major strides of `dims` (in elements).
std::vector<int64_t> strides_of(const std::vector<int64_t>& dims);
/// Throws kiln::Error ("<what>: slice ... lies outside the shape ...") unless `box` is a
/// non-empty box inside `dims`.
void check_box_in_shape(const std::vector<int64_t>& dims, const Box& box, const std::string& what);
/// Slices of one tensor must lie in its shape, not overlap and cover it exactly; throws
/// kiln::Error naming `what` and, through `label(i)`, the file or rank of slice i.
void validate_slices(const std::string& what, const std::vector<int64_t>& dims,
                     const std::vector<const Box*>& boxes,
                     const std::function<std::string(size_t)>& label);
/// The offset/extent of a manifest or part-file slice entry.
Box box_from_json(const nlohmann::json& slice, const std::string& what);
/// A manifest "shape" array (at most Shape::kMaxDims non-negative sizes).
std::vector<int64_t> shape_from_json(const nlohmann::json& j, const std::string& what);

/// Size of a regular file; throws "<path>: missing<what>" / "not a regular file<what>".
uint64_t file_size_or_fail(const std::filesystem::path& p, const std::string& what);
/// A relative path of plain components: no empty, ".", ".." or hidden component.
bool valid_relative_path(const std::string& n);
/// The first component of a relative path.
std::string top_component(const std::string& n);
/// A valid extra-file name: a plain relative path, not manifest.json, not rank_*.
bool valid_extra_name(const std::string& n);
/// `dir`'s sibling named `tag` + its name (".tmp_step_00000010" for tag ".tmp_").
std::filesystem::path tmp_sibling(const std::filesystem::path& dir, const std::string& tag);

/// Adds the manifest's own checksum ("manifest_crc32", the crc32 of the compact JSON of
/// every other key) and returns the text to write.
std::string seal_manifest(nlohmann::json manifest);
/// Reads and checks `dir`/manifest.json: it exists and parses, format and version, its
/// own checksum (version 2; version 1 has none), the required keys. Throws kiln::Error
/// naming the file.
nlohmann::json load_manifest(const std::filesystem::path& dir);

}  // namespace kiln::checkpoint::internal
