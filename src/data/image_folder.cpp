#include "data/image_folder.h"

#include "core/error.h"

#include <png.h>

#include <algorithm>
#include <cstring>

namespace kiln::data {

namespace fs = std::filesystem;

ImageFolderListing list_image_folder(const fs::path& dir) {
  KILN_CHECK(fs::is_directory(dir), "{}: not a directory (an image folder has one sub-folder per "
             "class)", dir.string());
  ImageFolderListing out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_directory()) out.classes.push_back(e.path().filename().string());
  std::sort(out.classes.begin(), out.classes.end());
  KILN_CHECK(!out.classes.empty(), "{}: no class folders (expected {}/<class>/*.png)", dir.string(),
             dir.string());
  for (size_t c = 0; c < out.classes.size(); ++c) {
    std::vector<fs::path> pngs;
    for (const auto& e : fs::directory_iterator(dir / out.classes[c])) {
      std::string ext = e.path().extension().string();
      std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char ch) { return std::tolower(ch); });
      if (e.is_regular_file() && ext == ".png") pngs.push_back(e.path());
    }
    KILN_CHECK(!pngs.empty(), "{}: class folder without a .png file", (dir / out.classes[c]).string());
    std::sort(pngs.begin(), pngs.end());
    for (auto& p : pngs) out.files.emplace_back(std::move(p), static_cast<int>(c));
  }
  return out;
}

std::vector<uint8_t> read_png(const fs::path& path, int channels, ImageShape* shape) {
  png_image im;
  std::memset(&im, 0, sizeof im);
  im.version = PNG_IMAGE_VERSION;
  KILN_CHECK(png_image_begin_read_from_file(&im, path.c_str()) != 0, "{}: not a readable PNG ({})",
             path.string(), im.message);
  const int c = channels > 0 ? channels : (im.format & PNG_FORMAT_FLAG_COLOR) ? 3 : 1;
  im.format = c == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
  KILN_CHECK(im.width > 0 && im.height > 0 && uint64_t{im.width} * im.height <= (uint64_t{1} << 26),
             "{}: a {}x{} PNG (at most 2^26 pixels are read)", path.string(), im.width, im.height);
  std::vector<uint8_t> px(PNG_IMAGE_SIZE(im));
  png_color black{0, 0, 0};
  const int ok = png_image_finish_read(&im, &black, px.data(), 0, nullptr);
  const std::string why = im.message;
  png_image_free(&im);
  KILN_CHECK(ok != 0, "{}: corrupt PNG ({})", path.string(), why);
  *shape = ImageShape{static_cast<int>(im.height), static_cast<int>(im.width), c};
  return px;
}

void write_png(const fs::path& path, const ImageShape& shape, const std::vector<uint8_t>& pixels) {
  KILN_CHECK(shape.channels == 1 || shape.channels == 3, "{}: PNGs of 1 or 3 channels", path.string());
  KILN_CHECK(static_cast<int64_t>(pixels.size()) == shape.pixels(), "{}: {} bytes for {} pixels",
             path.string(), pixels.size(), shape.pixels());
  png_image im;
  std::memset(&im, 0, sizeof im);
  im.version = PNG_IMAGE_VERSION;
  im.width = static_cast<png_uint_32>(shape.width);
  im.height = static_cast<png_uint_32>(shape.height);
  im.format = shape.channels == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
  const int ok = png_image_write_to_file(&im, path.c_str(), 0, pixels.data(), 0, nullptr);
  const std::string why = im.message;
  png_image_free(&im);
  KILN_CHECK(ok != 0, "{}: cannot write PNG ({})", path.string(), why);
}

}  // namespace kiln::data
