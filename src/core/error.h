// kiln::Error and the KILN_CHECK macro: every bad input becomes one clear line.
//
// Errors are exceptions carrying a single-line message that names the file, key,
// tensor or rank at fault. The `kiln` command catches them at the top, prints
// "kiln: error: <message>" and exits non-zero.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace kiln {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace kiln

// KILN_CHECK(cond, fmt, args...): throws kiln::Error with the formatted message when
// `cond` is false.
#define KILN_CHECK(cond, ...)                                  \
  do {                                                         \
    if (!(cond)) throw ::kiln::Error(::fmt::format(__VA_ARGS__)); \
  } while (0)

#define KILN_FAIL(...) throw ::kiln::Error(::fmt::format(__VA_ARGS__))
