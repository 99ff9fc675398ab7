// The byte tokenizer: every byte is its own id, end-of-text is 256.
#include "core/error.h"
#include "data/tokenizer.h"
#include "data/tokenizer_internal.h"
#include "data/utf8.h"

namespace kiln::data {

namespace {

class ByteTokenizer final : public Tokenizer {
 public:
  std::string kind() const override { return "byte"; }
  int vocab_size() const override { return 257; }
  int eot_id() const override { return 256; }
  std::vector<int32_t> encode(std::string_view text) const override {
    require_utf8(text, "byte tokenizer input");
    std::vector<int32_t> ids(text.size());
    for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
    return ids;
  }
  std::string decode(std::span<const int32_t> ids) const override {
    std::string out;
    out.reserve(ids.size());
    for (int32_t id : ids) {
      KILN_CHECK(id >= 0 && id <= 256, "byte tokenizer: id {} out of range [0, 257)", id);
      if (id == 256) out += "<|endoftext|>";
      else out.push_back(static_cast<char>(id));
    }
    return out;
  }
  std::string hash() const override { return hash_hex(fnv1a64("kiln byte tokenizer v1")); }
  void save(const std::filesystem::path& dir) const override {
    create_directory_for(dir);
    write_tokenizer_json(dir, *this, {});
  }
  std::map<std::string, std::string> hf_files() const override { return {}; }  // none exists
};

}  // namespace

std::unique_ptr<Tokenizer> make_byte_tokenizer() { return std::make_unique<ByteTokenizer>(); }

}  // namespace kiln::data
