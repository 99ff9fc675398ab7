// GPT-2's byte-level BPE, implemented from the algorithm of OpenAI's gpt-2/src/encoder.py
// (Radford et al. 2019):
//   1. pre-tokenize with  's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//      (hand-written below; \p{L} and \p{N} are ICU general categories L* and N*; \s is
//      ECMAScript's WhiteSpace + LineTerminator, i.e. TAB LF VT FF CR U+FEFF U+2028 U+2029
//      and category Zs, as in the JavaScript port we test against);
//   2. map each pre-token's UTF-8 bytes to printable characters (bytes_to_unicode);
//   3. repeatedly merge the adjacent pair of lowest rank in vocab.bpe (all occurrences,
//      left to right) until no ranked pair is left; the pieces' ids come from encoder.json.
// Merging runs on token ids instead of strings, which is equivalent because the
// vocabulary maps strings to ids one to one. Results are cached per pre-token.
#include "core/error.h"
#include "data/tokenizer.h"
#include "data/tokenizer_internal.h"
#include "data/utf8.h"

#include <nlohmann/json.hpp>
#include <unicode/uchar.h>

#include <array>
#include <mutex>
#include <unordered_map>

namespace kiln::data {

namespace fs = std::filesystem;

namespace {

// bytes_to_unicode() of encoder.py: printable bytes map to themselves, the others to
// U+0100 + n in byte order.
std::array<std::string, 256> bytes_to_unicode() {
  std::array<std::string, 256> out;
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    const char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
    utf8_append(out[b], cp);
  }
  return out;
}

bool is_letter(char32_t c) { return (U_GET_GC_MASK(static_cast<UChar32>(c)) & U_GC_L_MASK) != 0; }
bool is_number(char32_t c) { return (U_GET_GC_MASK(static_cast<UChar32>(c)) & U_GC_N_MASK) != 0; }
bool is_space(char32_t c) {
  if (c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r' || c == ' ') return true;
  if (c < 0x80) return false;
  return c == 0xFEFF || c == 0x2028 || c == 0x2029 || u_charType(static_cast<UChar32>(c)) == U_SPACE_SEPARATOR;
}
enum class Cls : uint8_t { Letter, Number, Space, Other };
Cls classify(char32_t c) {
  if (c < 0x80) {  // fast path
    if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return Cls::Letter;
    if (c >= '0' && c <= '9') return Cls::Number;
    if (c == ' ' || (c >= '\t' && c <= '\r')) return Cls::Space;
    return Cls::Other;
  }
  if (is_letter(c)) return Cls::Letter;
  if (is_number(c)) return Cls::Number;
  if (is_space(c)) return Cls::Space;
  return Cls::Other;
}

}  // namespace

/// Splits valid UTF-8 `text` into GPT-2 pre-tokens (byte ranges), calling f(string_view).
template <class F>
void gpt2_pretokenize(std::string_view text, F&& f) {
  // Decode once: code point classes with byte offsets.
  std::vector<Cls> cls;
  std::vector<uint32_t> off;
  cls.reserve(text.size());
  off.reserve(text.size() + 1);
  for (size_t i = 0; i < text.size();) {
    off.push_back(static_cast<uint32_t>(i));
    cls.push_back(classify(utf8_next(text, i)));
  }
  off.push_back(static_cast<uint32_t>(text.size()));
  const size_t n = cls.size();
  auto emit = [&](size_t a, size_t b) { f(text.substr(off[a], off[b] - off[a])); };
  auto run = [&](size_t j, Cls c) {
    while (j < n && cls[j] == c) ++j;
    return j;
  };
  size_t i = 0;
  while (i < n) {
    const char first = text[off[i]];
    // 's 't 're 've 'm 'll 'd
    if (first == '\'' && i + 1 < n) {
      const std::string_view rest = text.substr(off[i] + 1, 2);
      size_t len = 0;
      if (rest.size() >= 2 && (rest == "re" || rest == "ve" || rest == "ll")) len = 3;
      else if (!rest.empty() && (rest[0] == 's' || rest[0] == 't' || rest[0] == 'm' || rest[0] == 'd')) len = 2;
      if (len > 0) {
        emit(i, i + len);
        i += len;
        continue;
      }
    }
    const Cls c = cls[i];
    // " ?\p{L}+", " ?\p{N}+", " ?[^\s\p{L}\p{N}]+"
    if (first == ' ' && i + 1 < n && cls[i + 1] != Cls::Space) {
      const size_t j = run(i + 1, cls[i + 1]);
      emit(i, j);
      i = j;
      continue;
    }
    if (c != Cls::Space) {
      const size_t j = run(i, c);
      emit(i, j);
      i = j;
      continue;
    }
    // "\s+(?!\S)" then "\s+"
    size_t j = run(i, Cls::Space);
    if (j < n && j - i >= 2) --j;  // leave the last space for the following token
    emit(i, j);
    i = j;
  }
}

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
    tokens_.resize(j.size());
    std::vector<char> seen(j.size(), 0);
    for (auto it = j.begin(); it != j.end(); ++it) {
      KILN_CHECK(it.value().is_number_integer(), "{}: id of token '{}' is not an integer",
                 vocab_file.string(), it.key());
      const int64_t id = it.value().get<int64_t>();
      KILN_CHECK(id >= 0 && id < static_cast<int64_t>(tokens_.size()) && !seen[id],
                 "{}: ids are not a dense range 0..{} (id {} of token '{}')", vocab_file.string(),
                 tokens_.size() - 1, id, it.key());
      seen[id] = 1;
      tokens_[id] = it.key();
      ids_.emplace(it.key(), static_cast<int32_t>(id));
    }
    const auto eot = ids_.find("<|endoftext|>");
    KILN_CHECK(eot != ids_.end(), "{}: no '<|endoftext|>' token", vocab_file.string());
    eot_ = eot->second;
    const auto b2u = bytes_to_unicode();
    for (int b = 0; b < 256; ++b) {
      const auto it = ids_.find(b2u[b]);
      KILN_CHECK(it != ids_.end(), "{}: no token for byte {}", vocab_file.string(), b);
      byte_id_[b] = it->second;
    }
    // Byte strings of every token, for decode.
    std::unordered_map<std::string, unsigned char> u2b;
    for (int b = 0; b < 256; ++b) u2b.emplace(b2u[b], static_cast<unsigned char>(b));
    bytes_.resize(tokens_.size());
    for (size_t id = 0; id < tokens_.size(); ++id) {
      const std::string& t = tokens_[id];
      if (static_cast<int>(id) == eot_) {
        bytes_[id] = t;
        continue;
      }
      std::string out;
      bool ok = utf8_valid(t);
      for (size_t i = 0; ok && i < t.size();) {
        const size_t start = i;
        utf8_next(t, i);
        const auto it = u2b.find(t.substr(start, i - start));
        if (it == u2b.end()) ok = false;
        else out.push_back(static_cast<char>(it->second));
      }
      bytes_[id] = ok ? out : t;  // a token outside the byte alphabet decodes as its text
    }
    // Merges: "#version" line, then "a b" per line, rank = line order.
    const std::string merges = read_small_file(merges_file);
    std::string_view rest(merges);
    int rank = 0;
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
      const std::string a(line.substr(0, sp)), b(line.substr(sp + 1));
      const auto ia = ids_.find(a), ib = ids_.find(b), iab = ids_.find(a + b);
      KILN_CHECK(ia != ids_.end() && ib != ids_.end() && iab != ids_.end(),
                 "{}: line {} merges tokens missing from {}", merges_file.string(), line_no,
                 vocab_file.filename().string());
      merges_text_.emplace_back(line);
      ranks_[key(ia->second, ib->second)] = {rank++, iab->second};
    }
    KILN_CHECK(rank > 0, "{}: no merges", merges_file.string());
    // Canonical hash: tokens in id order, then merges in rank order.
    uint64_t h = fnv1a64("gpt2\n");
    for (const auto& t : tokens_) h = fnv1a64("\n", fnv1a64(t, h));
    h = fnv1a64("merges\n", h);
    for (const auto& m : merges_text_) h = fnv1a64("\n", fnv1a64(m, h));
    hash_ = hash_hex(h);
  }

  std::string kind() const override { return "gpt2"; }
  int vocab_size() const override { return static_cast<int>(tokens_.size()); }
  int eot_id() const override { return eot_; }

  std::vector<int32_t> encode(std::string_view text) const override {
    require_utf8(text, "gpt2 tokenizer input");
    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 4);
    std::vector<int32_t> word;
    gpt2_pretokenize(text, [&](std::string_view piece) {
      {
        std::lock_guard<std::mutex> lock(cache_mu_);
        const auto it = cache_.find(std::string(piece));
        if (it != cache_.end()) {
          out.insert(out.end(), it->second.begin(), it->second.end());
          return;
        }
      }
      word.clear();
      for (unsigned char c : piece) word.push_back(byte_id_[c]);
      bpe(word);
      out.insert(out.end(), word.begin(), word.end());
      std::lock_guard<std::mutex> lock(cache_mu_);
      if (cache_.size() > 200'000) cache_.clear();  // bound the memory
      cache_.emplace(std::string(piece), word);
    });
    return out;
  }

  std::string decode(std::span<const int32_t> ids) const override {
    std::string out;
    for (int32_t id : ids) {
      KILN_CHECK(id >= 0 && id < vocab_size(), "gpt2 tokenizer: id {} out of range [0, {})", id,
                 vocab_size());
      out += bytes_[id];
    }
    return out;
  }

  std::string hash() const override { return hash_; }

  void save(const fs::path& dir) const override {
    std::error_code ec;
    fs::create_directories(dir, ec);
    KILN_CHECK(!ec, "cannot create directory {}", dir.string());
    nlohmann::json j = nlohmann::json::object();
    for (size_t id = 0; id < tokens_.size(); ++id) j[tokens_[id]] = id;
    write_file_atomic(dir / "encoder.json", j.dump());
    std::string m = "#version: 0.2\n";
    for (const auto& line : merges_text_) (m += line) += '\n';
    write_file_atomic(dir / "vocab.bpe", m);
    write_tokenizer_json(dir, *this, {{"vocab", "encoder.json"}, {"merges", "vocab.bpe"}});
  }

 private:
  static uint64_t key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  // Greedy lowest-rank merging, as encoder.py's bpe().
  void bpe(std::vector<int32_t>& word) const {
    while (word.size() > 1) {
      int best_rank = INT32_MAX;
      int32_t a = 0, b = 0, merged = 0;
      for (size_t i = 0; i + 1 < word.size(); ++i) {
        const auto it = ranks_.find(key(word[i], word[i + 1]));
        if (it != ranks_.end() && it->second.first < best_rank) {
          best_rank = it->second.first;
          a = word[i];
          b = word[i + 1];
          merged = it->second.second;
        }
      }
      if (best_rank == INT32_MAX) break;
      size_t w = 0;
      for (size_t i = 0; i < word.size();) {
        if (i + 1 < word.size() && word[i] == a && word[i + 1] == b) {
          word[w++] = merged;
          i += 2;
        } else {
          word[w++] = word[i++];
        }
      }
      word.resize(w);
    }
  }

  std::vector<std::string> tokens_;  // id -> token text (byte-mapped)
  std::vector<std::string> bytes_;   // id -> raw bytes
  std::unordered_map<std::string, int32_t> ids_;
  std::unordered_map<uint64_t, std::pair<int, int32_t>> ranks_;  // (a, b) -> (rank, a+b)
  std::vector<std::string> merges_text_;
  std::array<int32_t, 256> byte_id_{};
  int32_t eot_ = 0;
  std::string hash_;
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
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
