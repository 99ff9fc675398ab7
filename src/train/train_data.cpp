#include "train/train_data.h"

#include "train/image_data.h"

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

}  // namespace

std::unique_ptr<TrainData> open_train_data(const std::filesystem::path& dir,
                                           const std::string& split, int seq_len, uint64_t seed,
                                           bool shuffle, data::Packing packing,
                                           const PairLayout& pairs) {
  if (data::is_image_dataset(dir)) return open_image_data(dir, split, seq_len, seed, shuffle, pairs);
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
  return open_train_data(c.data.dir, split, c.train.seq_len, seed, shuffle, packing,
                         pair_layout_of(c));
}

PairLayout pair_layout_of(const TrainConfig& c) {
  const ModelArch arch = model_arch(c.model.arch);
  if (!(arch.generates_images && arch.takes_text)) return {};
  ModelOptions o;
  o.family = c.model.family;
  return {.captions = true, .caption_tokens = o.integer(arch.keys, "caption_tokens")};
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
