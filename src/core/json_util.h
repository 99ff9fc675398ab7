// Integers out of JSON from outside (manifests, meta.json): nlohmann's get<int64_t>()
// converts a float such as 2e119 by an unchecked cast (undefined behaviour) and a string
// by throwing its own type_error, so every integer read from a file goes through here
// and comes back in range or as a one-line kiln::Error naming the file and key.
// Header-only: include it only where nlohmann/json is already linked.
#pragma once

#include "core/error.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string_view>
#include <vector>

namespace kiln {

/// v as an integer in [lo, hi]; throws kiln::Error "<where>: "<key>" ..." otherwise.
inline int64_t json_integer(const nlohmann::json& v, std::string_view where, std::string_view key,
                            int64_t lo = INT64_MIN, int64_t hi = INT64_MAX) {
  KILN_CHECK(v.is_number_integer(), "{}: \"{}\" must be an integer, got {}", where, key, v.dump());
  const bool huge = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{INT64_MAX};
  const int64_t x = huge ? INT64_MAX : v.get<int64_t>();
  KILN_CHECK(!huge && x >= lo && x <= hi, "{}: \"{}\" = {} is out of range [{}, {}]", where, key,
             v.dump(), lo, hi);
  return x;
}

/// obj[key] as an integer in [lo, hi]; throws kiln::Error when obj has no such key.
inline int64_t json_integer_field(const nlohmann::json& obj, std::string_view key,
                                  std::string_view where, int64_t lo = INT64_MIN,
                                  int64_t hi = INT64_MAX) {
  const auto it = obj.is_object() ? obj.find(key) : obj.end();
  KILN_CHECK(obj.is_object() && it != obj.end(), "{}: no \"{}\"", where, key);
  return json_integer(*it, where, key, lo, hi);
}

/// An array of integers in [lo, hi] (json_integer on each element).
inline std::vector<int64_t> json_integers(const nlohmann::json& v, std::string_view where,
                                          std::string_view key, int64_t lo = INT64_MIN,
                                          int64_t hi = INT64_MAX) {
  KILN_CHECK(v.is_array(), "{}: \"{}\" must be an array of integers, got {}", where, key, v.dump());
  std::vector<int64_t> out;
  out.reserve(v.size());
  for (const auto& e : v) out.push_back(json_integer(e, where, key, lo, hi));
  return out;
}

}  // namespace kiln
