// A weighted blend of token data sets as TrainData (data.blend; data/blend.h).
#include "core/error.h"
#include "data/blend.h"
#include "data/image_dataset.h"
#include "data/loader.h"
#include "data/packing.h"
#include "data/tokenizer.h"
#include "models/registry.h"
#include "model_io/model_io.h"
#include "train/train_data.h"

#include <fmt/format.h>

#include <memory>
#include <vector>

namespace kiln {

namespace {

class BlendData final : public TrainData {
 public:
  /// Part d's samples are shuffled under seed + d (so a blend of one data set visits it as
  /// data.dir does).
  BlendData(std::vector<data::BlendPart> parts, std::string split, int seq_len, uint64_t seed, bool shuffle,
            data::Packing packing)
      : parts_(std::move(parts)), seq_len_(seq_len), packing_(packing), schedule_(weights(parts_)) {
    for (size_t d = 0; d < parts_.size(); ++d) {
      const std::string& dir = parts_[d].dir;
      KILN_CHECK(!data::is_image_dataset(dir), "data.blend: {} holds images; a blend takes token data sets", dir);
      loaders_.push_back(std::make_unique<data::DataLoader>(dir, split, seq_len, seed + d, shuffle,
                                                            packing == data::Packing::Document));
      const data::DatasetMeta& m = loaders_.back()->meta();
      const data::DatasetMeta& first = loaders_.front()->meta();
      KILN_CHECK(m.tokenizer_hash == first.tokenizer_hash && m.vocab_size == first.vocab_size,
                 "data.blend: {} and {} were prepared with different tokenizers ({} with {} ids vs {} with "
                 "{}); a blend needs one", parts_[0].dir, dir, first.tokenizer_hash, first.vocab_size,
                 m.tokenizer_hash, m.vocab_size);
      total_ += loaders_.back()->samples_per_epoch();
    }
  }

  bool has_split(const std::string& name) const override {
    for (const auto& l : loaders_)
      if (l->meta().splits.count(name) == 0) return false;
    return true;
  }
  std::unique_ptr<TrainData> open_split(const std::string& name) const override {
    return std::make_unique<BlendData>(parts_, name, seq_len_, 0, /*shuffle=*/false, packing_);
  }
  std::vector<std::pair<std::string, std::unique_ptr<TrainData>>> open_split_by_dataset(
      const std::string& name) const override {
    std::vector<std::pair<std::string, std::unique_ptr<TrainData>>> out;
    for (const auto& p : parts_)
      out.emplace_back(p.dir, open_train_data(p.dir, name, seq_len_, 0, false, packing_));
    return out;
  }
  void fill_model_keys(TrainConfig& c) const override {
    fill_vocab_key(c, loaders_.front()->meta().vocab_size, parts_[0].dir);
  }
  void check_arch(const TrainConfig& c) const override {
    KILN_CHECK(!model_arch(c.model.arch).takes_images,
               "{}: model.arch = \"{}\" reads images but data.blend lists token data sets", c.source,
               c.model.arch);
  }
  // The global batch is the next micro_batch * dp_size samples of the blended stream; rank r
  // takes positions [r * micro_batch, (r + 1) * micro_batch) of it, as VisitOrder does.
  void next_batch(void* inputs, int32_t* targets, int B, int rank, int size) override {
    KILN_CHECK(B > 0 && size > 0 && rank >= 0 && rank < size, "data.blend: bad batch arguments");
    const int T = seq_len_;
    auto* in = static_cast<int32_t*>(inputs);
    const bool documents = packing_ == data::Packing::Document;
    starts_.resize(static_cast<size_t>(B));
    for (int64_t p = 0; p < int64_t{B} * size; ++p) {
      const auto [d, k] = schedule_.next();
      if (p / B != rank) continue;
      data::DataLoader& l = *loaders_[static_cast<size_t>(d)];
      const int64_t S = l.samples_per_epoch();
      const int64_t b = p % B;
      l.read_pair(l.sample_at(k / S, k % S), in + b * T, targets + b * T,
                  documents ? &starts_[static_cast<size_t>(b)] : nullptr);
    }
    if (documents) data::pack_documents(starts_, T, in + int64_t{B} * T, in + int64_t{2} * B * T);
  }
  int64_t input_bytes(int B) const override { return token_input_bytes(B, seq_len_, packing_); }
  /// One blend "epoch" is every part's samples once: the position's unit, not a promise
  /// that each part is then complete (parts run through their own epochs by weight).
  int64_t samples_per_epoch() const override { return total_; }
  data::LoaderState state() const override {
    const int64_t n = schedule_.position();
    return {n / total_, n % total_};
  }
  void set_state(const data::LoaderState& s) override {
    KILN_CHECK(s.epoch >= 0 && s.index >= 0 && s.index < total_, "data.blend: position {}/{} outside [0, {})",
               s.epoch, s.index, total_);
    schedule_.seek(s.epoch * total_ + s.index);
  }
  // What the samples depend on: each part's data (as data.dir's fingerprint: a moved
  // directory is the same data) and normalized weight, in order.
  nlohmann::json fingerprint() const override {
    double sum = 0;
    for (const auto& p : parts_) sum += p.weight;
    nlohmann::json parts = nlohmann::json::array();
    for (size_t d = 0; d < parts_.size(); ++d) {
      const data::DatasetMeta& m = loaders_[d]->meta();
      parts.push_back({{"weight", parts_[d].weight / sum}, {"tokenizer_hash", m.tokenizer_hash},
                       {"vocab_size", m.vocab_size}, {"train_tokens", loaders_[d]->total_tokens()}});
    }
    return {{"blend", std::move(parts)}};
  }
  std::map<std::string, std::string> checkpoint_files() const override {
    return tokenizer_files(*data::load_tokenizer(parts_[0].dir));
  }
  std::map<std::string, int64_t> tokens_by_dataset() const override {
    std::map<std::string, int64_t> out;
    for (size_t d = 0; d < parts_.size(); ++d) out[parts_[d].dir] = schedule_.counts()[d] * seq_len_;
    return out;
  }

 private:
  static std::vector<double> weights(const std::vector<data::BlendPart>& parts) {
    std::vector<double> w;
    for (const auto& p : parts) w.push_back(p.weight);
    return w;
  }

  std::vector<data::BlendPart> parts_;
  int seq_len_;
  data::Packing packing_;
  data::BlendSchedule schedule_;
  std::vector<std::vector<int32_t>> starts_;  // next_batch's samples' document starts
  std::vector<std::unique_ptr<data::DataLoader>> loaders_;
  int64_t total_ = 0;
};

}  // namespace

std::unique_ptr<TrainData> open_blend_data(const std::vector<data::BlendPart>& parts, const std::string& split,
                                           int seq_len, uint64_t seed, bool shuffle,
                                           data::Packing packing) {
  return std::make_unique<BlendData>(parts, split, seq_len, seed, shuffle, packing);
}

}  // namespace kiln
