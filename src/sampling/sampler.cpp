#include "sampling/sampler.h"

#include "core/rng.h"
#include "models/batch.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace kiln {

namespace {

int32_t pick(const float* logits, int V, const SampleOptions& o, Philox& rng) {
  KILN_CHECK(std::isfinite(o.temperature) && o.temperature >= 0.f,
             "sample: temperature {} must be a finite number >= 0", o.temperature);
  if (o.temperature <= 0.f) return static_cast<int32_t>(std::max_element(logits, logits + V) - logits);
  std::vector<int32_t> ids(static_cast<size_t>(V));
  std::iota(ids.begin(), ids.end(), 0);
  int n = V;
  if (o.top_k > 0 && o.top_k < V) {
    n = o.top_k;
    // Ties broken by id, so the choice does not depend on the sort's implementation.
    std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
  }
  float mx = -INFINITY;
  for (int i = 0; i < n; ++i) mx = std::max(mx, logits[ids[static_cast<size_t>(i)]]);
  std::vector<double> p(static_cast<size_t>(n));
  double sum = 0;
  for (int i = 0; i < n; ++i)
    sum += p[static_cast<size_t>(i)] =
        std::exp((logits[ids[static_cast<size_t>(i)]] - mx) / static_cast<double>(o.temperature));
  double u = static_cast<double>(rng.next_uniform()) * sum;
  for (int i = 0; i < n; ++i) {
    u -= p[static_cast<size_t>(i)];
    if (u < 0) return ids[static_cast<size_t>(i)];
  }
  return ids[static_cast<size_t>(n - 1)];
}

}  // namespace

std::vector<int32_t> sample_tokens(Model& model, const std::vector<int32_t>& prompt,
                                   const SampleOptions& o, const ImagePrompt* image) {
  KILN_CHECK(!prompt.empty(), "sample: the prompt must hold at least one token");
  LanguageModel& lm = as_language_model(model, "sample");
  const int block_size = lm.max_positions();
  Backend& be = model.backend();
  std::vector<int32_t> ctx = prompt;
  // The image's positions, in the context with the prompt's ids.
  const int N = image ? as_vision_language_model(model, "sample --image").image_tokens() : 0;
  KILN_CHECK(!image || static_cast<int>(ctx.size()) + N < block_size,
             "sample: the prompt's {} tokens and the image's {} exceed the model's context of {}",
             ctx.size(), N, block_size);
  if (static_cast<int>(ctx.size()) > block_size)  // keep the most recent block_size tokens
    ctx.erase(ctx.begin(), ctx.end() - block_size);
  const int total = std::min<int>(block_size, static_cast<int>(ctx.size()) + N + o.max_new_tokens);
  lm.begin_decode(1, total);
  Tensor logits = be.empty(Shape{1, lm.padded_vocab_size()}, DType::F32, MemCategory::Temporaries);
  std::vector<float> host(static_cast<size_t>(lm.padded_vocab_size()));
  Philox rng(o.seed, /*stream=*/0x5a3d1e);
  std::vector<int32_t> out;
  std::vector<int32_t> next = ctx;
  while (true) {
    Tensor tok = be.empty(Shape{1, static_cast<int64_t>(next.size())}, DType::I32,
                          MemCategory::Temporaries);
    be.copy_from_host(be.default_stream(), tok, next.data());
    if (image && out.empty()) {
      VisionLanguageModel& vlm = as_vision_language_model(model, "sample --image");
      const Shape shape = vlm.image_shape();
      KILN_CHECK(static_cast<int64_t>(image->pixels.size()) == shape.numel(),
                 "sample: the image has {} values, the model takes [{}, {}, {}]",
                 image->pixels.size(), shape[0], shape[1], shape[2]);
      Tensor pixels = be.empty(batched(1, shape), DType::F32, MemCategory::Temporaries);
      be.copy_from_host(be.default_stream(), pixels, image->pixels.data());
      vlm.prefill_image(pixels, tok, image->image_at, logits);
    } else {
      lm.decode(tok, logits);
    }
    be.copy_to_host(be.default_stream(), host.data(), logits);
    const int32_t id = pick(host.data(), lm.vocab_size(), o, rng);
    out.push_back(id);
    if (id == o.stop_token || static_cast<int>(out.size()) >= o.max_new_tokens ||
        lm.decoded_length() >= total)
      break;
    next.assign(1, id);
  }
  lm.end_decode();
  return out;
}

}  // namespace kiln
