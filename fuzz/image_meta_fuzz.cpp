// An image dataset's meta.json, read and validated.
#include "core/error.h"
#include "data/image_dataset.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kiln::fuzz::write_scratch("meta.json", data, size);
  try {
    kiln::data::read_image_meta(kiln::fuzz::scratch_dir());
  } catch (const kiln::Error&) {
  }
  return 0;
}
