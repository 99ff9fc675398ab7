// Byte-level BPE shared by the gpt2 and hf tokenizer kinds; see byte_level_bpe.h. The
// algorithm is OpenAI's gpt-2/src/encoder.py (Radford et al. 2019).
#include "data/byte_level_bpe.h"

#include "core/error.h"
#include "data/utf8.h"

#include <unicode/uchar.h>

#include <climits>

namespace kiln::data {

const std::array<std::string, 256>& bytes_to_unicode() {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> out;
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      utf8_append(out[b], cp);
    }
    return out;
  }();
  return table;
}

namespace {

bool is_letter(char32_t c) { return (U_GET_GC_MASK(static_cast<UChar32>(c)) & U_GC_L_MASK) != 0; }
bool is_number(char32_t c) { return (U_GET_GC_MASK(static_cast<UChar32>(c)) & U_GC_N_MASK) != 0; }
bool is_space(char32_t c, RegexSpace space) {
  if (c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r' || c == ' ') return true;
  if (c < 0x80) return false;
  if (space == RegexSpace::WhiteSpace) return u_isUWhiteSpace(static_cast<UChar32>(c));
  return c == 0xFEFF || c == 0x2028 || c == 0x2029 || u_charType(static_cast<UChar32>(c)) == U_SPACE_SEPARATOR;
}
enum class Cls : uint8_t { Letter, Number, Space, Other };
Cls classify(char32_t c, RegexSpace space) {
  if (c < 0x80) {  // fast path
    if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return Cls::Letter;
    if (c >= '0' && c <= '9') return Cls::Number;
    if (c == ' ' || (c >= '\t' && c <= '\r')) return Cls::Space;
    return Cls::Other;
  }
  if (is_letter(c)) return Cls::Letter;
  if (is_number(c)) return Cls::Number;
  if (is_space(c, space)) return Cls::Space;
  return Cls::Other;
}

}  // namespace

void gpt2_pretokenize(std::string_view text, const std::function<void(std::string_view)>& f, RegexSpace space) {
  // Decode once: code point classes with byte offsets.
  std::vector<Cls> cls;
  std::vector<uint32_t> off;
  cls.reserve(text.size());
  off.reserve(text.size() + 1);
  for (size_t i = 0; i < text.size();) {
    off.push_back(static_cast<uint32_t>(i));
    cls.push_back(classify(utf8_next(text, i), space));
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

ByteLevelBpe::ByteLevelBpe(std::vector<std::string> tokens,
                           std::vector<std::pair<std::string, std::string>> merges, const std::string& what)
    : tokens_(std::move(tokens)), merges_(std::move(merges)) {
  for (size_t id = 0; id < tokens_.size(); ++id) {
    KILN_CHECK(ids_.emplace(tokens_[id], static_cast<int32_t>(id)).second,
               "{}: token '{}' appears twice (ids {} and {})", what, tokens_[id], ids_[tokens_[id]], id);
  }
  const auto& b2u = bytes_to_unicode();
  std::unordered_map<std::string, unsigned char> u2b;
  for (int b = 0; b < 256; ++b) {
    const auto it = ids_.find(b2u[b]);
    KILN_CHECK(it != ids_.end(), "{}: no token for byte {} ('{}')", what, b, b2u[b]);
    byte_id_[b] = it->second;
    u2b.emplace(b2u[b], static_cast<unsigned char>(b));
  }
  // Byte strings of every token, for decode.
  bytes_.resize(tokens_.size());
  for (size_t id = 0; id < tokens_.size(); ++id) {
    const std::string& t = tokens_[id];
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
  for (size_t r = 0; r < merges_.size(); ++r) {
    const auto& [a, b] = merges_[r];
    const auto ia = ids_.find(a), ib = ids_.find(b), iab = ids_.find(a + b);
    KILN_CHECK(ia != ids_.end() && ib != ids_.end() && iab != ids_.end(),
               "{}: merge {} ('{} {}') names a token missing from the vocabulary", what, r, a, b);
    ranks_[key(ia->second, ib->second)] = {static_cast<int>(r), iab->second};  // a repeat: the later rank, as encoder.py
  }
}

int32_t ByteLevelBpe::find(const std::string& t) const {
  const auto it = ids_.find(t);
  return it == ids_.end() ? -1 : it->second;
}

uint64_t ByteLevelBpe::hash(uint64_t h) const {
  for (const auto& t : tokens_) h = fnv1a64("\n", fnv1a64(t, h));
  h = fnv1a64("merges\n", h);
  for (const auto& [a, b] : merges_) h = fnv1a64("\n", fnv1a64(b, fnv1a64(" ", fnv1a64(a, h))));
  return h;
}

void ByteLevelBpe::encode_piece(std::string_view piece, std::vector<int32_t>& out, bool ignore_merges) const {
  {
    std::lock_guard<std::mutex> lock(cache_mu_);
    const auto it = cache_.find(std::string(piece));
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> word;
  word.reserve(piece.size());
  if (ignore_merges) {
    std::string text;
    for (unsigned char c : piece) text += bytes_to_unicode()[c];
    if (const int32_t id = find(text); id >= 0) word.push_back(id);
  }
  if (word.empty()) {
    for (unsigned char c : piece) word.push_back(byte_id_[c]);
    bpe(word);
  }
  out.insert(out.end(), word.begin(), word.end());
  std::lock_guard<std::mutex> lock(cache_mu_);
  if (cache_.size() > 200'000) cache_.clear();  // bound the memory
  cache_.emplace(std::string(piece), std::move(word));
}

// Greedy lowest-rank merging, as encoder.py's bpe().
void ByteLevelBpe::bpe(std::vector<int32_t>& word) const {
  while (word.size() > 1) {
    int best_rank = INT_MAX;
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
    if (best_rank == INT_MAX) break;
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

}  // namespace kiln::data
