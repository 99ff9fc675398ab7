// kiln score-scenes' reading of canvases (eval/scene_score.h) with a tiny random ViT: an
// empty cell (mean pixel below the threshold) reads -1 without the classifier, any other
// cell reads the classifier's own top class of that cell alone, in reading order; the
// tally counts cells and whole canvases; bad scene records are one-line errors naming
// FILE:LINE.
#include "eval/scene_score.h"

#include "backend/registry.h"
#include "models/registry.h"
#include "support/error_of.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>

namespace kiln {
namespace {

std::unique_ptr<Model> tiny_vit(Backend& be) {
  ModelOptions o;
  o.arch = "vit";
  o.n_layer = 1;
  o.n_head = 2;
  o.n_embd = 16;
  o.block_size = 5;  // 4 patches and the class token
  o.family = {{"image_size", 8}, {"num_channels", 1}, {"patch_size", 4}, {"num_classes", 5}};
  auto m = make_model(o, be);  // parameters allocated by default
  m->init_weights(3);
  return m;
}

// The ViT's top class of one 8x8 cell of `canvas` [16, 16].
int top_class(Model& vit, const std::vector<uint8_t>& canvas, int cell) {
  Backend& be = vit.backend();
  std::vector<float> px(64);
  for (int y = 0; y < 8; ++y)
    for (int x = 0; x < 8; ++x)
      px[y * 8 + x] = canvas[(8 * (cell / 2) + y) * 16 + 8 * (cell % 2) + x] / 127.5f - 1.f;
  const Tensor images = be.empty(Shape{1, 8, 8, 1}, DType::F32, MemCategory::Activations);
  const Tensor logits = be.empty(Shape{1, 5}, DType::F32, MemCategory::Activations);
  be.copy_from_host(be.default_stream(), images, px.data());
  vit.image_classifier()->classify(images, logits);
  const auto l = download_f32(be, logits);
  return static_cast<int>(std::max_element(l.begin(), l.end()) - l.begin());
}

TEST(SceneScore, CellsReadAsEmptyOrAsTheClassifiersTopClass) {
  auto be = make_backend("cpu");
  auto vit = tiny_vit(*be);
  std::mt19937 rng(5);
  const data::ImageShape shape{16, 16, 1};
  std::vector<uint8_t> pixels;
  std::vector<std::vector<uint8_t>> canvases;
  for (int i = 0; i < 3; ++i) {
    std::vector<uint8_t> c(256, 0);
    for (int y = 0; y < 16; ++y)
      for (int x = 0; x < 16; ++x) {
        const int cell = (y / 8) * 2 + x / 8;
        const bool empty = (cell + i) % 3 == 0;  // some cells empty
        c[y * 16 + x] = empty ? static_cast<uint8_t>(rng() % 20) : static_cast<uint8_t>(rng() % 256);
      }
    pixels.insert(pixels.end(), c.begin(), c.end());
    canvases.push_back(c);
  }
  const auto read = read_canvases(*vit, shape, pixels, /*empty_below=*/16.0, /*batch=*/2);
  ASSERT_EQ(read.size(), 3u);
  for (int i = 0; i < 3; ++i)
    for (int c = 0; c < 4; ++c) {
      if ((c + i) % 3 == 0) {
        EXPECT_EQ(read[i][c], -1) << "canvas " << i << " cell " << c;
      } else {
        EXPECT_EQ(read[i][c], top_class(*vit, canvases[i], c)) << "canvas " << i << " cell " << c;
      }
    }
  // The tally: canvas 0 exactly as read, canvas 1 one cell off, canvas 2 all off.
  std::vector<std::array<int, 4>> expected = read;
  expected[1][3] = expected[1][3] == 4 ? 3 : 4;
  for (int& v : expected[2]) v = v == 4 ? 3 : 4;
  const SceneTally t = tally_scenes(read, expected);
  EXPECT_EQ(t.canvases, 3);
  EXPECT_EQ(t.canvases_right, 1);
  EXPECT_EQ(t.cells, 12);
  EXPECT_EQ(t.cells_right, 7);
  // Canvases that are not 2x2 cells of the classifier's images.
  EXPECT_NE(testing::error_of([&] {
              read_canvases(*vit, data::ImageShape{8, 8, 1}, std::span(pixels).first(64), 16, 2);
            }).find("do not hold 2x2 cells of the classifier's 8x8x1"),
            std::string::npos);
}

TEST(SceneScore, BadRecordsNameTheirLine) {
  const auto path = std::filesystem::temp_directory_path() / "kiln_scene_score_test.jsonl";
  auto write = [&](const std::string& text) { std::ofstream(path) << text; };
  const std::string good =
      R"({"image":"images/val/0.png","cells":[5,-1,8,-1],"conversations":[{"from":"human","value":"<image>\nDescribe the image."},{"from":"gpt","value":"A sandal in the top left and a bag in the bottom left."}]})";
  write(good + "\n\n" + good + "\n");
  const auto records = read_scene_records(path, 0);
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0].caption, "A sandal in the top left and a bag in the bottom left.");
  EXPECT_EQ(records[0].cells, (std::array<int, 4>{5, -1, 8, -1}));
  EXPECT_EQ(records[0].image, "images/val/0.png");
  EXPECT_EQ(records[0].line, 1);
  EXPECT_EQ(records[1].line, 3);
  EXPECT_EQ(read_scene_records(path, 1).size(), 1u);
  write(good + "\n" + R"({"cells":[5,-1,8],"conversations":[]})" + "\n");
  EXPECT_NE(testing::error_of([&] { read_scene_records(path, 0); }).find(":2: not a kiln scenes record"),
            std::string::npos);
  write(R"({"cells":[5,-1,8,12],"conversations":[{"from":"gpt","value":"x"}]})" "\n");
  EXPECT_NE(testing::error_of([&] { read_scene_records(path, 0); }).find(":1: cell 3 is not a class"),
            std::string::npos);
  write(R"({"cells":[5,-1,8,1],"conversations":[{"from":"human","value":"x"}]})" "\n");
  EXPECT_NE(testing::error_of([&] { read_scene_records(path, 0); })
                .find(":1: the last round is not \"Describe the image.\""),
            std::string::npos);
  // A record whose last round asks something else: its answer ("Yes.") is no caption.
  write(R"({"image":"a.png","cells":[5,-1,8,1],"conversations":[{"from":"human","value":"<image>\nDescribe the image."},{"from":"gpt","value":"A sandal."},{"from":"human","value":"Is there a bag?"},{"from":"gpt","value":"Yes."}]})" "\n");
  EXPECT_NE(testing::error_of([&] { read_scene_records(path, 0); })
                .find(":1: the last round is not \"Describe the image.\""),
            std::string::npos);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace kiln
