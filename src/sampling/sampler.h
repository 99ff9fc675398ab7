// Text generation from a language model: prefill the prompt into the KV cache, then draw one
// token at a time with temperature and top-k from a Philox stream, so that the same
// seed gives the same text. Temperature 0 is greedy (argmax).
#pragma once

#include "models/model.h"

#include <cstdint>
#include <vector>

namespace kiln {

struct SampleOptions {
  int max_new_tokens = 64;
  float temperature = 1.f;  // 0 = greedy
  int top_k = 0;            // 0 = the whole vocabulary
  uint64_t seed = 1337;
  int stop_token = -1;  // stop after emitting this id (e.g. end-of-text); -1 = never
};

/// An image in the prompt of a vision-language model (models/capabilities.h
/// VisionLanguageModel): its pixels fp32 [H,W,C] in [-1, 1], after the prompt's first
/// `image_at` ids.
struct ImagePrompt {
  std::vector<float> pixels;
  int image_at = 0;
};

/// Continues `prompt` (ids, at least one; use the end-of-text id for "no prompt"), with
/// `image` in it when given, and returns the new ids only. Throws kiln::Error naming the
/// arch for a model that is not a language model (or, with an image, not a
/// vision-language model: models/capabilities.h). The context is capped at block_size:
/// generation stops when the KV cache is full; without an image the prompt keeps its last
/// block_size ids, with one it must fit (a kiln::Error otherwise). Padded vocabulary
/// columns are never sampled.
std::vector<int32_t> sample_tokens(Model& model, const std::vector<int32_t>& prompt,
                                   const SampleOptions& options, const ImagePrompt* image = nullptr);

}  // namespace kiln
