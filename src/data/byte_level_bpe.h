// Internal to kiln_data: byte-level BPE (Radford et al. 2019, OpenAI's gpt-2/src/encoder.py),
// shared by the "gpt2" kind (OpenAI's encoder.json + vocab.bpe) and the "hf" kind (Hugging
// Face's tokenizer.json with model.type = "BPE" and a ByteLevel pre-tokenizer/decoder).
//
//   bytes_to_unicode(): every byte b gets a printable character (b itself when printable,
//     else U+0100 + n in byte order); a token's text is its bytes in that alphabet.
//   ByteLevelBpe: the vocabulary (id -> text) and the ranked merges. encode_piece() maps a
//     pre-token's UTF-8 bytes to their byte tokens and repeatedly merges the adjacent pair
//     of lowest rank (all its occurrences, left to right) until no ranked pair is left, as
//     encoder.py's bpe(). Merging runs on ids, equivalent because text <-> id is one to one.
//   gpt2_pretokenize(): GPT-2's pre-tokenizer regex, hand-written (see byte_level_bpe.cpp).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kiln::data {

/// encoder.py's bytes_to_unicode(): the UTF-8 text of byte b's character.
const std::array<std::string, 256>& bytes_to_unicode();

/// Which characters GPT-2's regex calls \s.
enum class RegexSpace {
  /// ECMAScript's WhiteSpace + LineTerminator: TAB LF VT FF CR U+FEFF U+2028 U+2029 and
  /// category Zs, as in the JavaScript port kiln's GPT-2 test compares against (gpt2 kind).
  EcmaScript,
  /// Unicode White_Space: the same without U+FEFF, with U+0085, as Oniguruma, the regex
  /// engine of Hugging Face's tokenizers (hf kind's ByteLevel pre-tokenizer).
  WhiteSpace,
};

/// Calls f(piece) for GPT-2's pre-tokens of valid UTF-8 `text`, in order:
///   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
/// \p{L} / \p{N} are ICU's general categories L* / N*; \s as `space` says. The pieces
/// concatenate to `text`.
void gpt2_pretokenize(std::string_view text, const std::function<void(std::string_view)>& f,
                      RegexSpace space = RegexSpace::EcmaScript);

class ByteLevelBpe {
 public:
  /// `tokens[id]` is token id's text in the bytes_to_unicode alphabet (special tokens may
  /// be any text: they decode as themselves); `merges` in rank order (rank = index). `what`
  /// names the source in errors. Throws kiln::Error (one line, naming `what` and the token
  /// or merge index) when a token text repeats, a byte has no token, or a merge names a
  /// token (or a concatenation) missing from the vocabulary.
  ByteLevelBpe(std::vector<std::string> tokens, std::vector<std::pair<std::string, std::string>> merges,
               const std::string& what);

  int vocab_size() const { return static_cast<int>(tokens_.size()); }
  /// The id of token text `t`, or -1.
  int32_t find(const std::string& t) const;
  /// Appends the BPE ids of one pre-token (any bytes) to out. With `ignore_merges` (Hugging
  /// Face's model.ignore_merges), a pre-token that is itself a token is that token, merges
  /// or not. Thread-safe (cached per piece; one tokenizer always passes the same flag).
  void encode_piece(std::string_view piece, std::vector<int32_t>& out, bool ignore_merges = false) const;
  /// The bytes of id (unchecked): its text mapped back through bytes_to_unicode, or the
  /// text itself for a token outside that alphabet.
  const std::string& bytes(int32_t id) const { return bytes_[static_cast<size_t>(id)]; }
  const std::vector<std::string>& tokens() const { return tokens_; }
  const std::vector<std::pair<std::string, std::string>>& merges() const { return merges_; }
  /// FNV-1a over the tokens in id order then the merges in rank order, continuing from h.
  uint64_t hash(uint64_t h) const;

 private:
  static uint64_t key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  void bpe(std::vector<int32_t>& word) const;

  std::vector<std::string> tokens_;  // id -> token text (byte-mapped)
  std::vector<std::string> bytes_;   // id -> raw bytes
  std::vector<std::pair<std::string, std::string>> merges_;
  std::unordered_map<std::string, int32_t> ids_;
  std::unordered_map<uint64_t, std::pair<int, int32_t>> ranks_;  // (a, b) -> (rank, a+b)
  std::array<int32_t, 256> byte_id_{};
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

/// An entry of tokenizer.json's added_tokens.
struct HfAddedToken {
  int32_t id;
  std::string content;
  bool special;
};

/// Hugging Face's tokenizer.json for `bpe` as GPT-2's own file has it: a BPE model with
/// vocab and "a b" merges, ByteLevel pre-tokenizer (use_regex), post-processor and decoder,
/// no normalizer, and `added` as added_tokens. Implemented in hf_tokenizer.cpp.
std::string byte_level_hf_json(const ByteLevelBpe& bpe, const std::vector<HfAddedToken>& added);

}  // namespace kiln::data
