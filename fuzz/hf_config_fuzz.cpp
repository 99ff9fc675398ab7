// A Hugging Face model folder's config.json, read and turned into model options.
#include "core/error.h"
#include "fuzz_util.h"
#include "models/hf_formats.h"
#include "models/registry.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kiln::fuzz::write_scratch("config.json", data, size);
  try {
    kiln::hf_folder_options(kiln::fuzz::scratch_dir());
  } catch (const kiln::Error&) {
  }
  return 0;
}
