// GPT-2's vocabulary files: encoder.json (before the first NUL byte of the input) and
// vocab.bpe (after it), loaded, then a short text encoded and decoded.
#include "core/error.h"
#include "data/tokenizer.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto [encoder, merges] = kiln::fuzz::split_at_nul(data, size);
  auto enc = kiln::fuzz::write_scratch("encoder.json", encoder);
  auto bpe = kiln::fuzz::write_scratch("vocab.bpe", merges);
  try {
    auto t = kiln::data::load_gpt2_tokenizer({enc, bpe});
    auto ids = t->encode("Hello, world! <|endoftext|> caf\xc3\xa9 123\n\n  x");
    t->decode(ids);
  } catch (const kiln::Error&) {
  }
  return 0;
}
