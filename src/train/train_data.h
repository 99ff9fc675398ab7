// TrainData: the trainer's view of its data set, whatever the kind: micro-batches shaped
// as the model takes them (Model::batch_shape), a resumable position, the [model] keys the
// data fixes, and what identifies it in a checkpoint.
//
// Four kinds: a weighted blend of token data sets (data.blend, data/blend.h), or one data
// set, told apart by its meta.json (docs/formats.md):
//   token data sets (data/loader.h): inputs int32 [B,T] tokens, targets [B,T] (the next
//     tokens); they fix model.vocab_size and carry their tokenizer into checkpoints; with
//     document packing (data/packing.h) the inputs go on with positions [B,T] and
//     cu_seqlens [B*T+1];
//   image data sets (data/image_dataset.h): inputs fp32 [B,H,W,C] pixels scaled to [-1, 1]
//     (p / 127.5 - 1), targets int32 [B] labels; they fix model.image_size (square
//     images), model.num_channels and model.num_classes;
//   image-text pairs (data/pair_dataset.h, an image data set with captions) for a
//     vision-language model whose sequence of seq_len positions is the image's N tokens
//     and the caption's L slots: inputs "images" as above, "tokens" int32 [B,L] (padded
//     with the end-of-text id) and "image_at" int32 [B], targets int32 [B, N + L] (each
//     flagged caption id at its place in the model's sequence, -1 elsewhere:
//     models/llava/llava.h); they fix image_size, num_channels and model.vocab_size, check
//     seq_len = N + L, and carry their tokenizer into checkpoints; for a text-to-image
//     model (PairLayout::captions) instead "images" and "tokens" int32 [B, caption_tokens],
//     each record's caption (its last answer and the end-of-text after it, then -1), targets
//     int32 [B] of 0 (models/mmdit/mmdit.h). Image data sets live in train/image_data.h.
#pragma once

#include "data/blend.h"
#include "data/packing.h"
#include "data/visit_order.h"
#include "models/model.h"
#include "config/config.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace kiln {

/// How image-text pairs meet the model (the family decides: a text-to-image model,
/// ModelArch::generates_images, reads captions): the whole conversation in the model's
/// sequence (a vision-language model), or each record's caption in caption_tokens slots.
struct PairLayout {
  bool captions = false;
  int caption_tokens = 0;  // with captions: the model's caption slots
};
/// The layout of `config`'s model: captions (in its model.caption_tokens) for a family that
/// generates images from text, else the sequence.
PairLayout pair_layout_of(const TrainConfig& config);

class TrainData {
 public:
  virtual ~TrainData() = default;
  /// Whether the data set has split `name` ("val").
  virtual bool has_split(const std::string& name) const = 0;
  /// Split `name` of the same data set, unshuffled (evaluation).
  virtual std::unique_ptr<TrainData> open_split(const std::string& name) const = 0;
  /// A blend: split `name` of each of its data sets, unshuffled, named by directory (the
  /// per-data-set validation losses). Empty for one data set.
  virtual std::vector<std::pair<std::string, std::unique_ptr<TrainData>>> open_split_by_dataset(
      const std::string& /*name*/) const {
    return {};
  }
  /// A blend: the tokens each data set gave so far (all ranks together; samples drawn x
  /// seq_len), by directory. Empty for one data set.
  virtual std::map<std::string, int64_t> tokens_by_dataset() const { return {}; }
  /// Sets the [model] keys the data fixes when they are 0; throws kiln::Error naming the
  /// key (and `config.source`) when one is set and does not fit the data.
  virtual void fill_model_keys(TrainConfig& config) const = 0;
  /// Throws kiln::Error (naming data.dir and `config.source`) when model.arch reads
  /// another kind of data (ModelArch::takes_images). Before the model is built.
  virtual void check_arch(const TrainConfig& config) const = 0;
  /// This rank's micro_batch samples of the next global batch into inputs and targets
  /// (BatchShape layouts), then advances by micro_batch * dp_size samples.
  virtual void next_batch(void* inputs, int32_t* targets, int micro_batch, int dp_rank,
                          int dp_size) = 0;
  /// Bytes next_batch writes to `inputs` for micro_batch samples (the packed inputs
  /// included), which a caller's BatchShape must match (check_input_bytes).
  virtual int64_t input_bytes(int micro_batch) const = 0;
  virtual int64_t samples_per_epoch() const = 0;
  virtual data::LoaderState state() const = 0;
  virtual void set_state(const data::LoaderState& s) = 0;
  /// What identifies the data (compared across ranks and with a resumed checkpoint).
  virtual nlohmann::json fingerprint() const = 0;
  /// Files a checkpoint stores beside the weights (name -> bytes): the tokenizer.
  virtual std::map<std::string, std::string> checkpoint_files() const = 0;
};

/// Split `split` of the data set in `dir` (token, image or pair, by its meta.json), in
/// samples of seq_len tokens (token data; pairs: the model's whole sequence), shuffled per epoch under `seed` when `shuffle`, packed
/// as `packing` says (token data). Throws kiln::Error naming the file when the data set is
/// missing or malformed, or has no document index for packing.
std::unique_ptr<TrainData> open_train_data(const std::filesystem::path& dir,
                                           const std::string& split, int seq_len, uint64_t seed,
                                           bool shuffle,
                                           data::Packing packing = data::Packing::None,
                                           const PairLayout& pairs = {});
/// A blend of the token data sets `parts` (data/blend.h): part d shuffled under seed + d.
/// Throws kiln::Error naming the directory when one is missing, holds images or was
/// prepared with another tokenizer than the first.
std::unique_ptr<TrainData> open_blend_data(const std::vector<data::BlendPart>& parts, const std::string& split,
                                           int seq_len, uint64_t seed, bool shuffle,
                                           data::Packing packing = data::Packing::None);
/// Bytes of a token data set's inputs for B samples of seq_len: the tokens, and with
/// document packing their positions and cu_seqlens (data/packing.h).
int64_t token_input_bytes(int B, int seq_len, data::Packing packing);
/// Sets config.model.vocab_size to `vocab` (the data's vocabulary, in `where`) when 0;
/// throws kiln::Error naming the key when it is set smaller.
void fill_vocab_key(TrainConfig& config, int vocab, const std::string& where);
/// Throws kiln::Error (naming `who`) unless `data` writes `shape`'s required inputs: a
/// caller sizes its buffers from the shape, the data writes what data.packing says.
void check_input_bytes(const TrainData& data, const BatchShape& shape, int micro_batch,
                       const std::string& who);
/// The [data] section's data: data.blend when set, else data.dir, packed as data.packing
/// says.
std::unique_ptr<TrainData> open_train_data(const TrainConfig& config, const std::string& split, bool shuffle);
/// The directory of the data's tokenizer: data.dir, or a blend's first data set.
std::filesystem::path tokenizer_data_dir(const TrainConfig& config);
/// How errors name the data: "data.dir X" or "data.blend [X, Y]".
std::string describe_data(const TrainConfig& config);
/// How the missing-val-split error names the data: describe_data, or for a blend the
/// data sets of it that have no val split ("data.blend's X, Y").
std::string without_val_split(const TrainConfig& config);

}  // namespace kiln
