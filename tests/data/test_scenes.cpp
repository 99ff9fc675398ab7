// The Fashion-MNIST scene set (data/scenes.h) from small IDX files whose every item is one
// gray level (so a cell's pixels say which item, and from which split, sits there):
//   - each record is a valid LLaVA pair; its PNG is the 2x2 canvas its "cells" say, each
//     item from its own split (val scenes only t10k items), empty cells black;
//   - every answer agrees with the canvas (position, presence, count, description), no
//     question asks about a class named before it, and both answers of presence and count
//     (none / some) are common;
//   - 2, 3 and 4 items all occur; the set is reproducible byte for byte, a longer set
//     extends a shorter one, another seed gives other scenes;
//   - a missing IDX file is a one-line error naming it.
#include "core/error.h"
#include "data/idx.h"
#include "data/image_folder.h"
#include "data/llava.h"
#include "data/scenes.h"
#include "test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <set>
#include <sstream>
#include <string>

using namespace kiln::data;
using kiln::data::testing::read_text;
using kiln::data::testing::TempDir;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

constexpr int kTrainItems = 12, kValItems = 6;

// Item j of a split is all one gray level: 1 + j (train) or 101 + j (t10k); its label is
// (3 j + 1) mod 10.
int level(bool val, int j) { return (val ? 101 : 1) + j; }
int label(int j) { return (3 * j + 1) % 10; }

void write_split(const fs::path& dir, const std::string& prefix, bool val, int n) {
  IdxArray images{{n, 28, 28}, {}}, labels{{n}, {}};
  for (int j = 0; j < n; ++j) {
    images.data.insert(images.data.end(), 28 * 28, static_cast<uint8_t>(level(val, j)));
    labels.data.push_back(static_cast<uint8_t>(label(j)));
  }
  write_idx(dir / (prefix + "-images-idx3-ubyte"), images);
  write_idx(dir / (prefix + "-labels-idx1-ubyte"), labels);
}

struct FakeFashionMnist {
  TempDir dir;
  FakeFashionMnist() {
    write_split(dir.path(), "train", false, kTrainItems);
    write_split(dir.path(), "t10k", true, kValItems);
  }
};

std::vector<json> records(const fs::path& jsonl) {
  std::vector<json> out;
  std::istringstream in(read_text(jsonl));
  for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
  return out;
}

const char* const kCells[4] = {"top left", "top right", "bottom left", "bottom right"};

TEST(Scenes, CanvasAndAnswersAgree) {
  FakeFashionMnist fm;
  TempDir out;
  write_scenes({fm.dir.path(), out.path(), 60, 20, 7});
  std::set<int> sizes;
  int presence_yes = 0, presence_asked = 0, count_some = 0, count_asked = 0;
  for (const std::string split : {"train", "val"}) {
    const bool val = split == "val";
    const auto recs = records(out.path() / (split + ".jsonl"));
    ASSERT_EQ(recs.size(), val ? 20u : 60u);
    for (const json& r : recs) {
      const LlavaRecord parsed = parse_llava_record(r);
      ASSERT_EQ(parsed.error, "") << r.dump();
      ImageShape shape;
      const auto px = read_png(out.path() / parsed.image, 1, &shape);
      ASSERT_EQ(shape, (ImageShape{56, 56, 1}));
      const std::vector<int> cells = r["cells"].get<std::vector<int>>();
      int items = 0;
      for (int c = 0; c < 4; ++c) {
        // The cell's item: its gray level names it; its label must be the cell's class.
        const int r0 = (c / 2) * 28, c0 = (c % 2) * 28;
        const int v = px[static_cast<size_t>(r0 * 56 + c0)];
        for (int y = 0; y < 28; ++y)
          for (int x = 0; x < 28; ++x)
            ASSERT_EQ(px[static_cast<size_t>((r0 + y) * 56 + c0 + x)], v) << parsed.image;
        if (cells[static_cast<size_t>(c)] < 0) {
          EXPECT_EQ(v, 0) << parsed.image << " cell " << c;
          continue;
        }
        ++items;
        const int j = v - level(val, 0);
        ASSERT_TRUE(j >= 0 && j < (val ? kValItems : kTrainItems)) << "item from the other split";
        EXPECT_EQ(label(j), cells[static_cast<size_t>(c)]);
      }
      sizes.insert(items);
      // The answers, from the cells.
      const auto& m = parsed.messages;
      ASSERT_EQ(m.size(), 12u);
      EXPECT_EQ(r["kinds"], json({"position", "presence", "count", "presence", "count", "describe"}));
      int named = -1;  // the class the position answer names
      for (int c = 0; c < 4; ++c) {
        if (m[0].content != std::string("<image>\nWhat is in the ") + kCells[c] + "?") continue;
        const int k = cells[static_cast<size_t>(c)];
        std::string want = k < 0 ? "Nothing." : std::string(k == 9 ? "An " : "A ") + kFashionNames[k] + ".";
        EXPECT_EQ(m[1].content, want);
        named = k;
      }
      std::set<int> asked;  // presence and count each ask about a class not named before
      if (named >= 0) asked.insert(named);
      const char* words[5] = {"None.", "One.", "Two.", "Three.", "Four."};
      for (size_t turn = 2; turn < 10; turn += 2) {
        int k_asked = -1;
        const bool presence = turn == 2 || turn == 6;
        for (int k = 0; k < 10; ++k) {
          const std::string article = k == 9 ? "an " : "a ";
          const std::string q = presence ? "Is there " + article + kFashionNames[k] + "?"
                                         : std::string("How many ") + kFashionPlurals[k] + " are there?";
          if (m[turn].content == q) k_asked = k;
        }
        ASSERT_GE(k_asked, 0) << m[turn].content;
        EXPECT_TRUE(asked.insert(k_asked).second) << m[turn].content << " asks a class named before";
        const auto n = std::count(cells.begin(), cells.end(), k_asked);
        EXPECT_EQ(m[turn + 1].content, presence ? (n > 0 ? "Yes." : "No.") : words[n]);
        (presence ? presence_yes : count_some) += n > 0 ? 1 : 0;
        (presence ? presence_asked : count_asked) += 1;
      }
      EXPECT_EQ(m[10].content, "Describe the image.");
      size_t at = 0;  // each item named with its cell, in reading order
      for (int c = 0; c < 4; ++c) {
        if (cells[static_cast<size_t>(c)] < 0) continue;
        const std::string part = std::string(kFashionNames[cells[static_cast<size_t>(c)]]) + " in the " + kCells[c];
        const size_t found = m[11].content.find(part, at);
        ASSERT_NE(found, std::string::npos) << m[11].content << " lacks " << part;
        at = found + part.size();
      }
      EXPECT_EQ(m[11].content.back(), '.');
    }
  }
  EXPECT_EQ(sizes, (std::set<int>{2, 3, 4}));
  // Both answers of each kind occur often (a present class is asked with probability 1/2
  // while one is left to ask).
  EXPECT_GT(presence_yes, presence_asked / 4);
  EXPECT_LT(presence_yes, presence_asked * 3 / 4);
  EXPECT_GT(count_some, count_asked / 5);
  EXPECT_LT(count_some, count_asked * 3 / 4);
}

TEST(Scenes, ReproducibleAndExtensible) {
  FakeFashionMnist fm;
  TempDir a, b, c, d;
  write_scenes({fm.dir.path(), a.path(), 30, 5, 11});
  write_scenes({fm.dir.path(), b.path(), 30, 5, 11});
  write_scenes({fm.dir.path(), c.path(), 40, 5, 11});
  write_scenes({fm.dir.path(), d.path(), 30, 5, 12});
  const std::string ta = read_text(a.path() / "train.jsonl");
  EXPECT_EQ(ta, read_text(b.path() / "train.jsonl"));
  EXPECT_EQ(read_text(a.path() / "images/train/000029.png"),
            read_text(b.path() / "images/train/000029.png"));
  EXPECT_EQ(read_text(c.path() / "train.jsonl").substr(0, ta.size()), ta);  // extends
  EXPECT_NE(read_text(d.path() / "train.jsonl"), ta);
  EXPECT_EQ(read_text(a.path() / "val.jsonl"), read_text(c.path() / "val.jsonl"));
}

TEST(Scenes, EnglishOfTheClasses) {
  // Articles and plurals as the texts use them (not derived: "pairs of trousers").
  FakeFashionMnist fm;
  TempDir out;
  write_scenes({fm.dir.path(), out.path(), 200, 0, 5});
  const std::string text = read_text(out.path() / "train.jsonl");
  for (const char* phrase : {"A pair of trousers.", "How many pairs of trousers are there?",
                             "Is there an ankle boot?", "How many dresses are there?"})
    EXPECT_NE(text.find(phrase), std::string::npos) << phrase;
  EXPECT_EQ(text.find("a trouser"), std::string::npos);
  EXPECT_THROW(write_scenes({fm.dir.path(), out.path(), 10, 0, 5}), kiln::Error);  // stale
}

TEST(Scenes, MissingIdxIsAnError) {
  TempDir empty, out;
  try {
    write_scenes({empty.path(), out.path(), 1, 1, 0});
    FAIL() << "no error";
  } catch (const kiln::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find((empty.path() / "train-images-idx3-ubyte").string()), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
}

}  // namespace
