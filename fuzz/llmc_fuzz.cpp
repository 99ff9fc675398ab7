// An llm.c GPT-2 checkpoint: header and sizes validated before the weights are read.
#include "core/error.h"
#include "fuzz_util.h"
#include "models/gpt2/formats.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto path = kiln::fuzz::write_scratch("gpt2_124M.bin", data, size);
  try {
    kiln::load_llmc(path);
  } catch (const kiln::Error&) {
  }
  return 0;
}
