// Helpers shared by the data tests.
#pragma once

#include "core/rng.h"
#include "data/utf8.h"

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace kiln::data::testing {

/// A fresh directory under the system temp dir, removed on destruction.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("kiln-data-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& s) const { return path_ / s; }

 private:
  std::filesystem::path path_;
};

inline void write_text(const std::filesystem::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary);
  f.write(s.data(), static_cast<std::streamsize>(s.size()));
}

inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

/// Random valid UTF-8 of about `n` code points, drawn with Philox: ASCII words, spaces,
/// tabs, newlines, apostrophes (contractions), digits, punctuation, Latin-1, Greek,
/// Cyrillic, CJK, emoji, U+2581, combining marks, Unicode spaces and any code point.
inline std::string random_utf8(Philox& rng, int n) {
  static const char32_t specials[] = {' ', ' ', ' ', '\n', '\t', '\r', '\'', '"', '.', ',', '!',
                                      0x2581, 0x00A0, 0x3000, 0x2009, 0x0301, 0xFEFF, 0x0085,
                                      0x200D, 0x1F600, 0x1F44D, 0x00E9, 0x00FC, 0x4E2D, 0x0416};
  static const char* pieces[] = {"'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "the", " the", "  ",
                                 "\n\n", " \n", "123", "3.14", "don't", "ö", "日本", "🙂"};
  std::string s;
  for (int i = 0; i < n; ++i) {
    const uint32_t r = rng.next_u32();
    switch (r % 8) {
      case 0:
      case 1: s.push_back(static_cast<char>('a' + (r >> 8) % 26)); break;
      case 2: s.push_back(static_cast<char>(' ' + (r >> 8) % 95)); break;
      case 3: utf8_append(s, specials[(r >> 8) % (sizeof(specials) / sizeof(specials[0]))]); break;
      case 4: s += pieces[(r >> 8) % (sizeof(pieces) / sizeof(pieces[0]))]; break;
      case 5: utf8_append(s, static_cast<char32_t>(0x80 + (r >> 8) % 0x780)); break;  // 2-byte
      case 6: {
        char32_t cp = 0x800 + (r >> 8) % (0x10000 - 0x800);                              // 3-byte
        if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0x4E00;
        utf8_append(s, cp);
        break;
      }
      default: utf8_append(s, static_cast<char32_t>(0x10000 + (r >> 8) % 0x100000)); break;  // 4-byte
    }
  }
  return s;
}

// Independent re-statement of encoder.py's bytes_to_unicode, for building test vocabularies.
inline std::string byte_char(int b) {
  std::vector<int> bs;
  for (int c = '!'; c <= '~'; ++c) bs.push_back(c);
  for (int c = 0xA1; c <= 0xAC; ++c) bs.push_back(c);
  for (int c = 0xAE; c <= 0xFF; ++c) bs.push_back(c);
  int n = 0;
  char32_t cp = 0;
  for (int c = 0; c < 256; ++c) {
    const bool in = std::find(bs.begin(), bs.end(), c) != bs.end();
    const char32_t m = in ? static_cast<char32_t>(c) : static_cast<char32_t>(256 + n++);
    if (c == b) cp = m;
  }
  std::string s;
  utf8_append(s, cp);
  return s;
}

// A tiny GPT-2-format vocabulary: 256 byte tokens, a few merges, then <|endoftext|>.
struct TinyGpt2 {
  std::vector<std::pair<std::string, std::string>> merges = {
      {"Ġ", "t"}, {"h", "e"}, {"Ġt", "he"}, {"i", "n"}, {"Ġ", "a"}, {"e", "r"}, {"Ġa", "n"},
      {"Ġan", "d"}, {"o", "n"}, {"Ġ", "Ġ"}, {"ĠĠ", "ĠĠ"}, {"'", "s"}, {"l", "l"}, {"Ċ", "Ċ"}};
  std::vector<std::string> tokens;
  void write(const std::filesystem::path& vocab, const std::filesystem::path& merges_file) {
    for (int b = 0; b < 256; ++b) tokens.push_back(byte_char(b));
    for (const auto& [a, b] : merges) tokens.push_back(a + b);
    tokens.push_back("<|endoftext|>");
    nlohmann::json j;
    for (size_t i = 0; i < tokens.size(); ++i) j[tokens[i]] = i;
    write_text(vocab, j.dump());
    std::string m = "#version: 0.2\n";
    for (const auto& [a, b] : merges) m += a + " " + b + "\n";
    write_text(merges_file, m);
  }
  int id(const std::string& t) const {
    return static_cast<int>(std::find(tokens.begin(), tokens.end(), t) - tokens.begin());
  }
};

}  // namespace kiln::data::testing
