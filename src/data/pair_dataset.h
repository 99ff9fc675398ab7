// Image-text pairs prepared for a vision-language model (issue 41): `kiln prepare --format
// llava` turns LLaVA pair files (data/llava.h) and their PNG images into image shards with
// captions (data/image_shard.h) and a meta.json with "captions" (data/image_dataset.h),
// which ImageLoader::next_pairs deals out.
//
// Per record, in file order: its image read as 8-bit gray or RGB (libpng: gray, RGB and
// alpha converted), as `channels` says or else as the first readable image of the train
// file is, resized to `image_size` when it differs (PIL's bilinear,
// data/image_resize.h), or without one of the first image's size (another size is then an
// error asking for --image-size); a text-only record's pixels are zero.
// Its caption is tokenize_llava's (LLaVA-1.5's conversation format), cut to the caption
// slots L when longer (counted: the loss then sees only the answers within L). The label
// is -1. The tokenizer is saved beside the shards (Tokenizer::save).
#pragma once

#include "data/image_dataset.h"
#include "data/tokenizer.h"

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace kiln::data {

struct PreparePairsOptions {
  std::filesystem::path input;      // the train split's pair file (a JSON array or JSONL)
  std::filesystem::path val_input;  // the val split's; empty: none, or val_fraction's
  double val_fraction = 0.0;        // without val_input: each record of `input` held out
                                    // for val with this probability (a fixed hash of its
                                    // index: reproducible, independent of the others)
  std::filesystem::path images;     // the folder image paths are relative to; empty: each
                                    // pair file's own folder
  std::filesystem::path out_dir;    // must not exist yet, or be empty
  int caption_tokens = 512;         // L, caption slots per record
  int image_height = 0, image_width = 0;  // every image resized to this; 0: the first's size
  int channels = 0;                 // 1 gray, 3 RGB; 0: the first readable image's
  int64_t shard_images = 100000;    // records per shard
  bool skip_bad = false;            // a bad record skipped and counted, not an error
  const Tokenizer* tokenizer = nullptr;  // not owned
};

struct PreparePairsSummary {
  ImageDatasetMeta meta;
  int64_t truncated = 0;  // records cut to L tokens
  int64_t answerless = 0; // of them, those cut before their first answer (nothing to learn)
  int64_t skipped = 0;    // bad records skipped (skip_bad)
  std::vector<std::string> skipped_examples;  // the first few, "FILE[i] (id X): reason"
};

/// Writes the dataset. Throws kiln::Error naming the file and record of a bad record
/// (data/llava.h's reasons, a missing or unreadable image, an image of another size
/// without image_size) unless skip_bad, and on a missing pair file, an out_dir that exists
/// and is not an empty folder, L < 1, no record with a readable image, a split left empty,
/// or a split whose every record is cut before its first answer. A failed run leaves
/// nothing (out_dir removed, or emptied when it was given empty); an interrupted one leaves
/// shards without meta.json, which no loader reads.
PreparePairsSummary prepare_pairs(const PreparePairsOptions& o);

/// A SentencePiece BPE tokenizer (train_sentencepiece_on_texts, `options`) trained on the
/// conversations of the pair file `path` as the model reads them: each good record's
/// prompt and answer pieces (for_each_llava_piece: the system sentence, role markers,
/// questions and answers; bad records are left to prepare_pairs to report). Throws
/// kiln::Error naming the file when it cannot be read or holds no good record.
std::unique_ptr<Tokenizer> train_pairs_tokenizer(const std::filesystem::path& path,
                                                 const SentencePieceTrainOptions& options);

/// An image file as a model of images `shape` takes it (kiln sample --image, kiln eval
/// --llava): read as shape.channels (libpng converts gray, RGB and alpha) and resized to
/// its height and width with Pillow's bilinear filter when it has another size. Throws
/// kiln::Error naming the file when it is missing or unreadable.
std::vector<uint8_t> read_image_as(const std::filesystem::path& path, const ImageShape& shape);

}  // namespace kiln::data
