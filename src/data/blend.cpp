#include "data/blend.h"

#include "core/error.h"

#include <cmath>
#include <filesystem>
#include <cstdlib>
#include <set>

namespace kiln::data {

std::vector<BlendPart> parse_blend(const std::vector<std::string>& list, const std::string& what) {
  KILN_CHECK(!list.empty() && list.size() % 2 == 0,
             "{}: expected weight and directory pairs, e.g. [\"0.3\", \"data/a\", \"0.7\", \"data/b\"] "
             "(got {} entries)", what, list.size());
  std::vector<BlendPart> parts;
  std::set<std::string> seen;
  for (size_t i = 0; i < list.size(); i += 2) {
    const std::string& w = list[i];
    char* end = nullptr;
    const double weight = w.empty() ? 0.0 : std::strtod(w.c_str(), &end);
    KILN_CHECK(!w.empty() && end == w.c_str() + w.size() && std::isfinite(weight) && weight > 0,
               "{}: entry {} should be a positive weight, got \"{}\" (pairs of weight and directory)", what,
               i + 1, w);
    const std::string& dir = list[i + 1];
    KILN_CHECK(!dir.empty(), "{}: entry {} is an empty directory", what, i + 2);
    std::error_code ec;  // "a", "a/" and "./a" are one directory
    std::string canonical =
        std::filesystem::weakly_canonical(std::filesystem::absolute(dir, ec), ec).lexically_normal().string();
    while (canonical.size() > 1 && canonical.back() == '/') canonical.pop_back();
    KILN_CHECK(seen.insert(ec ? dir : canonical).second, "{}: {} is listed twice", what, dir);
    parts.push_back({dir, weight});
  }
  return parts;
}

BlendSchedule::BlendSchedule(std::vector<double> weights) : weights_(std::move(weights)) {
  KILN_CHECK(!weights_.empty(), "blend: no data sets");
  double sum = 0.0;
  for (double w : weights_) {
    KILN_CHECK(std::isfinite(w) && w > 0, "blend: weight {} is not positive", w);
    sum += w;
  }
  for (double& w : weights_) w /= sum;
  counts_.assign(weights_.size(), 0);
}

std::pair<int, int64_t> BlendSchedule::next() {
  const double n1 = static_cast<double>(position_ + 1);
  size_t best = 0;
  double best_lag = weights_[0] * n1 - static_cast<double>(counts_[0]);
  for (size_t d = 1; d < weights_.size(); ++d) {
    const double lag = weights_[d] * n1 - static_cast<double>(counts_[d]);
    if (lag > best_lag) best = d, best_lag = lag;
  }
  ++position_;
  return {static_cast<int>(best), counts_[best]++};
}

void BlendSchedule::seek(int64_t n) {
  KILN_CHECK(n >= 0, "blend: negative position {}", n);
  counts_.assign(weights_.size(), 0);
  position_ = 0;
  while (position_ < n) next();
}

}  // namespace kiln::data
