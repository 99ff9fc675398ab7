// kiln's own saved tokenizer (the tokenizer.json beside every dataset and in every
// checkpoint): kind, hash, vocab_size, eot_id and files, then an encode and decode.
#include "core/error.h"
#include "data/tokenizer.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kiln::fuzz::write_scratch("tokenizer.json", data, size);
  try {
    auto t = kiln::data::load_tokenizer(kiln::fuzz::scratch_dir());
    t->decode(t->encode("Hello, world!\n"));
  } catch (const kiln::Error&) {
  }
  return 0;
}
