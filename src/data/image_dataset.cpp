#include "data/image_dataset.h"

#include "core/error.h"
#include "core/json_util.h"
#include "data/idx.h"
#include "data/image_folder.h"
#include "data/tokenizer.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>

namespace kiln::data {

namespace fs = std::filesystem;

namespace {
constexpr const char* kFormat = "kiln-image-shards";
constexpr int kFormatVersion = 1;
constexpr int64_t kMaxImages = int64_t{1} << 40;

std::string image_shard_name(const std::string& split, int index) {
  return fmt::format("{}_{:06d}.imgshard", split, index);
}
}  // namespace

int64_t ImageDatasetMeta::images(const std::string& split) const {
  const auto it = splits.find(split);
  int64_t n = 0;
  if (it != splits.end())
    for (const auto& s : it->second) n += s.images;
  return n;
}

void write_image_meta(const fs::path& dir, const ImageDatasetMeta& m) {
  nlohmann::ordered_json j;
  j["format"] = kFormat;
  j["format_version"] = kFormatVersion;
  j["image"] = {{"height", m.shape.height}, {"width", m.shape.width}, {"channels", m.shape.channels}};
  j["classes"] = m.classes;
  if (!m.class_names.empty()) j["class_names"] = m.class_names;
  if (const CaptionsMeta& c = m.captions; c.tokens > 0)
    j["captions"] = {{"tokens", c.tokens}, {"template", c.template_name},
                     {"tokenizer", {{"kind", c.tokenizer_kind}, {"hash", c.tokenizer_hash}}},
                     {"vocab_size", c.vocab_size}, {"eot_id", c.eot_id}};
  nlohmann::ordered_json splits = nlohmann::ordered_json::object();
  for (const auto& [name, shards] : m.splits) {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const auto& s : shards)
      list.push_back({{"file", s.file}, {"images", s.images}, {"crc32", fmt::format("{:08x}", s.crc32)}});
    splits[name] = {{"images", m.images(name)}, {"shards", std::move(list)}};
  }
  j["splits"] = std::move(splits);
  write_file_atomic(dir / "meta.json", j.dump(2) + "\n");
}

bool is_image_dataset(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_regular_file(dir / "meta.json", ec)) return false;
  try {
    const auto j = nlohmann::json::parse(read_small_file(dir / "meta.json"));
    return j.is_object() && j.value("format", std::string()) == kFormat;
  } catch (const std::exception&) {
    return false;
  }
}

ImageDatasetMeta read_image_meta(const fs::path& dir) {
  KILN_CHECK(fs::is_directory(dir), "dataset directory {} does not exist", dir.string());
  const fs::path path = dir / "meta.json";
  const std::string where = path.string();
  KILN_CHECK(fs::exists(path), "{}: missing (not a dataset prepared by `kiln prepare`?)", where);
  ImageDatasetMeta m;
  try {
    const auto j = nlohmann::json::parse(read_small_file(path));
    KILN_CHECK(j.is_object() && j.value("format", std::string()) == kFormat,
               "{}: not an image dataset (format \"{}\"; `kiln prepare --format idx` writes \"{}\")",
               where, j.is_object() ? j.value("format", std::string()) : std::string(), kFormat);
    KILN_CHECK(json_integer_field(j, "format_version", where) == kFormatVersion,
               "{}: format_version {} (this build reads {})", where, j.at("format_version").dump(),
               kFormatVersion);
    const auto& im = j.at("image");
    m.shape.height = static_cast<int>(json_integer_field(im, "height", where, 1, 1 << 16));
    m.shape.width = static_cast<int>(json_integer_field(im, "width", where, 1, 1 << 16));
    m.shape.channels = static_cast<int>(json_integer_field(im, "channels", where, 1, 4));
    if (j.contains("captions")) {
      const auto& c = j.at("captions");
      CaptionsMeta& cap = m.captions;
      cap.tokens = static_cast<int>(json_integer_field(c, "tokens", where, 1, 1 << 20));
      cap.template_name = c.at("template").get<std::string>();
      cap.tokenizer_kind = c.at("tokenizer").at("kind").get<std::string>();
      cap.tokenizer_hash = c.at("tokenizer").at("hash").get<std::string>();
      cap.vocab_size = static_cast<int>(json_integer_field(c, "vocab_size", where, 1, 1 << 30));
      cap.eot_id = static_cast<int>(json_integer_field(c, "eot_id", where, 0, cap.vocab_size - 1));
    }
    // Pairs have no classes; labelled images at least one.
    m.classes = static_cast<int>(
        json_integer_field(j, "classes", where, m.captions.tokens > 0 ? 0 : 1, 1 << 20));
    if (j.contains("class_names")) {
      m.class_names = j.at("class_names").get<std::vector<std::string>>();
      KILN_CHECK(static_cast<int>(m.class_names.size()) == m.classes, "{}: {} class_names for {} "
                 "classes", where, m.class_names.size(), m.classes);
    }
    for (const auto& [name, split] : j.at("splits").items()) {
      int64_t sum = 0;
      for (const auto& s : split.at("shards")) {
        ImageShardInfo info;
        info.file = s.at("file").get<std::string>();
        KILN_CHECK(!info.file.empty() && info.file.find('/') == std::string::npos &&
                       info.file.find('\0') == std::string::npos && info.file != "..",
                   "{}: shard file \"{}\" must be a plain file name", where, info.file);
        info.images = json_integer_field(s, "images", where, 1, kMaxImages);
        const std::string crc = s.at("crc32").get<std::string>();
        KILN_CHECK(crc.size() == 8 && crc.find_first_not_of("0123456789abcdef") == std::string::npos,
                   "{}: crc32 \"{}\" of {} is not 8 hex digits", where, crc, info.file);
        info.crc32 = static_cast<uint32_t>(std::stoul(crc, nullptr, 16));
        sum += info.images;
        KILN_CHECK(sum <= kMaxImages, "{}: split '{}' holds too many images", where, name);
        m.splits[name].push_back(info);
      }
      KILN_CHECK(json_integer_field(split, "images", where, 0, kMaxImages) == sum,
                 "{}: split '{}' says {} images, its shards hold {}", where, name,
                 split.at("images").dump(), sum);
    }
  } catch (const nlohmann::json::exception& e) {
    KILN_FAIL("{}: malformed ({})", where, e.what());
  }
  return m;
}

namespace {

// The shards of one split: n images of `shape`, image i given by get(i, label, pixels).
template <class Get>
void write_split(const PrepareImagesOptions& o, ImageDatasetMeta& meta, const std::string& split,
                 const ImageShape& shape, int64_t n, Get&& get, std::vector<fs::path>& written) {
  std::vector<uint8_t> pixels;
  for (int64_t first = 0, k = 0; first < n; first += o.shard_images, ++k) {
    const int64_t count = std::min(o.shard_images, n - first);
    const std::string file = image_shard_name(split, static_cast<int>(k));
    ImageShardWriter w(o.out_dir / file, shape);
    for (int64_t i = first; i < first + count; ++i) {
      int32_t label = 0;
      get(i, label, pixels);
      meta.classes = std::max(meta.classes, label + 1);
      w.write(label, pixels);
    }
    const uint32_t crc = w.finish();
    written.push_back(o.out_dir / file);
    meta.splits[split].push_back({file, count, crc});
  }
}

void prepare_idx(const PrepareImagesOptions& o, ImageDatasetMeta& meta, std::vector<fs::path>& written) {
  for (const auto& [prefix, split] : {std::pair<std::string, std::string>{"train", "train"}, {"t10k", "val"}}) {
    const fs::path images_path = idx_file(o.input, prefix + "-images-idx3-ubyte");
    const fs::path labels_path = idx_file(o.input, prefix + "-labels-idx1-ubyte");
    const bool have_images = fs::exists(images_path), have_labels = fs::exists(labels_path);
    if (split == "val" && !have_images && !have_labels) continue;  // optional
    KILN_CHECK(have_images, "{}: no {}-images-idx3-ubyte[.gz]", o.input.string(), prefix);
    KILN_CHECK(have_labels, "{}: no {}-labels-idx1-ubyte[.gz]", o.input.string(), prefix);
    const IdxArray images = read_idx(images_path), labels = read_idx(labels_path);
    KILN_CHECK(images.dims.size() == 3, "{}: {} dimensions; images are [count, rows, cols]",
               images_path.string(), images.dims.size());
    KILN_CHECK(labels.dims.size() == 1, "{}: {} dimensions; labels are [count]",
               labels_path.string(), labels.dims.size());
    KILN_CHECK(images.dims[0] == labels.dims[0], "{} holds {} images but {} holds {} labels",
               images_path.string(), images.dims[0], labels_path.string(), labels.dims[0]);
    const ImageShape shape{static_cast<int>(images.dims[1]), static_cast<int>(images.dims[2]), 1};
    KILN_CHECK(meta.splits.empty() || shape == meta.shape, "{}: images of {}x{}, the train split's "
               "are {}x{}", images_path.string(), shape.height, shape.width, meta.shape.height,
               meta.shape.width);
    meta.shape = shape;
    write_split(o, meta, split, shape, images.dims[0], [&](int64_t i, int32_t& label, std::vector<uint8_t>& px) {
      label = labels.data[static_cast<size_t>(i)];
      px.assign(images.data.begin() + i * shape.pixels(), images.data.begin() + (i + 1) * shape.pixels());
    }, written);
  }
}

void prepare_image_folder(const PrepareImagesOptions& o, ImageDatasetMeta& meta,
                          std::vector<fs::path>& written) {
  const bool nested = fs::is_directory(o.input / "train");
  std::vector<std::pair<std::string, fs::path>> splits{{"train", nested ? o.input / "train" : o.input}};
  if (nested && fs::is_directory(o.input / "val")) splits.emplace_back("val", o.input / "val");
  for (const auto& [split, dir] : splits) {
    const ImageFolderListing list = list_image_folder(dir);
    if (split == "train") {
      meta.class_names = list.classes;
    } else {
      KILN_CHECK(list.classes == meta.class_names, "{}: its class folders differ from the train "
                 "split's", dir.string());
    }
    // The first image fixes the shape (and gray or RGB) of the whole dataset.
    ImageShape first;
    const int channels = meta.splits.empty() ? 0 : meta.shape.channels;
    std::vector<uint8_t> first_pixels = read_png(list.files.front().first, channels, &first);
    KILN_CHECK(meta.splits.empty() || first == meta.shape, "{}: {}x{}x{}, the train split's "
               "images are {}x{}x{}", list.files.front().first.string(), first.height, first.width,
               first.channels, meta.shape.height, meta.shape.width, meta.shape.channels);
    meta.shape = first;
    const auto n = static_cast<int64_t>(list.files.size());
    write_split(o, meta, split, first, n, [&](int64_t i, int32_t& label, std::vector<uint8_t>& px) {
      const auto& [path, l] = list.files[static_cast<size_t>(i)];
      label = l;
      if (i == 0) {  // read above
        px = std::move(first_pixels);
        return;
      }
      ImageShape got;
      px = read_png(path, first.channels, &got);
      KILN_CHECK(got == first, "{}: {}x{}, the dataset's images are {}x{} (resize them first)",
                 path.string(), got.height, got.width, first.height, first.width);
    }, written);
  }
}

}  // namespace

ImageDatasetMeta prepare_images(const PrepareImagesOptions& o) {
  KILN_CHECK(o.format == "idx" || o.format == "imagefolder",
             "prepare: --format must be text, idx or imagefolder, got '{}'", o.format);
  KILN_CHECK(fs::is_directory(o.input), "{}: not a directory ({})", o.input.string(),
             o.format == "idx" ? "of IDX files" : "an image folder");
  KILN_CHECK(o.shard_images >= 1, "prepare: --shard-images must be >= 1");
  std::error_code ec;
  const bool existed = fs::exists(o.out_dir, ec);
  fs::create_directories(o.out_dir, ec);
  KILN_CHECK(!ec && fs::is_directory(o.out_dir), "{}: cannot create output directory",
             o.out_dir.string());
  KILN_CHECK(!fs::exists(o.out_dir / "meta.json"), "{}: already holds a prepared dataset (remove "
             "it first)", o.out_dir.string());
  ImageDatasetMeta meta;
  std::vector<fs::path> written;
  try {
    if (o.format == "idx") {
      prepare_idx(o, meta, written);
    } else {
      prepare_image_folder(o, meta, written);
    }
    if (!o.class_names.empty()) {
      KILN_CHECK(o.format == "idx", "prepare: --class-names is for --format idx (an image "
                 "folder's classes are its folder names)");
      KILN_CHECK(static_cast<int>(o.class_names.size()) == meta.classes, "prepare: "
                 "--class-names gives {} names, the labels of {} have {} classes",
                 o.class_names.size(), o.input.string(), meta.classes);
      for (size_t k = 0; k < o.class_names.size(); ++k) {
        KILN_CHECK(!o.class_names[k].empty(), "prepare: --class-names: name {} (label {}) is "
                   "empty", k + 1, k);
        KILN_CHECK(std::count(o.class_names.begin(), o.class_names.end(), o.class_names[k]) == 1,
                   "prepare: --class-names: '{}' is given twice", o.class_names[k]);
      }
      meta.class_names = o.class_names;
    }
    write_image_meta(o.out_dir, meta);  // last: a dataset exists once its meta.json does
  } catch (...) {
    for (const auto& p : written) fs::remove(p, ec);
    if (!existed) fs::remove(o.out_dir, ec);
    throw;
  }
  return meta;
}

ImageLoader::ImageLoader(const fs::path& dir, const std::string& split, uint64_t seed, bool shuffle)
    : meta_(read_image_meta(dir)) {
  const auto it = meta_.splits.find(split);
  KILN_CHECK(it != meta_.splits.end(), "{}: no '{}' split", (dir / "meta.json").string(), split);
  int64_t total = 0;
  for (const auto& s : it->second) {
    starts_.push_back(total);
    shards_.emplace_back(dir / s.file, meta_.shape, s.images, s.crc32, meta_.captions.tokens);
    total += s.images;
  }
  starts_.push_back(total);
  where_ = fmt::format("{} split '{}'", dir.string(), split);
  order_ = VisitOrder(total, seed, shuffle, where_);
}

std::pair<size_t, int64_t> ImageLoader::locate(int64_t sample) const {
  const auto k = static_cast<size_t>(
      std::upper_bound(starts_.begin(), starts_.end(), sample) - starts_.begin() - 1);
  return {k, sample - starts_[k]};
}

void ImageLoader::for_each_caption(
    const std::function<void(const CaptionTokens&, const std::string& where)>& visit) const {
  for (const ImageShardReader& shard : shards_)
    for (int64_t i = 0; i < shard.images(); ++i)
      visit(shard.caption(i), fmt::format("{} record {}", shard.path().string(), i));
}

void ImageLoader::next_pairs(uint8_t* pixels, std::vector<CaptionTokens>& captions,
                             int micro_batch, int dp_rank, int dp_size) {
  KILN_CHECK(meta_.captions.tokens > 0, "{}: labelled images, not image-text pairs", where_);
  const int64_t P = meta_.shape.pixels();
  const std::vector<int64_t> mine = order_.next_batch(micro_batch, dp_rank, dp_size);
  captions.resize(mine.size());
  for (size_t b = 0; b < mine.size(); ++b) {
    const auto [k, i] = locate(mine[b]);
    captions[b] = shards_[k].caption(i);
    std::copy_n(shards_[k].pixels(i).data(), P, pixels + static_cast<int64_t>(b) * P);
  }
}

void ImageLoader::next_batch(uint8_t* pixels, int32_t* labels, int micro_batch, int dp_rank, int dp_size) {
  KILN_CHECK(meta_.captions.tokens == 0, "{}: image-text pairs, not labelled images", where_);
  const int64_t P = meta_.shape.pixels();
  const std::vector<int64_t> mine = order_.next_batch(micro_batch, dp_rank, dp_size);
  for (size_t b = 0; b < mine.size(); ++b) {
    const auto [k, i] = locate(mine[b]);
    const int32_t label = shards_[k].label(i);
    KILN_CHECK(label >= 0 && label < meta_.classes, "{}: image {} has label {}, outside the {} "
               "classes of meta.json", shards_[k].path().string(), i, label, meta_.classes);
    labels[b] = label;
    std::copy_n(shards_[k].pixels(i).data(), P, pixels + static_cast<int64_t>(b) * P);
  }
}

void scale_pixels(std::span<const uint8_t> pixels, float* out) {
  for (size_t i = 0; i < pixels.size(); ++i) out[i] = static_cast<float>(pixels[i]) / 127.5f - 1.f;
}

}  // namespace kiln::data
