// Test helper: the message of the kiln::Error a callable throws.
#pragma once

#include "core/error.h"

#include <string>

namespace kiln::testing {

/// The message of the kiln::Error that `f` throws; "" when it throws none.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace kiln::testing
