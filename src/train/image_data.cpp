#include "train/image_data.h"

#include "core/error.h"
#include "data/image_dataset.h"
#include "data/llava.h"
#include "data/tokenizer.h"
#include "models/registry.h"
#include "model_io/model_io.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

namespace kiln {

namespace {

// Sets the [model] keys an image data set fixes (those the arch declares: ModelArch::keys,
// all in c.model.family; 0 = unset): image_size (square images), num_channels and, with
// `classes`, num_classes. Throws kiln::Error naming a key set to another value.
void fill_image_keys(TrainConfig& c, const data::ImageDatasetMeta& m, const std::filesystem::path& dir,
                     bool classes) {
  KILN_CHECK(m.shape.height == m.shape.width, "{}: data.dir {} holds {}x{} images; the vision "
             "models take square images", c.source, dir.string(), m.shape.height, m.shape.width);
  auto fill = [&](const char* key, int data_value) {
    const auto it = c.model.family.find(std::string_view(key).substr(6));
    if (it == c.model.family.end()) return;
    if (it->second == 0) it->second = data_value;
    KILN_CHECK(it->second == data_value, "{}: {} is {} but the images in {} have {}", c.source,
               key, static_cast<int>(it->second), dir.string(), data_value);
  };
  fill("model.image_size", m.shape.height);
  fill("model.num_channels", m.shape.channels);
  if (classes) fill("model.num_classes", m.classes);
}

// What identifies an image data set's train split.
nlohmann::json image_fingerprint(const data::ImageDatasetMeta& m) {
  nlohmann::json crcs = nlohmann::json::array();
  for (const auto& shard : m.splits.at("train")) crcs.push_back(shard.crc32);
  return {{"images", m.images("train")},
          {"shape", {m.shape.height, m.shape.width, m.shape.channels}},
          {"classes", m.classes},
          {"train_crc32", crcs}};
}

class ImageData final : public TrainData {
 public:
  ImageData(const std::filesystem::path& dir, const std::string& split, uint64_t seed, bool shuffle)
      : dir_(dir), loader_(dir, split, seed, shuffle) {}

  bool has_split(const std::string& name) const override {
    return loader_.meta().splits.count(name) > 0;
  }
  std::unique_ptr<TrainData> open_split(const std::string& name) const override {
    return std::make_unique<ImageData>(dir_, name, 0, /*shuffle=*/false);
  }
  void fill_model_keys(TrainConfig& c) const override {
    fill_image_keys(c, loader_.meta(), dir_, /*classes=*/true);
  }
  void check_arch(const TrainConfig& c) const override {
    const ModelArch arch = model_arch(c.model.arch);
    KILN_CHECK(arch.takes_images && !arch.takes_text,
               "{}: model.arch = \"{}\" reads {} but data.dir {} holds images with labels (an "
               "image model, e.g. model.arch = \"vit\", or {})", c.source, c.model.arch,
               arch.takes_text ? "image-text pairs" : "tokens", dir_.string(),
               arch.takes_text ? "pairs prepared with kiln prepare --format llava"
                               : "a token data set");
  }
  void next_batch(void* inputs, int32_t* targets, int B, int rank, int size) override {
    const int64_t P = loader_.meta().shape.pixels();
    pixels_.resize(static_cast<size_t>(B * P));
    loader_.next_batch(pixels_.data(), targets, B, rank, size);
    data::scale_pixels(pixels_, static_cast<float*>(inputs));
  }
  int64_t input_bytes(int B) const override { return int64_t{B} * loader_.meta().shape.pixels() * 4; }
  int64_t samples_per_epoch() const override { return loader_.samples_per_epoch(); }
  data::LoaderState state() const override { return loader_.state(); }
  void set_state(const data::LoaderState& s) override { loader_.set_state(s); }
  nlohmann::json fingerprint() const override { return image_fingerprint(loader_.meta()); }
  std::map<std::string, std::string> checkpoint_files() const override { return {}; }

 private:
  std::filesystem::path dir_;
  data::ImageLoader loader_;
  std::vector<uint8_t> pixels_;
};

// Image-text pairs (data/pair_dataset.h), laid out as `layout` says (PairLayout):
//   Sequence  for a vision-language model whose sequence of seq_len positions is the
//             image's N tokens and the caption's L slots (N = seq_len - L);
//   Caption   for a text-to-image model: each record's caption, its last answer (with the
//             end-of-text closing it), in layout.caption_tokens slots.
class PairData final : public TrainData {
 public:
  PairData(const std::filesystem::path& dir, const std::string& split, int seq_len,
           uint64_t seed, bool shuffle, const PairLayout& layout)
      : dir_(dir), seq_len_(seq_len), layout_(layout), loader_(dir, split, seed, shuffle) {
    if (layout_.captions) check_captions(split);
  }

  bool has_split(const std::string& name) const override {
    return loader_.meta().splits.count(name) > 0;
  }
  std::unique_ptr<TrainData> open_split(const std::string& name) const override {
    return std::make_unique<PairData>(dir_, name, seq_len_, 0, /*shuffle=*/false, layout_);
  }
  void fill_model_keys(TrainConfig& c) const override {
    const data::ImageDatasetMeta& m = loader_.meta();
    fill_image_keys(c, m, dir_, /*classes=*/false);
    fill_vocab_key(c, m.captions.vocab_size, dir_.string());
    if (layout_.captions) return;
    // The image's tokens (a llava's patches) and the caption's slots fill the sequence.
    const auto size = c.model.family.find("image_size");
    const auto patch = c.model.family.find("vision.patch_size");
    if (size == c.model.family.end() || patch == c.model.family.end() || patch->second <= 0 ||
        static_cast<int>(size->second) % static_cast<int>(patch->second) != 0)
      return;  // (the model names a patch that does not divide the image)
    const int side = static_cast<int>(size->second) / static_cast<int>(patch->second);
    const int N = side * side, L = m.captions.tokens;
    KILN_CHECK(c.train.seq_len == N + L, "{}: train.seq_len (model.block_size when unset) is {} "
               "but a sequence here is the image's {} tokens and the caption's {} slots (data.dir "
               "{}): set it to {}", c.source, c.train.seq_len, N, L, dir_.string(), N + L);
  }
  void check_arch(const TrainConfig& c) const override {
    const ModelArch arch = model_arch(c.model.arch);
    KILN_CHECK(arch.takes_images && arch.takes_text,
               "{}: model.arch = \"{}\" reads {} but data.dir {} holds image-text pairs (a "
               "vision-language model, model.arch = \"llava\", or a text-to-image one, "
               "\"mmdit\")", c.source, c.model.arch,
               arch.takes_images ? "labelled images" : "tokens", dir_.string());
  }
  void next_batch(void* inputs, int32_t* targets, int B, int rank, int size) override {
    const int64_t P = loader_.meta().shape.pixels();
    pixels_.resize(static_cast<size_t>(B * P));
    loader_.next_pairs(pixels_.data(), captions_, B, rank, size);
    auto* images = static_cast<float*>(inputs);
    data::scale_pixels(pixels_, images);
    auto* tokens = reinterpret_cast<int32_t*>(images + B * P);
    if (layout_.captions) {
      caption_batch(tokens, targets, B);
    } else {
      sequence_batch(tokens, targets, B);
    }
  }
  int64_t input_bytes(int B) const override {
    const data::ImageDatasetMeta& m = loader_.meta();
    if (layout_.captions) return int64_t{B} * (m.shape.pixels() * 4 + int64_t{layout_.caption_tokens} * 4);
    return int64_t{B} * (m.shape.pixels() * 4 + int64_t{m.captions.tokens} * 4 + 4);
  }
  int64_t samples_per_epoch() const override { return loader_.samples_per_epoch(); }
  data::LoaderState state() const override { return loader_.state(); }
  void set_state(const data::LoaderState& s) override { loader_.set_state(s); }
  nlohmann::json fingerprint() const override {
    const data::ImageDatasetMeta& m = loader_.meta();
    nlohmann::json j = image_fingerprint(m);
    j["captions"] = {{"tokens", m.captions.tokens}, {"tokenizer_hash", m.captions.tokenizer_hash},
                     {"vocab_size", m.captions.vocab_size}};
    return j;
  }
  std::map<std::string, std::string> checkpoint_files() const override {
    return tokenizer_files(*data::load_tokenizer(dir_));
  }

 private:
  /// Sequence: tokens int32 [B,L] (padded with the end-of-text id) and image_at int32 [B]
  /// after them; targets int32 [B, N + L] over the model's sequence (llava.h): the caption's
  /// id i at position pos(i) - 1, pos(i) = i + (i >= image_at >= 0 ? N : 0), where its loss
  /// flag is set; -1 elsewhere.
  void sequence_batch(int32_t* tokens, int32_t* targets, int B) const {
    const data::ImageDatasetMeta& m = loader_.meta();
    const int64_t L = m.captions.tokens, T = seq_len_, N = T - L;
    KILN_CHECK(N >= 0, "{}: train.seq_len {} is shorter than the caption's {} slots",
               dir_.string(), T, L);
    int32_t* image_at = tokens + B * L;
    std::fill_n(tokens, B * L, static_cast<int32_t>(m.captions.eot_id));
    std::fill_n(targets, B * T, -1);
    for (int64_t b = 0; b < B; ++b) {
      const data::CaptionTokens& cap = captions_[static_cast<size_t>(b)];
      const auto n = static_cast<int64_t>(cap.ids.size());
      std::copy_n(cap.ids.data(), n, tokens + b * L);
      image_at[b] = static_cast<int32_t>(cap.image_at);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t pos = i + (cap.image_at >= 0 && i >= cap.image_at ? N : 0);
        if (cap.in_loss[static_cast<size_t>(i)] && pos > 0) targets[b * T + pos - 1] = cap.ids[static_cast<size_t>(i)];
      }
    }
  }
  /// Caption: every record of the split ends with a whole answer (kiln prepare did not cut
  /// it), whose ids and end-of-text fit model.caption_tokens; throws kiln::Error naming
  /// the record otherwise (before any training).
  void check_captions(const std::string& split) const {
    const int eot = loader_.meta().captions.eot_id;
    size_t longest = 0;
    std::string where_longest;
    loader_.for_each_caption([&](const data::CaptionTokens& cap, const std::string& where) {
      const auto answer = data::llava_last_answer(cap, eot);
      KILN_CHECK(answer, "{}: no whole last answer to take as a text-to-image caption (kiln "
                 "prepare cut the record at its --caption-tokens slots: prepare with more)", where);
      if (answer->second - answer->first > longest)
        longest = answer->second - answer->first, where_longest = where;
    });
    KILN_CHECK(static_cast<int64_t>(longest) <= layout_.caption_tokens,
               "{}: the {} split's longest caption (a record's last answer and its end-of-text) "
               "is {} tokens ({}) but model.caption_tokens is {}: raise it", dir_.string(), split,
               longest, where_longest, layout_.caption_tokens);
  }
  /// Caption: tokens int32 [B, caption_tokens], each record's last answer (its ids and the
  /// end-of-text after them), then -1; targets int32 [B] all 0 (every image counted).
  void caption_batch(int32_t* tokens, int32_t* targets, int B) const {
    const int64_t Lc = layout_.caption_tokens;
    std::fill_n(tokens, B * Lc, -1);
    std::fill_n(targets, B, 0);
    for (int64_t b = 0; b < B; ++b) {
      const data::CaptionTokens& cap = captions_[static_cast<size_t>(b)];
      const auto [begin, end] = *data::llava_last_answer(cap, loader_.meta().captions.eot_id);
      std::copy_n(cap.ids.data() + begin, end - begin, tokens + b * Lc);  // checked to fit
    }
  }

  std::filesystem::path dir_;
  int seq_len_;
  PairLayout layout_;
  data::ImageLoader loader_;
  std::vector<uint8_t> pixels_;
  std::vector<data::CaptionTokens> captions_;
};

}  // namespace

std::unique_ptr<TrainData> open_image_data(const std::filesystem::path& dir,
                                           const std::string& split, int seq_len, uint64_t seed,
                                           bool shuffle, const PairLayout& pairs) {
  if (data::read_image_meta(dir).captions.tokens > 0)
    return std::make_unique<PairData>(dir, split, seq_len, seed, shuffle, pairs);
  return std::make_unique<ImageData>(dir, split, seed, shuffle);
}

}  // namespace kiln
