#include "train/train_data.h"

#include "core/error.h"
#include "data/image_dataset.h"
#include "data/loader.h"
#include "data/tokenizer.h"
#include "models/registry.h"
#include "model_io/model_io.h"

#include <fmt/format.h>

#include <vector>

namespace kiln {

namespace {

class TokenData final : public TrainData {
 public:
  TokenData(const std::filesystem::path& dir, const std::string& split, int seq_len,
            uint64_t seed, bool shuffle, data::Packing packing)
      : dir_(dir),
        seq_len_(seq_len),
        packing_(packing),
        loader_(dir, split, seq_len, seed, shuffle, packing == data::Packing::Document) {}

  bool has_split(const std::string& name) const override {
    return loader_.meta().splits.count(name) > 0;
  }
  std::unique_ptr<TrainData> open_split(const std::string& name) const override {
    return std::make_unique<TokenData>(dir_, name, seq_len_, 0, /*shuffle=*/false, packing_);
  }
  void fill_model_keys(TrainConfig& c) const override {
    fill_vocab_key(c, loader_.meta().vocab_size, dir_.string());
  }
  void check_arch(const TrainConfig& c) const override {
    const ModelArch arch = model_arch(c.model.arch);
    KILN_CHECK(!arch.takes_images,
               "{}: model.arch = \"{}\" reads {} but data.dir {} holds tokens (prepare them "
               "with kiln prepare --format {})", c.source, c.model.arch,
               arch.takes_text ? "image-text pairs" : "images", dir_.string(),
               arch.takes_text ? "llava" : "idx|imagefolder");
  }
  void next_batch(void* inputs, int32_t* targets, int B, int rank, int size) override {
    auto* in = static_cast<int32_t*>(inputs);
    if (packing_ == data::Packing::None) {
      loader_.next_batch(in, targets, B, rank, size);
      return;
    }
    loader_.next_batch(in, targets, B, rank, size, &starts_);
    const int64_t BT = int64_t{B} * seq_len_;
    data::pack_documents(starts_, seq_len_, in + BT, in + 2 * BT);
  }
  int64_t input_bytes(int B) const override {
    return token_input_bytes(B, seq_len_, packing_);
  }
  int64_t samples_per_epoch() const override { return loader_.samples_per_epoch(); }
  data::LoaderState state() const override { return loader_.state(); }
  void set_state(const data::LoaderState& s) override { loader_.set_state(s); }
  nlohmann::json fingerprint() const override {
    const data::DatasetMeta& meta = loader_.meta();
    return {{"tokenizer_hash", meta.tokenizer_hash}, {"vocab_size", meta.vocab_size},
            {"train_tokens", loader_.total_tokens()}};
  }
  std::map<std::string, std::string> checkpoint_files() const override {
    return tokenizer_files(*data::load_tokenizer(dir_));
  }

 private:
  std::filesystem::path dir_;
  int seq_len_;
  data::Packing packing_;
  data::DataLoader loader_;
  std::vector<std::vector<int32_t>> starts_;  // next_batch's samples' document starts
};

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

// Image-text pairs (data/pair_dataset.h) for a vision-language model whose sequence of
// seq_len positions is the image's N tokens and the caption's L slots (N = seq_len - L).
class PairData final : public TrainData {
 public:
  PairData(const std::filesystem::path& dir, const std::string& split, int seq_len,
           uint64_t seed, bool shuffle)
      : dir_(dir), seq_len_(seq_len), loader_(dir, split, seed, shuffle) {}

  bool has_split(const std::string& name) const override {
    return loader_.meta().splits.count(name) > 0;
  }
  std::unique_ptr<TrainData> open_split(const std::string& name) const override {
    return std::make_unique<PairData>(dir_, name, seq_len_, 0, /*shuffle=*/false);
  }
  void fill_model_keys(TrainConfig& c) const override {
    const data::ImageDatasetMeta& m = loader_.meta();
    fill_image_keys(c, m, dir_, /*classes=*/false);
    fill_vocab_key(c, m.captions.vocab_size, dir_.string());
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
               "vision-language model: model.arch = \"llava\")", c.source, c.model.arch,
               arch.takes_images ? "labelled images" : "tokens", dir_.string());
  }
  /// Inputs: images fp32 [B,H,W,C], tokens int32 [B,L] (padded with the end-of-text id),
  /// image_at int32 [B]; targets int32 [B, N + L] over the model's sequence (llava.h):
  /// the caption's id i at position pos(i) - 1, pos(i) = i + (i >= image_at >= 0 ? N : 0),
  /// where its loss flag is set; -1 elsewhere.
  void next_batch(void* inputs, int32_t* targets, int B, int rank, int size) override {
    const data::ImageDatasetMeta& m = loader_.meta();
    const int64_t P = m.shape.pixels(), L = m.captions.tokens, T = seq_len_, N = T - L;
    KILN_CHECK(N >= 0, "{}: train.seq_len {} is shorter than the caption's {} slots",
               dir_.string(), T, L);
    pixels_.resize(static_cast<size_t>(B * P));
    loader_.next_pairs(pixels_.data(), captions_, B, rank, size);
    auto* images = static_cast<float*>(inputs);
    data::scale_pixels(pixels_, images);
    auto* tokens = reinterpret_cast<int32_t*>(images + B * P);
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
  int64_t input_bytes(int B) const override {
    const data::ImageDatasetMeta& m = loader_.meta();
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
  std::filesystem::path dir_;
  int seq_len_;
  data::ImageLoader loader_;
  std::vector<uint8_t> pixels_;
  std::vector<data::CaptionTokens> captions_;
};

}  // namespace

std::unique_ptr<TrainData> open_train_data(const std::filesystem::path& dir,
                                           const std::string& split, int seq_len, uint64_t seed,
                                           bool shuffle, data::Packing packing) {
  if (data::is_image_dataset(dir)) {
    if (data::read_image_meta(dir).captions.tokens > 0)
      return std::make_unique<PairData>(dir, split, seq_len, seed, shuffle);
    return std::make_unique<ImageData>(dir, split, seed, shuffle);
  }
  return std::make_unique<TokenData>(dir, split, seq_len, seed, shuffle, packing);
}

int64_t token_input_bytes(int B, int seq_len, data::Packing packing) {
  const int64_t tokens = int64_t{B} * seq_len * 4;
  return packing == data::Packing::Document ? tokens + data::packed_input_bytes(B, seq_len) : tokens;
}

void check_input_bytes(const TrainData& data, const BatchShape& shape, int B, const std::string& who) {
  KILN_CHECK(data.input_bytes(B) == shape.required_bytes(), "{}: the data writes {} bytes of inputs "
             "per micro-batch but the model's batch takes {} (data.packing and the model's inputs "
             "disagree)", who, data.input_bytes(B), shape.required_bytes());
}

void fill_vocab_key(TrainConfig& c, int vocab, const std::string& where) {
  if (c.model.vocab_size == 0) c.model.vocab_size = vocab;
  KILN_CHECK(c.model.vocab_size >= vocab, "{}: model.vocab_size {} is smaller than the data set's vocabulary ({} in {})",
             c.source, c.model.vocab_size, vocab, where);
}

std::unique_ptr<TrainData> open_train_data(const TrainConfig& c, const std::string& split, bool shuffle) {
  const auto seed = static_cast<uint64_t>(c.train.seed);
  const data::Packing packing = data::parse_packing(c.data.packing, c.source);
  if (!c.data.blend.empty())  // (a blend refuses image data sets itself)
    return open_blend_data(data::parse_blend(c.data.blend, c.source + ": data.blend"), split, c.train.seq_len,
                           seed, shuffle, packing);
  KILN_CHECK(packing == data::Packing::None || !data::is_image_dataset(c.data.dir),
             "{}: data.packing = \"document\" packs the documents of token data sets, but data.dir {} "
             "holds images", c.source, c.data.dir);
  return open_train_data(c.data.dir, split, c.train.seq_len, seed, shuffle, packing);
}

std::filesystem::path tokenizer_data_dir(const TrainConfig& c) {
  if (!c.data.blend.empty()) return data::parse_blend(c.data.blend, c.source + ": data.blend").front().dir;
  return c.data.dir;
}

std::string without_val_split(const TrainConfig& c) {
  if (c.data.blend.empty()) return describe_data(c);
  std::string dirs;
  for (const auto& p : data::parse_blend(c.data.blend, c.source + ": data.blend"))
    if (data::read_dataset_meta(p.dir).splits.count("val") == 0) dirs += (dirs.empty() ? "" : ", ") + p.dir;
  return "data.blend's " + dirs;
}

std::string describe_data(const TrainConfig& c) {
  if (c.data.blend.empty()) return "data.dir " + c.data.dir;
  std::string dirs;
  for (const auto& p : data::parse_blend(c.data.blend, c.source + ": data.blend"))
    dirs += (dirs.empty() ? "" : ", ") + p.dir;
  return "data.blend [" + dirs + "]";
}

}  // namespace kiln
