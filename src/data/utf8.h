// UTF-8 helpers shared by the tokenizers and `prepare`.
//
// Validation follows RFC 3629 / Unicode 15 table 3-7 (well-formed UTF-8 byte sequences):
// no overlong forms, no surrogates (U+D800..U+DFFF), nothing above U+10FFFF.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace kiln::data {

/// Result of utf8_check: `valid_len` bytes from the start are well-formed UTF-8.
/// error == true: the byte at `valid_len` starts an ill-formed sequence.
/// error == false and valid_len < size: the input ends inside a sequence that may still be
/// completed by more bytes (useful when validating a stream chunk by chunk).
struct Utf8Check {
  size_t valid_len = 0;
  bool error = false;
};

/// Scans `s` for well-formed UTF-8 (see the file comment). Never throws.
Utf8Check utf8_check(std::string_view s);

/// True when all of `s` is well-formed UTF-8.
inline bool utf8_valid(std::string_view s) {
  const Utf8Check c = utf8_check(s);
  return !c.error && c.valid_len == s.size();
}

/// Decodes the code point starting at s[i] and advances i past it. `s` must be valid UTF-8
/// (as checked by utf8_check); behaviour on ill-formed input is unspecified but memory-safe.
char32_t utf8_next(std::string_view s, size_t& i);

/// Appends the UTF-8 encoding of code point `cp` (<= U+10FFFF) to `out`.
template <class String>
void utf8_append(String& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

/// 64-bit FNV-1a (Fowler-Noll-Vo, http://www.isthe.com/chongo/tech/comp/fnv/) over `bytes`,
/// continuing from `h` (start with kFnvOffset). Used for the stable tokenizer hash.
inline constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull;
uint64_t fnv1a64(std::string_view bytes, uint64_t h = kFnvOffset);

/// `h` as 16 lower-case hex digits.
std::string_view hex64(uint64_t h, char (&buf)[17]);

}  // namespace kiln::data
