// GPT-2's byte-level BPE, implemented from the algorithm of OpenAI's gpt-2/src/encoder.py
// (Radford et al. 2019):
//   1. pre-tokenize with  's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//      (hand-written below; \p{L} and \p{N} are ICU general categories L* and N*; \s is
//      ECMAScript's WhiteSpace + LineTerminator, i.e. TAB LF VT FF CR U+FEFF U+2028 U+2029
//      and category Zs, as in the JavaScript port we test against);
//   2. map each pre-token's UTF-8 bytes to printable characters (bytes_to_unicode);
//   3. repeatedly merge the adjacent pair of lowest rank in vocab.bpe (all occurrences,
//      left to right) until no ranked pair is left; the pieces' ids come from encoder.json.
// Steps 1-3 are shared with the hf kind: data/byte_level_bpe.h.
#include "core/error.h"
#include "data/byte_level_bpe.h"
#include "data/tokenizer.h"
#include "data/tokenizer_internal.h"
#include "data/utf8.h"

#include <nlohmann/json.hpp>

#include <memory>

namespace kiln::data {

namespace fs = std::filesystem;

std::vector<std::string> gpt2_pretokens(std::string_view text) {
  require_utf8(text, "gpt2_pretokens input");
  std::vector<std::string> out;
  gpt2_pretokenize(text, [&](std::string_view p) { out.emplace_back(p); });
  return out;
}

namespace {

class Gpt2Tokenizer final : public Tokenizer {
 public:
  Gpt2Tokenizer(const fs::path& vocab_file, const fs::path& merges_file) {
    // Vocabulary: {"token string": id}.
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(read_small_file(vocab_file));
    } catch (const nlohmann::json::exception& e) {
      KILN_FAIL("{}: malformed JSON ({})", vocab_file.string(), e.what());
    }
    KILN_CHECK(j.is_object() && !j.empty(), "{}: expected a JSON object {{token: id}}", vocab_file.string());
    std::vector<std::string> tokens(j.size());
    std::vector<char> seen(j.size(), 0);
    for (auto it = j.begin(); it != j.end(); ++it) {
      KILN_CHECK(it.value().is_number_integer(), "{}: id of token '{}' is not an integer",
                 vocab_file.string(), it.key());
      const int64_t id = it.value().get<int64_t>();
      KILN_CHECK(id >= 0 && id < static_cast<int64_t>(tokens.size()) && !seen[id],
                 "{}: ids are not a dense range 0..{} (id {} of token '{}')", vocab_file.string(),
                 tokens.size() - 1, id, it.key());
      seen[id] = 1;
      tokens[id] = it.key();
    }
    // Merges: "#version" line, then "a b" per line, rank = line order.
    std::vector<std::pair<std::string, std::string>> merges;
    const std::string text = read_small_file(merges_file);
    std::string_view rest(text);
    int64_t line_no = 0;
    while (!rest.empty()) {
      const size_t nl = rest.find('\n');
      std::string_view line = rest.substr(0, nl);
      rest.remove_prefix(nl == std::string_view::npos ? rest.size() : nl + 1);
      ++line_no;
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line.empty() || (line_no == 1 && line.starts_with("#version"))) continue;
      const size_t sp = line.find(' ');
      KILN_CHECK(sp != std::string_view::npos && sp > 0 && sp + 1 < line.size() &&
                     line.find(' ', sp + 1) == std::string_view::npos,
                 "{}: line {} is not 'a b'", merges_file.string(), line_no);
      merges.emplace_back(line.substr(0, sp), line.substr(sp + 1));
    }
    KILN_CHECK(!merges.empty(), "{}: no merges", merges_file.string());
    bpe_ = std::make_unique<ByteLevelBpe>(std::move(tokens), std::move(merges),
                                          vocab_file.string() + " + " + merges_file.filename().string());
    eot_ = bpe_->find("<|endoftext|>");
    KILN_CHECK(eot_ >= 0, "{}: no '<|endoftext|>' token", vocab_file.string());
    // Canonical hash: tokens in id order, then merges in rank order.
    hash_ = hash_hex(bpe_->hash(fnv1a64("gpt2\n")));
  }

  std::string kind() const override { return "gpt2"; }
  int vocab_size() const override { return bpe_->vocab_size(); }
  int eot_id() const override { return eot_; }

  std::vector<int32_t> encode(std::string_view text) const override {
    require_utf8(text, "gpt2 tokenizer input");
    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 4);
    gpt2_pretokenize(text, [&](std::string_view piece) { bpe_->encode_piece(piece, out); });
    return out;
  }

  std::string decode(std::span<const int32_t> ids) const override {
    std::string out;
    for (int32_t id : ids) {
      KILN_CHECK(id >= 0 && id < vocab_size(), "gpt2 tokenizer: id {} out of range [0, {})", id,
                 vocab_size());
      out += bpe_->bytes(id);
    }
    return out;
  }

  std::string hash() const override { return hash_; }

  void save(const fs::path& dir) const override {
    create_directory_for(dir);
    nlohmann::json j = nlohmann::json::object();
    const auto& tokens = bpe_->tokens();
    for (size_t id = 0; id < tokens.size(); ++id) j[tokens[id]] = id;
    write_file_atomic(dir / "encoder.json", j.dump());
    std::string m = "#version: 0.2\n";
    for (const auto& [a, b] : bpe_->merges()) (((m += a) += ' ') += b) += '\n';
    write_file_atomic(dir / "vocab.bpe", m);
    write_tokenizer_json(dir, *this, {{"vocab", "encoder.json"}, {"merges", "vocab.bpe"}});
  }

  std::map<std::string, std::string> hf_files() const override {
    // bos = eos = unk = "<|endoftext|>", as Hugging Face's own GPT-2 tokenizer files.
    const std::string eot = bpe_->tokens()[static_cast<size_t>(eot_)];
    return {{"tokenizer.json", byte_level_hf_json(*bpe_, {{eot_, eot, true}})},
            {"tokenizer_config.json", hf_tokenizer_config("PreTrainedTokenizerFast", eot, eot)}};
  }

 private:
  std::unique_ptr<ByteLevelBpe> bpe_;
  int32_t eot_ = 0;
  std::string hash_;
};

}  // namespace

std::unique_ptr<Tokenizer> load_gpt2_tokenizer(const std::vector<fs::path>& files) {
  fs::path vocab, merges;
  auto take = [&](const fs::path& p) {
    const std::string name = p.filename().string();
    if (name == "encoder.json" || name == "vocab.json" || p.extension() == ".json") vocab = p;
    else if (name == "vocab.bpe" || name == "merges.txt" || p.extension() == ".bpe" || p.extension() == ".txt") merges = p;
    else KILN_FAIL("{}: not a GPT-2 tokenizer file (expected encoder.json/vocab.json and vocab.bpe/merges.txt)", p.string());
  };
  if (files.size() == 1 && fs::is_directory(files[0])) {
    const fs::path& d = files[0];
    if (fs::exists(d / "encoder.json") && fs::exists(d / "vocab.bpe")) {
      vocab = d / "encoder.json";
      merges = d / "vocab.bpe";
    } else if (fs::exists(d / "vocab.json") && fs::exists(d / "merges.txt")) {
      vocab = d / "vocab.json";
      merges = d / "merges.txt";
    } else {
      KILN_FAIL("{}: holds neither encoder.json + vocab.bpe nor vocab.json + merges.txt", d.string());
    }
  } else {
    for (const auto& p : files) take(p);
  }
  KILN_CHECK(!vocab.empty() && !merges.empty(),
             "gpt2 tokenizer needs a vocabulary (encoder.json or vocab.json) and merges (vocab.bpe or merges.txt); got {} file(s)",
             files.size());
  KILN_CHECK(fs::exists(vocab), "{}: no such file", vocab.string());
  KILN_CHECK(fs::exists(merges), "{}: no such file", merges.string());
  return std::make_unique<Gpt2Tokenizer>(vocab, merges);
}

}  // namespace kiln::data
