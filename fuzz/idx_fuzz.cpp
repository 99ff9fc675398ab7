// An IDX file (plain or gzip), read whole.
#include "core/error.h"
#include "data/idx.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = kiln::fuzz::write_scratch("input-idx3-ubyte", data, size);
  try {
    kiln::data::read_idx(path);
  } catch (const kiln::Error&) {
  }
  return 0;
}
