#include "models/llava/llava.h"

#include "core/error.h"
#include "models/llama_layers.h"
#include "models/patch_encoder.h"
#include "nn/linear.h"

#include <algorithm>
#include <vector>

namespace kiln {

/// The layers, named as llava.h lists them.
struct LlavaLayers {
  explicit LlavaLayers(const LlavaConfig& c)
      : vision(c.vision, c.image_tokens(), "vision_tower."),
        linear_1("multi_modal_projector.linear_1", c.vision.n_embd, c.text.n_embd,
                 /*bias=*/true, 0.02f),
        linear_2("multi_modal_projector.linear_2", c.text.n_embd, c.text.n_embd,
                 /*bias=*/true, 0.02f),
        text(c.text, "language_model.") {}

  /// The decoder's parts, its embeddings (part 0) joined by the vision tower and the
  /// projector.
  std::vector<PartLayout> parts(const LlavaConfig& c) {
    std::vector<PartLayout> out = text.parts(c.text);
    std::vector<PartLayout> tower;
    vision.add_parts(tower);
    PartLayout& first = out.front();
    std::vector<nn::Param*> params;
    double cost = 0.0;
    for (size_t i = 0; i < tower.size(); ++i) {
      // Only the blocks that run cost anything (the embeddings are tower[0]).
      if (i <= static_cast<size_t>(c.vision_blocks())) cost += tower[i].cost;
      params.insert(params.end(), tower[i].params.begin(), tower[i].params.end());
    }
    linear_1.collect(params);
    linear_2.collect(params);
    params.insert(params.end(), first.params.begin(), first.params.end());
    const double C = c.text.n_embd, Cv = c.vision.n_embd;
    // Per decoder position: the image's N positions spread over the T of its sequence.
    const double share = static_cast<double>(c.image_tokens()) / c.text.block_size;
    first.params = std::move(params);
    first.cost += share * (cost + Cv * C + C * C);
    return out;
  }

  PatchEncoder vision;
  nn::Linear linear_1, linear_2;
  LlamaLayers text;
};

/// Part 0's activations for B samples of Lt text slots.
struct Llava::State {
  int B = 0;
  int64_t Lt = 0;
  PatchActivations vision;  // the tower's; feats = vision.stream[vision_blocks()]
  Tensor hidden;            // [B,N,C] linear_1's output
  Tensor act;               // [B,N,C] GELU(hidden)
  Tensor image;             // [B,N,C] linear_2's output: the image's tokens
  Tensor text;              // [B,Lt,C] the text's embeddings
  Tensor dimage, dact;      // [B,N,C] their gradients (dact also holds dL/d hidden)
  Tensor dtext;             // [B,Lt,C]
  Tensor dfeats;            // [B,N,Cv]
  std::vector<int32_t> image_at;  // the forward's, each in [0, Lt]
};

Llava::Llava(const LlavaConfig& config, Backend& backend, const ModelStorage& storage)
    : DecoderModel(backend, storage), config_(config) {
  config_.validate();
  KILN_CHECK(storage.plans.empty(), "llava: {} is not implemented for llava yet",
             storage.plans.empty() ? "" : storage.plans.front()->what());
  KILN_CHECK(storage.held_parts.empty(), "llava: pipeline parallelism is not implemented for "
             "llava yet");
  layers_ = std::make_unique<LlavaLayers>(config_);
  state_ = std::make_unique<State>();
  cache_ = std::make_unique<LlamaKvCache>();
  LlamaLayers& t = layers_->text;
  set_layers(DecoderLayers{&t.embedding, &t.blocks, &t.norm, &t.head_weight(),
                           &t.head_placement(), config_.text.vocab_size, config_.text.n_embd,
                           llama_balance_spec(config_.text)});
  build(layers_->parts(config_),
        {OpFamily::Patchify, OpFamily::Embedding, OpFamily::LayerNorm, OpFamily::RMSNorm,
         OpFamily::Linear, OpFamily::Attention, OpFamily::Rope, OpFamily::Gelu,
         OpFamily::SwiGLU, OpFamily::Add, OpFamily::SoftmaxCrossEntropy});
  // A frozen part's backward is skipped (the usual first stage trains the projector only).
  for (const ParamSpec& p : params()) {
    if (!p.trainable) continue;
    vision_trains_ |= p.name.starts_with("vision_tower.");
    projector_trains_ |= p.name.starts_with("multi_modal_projector.");
  }
}

Llava::~Llava() = default;

BatchShape Llava::batch_shape(int B, int T) const {
  const int N = config_.image_tokens(), Lt = config_.text_tokens(T);
  KILN_CHECK(Lt >= 1, "llava: train.seq_len ({}) must exceed the image's {} tokens: a sequence "
             "is the image's tokens and the text's", T, N);
  const Shape image{config_.vision.image_size, config_.vision.image_size,
                    config_.vision.num_channels};
  BatchShape s;
  s.inputs.push_back({.name = "images", .shape = batched(B, image), .dtype = DType::F32});
  s.inputs.push_back({.name = "tokens", .shape = Shape{B, Lt}, .dtype = DType::I32,
                      .range = vocab_size()});
  s.inputs.push_back({.name = "image_at", .shape = Shape{B}, .dtype = DType::I32});
  s.targets = Shape{B, T};
  s.target_range = vocab_size();
  return s;
}

void Llava::set_activation_checkpointing(nn::ActivationCheckpointing mode) {
  mode_ = mode;
  DecoderModel::set_activation_checkpointing(mode);
}

void Llava::reserve(int B, int64_t Lt) {
  State& a = *state_;
  Backend& be = backend();
  const DType dt = dtype();
  layers_->vision.reserve(be, a.vision, B, dt, mode_);
  if (a.B == B && a.Lt == Lt) return;
  a.B = B;
  a.Lt = Lt;
  const int64_t N = config_.image_tokens(), C = config_.text.n_embd, Cv = config_.vision.n_embd;
  auto act = [&](Shape sh) { return be.empty(sh, dt, MemCategory::Activations); };
  a.hidden = act(Shape{B, N, C});
  a.act = act(Shape{B, N, C});
  a.image = act(Shape{B, N, C});
  a.text = act(Shape{B, Lt, C});
  a.dimage = act(Shape{B, N, C});
  a.dact = act(Shape{B, N, C});
  a.dtext = act(Shape{B, Lt, C});
  a.dfeats = act(Shape{B, N, Cv});
}

Shape Llava::image_shape() const {
  return Shape{config_.vision.image_size, config_.vision.image_size, config_.vision.num_channels};
}

void Llava::encode_images(const Tensor& images) {
  State& a = *state_;
  Backend& be = backend();
  const Stream s = be.default_stream();
  const int run = config_.vision_blocks();
  layers_->vision.forward(be, s, a.vision, images, run);
  layers_->linear_1.forward(be, s, a.hidden, a.vision.stream[static_cast<size_t>(run)]);
  be.gelu_forward(s, a.act, a.hidden);
  layers_->linear_2.forward(be, s, a.image, a.act);
}

void Llava::splice(const Tensor& out) {
  // Three row copies per sample: text before the image, the image, text after it.
  const State& a = *state_;
  Backend& be = backend();
  const Stream s = be.default_stream();
  const int64_t Lt = a.Lt, N = config_.image_tokens(), C = config_.text.n_embd, T = N + Lt;
  for (int64_t b = 0; b < a.B; ++b) {
    const int64_t at = a.image_at[static_cast<size_t>(b)];
    auto seq = [&](int64_t row, int64_t rows) { return out.view_at((b * T + row) * C, Shape{rows, C}); };
    auto text = [&](int64_t row, int64_t rows) { return a.text.view_at((b * Lt + row) * C, Shape{rows, C}); };
    if (at > 0) be.copy(s, seq(0, at), text(0, at));
    be.copy(s, seq(at, N), a.image.view_at(b * N * C, Shape{N, C}));
    if (at < Lt) be.copy(s, seq(at + N, Lt - at), text(at, Lt - at));
  }
}

void Llava::embed_forward(const Batch& batch, const Tensor&, const Tensor& out) {
  const Tensor& images = batch.require("images", arch());
  const Tensor& tokens = batch.require("tokens", arch());
  const Tensor& image_at = batch.require("image_at", arch());
  const int64_t N = config_.image_tokens();
  KILN_CHECK(images.ndim() == 4 && tokens.ndim() == 2 && tokens.size(0) == images.size(0) &&
                 out.ndim() == 3 && out.size(0) == tokens.size(0) &&
                 out.size(1) == N + tokens.size(1) && image_at.shape() == Shape{tokens.size(0)} &&
                 image_at.dtype() == DType::I32,
             "llava: needs images [B,H,W,C], tokens [B,Lt], image_at int32 [B] and targets "
             "[B, {} + Lt], got {}, {}, {} and {}", N, images.str(), tokens.str(),
             image_at.str(), batch.targets.str());
  const int B = static_cast<int>(tokens.size(0));
  const int64_t Lt = tokens.size(1);
  reserve(B, Lt);
  State& a = *state_;
  Backend& be = backend();
  const Stream s = be.default_stream();
  a.image_at.resize(static_cast<size_t>(B));
  be.copy_to_host(s, a.image_at.data(), image_at);
  be.synchronize(s);
  for (int b = 0; b < B; ++b) {
    int32_t& at = a.image_at[static_cast<size_t>(b)];
    KILN_CHECK(at >= -1 && at <= Lt, "llava: image_at[{}] = {} is outside [-1, {}]", b, at, Lt);
    if (at < 0) at = static_cast<int32_t>(Lt);  // text only: the image after the text
  }
  encode_images(images);
  layers_->text.embedding.forward(be, s, a.text, tokens);
  splice(out);
}

void Llava::embed_backward(const Batch& batch, const Tensor&, const Tensor& dout) {
  State& a = *state_;
  Backend& be = backend();
  const Stream s = be.default_stream();
  const int64_t B = a.B, Lt = a.Lt, N = config_.image_tokens(), C = config_.text.n_embd;
  const int64_t T = N + Lt;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t at = a.image_at[static_cast<size_t>(b)];
    auto seq = [&](int64_t row, int64_t rows) { return dout.view_at((b * T + row) * C, Shape{rows, C}); };
    auto text = [&](int64_t row, int64_t rows) { return a.dtext.view_at((b * Lt + row) * C, Shape{rows, C}); };
    if (at > 0) be.copy(s, text(0, at), seq(0, at));
    be.copy(s, a.dimage.view_at(b * N * C, Shape{N, C}), seq(at, N));
    if (at < Lt) be.copy(s, text(at, Lt - at), seq(at + N, Lt - at));
  }
  layers_->text.embedding.backward(be, s, a.dtext, batch.require("tokens", arch()));
  if (!projector_trains_ && !vision_trains_) return;
  const int run = config_.vision_blocks();
  const Tensor& feats = a.vision.stream[static_cast<size_t>(run)];
  layers_->linear_2.backward(be, s, a.dact, a.dimage, a.act);
  be.gelu_backward(s, a.dact, a.dact, a.hidden);
  layers_->linear_1.backward(be, s, vision_trains_ ? a.dfeats : Tensor(), a.dact, feats);
  if (vision_trains_) layers_->vision.backward(be, s, a.vision, a.dfeats, run);
}

// ---- KV-cache decoding ----------------------------------------------------------------

void Llava::begin_decode(int B, int max_len) {
  cache_->begin(backend(), config_.text, layers_->text, dtype(), B, max_len);
}

void Llava::end_decode() { cache_->end(); }

int Llava::decoded_length() const { return cache_->past(); }

void Llava::decode(const Tensor& tokens, const Tensor& logits) {
  const int B = cache_->batch();
  KILN_CHECK(B > 0, "decode() needs begin_decode() first");
  check_shape(logits, Shape{B, config_.text.padded_vocab_size}, "decode logits");
  Tensor last = backend().empty(Shape{B, config_.text.n_embd}, dtype(), MemCategory::Temporaries);
  cache_->decode(backend(), layers_->text, tokens, last);
  project_logits(logits, last, layers_->text.head_weight().v());
}

void Llava::prefill_image(const Tensor& images, const Tensor& tokens, int image_at,
                          const Tensor& logits) {
  const int B = cache_->batch();
  KILN_CHECK(B > 0, "prefill_image() needs begin_decode() first");
  KILN_CHECK(tokens.ndim() == 2 && tokens.size(0) == B && image_at >= 0 &&
                 image_at <= tokens.size(1),
             "llava prefill: tokens {} must be [{}, Tq] with the image after 0..Tq of them (got "
             "{})", tokens.str(), B, image_at);
  KILN_CHECK(images.shape() == batched(B, image_shape()) && images.dtype() == DType::F32,
             "llava prefill: images {} must be fp32 [{}, {}, {}, {}]", images.str(), B,
             config_.vision.image_size, config_.vision.image_size, config_.vision.num_channels);
  check_shape(logits, Shape{B, config_.text.padded_vocab_size}, "prefill logits");
  const int64_t Lt = tokens.size(1), N = config_.image_tokens(), C = config_.text.n_embd;
  reserve(B, Lt);
  State& a = *state_;
  a.image_at.assign(static_cast<size_t>(B), image_at);
  Backend& be = backend();
  encode_images(images);
  layers_->text.embedding.forward(be, be.default_stream(), a.text, tokens);
  Tensor x = be.empty(Shape{B, N + Lt, C}, dtype(), MemCategory::Temporaries);
  Tensor last = be.empty(Shape{B, C}, dtype(), MemCategory::Temporaries);
  splice(x);
  cache_->run(be, layers_->text, x, last);
  project_logits(logits, last, layers_->text.head_weight().v());
}

}  // namespace kiln
