#include "train/metrics.h"

#include "core/error.h"
#include "core/json_util.h"

#include <fmt/format.h>

#include <sstream>
#include <vector>

namespace kiln {

MetricsLog::MetricsLog(const std::filesystem::path& run_dir, int64_t resume_step)
    : path_(run_dir / "metrics.jsonl") {
  if (resume_step > 0 && std::filesystem::exists(path_)) {
    std::ifstream in(path_);
    std::vector<std::string> kept;
    for (std::string line; std::getline(in, line);) {
      if (line.empty()) continue;
      const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_object() && j.contains("step") &&
          json_integer(j["step"], path_.string(), "step", 0) > resume_step)
        continue;
      kept.push_back(line);
    }
    in.close();
    const auto tmp = path_.string() + ".tmp";
    std::ofstream t(tmp, std::ios::trunc);
    for (const auto& l : kept) t << l << '\n';
    t.close();
    KILN_CHECK(t.good(), "{}: cannot rewrite metrics", tmp);
    std::filesystem::rename(tmp, path_);
  }
  out_.open(path_, resume_step > 0 ? std::ios::app : std::ios::trunc);
  KILN_CHECK(out_.good(), "{}: cannot open for writing", path_.string());
}

void MetricsLog::write(const nlohmann::json& record) {
  // Invalid UTF-8 (a sample decoded from a byte-level tokenizer may split a character)
  // becomes U+FFFD rather than an exception.
  out_ << record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
  out_.flush();
}

std::string format_duration(double s) {
  if (s < 60) return fmt::format("{:.1f}s", s);
  const auto t = static_cast<int64_t>(s + 0.5);
  if (t < 3600) return fmt::format("{}m{:02d}s", t / 60, t % 60);
  return fmt::format("{}h{:02d}m", t / 3600, (t % 3600) / 60);
}

}  // namespace kiln
