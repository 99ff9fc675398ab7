// The CPU backend: OpenMP threads over rows/heads, GEMMs through oneDNN (which detects
// AVX-512 and AMX at run time), everything else as plain C++ loops the compiler
// vectorises. Ops complete before they return; the Stream argument is unused.
#pragma once

#include "backend/backend.h"

#include <memory>

namespace kiln {

/// A new CPU backend using the process's OpenMP thread count.
std::unique_ptr<Backend> make_cpu_backend();

}  // namespace kiln
