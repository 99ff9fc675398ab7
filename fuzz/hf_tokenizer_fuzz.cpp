// Hugging Face's tokenizer.json: loaded, then a short mixed text encoded and decoded.
#include "core/error.h"
#include "data/tokenizer.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto path = kiln::fuzz::write_scratch("tokenizer.json", data, size);
  try {
    auto t = kiln::data::load_hf_tokenizer(path);
    auto ids = t->encode("Hello, world! <|endoftext|> caf\xc3\xa9 123\n\n  x");
    t->decode(ids);
  } catch (const kiln::Error&) {
  }
  return 0;
}
