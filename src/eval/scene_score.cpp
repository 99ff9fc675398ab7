#include "eval/scene_score.h"

#include "core/error.h"
#include "models/capabilities.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <fstream>

namespace kiln {

std::vector<SceneRecord> read_scene_records(const std::filesystem::path& path, int64_t max_records) {
  std::ifstream in(path);
  KILN_CHECK(in, "{}: cannot read (a kiln scenes JSONL)", path.string());
  std::vector<SceneRecord> out;
  std::string line;
  for (int64_t n = 1; std::getline(in, line) && (max_records <= 0 || static_cast<int64_t>(out.size()) < max_records); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = fmt::format("{}:{}", path.string(), n);
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    KILN_CHECK(j.is_object() && j.contains("cells") && j["cells"].is_array() &&
                   j["cells"].size() == 4 && j.contains("conversations") && j["conversations"].is_array(),
               "{}: not a kiln scenes record (\"cells\" of 4 and \"conversations\")", where);
    SceneRecord r;
    for (size_t c = 0; c < 4; ++c) {
      KILN_CHECK(j["cells"][c].is_number_integer() && j["cells"][c].get<int>() >= -1 &&
                     j["cells"][c].get<int>() <= 9,
                 "{}: cell {} is not a class in [-1, 9]", where, c);
      r.cells[c] = j["cells"][c].get<int>();
    }
    // The caption is the last answer (what a text-to-image model trains on), the answer
    // to "Describe the image.".
    const auto& turns = j["conversations"];
    const size_t n_turns = turns.size();
    auto text = [&](size_t i, const char* from) -> std::string {
      const auto& t = turns[i];
      if (!t.is_object() || t.value("from", "") != from || !t.contains("value") ||
          !t["value"].is_string())
        return "";
      return t["value"].get<std::string>();
    };
    KILN_CHECK(n_turns >= 2 && text(n_turns - 2, "human").ends_with(kDescribeQuestion) &&
                   !text(n_turns - 1, "gpt").empty(),
               "{}: the last round is not \"{}\" and its answer (the caption scored)", where,
               kDescribeQuestion);
    r.caption = text(n_turns - 1, "gpt");
    KILN_CHECK(j.contains("image") && j["image"].is_string(), "{}: no \"image\" path", where);
    r.image = j["image"].get<std::string>();
    r.line = n;
    out.push_back(std::move(r));
  }
  KILN_CHECK(!out.empty(), "{}: no scene record", path.string());
  return out;
}

void SceneTally::add(const SceneTally& o) {
  canvases += o.canvases;
  canvases_right += o.canvases_right;
  cells += o.cells;
  cells_right += o.cells_right;
}

std::vector<std::array<int, 4>> read_canvases(Model& model, const data::ImageShape& shape,
                                              std::span<const uint8_t> pixels, double empty_below,
                                              int batch) {
  ImageClassifier& classifier = as_image_classifier(model, "score-scenes");
  const Shape cell = classifier.image_shape();
  const int64_t S = cell[0];
  KILN_CHECK(cell[1] == S && cell[2] == 1 && shape.height == 2 * S && shape.width == 2 * S &&
                 shape.channels == 1,
             "score-scenes: canvases of {}x{}x{} do not hold 2x2 cells of the classifier's {}x{}x{}",
             shape.height, shape.width, shape.channels, cell[0], cell[1], cell[2]);
  const int64_t n = static_cast<int64_t>(pixels.size()) / shape.pixels();
  std::vector<std::array<int, 4>> out(static_cast<size_t>(n));
  // The non-empty cells, as (canvas, cell) and their pixels scaled to [-1, 1].
  std::vector<std::pair<int64_t, int>> items;
  std::vector<float> cells;
  for (int64_t i = 0; i < n; ++i)
    for (int c = 0; c < 4; ++c) {
      // The cell's pixels go to `cells` and come off again when it reads as empty.
      const uint8_t* canvas = pixels.data() + i * shape.pixels();
      const int64_t y0 = (c / 2) * S, x0 = (c % 2) * S;
      double sum = 0;
      for (int64_t y = 0; y < S; ++y)
        for (int64_t x = 0; x < S; ++x) {
          const uint8_t p = canvas[(y0 + y) * shape.width + x0 + x];
          sum += p;
          cells.push_back(static_cast<float>(p) / 127.5f - 1.f);
        }
      out[static_cast<size_t>(i)][c] = -1;
      if (sum / static_cast<double>(S * S) < empty_below) {
        cells.resize(cells.size() - static_cast<size_t>(S * S));
        continue;
      }
      items.emplace_back(i, c);
    }
  Backend& be = model.backend();
  const int K = classifier.num_classes();
  const Tensor image_buf = be.empty(Shape{batch, S, S, 1}, DType::F32, MemCategory::Activations);
  const Tensor logit_buf = be.empty(Shape{batch, K}, DType::F32, MemCategory::Activations);
  for (size_t first = 0; first < items.size(); first += static_cast<size_t>(batch)) {
    const auto B = static_cast<int64_t>(std::min<size_t>(static_cast<size_t>(batch), items.size() - first));
    const Tensor images = image_buf.view_at(0, Shape{B, S, S, 1});
    const Tensor logits = logit_buf.view_at(0, Shape{B, K});
    be.copy_from_host(be.default_stream(), images, cells.data() + first * static_cast<size_t>(S * S));
    classifier.classify(images, logits);
    const std::vector<float> l = download_f32(be, logits);
    for (int64_t b = 0; b < B; ++b) {
      const float* row = l.data() + b * K;
      const auto [i, c] = items[first + static_cast<size_t>(b)];
      out[static_cast<size_t>(i)][c] = static_cast<int>(std::max_element(row, row + K) - row);
    }
  }
  return out;
}

SceneTally tally_scenes(std::span<const std::array<int, 4>> read,
                        std::span<const std::array<int, 4>> expected) {
  KILN_CHECK(read.size() == expected.size(), "score-scenes: {} canvases read, {} expected",
             read.size(), expected.size());
  SceneTally t;
  for (size_t i = 0; i < read.size(); ++i) {
    int right = 0;
    for (int c = 0; c < 4; ++c) right += read[i][c] == expected[i][c];
    t.canvases += 1;
    t.canvases_right += right == 4;
    t.cells += 4;
    t.cells_right += right;
  }
  return t;
}

}  // namespace kiln
