// A safetensors file: the header is validated on open (a header or tensor claiming more
// bytes than the file holds is refused before anything is allocated), then every tensor
// is read as raw bytes and as fp32.
#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto path = kiln::fuzz::write_scratch("input.safetensors", data, size);
  try {
    kiln::safetensors::Reader reader(path.string());
    for (const auto& t : reader.tensors()) {
      reader.read_bytes(t.name);
      try {
        reader.read_f32(t.name);
      } catch (const kiln::Error&) {
      }
    }
  } catch (const kiln::Error&) {
  }
  return 0;
}
