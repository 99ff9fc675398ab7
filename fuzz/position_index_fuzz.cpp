// A position index beside a token split (<split>_docs.idx, <split>_loss.idx): the file
// read as each kind, every position checked (header, size, order, bounds, crc32).
#include "core/error.h"
#include "data/position_index.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto path = kiln::fuzz::write_scratch("train_docs.idx", data, size);
  for (auto kind : {kiln::data::PositionIndexKind::DocumentStarts, kiln::data::PositionIndexKind::LossSpans}) {
    try {
      int64_t last = -1;
      kiln::data::scan_position_index(path, kind, -1, -1, [&](int64_t p) { last = p; });
      (void)last;
    } catch (const kiln::Error&) {
    }
  }
  return 0;
}
