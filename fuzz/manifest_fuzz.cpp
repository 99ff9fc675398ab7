// A checkpoint's manifest.json, opened as a checkpoint (the files it lists do not exist
// unless it names manifest.json itself, so every input that gets past the manifest's
// checks is refused for a missing file).
#include "checkpoint/checkpoint.h"
#include "core/error.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auto dir = [] {
    auto d = kiln::fuzz::scratch_dir() / "step_00000001";
    std::filesystem::create_directories(d);
    return d;
  }();
  kiln::fuzz::write_scratch("step_00000001/manifest.json", data, size);
  try {
    kiln::checkpoint::CheckpointReader reader(dir, kiln::checkpoint::Verify::SizeOnly);
  } catch (const kiln::Error&) {
  }
  return 0;
}
