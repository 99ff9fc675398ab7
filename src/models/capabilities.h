// What a model can do beyond training, each an interface of its own (a model implements
// those it has and answers for them through Model::language_model() etc.):
//   LanguageModel    a vocabulary and KV-cache decoding (kiln sample, sampling in training)
//   ImageClassifier  class logits of images (kiln classify)
//   FlowModel        the velocity of a flow over images, under a conditioning (kiln
//                    sample-images)
//   VisionLanguageModel  a language model whose prompt holds an image (kiln sample
//                    --image)
// Callers reach one with as_language_model(model, who) and the like, which throw a
// one-line kiln::Error naming the model's arch when it lacks the capability.
#pragma once

#include "core/tensor.h"

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace kiln {

class Model;

/// A model of token sequences with a vocabulary that decodes with a KV cache (Pope et
/// al. 2022 call the two phases prefill and decode).
class LanguageModel {
 public:
  virtual ~LanguageModel() = default;
  /// The real vocabulary, and the padded one of the logits (columns >= vocab_size unused).
  virtual int vocab_size() const = 0;
  virtual int padded_vocab_size() const = 0;
  /// The longest sequence the model takes (block_size).
  virtual int max_positions() const = 0;
  /// begin_decode(B, max_len) allocates caches for B sequences of up to max_len <=
  /// max_positions() tokens; each decode() runs tokens int32 [B,Tq] at the next Tq
  /// positions and writes the last position's logits fp32 [B, padded_vocab_size()].
  /// Throws kiln::Error when the cache would overflow.
  virtual void begin_decode(int B, int max_len) = 0;
  virtual void decode(const Tensor& tokens, const Tensor& logits) = 0;
  virtual void end_decode() = 0;
  /// Tokens decoded since begin_decode.
  virtual int decoded_length() const = 0;
};

/// A language model that reads an image among its text (LLaVA): its decoding starts from a
/// prompt that holds one image.
class VisionLanguageModel {
 public:
  virtual ~VisionLanguageModel() = default;
  /// One image: [H, W, C].
  virtual Shape image_shape() const = 0;
  /// The positions the image takes in the sequence.
  virtual int image_tokens() const = 0;
  /// The prefill, after LanguageModel::begin_decode(B, ..): tokens int32 [B,Tq] with
  /// images fp32 [B,H,W,C] (pixels in [-1, 1]) spliced in after the first image_at tokens
  /// of each sequence (0 <= image_at <= Tq), Tq + image_tokens() positions in all; writes
  /// the last position's logits fp32 [B, padded_vocab_size()]. LanguageModel::decode
  /// goes on from there.
  virtual void prefill_image(const Tensor& images, const Tensor& tokens, int image_at,
                             const Tensor& logits) = 0;
};

/// An image classifier.
class ImageClassifier {
 public:
  virtual ~ImageClassifier() = default;
  virtual int num_classes() const = 0;
  /// One image: [H, W, C].
  virtual Shape image_shape() const = 0;
  /// Class logits fp32 [B, num_classes()] of images fp32 [B,H,W,C] (pixels in [-1, 1]).
  virtual void classify(const Tensor& images, const Tensor& logits) = 0;
};

/// What a flow model's velocity is conditioned on: class labels (a class-conditional
/// model, FlowModel::num_classes() > 0) or captions (a text-conditioned one,
/// FlowModel::caption_tokens() > 0); the other is empty.
struct FlowConditioning {
  /// Host labels [B]: a class in [0, FlowModel::num_classes()), or -1 for none (the null
  /// class of classifier-free guidance).
  std::span<const int32_t> labels;
  /// Host captions [B]: each a caption's token ids as the training data holds them (the
  /// end-of-text id last), at most caption_tokens(); an empty one is the null caption of
  /// classifier-free guidance.
  std::span<const std::vector<int32_t>> captions;
};

/// A generative flow over images (a rectified flow: t = 1 pure noise, t = 0 the data).
class FlowModel {
 public:
  virtual ~FlowModel() = default;
  /// The classes it is conditioned on (labels in [0, num_classes())); 0: none.
  virtual int num_classes() const = 0;
  /// The longest caption it is conditioned on, in tokens; 0: none.
  virtual int caption_tokens() const { return 0; }
  /// One image: [H, W, C].
  virtual Shape image_shape() const = 0;
  /// The velocity fp32 [B,H,W,C] at noisy images xt fp32 [B,H,W,C] at times t[b] in
  /// [0, 1] (a host array of B) under `conditioning`.
  virtual void predict_velocity(const Tensor& xt, std::span<const float> t,
                                const FlowConditioning& conditioning, const Tensor& velocity) = 0;
};

/// The model's capability; throws kiln::Error "<who>: model.arch '<arch>' is not a
/// language model (...)" when it lacks it. `who` names the caller (a command, a file).
LanguageModel& as_language_model(Model& model, std::string_view who);
VisionLanguageModel& as_vision_language_model(Model& model, std::string_view who);
ImageClassifier& as_image_classifier(Model& model, std::string_view who);
FlowModel& as_flow_model(Model& model, std::string_view who);

}  // namespace kiln
