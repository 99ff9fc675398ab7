// Image datasets: `kiln prepare --format idx` turns IDX files (data/idx.h) into image
// shards (data/image_shard.h) with a meta.json, and ImageLoader deals them out as the text
// loader deals token samples (data/visit_order.h: shuffled per epoch, disjoint across
// data-parallel ranks, resumable at any (epoch, index)).
//
// meta.json (docs/formats.md):
//   {"format": "kiln-image-shards", "format_version": 1,
//    "image": {"height": H, "width": W, "channels": C}, "classes": K,
//    "splits": {"train": {"images": N, "shards": [{"file": F, "images": n, "crc32": "8 hex"}]},
//               "val": {...}}}
// Image-text pairs (`kiln prepare --format llava`, data/pair_dataset.h) add
//    "captions": {"tokens": L, "template": "llava_v1", "tokenizer": {"kind", "hash"},
//                 "vocab_size": V, "eot_id": E}
// (their shards' caption slots, data/image_shard.h; the tokenizer saved beside) and have
// "classes": 0.
#pragma once

#include "data/image_shard.h"
#include "data/visit_order.h"

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace kiln::data {

struct ImageShardInfo {
  std::string file;  // relative to the dataset directory
  int64_t images = 0;
  uint32_t crc32 = 0;
};

/// The captions of image-text pairs: the slots per record and how their ids were made.
struct CaptionsMeta {
  int tokens = 0;            // L, caption slots per record; 0: labelled images, no captions
  std::string template_name;  // "llava_v1" (data/llava.h)
  std::string tokenizer_kind, tokenizer_hash;
  int vocab_size = 0, eot_id = 0;
};

struct ImageDatasetMeta {
  ImageShape shape;
  CaptionsMeta captions;
  int classes = 0;  // labels are 0 .. classes - 1 (pairs: 0, their labels -1)
  std::vector<std::string> class_names;  // image folders: the class folders' names
  std::map<std::string, std::vector<ImageShardInfo>> splits;  // "train", "val"
  int64_t images(const std::string& split) const;
};

/// Pixels p in [0, 255] as the image models take them: out[i] = p[i] / 127.5 - 1, in
/// [-1, 1] (out holds pixels.size() floats).
void scale_pixels(std::span<const uint8_t> pixels, float* out);

/// Writes dir/meta.json atomically. Throws kiln::Error naming the file.
void write_image_meta(const std::filesystem::path& dir, const ImageDatasetMeta& meta);
/// Reads and validates dir/meta.json. Throws kiln::Error naming the file and key when it
/// is missing, malformed, of another format (a token dataset) or inconsistent.
ImageDatasetMeta read_image_meta(const std::filesystem::path& dir);
/// True when dir/meta.json says "kiln-image-shards" (false when absent or another format).
bool is_image_dataset(const std::filesystem::path& dir);

struct PrepareImagesOptions {
  std::string format = "idx";      // "idx" | "imagefolder"
  std::filesystem::path input;     // a directory of IDX files, or an image folder
  std::filesystem::path out_dir;
  int64_t shard_images = 100000;   // images per shard
  /// --format idx: the classes' names, label order (IDX files carry none); empty: none.
  std::vector<std::string> class_names{};
};

/// `kiln prepare --format idx`: in `input`, the images `<prefix>-images-idx3-ubyte[.gz]`
/// and labels `<prefix>-labels-idx1-ubyte[.gz]` of prefix "train" (the train split) and
/// "t10k" (the val split, when present): MNIST's and Fashion-MNIST's names.
/// `--format imagefolder`: torchvision's ImageFolder convention, `input/train/<class>/*.png`
/// (and `input/val/<class>/*.png` when present; without a train/ folder, `input/<class>/`
/// is the train split), classes numbered in sorted folder-name order, files in sorted
/// order; every PNG (libpng) of one size, read as 8-bit gray or RGB as the first is.
/// Throws kiln::Error naming the file when one is missing or malformed, the counts of
/// images and labels differ, images differ in size, or out_dir already holds a dataset;
/// nothing is left half-written.
ImageDatasetMeta prepare_images(const PrepareImagesOptions& o);

/// Labelled images, or image-text pairs, of one split, in micro-batches.
class ImageLoader {
 public:
  /// Opens split `split` of the image dataset in `dir`, verifying every shard (size,
  /// header, crc32). Throws kiln::Error naming the file at fault.
  ImageLoader(const std::filesystem::path& dir, const std::string& split, uint64_t seed, bool shuffle);

  /// This rank's micro_batch images of the next global batch: pixels [micro_batch, H, W, C]
  /// uint8 and labels [micro_batch] int32; then advances by micro_batch * dp_size.
  void next_batch(uint8_t* pixels, int32_t* labels, int micro_batch, int dp_rank = 0, int dp_size = 1);
  /// Pairs (meta().captions.tokens > 0): as next_batch, with each image's caption in
  /// `captions` (resized to micro_batch) instead of a label. Throws kiln::Error on a
  /// dataset without captions, or (next_batch) with them.
  void next_pairs(uint8_t* pixels, std::vector<CaptionTokens>& captions, int micro_batch,
                  int dp_rank = 0, int dp_size = 1);
  /// Pairs: every record's caption in storage order, with where it is ("FILE record I").
  void for_each_caption(
      const std::function<void(const CaptionTokens&, const std::string& where)>& visit) const;
  int64_t samples_per_epoch() const { return order_.samples(); }
  LoaderState state() const { return order_.state(); }
  void set_state(const LoaderState& s) { order_.set_state(s); }
  const ImageDatasetMeta& meta() const { return meta_; }

 private:
  ImageDatasetMeta meta_;
  std::vector<ImageShardReader> shards_;
  std::vector<int64_t> starts_;  // first image of each shard, plus the total
  VisitOrder order_;
  std::string where_;  // "DIR split 'S'", for errors
  /// Sample `sample`'s shard and its index there.
  std::pair<size_t, int64_t> locate(int64_t sample) const;
};

}  // namespace kiln::data
