// A JSONL input of `kiln prepare --format jsonl | chat`: the file (plain, gzip or zstd, by
// its first bytes) read line by line, each line's text record and chat record parsed, and
// a good conversation rendered by both templates (its loss ranges must lie in the text).
#include "core/error.h"
#include "data/chat.h"
#include "data/input_file.h"
#include "data/jsonl.h"
#include "fuzz_util.h"

#include <cstdlib>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto path = kiln::fuzz::write_scratch("input.jsonl", data, size);
  try {
    kiln::data::LineReader reader(path);
    std::string line;
    while (reader.next(line)) {
      (void)kiln::data::jsonl_text(line, "text");
      const kiln::data::ChatRecord rec = kiln::data::parse_chat_record(line);
      if (!rec.error.empty()) continue;
      for (auto t : {kiln::data::ChatTemplate::Llama3, kiln::data::ChatTemplate::ChatML}) {
        const kiln::data::RenderedChat r = kiln::data::render_chat(rec.messages, t);
        for (const auto& [begin, end] : r.loss_bytes)
          if (begin > end || end > r.text.size()) std::abort();
      }
    }
  } catch (const kiln::Error&) {
  }
  return 0;
}
