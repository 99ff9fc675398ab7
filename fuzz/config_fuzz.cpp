// The TOML training config and its --set overrides: the input up to the first NUL byte is
// the TOML text, each line after it one "section.key=value" override.
#include "core/error.h"
#include "config/config.h"

#include <string_view>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  auto nul = in.find('\0');
  std::string_view toml = in.substr(0, nul);
  std::vector<std::string> overrides;
  if (nul != std::string_view::npos) {
    std::string_view rest = in.substr(nul + 1);
    while (!rest.empty()) {
      auto nl = rest.find('\n');
      overrides.emplace_back(rest.substr(0, nl));
      rest = nl == std::string_view::npos ? std::string_view{} : rest.substr(nl + 1);
    }
  }
  try {
    kiln::load_config_string(toml, overrides, "fuzz.toml");
  } catch (const kiln::Error&) {
  }
  return 0;
}
