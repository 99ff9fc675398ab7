#include "data/scenes.h"

#include "core/error.h"
#include "data/idx.h"
#include "data/image_folder.h"
#include "data/tokenizer.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <random>
#include <string>
#include <vector>

namespace kiln::data {

namespace fs = std::filesystem;

namespace {

constexpr int kSide = 28;  // a Fashion-MNIST item; the canvas is 2 x 2 of them
constexpr std::array<const char*, 4> kCells = {"top left", "top right", "bottom left",
                                               "bottom right"};
constexpr std::array<const char*, 5> kCounts = {"None.", "One.", "Two.", "Three.", "Four."};

// One split's items: images [n, 28, 28] and their labels.
struct Items {
  IdxArray images, labels;
  int64_t size() const { return labels.dims[0]; }
};

Items read_items(const fs::path& dir, const std::string& prefix) {
  const fs::path images = idx_file(dir, prefix + "-images-idx3-ubyte");
  const fs::path labels = idx_file(dir, prefix + "-labels-idx1-ubyte");
  Items s{read_idx(images), read_idx(labels)};
  KILN_CHECK(s.images.dims.size() == 3 && s.images.dims[1] == kSide && s.images.dims[2] == kSide,
             "{}: expected [n, 28, 28] Fashion-MNIST images", images.string());
  KILN_CHECK(s.labels.dims.size() == 1 && s.labels.dims[0] == s.images.dims[0],
             "{}: expected one label per image of {} ({})", labels.string(), images.string(),
             s.images.dims[0]);
  for (uint8_t l : s.labels.data)
    KILN_CHECK(l < 10, "{}: label {} (Fashion-MNIST's are 0..9)", labels.string(), int{l});
  return s;
}

std::string with_article(const std::string& noun) {
  const bool vowel = std::string("aeiou").find(noun[0]) != std::string::npos;
  return (vowel ? "an " : "a ") + noun;
}

std::string capitalised(std::string s) {
  if (!s.empty() && s[0] >= 'a' && s[0] <= 'z') s[0] = static_cast<char>(s[0] - 'a' + 'A');
  return s;
}

// A uniform draw from [0, n) (the modulo's bias is below 2^-50 here; unlike
// std::uniform_int_distribution, the same on every standard library).
int64_t uniform(std::mt19937_64& rng, int64_t n) { return static_cast<int64_t>(rng() % static_cast<uint64_t>(n)); }

// One scene: the class in each cell (-1: empty) and the item drawn for it.
struct Scene {
  std::array<int, 4> cls{-1, -1, -1, -1};
  std::array<int64_t, 4> item{-1, -1, -1, -1};
};

Scene draw_scene(std::mt19937_64& rng, const Items& items) {
  Scene s;
  std::array<int, 4> order = {0, 1, 2, 3};
  for (int i = 3; i > 0; --i) std::swap(order[i], order[uniform(rng, i + 1)]);  // Fisher-Yates
  const int k = 2 + static_cast<int>(uniform(rng, 3));
  for (int j = 0; j < k; ++j) {
    const int cell = order[j];
    s.item[cell] = uniform(rng, items.size());
    s.cls[cell] = items.labels.data[static_cast<size_t>(s.item[cell])];
  }
  return s;
}

std::vector<uint8_t> canvas(const Scene& s, const Items& items) {
  std::vector<uint8_t> px(static_cast<size_t>(4 * kSide * kSide), 0);
  for (int cell = 0; cell < 4; ++cell) {
    if (s.item[cell] < 0) continue;
    const uint8_t* src = items.images.data.data() + s.item[cell] * kSide * kSide;
    const int r0 = (cell / 2) * kSide, c0 = (cell % 2) * kSide;
    for (int r = 0; r < kSide; ++r)
      for (int c = 0; c < kSide; ++c)
        px[static_cast<size_t>((r0 + r) * 2 * kSide + c0 + c)] = src[r * kSide + c];
  }
  return px;
}

// A class to ask about that the conversation has not named yet (`named`, updated): with
// probability 1/2 one of the scene's items, else a class the scene lacks (the other kind
// when one kind has none left). Distinct classes keep each answer from being read off an
// earlier one ("Is there a bag?" "Yes." then "How many bags...").
int asked_class(std::mt19937_64& rng, const Scene& s, std::array<bool, 10>& named) {
  std::vector<int> present, absent;
  for (int c = 0; c < 10; ++c) {
    if (named[static_cast<size_t>(c)]) continue;
    const bool there = std::find(s.cls.begin(), s.cls.end(), c) != s.cls.end();
    (there ? present : absent).push_back(c);
  }
  const bool pick_present = absent.empty() || (!present.empty() && uniform(rng, 2) == 0);
  const std::vector<int>& pool = pick_present ? present : absent;
  const int c = pool[static_cast<size_t>(uniform(rng, static_cast<int64_t>(pool.size())))];
  named[static_cast<size_t>(c)] = true;
  return c;
}

std::string description(const Scene& s) {
  std::vector<std::string> parts;
  for (int cell = 0; cell < 4; ++cell)
    if (s.cls[cell] >= 0)
      parts.push_back(with_article(kFashionNames[s.cls[cell]]) + " in the " + kCells[cell]);
  std::string out = parts[0];
  for (size_t i = 1; i < parts.size(); ++i) out += (i + 1 == parts.size() ? " and " : ", ") + parts[i];
  return capitalised(out) + ".";
}

nlohmann::json conversation(std::mt19937_64& rng, const Scene& s) {
  nlohmann::json turns = nlohmann::json::array();
  auto round = [&](const std::string& q, const std::string& a) {
    turns.push_back({{"from", "human"}, {"value", q}});
    turns.push_back({{"from", "gpt"}, {"value", a}});
  };
  const int cell = static_cast<int>(uniform(rng, 4));
  round(fmt::format("<image>\nWhat is in the {}?", kCells[cell]),
        s.cls[cell] < 0 ? "Nothing." : capitalised(with_article(kFashionNames[s.cls[cell]])) + ".");
  std::array<bool, 10> named{};
  if (s.cls[cell] >= 0) named[static_cast<size_t>(s.cls[cell])] = true;
  for (int pair = 0; pair < 2; ++pair) {
    const int sought = asked_class(rng, s, named);
    const bool there = std::find(s.cls.begin(), s.cls.end(), sought) != s.cls.end();
    round(fmt::format("Is there {}?", with_article(kFashionNames[sought])), there ? "Yes." : "No.");
    const int counted = asked_class(rng, s, named);
    round(fmt::format("How many {} are there?", kFashionPlurals[counted]),
          kCounts[static_cast<size_t>(std::count(s.cls.begin(), s.cls.end(), counted))]);
  }
  round("Describe the image.", description(s));
  return turns;
}

void write_split(const SceneOptions& o, const std::string& split, const Items& items, int64_t count) {
  const fs::path dir = o.out / "images" / split;
  fs::create_directories(dir);
  std::string jsonl;
  for (int64_t i = 0; i < count; ++i) {
    std::seed_seq seq{static_cast<uint32_t>(o.seed), static_cast<uint32_t>(o.seed >> 32),
                      static_cast<uint32_t>(split == "train" ? 0 : 1), static_cast<uint32_t>(i),
                      static_cast<uint32_t>(static_cast<uint64_t>(i) >> 32)};
    std::mt19937_64 rng(seq);
    const Scene s = draw_scene(rng, items);
    const std::string image = fmt::format("images/{}/{:06d}.png", split, i);
    write_png(o.out / image, ImageShape{2 * kSide, 2 * kSide, 1}, canvas(s, items));
    const nlohmann::json record = {
        {"id", fmt::format("{}-{:06d}", split, i)}, {"image", image},
        {"conversations", conversation(rng, s)},
        {"kinds", {"position", "presence", "count", "presence", "count", "describe"}}, {"cells", s.cls}};
    jsonl += record.dump() + "\n";
  }
  write_file_atomic(o.out / (split + ".jsonl"), jsonl);
}

}  // namespace

void write_scenes(const SceneOptions& options) {
  KILN_CHECK(options.train >= 0 && options.val >= 0, "kiln scenes: scene counts must be >= 0");
  for (const char* mine : {"train.jsonl", "val.jsonl", "images"})
    KILN_CHECK(!fs::exists(options.out / mine), "{}: already holds scenes ({}): remove them first",
               options.out.string(), mine);
  const Items train = read_items(options.fashion_mnist, "train");
  const Items val = read_items(options.fashion_mnist, "t10k");
  write_split(options, "train", train, options.train);
  write_split(options, "val", val, options.val);
}

}  // namespace kiln::data
