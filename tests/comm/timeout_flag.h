// `--timeout-s S` on the command line of the MPI test programs: the seconds their world
// communicator waits before it ends the job (Communicator::set_timeout; the tests have no
// config, so no parallel.timeout_s).
#pragma once

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace kiln::testing {

/// S of the first `--timeout-s S` in argv, or `fallback` when there is none. Exits with
/// status 2, naming the flag, when S is missing or not a positive number of seconds.
inline double timeout_flag(int argc, char** argv, double fallback) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--timeout-s") != 0) continue;
    char* end = nullptr;
    const double s = i + 1 < argc ? std::strtod(argv[i + 1], &end) : 0.0;
    if (i + 1 >= argc || end == argv[i + 1] || *end != '\0' || !std::isfinite(s) || s <= 0) {
      std::fprintf(stderr, "--timeout-s needs a positive number of seconds\n");
      std::exit(2);
    }
    return s;
  }
  return fallback;
}

}  // namespace kiln::testing
