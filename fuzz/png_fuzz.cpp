// A PNG of an image folder (libpng's simplified API), read as gray and as stored.
#include "core/error.h"
#include "data/image_folder.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = kiln::fuzz::write_scratch("input.png", data, size);
  for (int channels : {0, 1}) {
    try {
      kiln::data::ImageShape shape;
      kiln::data::read_png(path, channels, &shape);
    } catch (const kiln::Error&) {
    }
  }
  return 0;
}
