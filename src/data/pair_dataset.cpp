#include "data/pair_dataset.h"

#include "core/error.h"
#include "data/image_folder.h"
#include "data/image_resize.h"
#include "data/image_shard.h"
#include "data/llava.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <memory>

namespace kiln::data {

namespace fs = std::filesystem;

namespace {

constexpr size_t kMaxExamples = 5;

// Whether record i of a single pair file is held out for val: splitmix64(i) / 2^64 below
// `fraction` (a fixed, order-independent draw per record).
bool in_val(size_t i, double fraction) {
  uint64_t z = static_cast<uint64_t>(i) + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53 < fraction;
}

// Cuts caption `c` to L tokens when longer (its image at the end at most); returns whether
// it did.
bool cut_to(CaptionTokens& c, int L) {
  if (static_cast<int64_t>(c.ids.size()) <= L) return false;
  c.ids.resize(static_cast<size_t>(L));
  c.in_loss.resize(static_cast<size_t>(L));
  c.image_at = std::min<int64_t>(c.image_at, L);
  return true;
}

// "FILE[i] (id X)": where a record is, for errors.
std::string where_of(const LlavaEntry& e) {
  return e.record.id.empty() ? e.where : fmt::format("{} (id {})", e.where, e.record.id);
}

// What one run writes: the dataset's meta, the counts, and the shape the first image set.
struct Writing {
  const PreparePairsOptions& o;
  PreparePairsSummary summary;
  bool shaped = false;

  // A bad record: an error, or (skip_bad) counted.
  void bad(const LlavaEntry& e, const std::string& why) {
    const std::string line = fmt::format("{}: {}", where_of(e), why);
    KILN_CHECK(o.skip_bad, "{} (--skip-bad skips such records)", line);
    ++summary.skipped;
    if (summary.skipped_examples.size() < kMaxExamples) summary.skipped_examples.push_back(line);
  }

  // Record e's pixels into `px`, or false (reported by bad()) when its image is wanting.
  bool pixels(const LlavaEntry& e, const fs::path& folder, std::vector<uint8_t>& px) {
    ImageShape& shape = summary.meta.shape;
    if (e.record.image.empty()) {
      px.assign(static_cast<size_t>(shape.pixels()), 0);
      return true;
    }
    const fs::path path = folder / e.record.image;
    if (!fs::is_regular_file(path)) {
      bad(e, fmt::format("image '{}' ({}) is missing or not a file", e.record.image,
                         path.string()));
      return false;
    }
    ImageShape got;
    try {
      px = read_png(path, shape.channels, &got);
    } catch (const Error& err) {
      bad(e, err.what());
      return false;
    }
    if (got == shape) return true;
    if (o.image_height > 0) {  // read as the dataset's channels: only the size differs
      px = resize_bilinear(px, got, shape.height, shape.width);
      return true;
    }
    bad(e, fmt::format("image {} is {}x{}, the dataset's are {}x{} (--image-size resizes "
                       "them)", path.string(), got.height, got.width, shape.height, shape.width));
    return false;
  }

  // The shape of the first readable image among `entries` (the train split's), gray or RGB
  // as it is unless o.channels says; the records before it are reported in their turn.
  void take_shape(const std::vector<LlavaEntry>& entries, const fs::path& folder) {
    const LlavaEntry* first = nullptr;  // the first good record with an image
    for (const LlavaEntry& e : entries) {
      if (!e.record.error.empty() || e.record.image.empty()) continue;
      if (!first) first = &e;
      ImageShape& shape = summary.meta.shape;
      try {
        read_png(folder / e.record.image, o.channels, &shape);
      } catch (const Error&) {
        continue;  // missing or unreadable: reported in its turn
      }
      if (o.image_height > 0) shape.height = o.image_height, shape.width = o.image_width;
      shaped = true;
      return;
    }
    KILN_CHECK(first, "{}: no record has an image (image-text pairs need images)",
               o.input.string());
    KILN_FAIL("{}: no record's image can be read, e.g. image '{}' ({}) (are the paths "
              "relative to --images?)", where_of(*first), first->record.image,
              (folder / first->record.image).string());
  }

  // Split `name` of the records `entries` of `file` that `mine` takes (by index).
  void split(const std::string& name, const fs::path& file, const std::vector<LlavaEntry>& entries,
             const std::function<bool(size_t)>& mine) {
    const fs::path folder = o.images.empty() ? file.parent_path() : o.images;
    if (!shaped) take_shape(entries, folder);
    const int L = o.caption_tokens;
    std::vector<uint8_t> px;
    std::unique_ptr<ImageShardWriter> w;
    std::string shard;
    int64_t in_shard = 0, kept = 0, answerless = 0;
    auto close = [&] {
      if (!w) return;
      summary.meta.splits[name].push_back({shard, in_shard, w->finish()});
      w.reset();
    };
    for (size_t i = 0; i < entries.size(); ++i) {
      if (!mine(i)) continue;
      const LlavaEntry& e = entries[i];
      if (!e.record.error.empty()) {
        bad(e, e.record.error);
        continue;
      }
      if (!pixels(e, folder, px)) continue;
      CaptionTokens c = tokenize_llava(*o.tokenizer, e.record);
      if (cut_to(c, L)) {
        ++summary.truncated;
        if (std::count(c.in_loss.begin(), c.in_loss.end(), 1) == 0) ++answerless;
      }
      if (!w) {
        shard = fmt::format("{}_{:06d}.imgshard", name, summary.meta.splits[name].size());
        w = std::make_unique<ImageShardWriter>(o.out_dir / shard, summary.meta.shape, L);
        in_shard = 0;
      }
      w->write(-1, px, c);
      ++kept;
      if (++in_shard == o.shard_images) close();
    }
    close();
    KILN_CHECK(kept > 0, "{}: no record left for the {} split", file.string(), name);
    summary.answerless += answerless;
    KILN_CHECK(answerless < kept, "{}: no record keeps an answer within --caption-tokens "
               "{} (LLaVA's system sentence alone takes {} tokens): nothing to learn", file.string(),
               L, o.tokenizer->encode(std::string(kLlavaSystem) + " ").size());
  }
};

}  // namespace

PreparePairsSummary prepare_pairs(const PreparePairsOptions& o) {
  KILN_CHECK(o.tokenizer != nullptr, "prepare --format llava: no tokenizer");
  KILN_CHECK(o.caption_tokens >= 1, "prepare --format llava: --caption-tokens must be >= 1");
  KILN_CHECK(o.shard_images >= 1, "prepare: --shard-images must be >= 1");
  KILN_CHECK((o.image_height > 0) == (o.image_width > 0) && o.image_height <= 1 << 14 &&
                 o.image_width <= 1 << 14,
             "prepare --format llava: --image-size {}x{}: both sides 1 .. 16384, or neither",
             o.image_height, o.image_width);
  KILN_CHECK(o.val_fraction >= 0.0 && o.val_fraction < 1.0 &&
                 (o.val_fraction == 0.0 || o.val_input.empty()),
             "prepare --format llava: --val-fraction {} must be in [0, 1), and not with "
             "--val-input", o.val_fraction);
  for (const fs::path& f : {o.input, o.val_input})
    KILN_CHECK(f.empty() || fs::is_regular_file(f), "{}: no such pair file", f.string());
  KILN_CHECK(o.channels == 0 || o.channels == 1 || o.channels == 3,
             "prepare --format llava: --channels {} (1 gray, 3 RGB)", o.channels);
  std::error_code ec;
  const bool existed = fs::exists(o.out_dir, ec);
  KILN_CHECK(!existed || (fs::is_directory(o.out_dir, ec) && fs::is_empty(o.out_dir, ec)),
             "{}: already exists and is not an empty folder (image-text pairs go to a new one)",
             o.out_dir.string());
  fs::create_directories(o.out_dir, ec);
  KILN_CHECK(!ec, "{}: cannot create output directory", o.out_dir.string());
  Writing run{o, {}, false};
  try {
    const std::vector<LlavaEntry> records = read_llava_file(o.input);
    const bool held_out = o.val_input.empty() && o.val_fraction > 0.0;
    run.split("train", o.input, records, [&](size_t i) { return !held_out || !in_val(i, o.val_fraction); });
    if (!o.val_input.empty())
      run.split("val", o.val_input, read_llava_file(o.val_input), [](size_t) { return true; });
    if (held_out) run.split("val", o.input, records, [&](size_t i) { return in_val(i, o.val_fraction); });
    ImageDatasetMeta& meta = run.summary.meta;
    meta.classes = 0;
    meta.captions = {o.caption_tokens, "llava_v1", o.tokenizer->kind(), o.tokenizer->hash(),
                     o.tokenizer->vocab_size(), o.tokenizer->eot_id()};
    o.tokenizer->save(o.out_dir);
    write_image_meta(o.out_dir, meta);  // last: a dataset exists once its meta.json does
  } catch (...) {
    // Nothing left: the folder this run made, or what it wrote into the empty one given.
    if (!existed) fs::remove_all(o.out_dir, ec);
    else
      for (const auto& entry : fs::directory_iterator(o.out_dir, ec)) fs::remove_all(entry.path(), ec);
    throw;
  }
  return run.summary;
}

std::vector<uint8_t> read_image_as(const fs::path& path, const ImageShape& shape) {
  KILN_CHECK(fs::is_regular_file(path), "{}: no such image file", path.string());
  ImageShape got;
  std::vector<uint8_t> px = read_png(path, shape.channels, &got);
  if (got == shape) return px;
  return resize_bilinear(px, got, shape.height, shape.width);
}

std::unique_ptr<Tokenizer> train_pairs_tokenizer(const fs::path& path,
                                                 const SentencePieceTrainOptions& options) {
  const std::vector<LlavaEntry> entries = read_llava_file(path);
  const bool any = std::any_of(entries.begin(), entries.end(),
                               [](const LlavaEntry& e) { return e.record.error.empty(); });
  KILN_CHECK(any, "{}: no good record to train a tokenizer on", path.string());
  return train_sentencepiece_on_texts(
      [&](const std::function<void(std::string_view)>& add) {
        std::string text;
        for (const LlavaEntry& e : entries) {
          if (!e.record.error.empty()) continue;
          text.clear();
          for_each_llava_piece(e.record, [&](LlavaPiece kind, std::string_view piece) {
            if (kind == LlavaPiece::Prompt || kind == LlavaPiece::Answer) text += piece;
          });
          add(text);
        }
      },
      options);
}

}  // namespace kiln::data
