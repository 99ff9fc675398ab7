#include "data/utf8.h"

namespace kiln::data {

Utf8Check utf8_check(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len;
    unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;        // no overlongs
      else if (c == 0xED) hi = 0x9F;   // no surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;        // no overlongs
      else if (c == 0xF4) hi = 0x8F;   // <= U+10FFFF
    } else {
      return {i, true};
    }
    for (int k = 1; k < len; ++k) {
      if (i + k >= n) return {i, false};  // incomplete so far
      const unsigned char b = p[i + k];
      const unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
      if (b < l || b > h) return {i, true};
    }
    i += len;
  }
  return {n, false};
}

char32_t utf8_next(std::string_view s, size_t& i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const unsigned char c = p[i];
  int len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
  if (i + len > s.size()) len = 1;
  char32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
  for (int k = 1; k < len; ++k) cp = (cp << 6) | (p[i + k] & 0x3F);
  i += len;
  return cp;
}

uint64_t fnv1a64(std::string_view bytes, uint64_t h) {
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

std::string_view hex64(uint64_t h, char (&buf)[17]) {
  static const char* digits = "0123456789abcdef";
  for (int k = 15; k >= 0; --k) {
    buf[k] = digits[h & 0xF];
    h >>= 4;
  }
  buf[16] = 0;
  return {buf, 16};
}

}  // namespace kiln::data
