// A token shard: its header is validated on open, then every token is read (in chunks of
// 4096, as the loader does) and checked against a small vocabulary.
#include "core/error.h"
#include "data/shard.h"
#include "fuzz_util.h"

#include <algorithm>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto path = kiln::fuzz::write_scratch("train_000000.bin", data, size);
  try {
    kiln::data::ShardReader shard(path);
    std::vector<int32_t> out(4096);
    for (int64_t at = 0; at < shard.size(); at += static_cast<int64_t>(out.size())) {
      const int64_t n = std::min<int64_t>(shard.size() - at, static_cast<int64_t>(out.size()));
      shard.read(at, n, out.data(), 50257);
    }
  } catch (const kiln::Error&) {
  }
  return 0;
}
