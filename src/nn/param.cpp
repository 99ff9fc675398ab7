#include "nn/param.h"

#include "core/rng.h"

#include <fnmatch.h>

#include <algorithm>

namespace kiln::nn {

std::vector<float> init_values(const Param& p, uint64_t seed, uint64_t stream, int64_t begin,
                               int64_t end) {
  KILN_CHECK(0 <= begin && begin <= end && end <= p.shape.numel(),
             "init_values: range [{}, {}) outside {} of {}", begin, end, p.shape.str(), p.name);
  std::vector<float> host(static_cast<size_t>(end - begin), 0.f);
  switch (p.init.kind) {
    case Init::Kind::Zeros: break;
    case Init::Kind::Ones: std::fill(host.begin(), host.end(), 1.f); break;
    case Init::Kind::Normal:
      fill_normal(host.data(), end - begin, seed, stream, 0.f, p.init.std,
                  static_cast<uint64_t>(begin));
      break;
    case Init::Kind::Uniform:
      for (int64_t i = begin; i < end; ++i)
        host[static_cast<size_t>(i - begin)] =
            p.init.std * (2.f * uniform_at(seed, stream, static_cast<uint64_t>(i)) - 1.f);
      break;
  }
  if (p.init.zero_rows_from >= 0) {
    const int64_t row = p.shape.numel() / p.shape[0];
    const int64_t z = std::max(begin, p.init.zero_rows_from * row);
    for (int64_t i = z; i < end; ++i) host[static_cast<size_t>(i - begin)] = 0.f;
  }
  return host;
}

bool dotted_tail_matches(const std::string& pattern, const std::string& name) {
  for (size_t start = 0; start != std::string::npos;) {
    if (fnmatch(pattern.c_str(), name.c_str() + start, 0) == 0) return true;
    start = name.find('.', start);
    if (start != std::string::npos) ++start;
  }
  return false;
}

bool freeze_pattern_matches(const std::string& pattern, const std::string& name) {
  return dotted_tail_matches(pattern, name) || dotted_tail_matches(pattern + ".*", name);
}

namespace {

// The first `most` distinct modules of `params` (a name without its last component, e.g.
// "transformer.h.0.attn.c_attn"), in order, for an error that shows what names look like.
std::string first_modules(const std::vector<Param*>& params, size_t most) {
  std::vector<std::string> modules;
  for (const Param* p : params) {
    const std::string module = p->name.substr(0, p->name.rfind('.'));
    if (std::find(modules.begin(), modules.end(), module) == modules.end())
      modules.push_back(module);
    if (modules.size() == most) break;
  }
  std::string out;
  for (const std::string& m : modules) out += (out.empty() ? "" : ", ") + m;
  return out;
}

}  // namespace

void freeze_matching(const std::vector<Param*>& params, const std::vector<std::string>& patterns,
                     const std::string& key) {
  for (const std::string& pattern : patterns) {
    bool matched = false;
    for (Param* p : params) {
      if (!freeze_pattern_matches(pattern, p->name)) continue;
      p->trainable = false;
      matched = true;
    }
    KILN_CHECK(matched, "{}: the pattern \"{}\" matches no parameter of the model (its "
               "modules begin {}, ...)", key, pattern, first_modules(params, 6));
  }
}

}  // namespace kiln::nn
