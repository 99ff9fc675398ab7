// A harness without libFuzzer: runs LLVMFuzzerTestOneInput on each file named on the
// command line (what libFuzzer does when given files). The regular build links every
// harness with this main so that ctest replays the committed regression inputs and seeds
// with the regular compiler: an exception other than kiln::Error escapes the harness and
// fails the test; the sanitizers' findings need scripts/fuzz.sh's build.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::ifstream in(argv[i], std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "replay: cannot read %s\n", argv[i]);
      return 1;
    }
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  }
  std::printf("replay: %d inputs, no escape\n", argc - 1);
  return 0;
}
