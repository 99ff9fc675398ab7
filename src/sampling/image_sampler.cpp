#include "sampling/image_sampler.h"

#include "checkpoint/file_util.h"
#include "core/error.h"
#include "core/rng.h"
#include "data/image_dataset.h"
#include "data/image_folder.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace kiln {

namespace fs = std::filesystem;

namespace {

constexpr uint64_t kSampleNoiseStream = (uint64_t{0xD17} << 32) + 64;

uint8_t to_pixel(float x) {
  const float v = std::round((std::clamp(x, -1.f, 1.f) + 1.f) * 127.5f);
  return static_cast<uint8_t>(v);
}

// Throws kiln::Error for rows the flow model cannot be conditioned on (see the header).
void check_rows(const FlowModel& flow, const ImageSampleOptions& o) {
  KILN_CHECK(o.classes.empty() || o.captions.empty(),
             "sample-images: rows of classes and of captions at once");
  if (flow.caption_tokens() > 0) {
    KILN_CHECK(o.classes.empty() && !o.captions.empty(), "sample-images: the model is "
               "conditioned on text: give prompts (--prompt, --prompts), not classes");
    for (size_t r = 0; r < o.captions.size(); ++r)
      KILN_CHECK(static_cast<int>(o.captions[r].size()) <= flow.caption_tokens(),
                 "sample-images: prompt {} is {} tokens, more than the model's {} "
                 "(model.caption_tokens)", r + 1, o.captions[r].size(), flow.caption_tokens());
    return;
  }
  KILN_CHECK(o.captions.empty(), "sample-images: the model is conditioned on classes, not text "
             "(give --classes)");
  KILN_CHECK(!o.classes.empty(), "sample-images: no classes to sample");
  for (int c : o.classes)
    KILN_CHECK(c >= 0 && c < flow.num_classes(), "sample-images: class {} is outside the "
               "model's [0, {})", c, flow.num_classes());
}

// The conditioning of B samples (labels[first..]) and, with guidance, B null rows after them.
struct RowConditions {
  std::vector<int32_t> labels;
  std::vector<std::vector<int32_t>> captions;
  FlowConditioning of(const ImageSampleOptions& o, std::span<const int32_t> rows, bool guided) {
    const size_t n = rows.size() * (guided ? 2 : 1);
    if (!o.captions.empty()) {
      captions.assign(n, {});  // rows B.. (guidance): the empty caption
      for (size_t b = 0; b < rows.size(); ++b) captions[b] = o.captions[static_cast<size_t>(rows[b])];
      return FlowConditioning{{}, captions};
    }
    labels.assign(n, -1);  // rows B.. (guidance): the null class
    std::copy(rows.begin(), rows.end(), labels.begin());
    return FlowConditioning{labels, {}};
  }
};

// t_k of the grid: shift u / (1 + (shift - 1) u), u = 1 - k / steps.
float shifted_time(const ImageSampleOptions& o, int k) {
  const double u = 1.0 - static_cast<double>(k) / o.steps;
  return static_cast<float>(o.shift * u / (1.0 + (o.shift - 1.0) * u));
}

}  // namespace

SampledImages sample_images(Model& model, const ImageSampleOptions& o) {
  KILN_CHECK(o.steps >= 1, "sample-images: --steps must be at least 1 (got {})", o.steps);
  KILN_CHECK(o.per_row >= 1, "sample-images: --per-row must be at least 1 (got {})", o.per_row);
  KILN_CHECK(std::isfinite(o.cfg_scale), "sample-images: --cfg-scale must be finite (got {})",
             o.cfg_scale);
  KILN_CHECK(std::isfinite(o.shift) && o.shift > 0, "sample-images: --shift must be positive "
             "(got {})", o.shift);
  FlowModel& flow = as_flow_model(model, "sample-images");
  check_rows(flow, o);
  const Shape image = flow.image_shape();
  SampledImages out;
  out.shape = {static_cast<int>(image[0]), static_cast<int>(image[1]), static_cast<int>(image[2])};
  const int64_t P = out.shape.pixels();
  const auto n_rows = static_cast<int32_t>(o.captions.empty() ? o.classes.size() : o.captions.size());
  for (int32_t r = 0; r < n_rows; ++r)
    out.labels.insert(out.labels.end(), static_cast<size_t>(o.per_row),
                      o.captions.empty() ? o.classes[static_cast<size_t>(r)] : r);
  const int64_t n = out.count();
  out.pixels.resize(static_cast<size_t>(n * P));
  const bool guided = o.cfg_scale != 1.0;
  const int B_max = static_cast<int>(std::min<int64_t>(std::max(o.batch, 1), n));
  const int rows_max = guided ? 2 * B_max : B_max;
  Backend& be = model.backend();
  const Stream s = be.default_stream();
  const Tensor x_buf = be.empty(batched(rows_max, image), DType::F32, MemCategory::Activations);
  const Tensor v_buf = be.empty(batched(rows_max, image), DType::F32, MemCategory::Activations);
  std::vector<float> x, v(static_cast<size_t>(rows_max * P)), t;
  RowConditions conditions;
  for (int64_t first = 0; first < n; first += B_max) {
    const int B = static_cast<int>(std::min<int64_t>(B_max, n - first));
    const int rows = guided ? 2 * B : B;
    x.assign(static_cast<size_t>(B * P), 0.f);
    for (int b = 0; b < B; ++b)
      fill_normal(x.data() + static_cast<size_t>(b) * P, P, o.seed, kSampleNoiseStream, 0.f, 1.f,
                  static_cast<uint64_t>(first + b) * static_cast<uint64_t>(P));
    const FlowConditioning cond = conditions.of(
        o, std::span<const int32_t>(out.labels).subspan(static_cast<size_t>(first), B), guided);
    const Shape shape = batched(rows, image), half = batched(B, image);
    const Tensor xt = x_buf.view_at(0, shape), vt = v_buf.view_at(0, shape);
    for (int k = 0; k < o.steps; ++k) {
      const float tk = shifted_time(o, k), dt = shifted_time(o, k + 1) - tk;
      t.assign(static_cast<size_t>(rows), tk);
      // The conditional rows, and with guidance the same images again as the null rows.
      be.copy_from_host(s, xt.view_at(0, half), x.data());
      if (guided) be.copy_from_host(s, xt.view_at(B * P, half), x.data());
      flow.predict_velocity(xt, t, cond, vt);
      be.copy_to_host(s, v.data(), vt);
      be.synchronize(s);
      const auto g = static_cast<float>(o.cfg_scale);
      for (int64_t i = 0; i < B * P; ++i) {
        const float vel = guided ? v[i + B * P] + g * (v[i] - v[i + B * P]) : v[i];
        x[i] += dt * vel;
      }
    }
    for (int64_t i = 0; i < B * P; ++i) out.pixels[static_cast<size_t>(first * P + i)] = to_pixel(x[i]);
  }
  return out;
}

SampledImages SampledImages::slice(int64_t first, int64_t n) const {
  KILN_CHECK(first >= 0 && n >= 0 && first + n <= count(), "images [{}, {}) of {}", first,
             first + n, count());
  SampledImages out;
  out.shape = shape;
  const auto P = static_cast<size_t>(shape.pixels());
  out.pixels.assign(pixels.begin() + static_cast<ptrdiff_t>(first * P),
                    pixels.begin() + static_cast<ptrdiff_t>((first + n) * P));
  out.labels.assign(labels.begin() + first, labels.begin() + first + n);
  return out;
}

void write_image_grid(const fs::path& path, const SampledImages& im, int columns) {
  KILN_CHECK(columns >= 1 && im.count() > 0, "{}: nothing to draw", path.string());
  constexpr int kGap = 2;
  const int h = im.shape.height, w = im.shape.width, c = im.shape.channels;
  const int64_t rows = (im.count() + columns - 1) / columns;
  data::ImageShape grid{static_cast<int>(rows * (h + kGap) + kGap),
                        columns * (w + kGap) + kGap, c};
  std::vector<uint8_t> px(static_cast<size_t>(grid.pixels()), 255);  // white gaps
  for (int64_t i = 0; i < im.count(); ++i) {
    const int64_t r0 = kGap + (i / columns) * (h + kGap), c0 = kGap + (i % columns) * (w + kGap);
    for (int y = 0; y < h; ++y)
      std::copy_n(im.pixels.begin() + static_cast<ptrdiff_t>(((i * h + y) * w) * c), w * c,
                  px.begin() + static_cast<ptrdiff_t>(((r0 + y) * grid.width + c0) * c));
  }
  // write_png writes in place: go through a temporary and rename, so no half file remains.
  const fs::path tmp = path.string() + ".tmp";
  data::write_png(tmp, grid, px);
  std::error_code ec;
  fs::rename(tmp, path, ec);
  KILN_CHECK(!ec, "{}: cannot rename into place ({})", path.string(), ec.message());
}

void write_sample_dataset(const fs::path& dir, const SampledImages& im, int classes,
                          const std::vector<std::string>& class_names) {
  KILN_CHECK(!data::is_image_dataset(dir), "{}: holds a data set already (choose another "
             "--samples folder)", dir.string());
  fs::create_directories(dir);
  const std::string file = "val_000000.imgshard";  // prepare's naming
  data::ImageShardWriter w(dir / file, im.shape);
  for (int64_t i = 0; i < im.count(); ++i)
    w.write(im.labels[static_cast<size_t>(i)],
            std::span<const uint8_t>(im.pixels.data() + i * im.shape.pixels(),
                                     static_cast<size_t>(im.shape.pixels())));
  const uint32_t crc = w.finish();
  data::ImageDatasetMeta meta;
  meta.shape = im.shape;
  meta.classes = classes;
  meta.class_names = class_names;
  meta.splits["val"].push_back({file, im.count(), crc});
  data::write_image_meta(dir, meta);
}

std::vector<int> parse_class_list(const std::string& spec, const std::string& what) {
  std::vector<int> out;
  size_t pos = 0;
  auto number = [&](const std::string& s) {
    KILN_CHECK(!s.empty() && s.size() < 9 && std::all_of(s.begin(), s.end(), ::isdigit),
               "{} '{}': expected class numbers like 0-9 or 1,4,7", what, spec);
    return std::stoi(s);
  };
  while (pos <= spec.size()) {
    const size_t comma = std::min(spec.find(',', pos), spec.size());
    const std::string item = spec.substr(pos, comma - pos);
    const size_t dash = item.find('-');
    if (dash == std::string::npos) {
      out.push_back(number(item));
    } else {
      const int lo = number(item.substr(0, dash)), hi = number(item.substr(dash + 1));
      KILN_CHECK(lo <= hi, "{} '{}': range {} is empty", what, spec, item);
      KILN_CHECK(out.size() + static_cast<size_t>(hi - lo) < 100000,
                 "{} '{}': more than 100000 classes", what, spec);
      for (int k = lo; k <= hi; ++k) out.push_back(k);
    }
    pos = comma + 1;
  }
  return out;
}

}  // namespace kiln
