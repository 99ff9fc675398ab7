// `kiln prepare --format llava` (data/pair_dataset.h) on small pair files with the byte
// tokenizer: each record's pixels and caption come back from ImageLoader::next_pairs as
// tokenize_llava made them (a text-only record's pixels zero, a long one cut to the caption
// slots and counted), meta.json says what was made, --image-size resizes (Pillow's
// bilinear, checked on values computed by hand), and bad input is one error naming the
// file and record (or, with skip_bad, a count) that leaves no output behind.
#include "core/error.h"
#include "data/image_dataset.h"
#include "data/image_folder.h"
#include "data/image_resize.h"
#include "data/llava.h"
#include "data/pair_dataset.h"
#include "data/tokenizer.h"
#include "test_util.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <string>
#include <vector>

using namespace kiln::data;
using kiln::data::testing::TempDir;
using kiln::data::testing::write_text;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

constexpr int L = 182;  // caption slots: every record (184 bytes) cut within its answer

json record(const std::string& id, const std::string& image, const std::string& answer) {
  json r = {{"id", id},
            {"conversations",
             {{{"from", "human"}, {"value", image.empty() ? "Hi" : "<image>\nWhat?"}},
              {{"from", "gpt"}, {"value", answer}}}}};
  if (!image.empty()) r["image"] = image;
  return r;
}

// Gray 4x4 PNGs a.png (all 10), b.png (all 20); train.jsonl of three records (one text
// only), val.json an array of one.
struct Pairs {
  TempDir dir;
  std::unique_ptr<Tokenizer> tok = make_byte_tokenizer();
  Pairs(int caption_slots = L) : slots(caption_slots) {
    write_png(dir.path() / "a.png", {4, 4, 1}, std::vector<uint8_t>(16, 10));
    write_png(dir.path() / "b.png", {4, 4, 1}, std::vector<uint8_t>(16, 20));
    write_lines("train.jsonl", {record("t0", "a.png", "A."), record("t1", "", "Hello."),
                                record("t2", "b.png", "B.")});
    write_text(dir.path() / "val.json", json::array({record("v0", "b.png", "B!")}).dump());
  }
  void write_lines(const std::string& name, const std::vector<json>& records) {
    std::string text;
    for (const json& r : records) text += r.dump() + "\n";
    write_text(dir.path() / name, text);
  }
  PreparePairsOptions options(const std::string& out = "out") const {
    PreparePairsOptions o;
    o.input = dir.path() / "train.jsonl";
    o.val_input = dir.path() / "val.json";
    o.out_dir = dir.path() / out;
    o.caption_tokens = slots;
    o.shard_images = 2;
    o.tokenizer = tok.get();
    return o;
  }
  int slots;
};

// Options whose every record is cut before its first answer (an error), into `out`.
PreparePairsOptions tiny_in(const Pairs& p, const std::string& out) {
  PreparePairsOptions o = p.options(out);
  o.caption_tokens = 16;
  return o;
}

std::string error_of(const PreparePairsOptions& o) {
  try {
    prepare_pairs(o);
  } catch (const kiln::Error& e) {
    EXPECT_FALSE(fs::exists(o.out_dir)) << "a failed run left " << o.out_dir;
    return e.what();
  }
  return "no error";
}

TEST(Pairs, RecordsComeBackAsTokenizedWithTheirPixels) {
  for (const int slots : {L, 400}) {  // every record cut, and none
    Pairs p(slots);
    const PreparePairsSummary s = prepare_pairs(p.options());
    EXPECT_EQ(s.truncated, slots == L ? 4 : 0);
    const ImageDatasetMeta m = read_image_meta(p.dir.path() / "out");
    EXPECT_EQ(m.shape, (ImageShape{4, 4, 1}));
    EXPECT_EQ(m.classes, 0);
    EXPECT_EQ(m.captions.tokens, slots);
    EXPECT_EQ(m.captions.template_name, "llava_v1");
    EXPECT_EQ(m.captions.tokenizer_kind, "byte");
    EXPECT_EQ(m.captions.eot_id, 256);
    EXPECT_EQ(m.images("train"), 3);
    EXPECT_EQ(m.splits.at("train").size(), 2u);  // two per shard
    EXPECT_EQ(load_tokenizer(p.dir.path() / "out")->hash(), p.tok->hash());
    const std::vector<std::pair<std::string, std::vector<json>>> splits = {
        {"train", {record("t0", "a.png", "A."), record("t1", "", "Hello."), record("t2", "b.png", "B.")}},
        {"val", {record("v0", "b.png", "B!")}}};
    for (const auto& [split, records] : splits) {
      ImageLoader loader(p.dir.path() / "out", split, 1, /*shuffle=*/false);
      std::vector<uint8_t> px(16 * records.size());
      std::vector<CaptionTokens> captions;
      loader.next_pairs(px.data(), captions, static_cast<int>(records.size()));
      for (size_t i = 0; i < records.size(); ++i) {
        CaptionTokens want = tokenize_llava(*p.tok, parse_llava_record(records[i]));
        if (static_cast<int>(want.ids.size()) > slots) {  // cut: the image at the end at most
          want.ids.resize(static_cast<size_t>(slots));
          want.in_loss.resize(static_cast<size_t>(slots));
          want.image_at = std::min<int64_t>(want.image_at, slots);
        }
        EXPECT_EQ(captions[i].ids, want.ids) << split << " " << i;
        EXPECT_EQ(captions[i].in_loss, want.in_loss) << split << " " << i;
        EXPECT_EQ(captions[i].image_at, want.image_at) << split << " " << i;
        const std::string image = records[i].value("image", "");
        const int level = image == "a.png" ? 10 : image == "b.png" ? 20 : 0;
        EXPECT_EQ(px[16 * i + 15], level) << split << " " << i;
      }
      uint8_t one[16];
      int32_t label = 0;
      EXPECT_THROW(loader.next_batch(one, &label, 1), kiln::Error);  // pairs have no labels
    }
  }
}

// SentencePiece trained on a pair file's conversations as the model reads them: the
// repeated system sentence and role markers become few pieces; text round-trips; a file
// of bad records only is an error. read_image_as resizes as prepare does.
TEST(Pairs, TokenizerTrainedOnTheConversations) {
  Pairs p;
  std::vector<json> records;
  for (int i = 0; i < 200; ++i)
    records.push_back(record(fmt::format("r{}", i), i % 2 ? "a.png" : "b.png",
                             fmt::format("A {} with {} stripes.", i % 3 ? "coat" : "bag", i % 7)));
  p.write_lines("many.jsonl", records);
  SentencePieceTrainOptions so;
  so.vocab_size = 600;
  const auto tok = train_pairs_tokenizer(p.dir.path() / "many.jsonl", so);
  EXPECT_EQ(tok->kind(), "sentencepiece");
  const std::string system = std::string(kLlavaSystem) + " ";
  EXPECT_LT(tok->encode(system).size(), system.size() / 2);
  const CaptionTokens t = tokenize_llava(*tok, parse_llava_record(records[5]));
  std::vector<int32_t> text;
  for (size_t i = 0; i < t.ids.size(); ++i)
    if (t.ids[i] != tok->eot_id()) text.push_back(t.ids[i]);
  EXPECT_EQ(tok->decode(text), system + "USER: \nWhat? ASSISTANT: A coat with 5 stripes.");
  p.write_lines("bad.jsonl", {json{{"id", "x"}}});
  EXPECT_THROW(train_pairs_tokenizer(p.dir.path() / "bad.jsonl", so), kiln::Error);
  // An image as a 2x2 model takes it: the 4x4 gray image averaged; a missing one names itself.
  EXPECT_EQ(read_image_as(p.dir.path() / "a.png", {2, 2, 1}), std::vector<uint8_t>(4, 10));
  EXPECT_EQ(read_image_as(p.dir.path() / "a.png", {4, 4, 3}), std::vector<uint8_t>(48, 10));
  try {
    read_image_as(p.dir.path() / "none.png", {2, 2, 1});
    ADD_FAILURE() << "a missing image was read";
  } catch (const kiln::Error& e) {
    EXPECT_NE(std::string(e.what()).find("none.png: no such image file"), std::string::npos);
  }
}

TEST(Pairs, BilinearResizeAsPillow) {
  // By hand (the header's kernel): 4 -> 2 averages each footprint with weights 3/4, 3/4,
  // 1/4 (over 7/4); 2 -> 4 interpolates, the edges clamped.
  EXPECT_EQ(resize_bilinear({0, 40, 80, 120}, {1, 4, 1}, 1, 2), (std::vector<uint8_t>{29, 91}));
  EXPECT_EQ(resize_bilinear({0, 255}, {1, 2, 1}, 1, 4), (std::vector<uint8_t>{0, 64, 191, 255}));
  EXPECT_EQ(resize_bilinear({0, 255}, {2, 1, 1}, 4, 1), (std::vector<uint8_t>{0, 64, 191, 255}));
  // Channels apart: an RGB ramp resized is each channel's ramp resized.
  const std::vector<uint8_t> rgb = {0, 100, 200, 40, 110, 210, 80, 120, 220, 120, 130, 230};
  EXPECT_EQ(resize_bilinear(rgb, {1, 4, 3}, 1, 2),
            (std::vector<uint8_t>{29, 107, 207, 91, 123, 223}));
  // Constant stays constant, in both directions and odd sizes; the same size is a copy.
  for (const auto& [h, w] : {std::pair{3, 5}, {11, 2}, {7, 7}})
    EXPECT_EQ(resize_bilinear(std::vector<uint8_t>(35, 77), {5, 7, 1}, h, w),
              std::vector<uint8_t>(static_cast<size_t>(h * w), 77));
  EXPECT_EQ(resize_bilinear(rgb, {2, 2, 3}, 2, 2), rgb);
  EXPECT_THROW(resize_bilinear(rgb, {2, 2, 1}, 2, 2), kiln::Error);
}

TEST(Pairs, ImageSizeResizesEveryImage) {
  Pairs p;
  write_png(p.dir.path() / "b.png", {6, 2, 1}, std::vector<uint8_t>(12, 20));  // another size
  PreparePairsOptions o = p.options();
  o.image_height = 3, o.image_width = 5;
  prepare_pairs(o);
  const ImageDatasetMeta m = read_image_meta(p.dir.path() / "out");
  EXPECT_EQ(m.shape, (ImageShape{3, 5, 1}));
  ImageLoader loader(p.dir.path() / "out", "train", 1, false);
  std::vector<uint8_t> px(3 * 15);
  std::vector<CaptionTokens> captions;
  loader.next_pairs(px.data(), captions, 3);
  EXPECT_EQ(std::vector<uint8_t>(px.begin(), px.begin() + 15), std::vector<uint8_t>(15, 10));
  EXPECT_EQ(std::vector<uint8_t>(px.begin() + 30, px.end()), std::vector<uint8_t>(15, 20));
  o.out_dir = p.dir.path() / "bad";
  o.image_width = 0;
  EXPECT_NE(error_of(o).find("--image-size 3x0"), std::string::npos);
}

TEST(Pairs, ValFractionHoldsOutRecordsOfOneFile) {
  Pairs p;
  std::vector<json> records;
  for (int k = 0; k < 40; ++k)
    records.push_back(record(fmt::format("r{}", k), "a.png", fmt::format("R{}.", k)));
  p.write_lines("train.jsonl", records);
  auto run = [&](const std::string& out) {
    PreparePairsOptions o = p.options(out);
    o.val_input.clear();
    o.val_fraction = 0.25;
    o.shard_images = 100;
    return prepare_pairs(o).meta;
  };
  const ImageDatasetMeta a = run("a"), b = run("b");
  const int64_t val = a.images("val");
  EXPECT_EQ(a.images("train") + val, 40);
  EXPECT_GE(val, 3);
  EXPECT_LE(val, 20);
  EXPECT_EQ(a.splits.at("val")[0].crc32, b.splits.at("val")[0].crc32);  // the same records
  EXPECT_EQ(a.splits.at("train")[0].crc32, b.splits.at("train")[0].crc32);
  PreparePairsOptions both = p.options("c");
  both.val_fraction = 0.1;
  EXPECT_NE(error_of(both).find("not with --val-input"), std::string::npos);
}

TEST(Pairs, BadInputIsOneErrorNamingTheRecordOrSkipped) {
  Pairs p;
  const std::string train = (p.dir.path() / "train.jsonl").string();
  json no_turns = record("t9", "a.png", "A.");
  no_turns.erase("conversations");
  p.write_lines("train.jsonl", {record("t0", "a.png", "A."), no_turns, record("t2", "b.png", "B.")});
  EXPECT_EQ(error_of(p.options()), train + ":2 (id t9): no \"conversations\" list (--skip-bad "
                                   "skips such records)");
  PreparePairsOptions skip = p.options();
  skip.skip_bad = true;
  const PreparePairsSummary s = prepare_pairs(skip);
  EXPECT_EQ(s.skipped, 1);
  EXPECT_EQ(s.meta.images("train"), 2);
  ASSERT_EQ(s.skipped_examples.size(), 1u);
  EXPECT_EQ(s.skipped_examples[0], train + ":2 (id t9): no \"conversations\" list");

  p.write_lines("train.jsonl", {record("t0", "a.png", "A."), record("t1", "gone.png", "G.")});
  EXPECT_NE(error_of(p.options("o1")).find(train + ":2 (id t1): image 'gone.png' ("), std::string::npos);
  write_png(p.dir.path() / "big.png", {5, 4, 1}, std::vector<uint8_t>(20, 1));
  p.write_lines("train.jsonl", {record("t0", "a.png", "A."), record("t1", "big.png", "G.")});
  EXPECT_NE(error_of(p.options("o2")).find("is 5x4, the dataset's are 4x4 (--image-size resizes them)"),
            std::string::npos);
  p.write_lines("train.jsonl", {record("t1", "", "Text only.")});
  EXPECT_NE(error_of(p.options("o3")).find("no record has an image"), std::string::npos);
  // No image readable (paths relative to another folder): the first record named.
  p.write_lines("train.jsonl", {record("t0", "sub/a.png", "A.")});
  EXPECT_NE(error_of(p.options("o5")).find(train + ":1 (id t0): no record's image can be read, "
                                           "e.g. image 'sub/a.png'"), std::string::npos);
  // A corrupt first image is that record's problem: skipped with skip_bad, the next sets
  // the shape.
  write_text(p.dir.path() / "bad.png", "not a png");
  p.write_lines("train.jsonl", {record("t0", "bad.png", "A."), record("t1", "b.png", "B.")});
  EXPECT_NE(error_of(p.options("o6")).find(train + ":1 (id t0): "), std::string::npos);
  PreparePairsOptions skip_corrupt = p.options("o7");
  skip_corrupt.skip_bad = true;
  EXPECT_EQ(prepare_pairs(skip_corrupt).skipped, 1);
  // --channels 3: a gray dataset stored as RGB.
  PreparePairsOptions rgb = p.options("o8");
  rgb.channels = 3;
  p.write_lines("train.jsonl", {record("t0", "a.png", "A.")});
  EXPECT_EQ(prepare_pairs(rgb).meta.shape, (ImageShape{4, 4, 3}));
  // Every record cut before its first answer: nothing to learn.
  PreparePairsOptions tiny = p.options("o9");
  tiny.caption_tokens = 16;
  EXPECT_NE(error_of(tiny).find("no record keeps an answer within --caption-tokens 16"),
            std::string::npos);

  // An empty folder given as --out: emptied again after a failure, not removed.
  fs::create_directories(p.dir.path() / "given");
  EXPECT_THROW(prepare_pairs(tiny_in(p, "given")), kiln::Error);
  EXPECT_TRUE(fs::is_directory(p.dir.path() / "given"));
  EXPECT_TRUE(fs::is_empty(p.dir.path() / "given"));
  fs::create_directories(p.dir.path() / "full");
  write_text(p.dir.path() / "full" / "x", "x");
  try {
    prepare_pairs(p.options("full"));
    ADD_FAILURE() << "wrote into a non-empty folder";
  } catch (const kiln::Error& e) {
    EXPECT_NE(std::string(e.what()).find("already exists and is not an empty folder"), std::string::npos);
  }
  PreparePairsOptions missing = p.options("o4");
  missing.val_input = p.dir.path() / "none.json";
  EXPECT_EQ(error_of(missing), (p.dir.path() / "none.json").string() + ": no such pair file");
}

}  // namespace
