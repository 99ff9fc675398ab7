// The sentencepiece tokenizer: BPE trained with libsentencepiece (Kudo & Richardson,
// "SentencePiece", EMNLP 2018; https://github.com/google/sentencepiece, trainer options as
// documented in its doc/options.md), configured for lossless round trips:
//
//   normalization_rule_name=identity   no NFKC, text is kept as is
//   add_dummy_prefix=false             no space added in front
//   remove_extra_whitespaces=false     runs of spaces kept
//   allow_whitespace_only_pieces=true  "    " can be one piece (code indentation)
//   byte_fallback=true                 characters outside the vocabulary become <0xHH>
//   eos = "<|endoftext|>" (id 1), unk = id 0, no bos/pad
//   hard_vocab_limit=false             a small corpus gives a smaller vocabulary
//
// sentencepiece reads text line by line and represents ' ' by U+2581 ("▁"), so two
// characters cannot survive its own encoder: '\n' and a literal U+2581. kiln cuts the
// text at both and emits their byte-fallback pieces itself (<0x0A>; <0xE2><0x96><0x81>),
// and decodes with its own table (byte pieces -> bytes, '▁' -> ' ', eot ->
// "<|endoftext|>"), so decode(encode(x)) == x for every valid UTF-8 x.
#include "core/error.h"
#include "core/rng.h"
#include "data/input_file.h"
#include "data/tokenizer.h"
#include "data/tokenizer_internal.h"
#include "data/utf8.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <fstream>
#include <unordered_map>
#include <unordered_set>

namespace kiln::data {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kSpaceSymbol = "\xE2\x96\x81";  // U+2581
constexpr std::string_view kEotPiece = "<|endoftext|>";
constexpr size_t kMaxLine = 4096;

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(std::string model_bytes, const std::string& origin)
      : model_bytes_(std::move(model_bytes)) {
    const auto st = sp_.LoadFromSerializedProto(model_bytes_);
    KILN_CHECK(st.ok(), "{}: not a sentencepiece model ({})", origin, st.ToString());
    const int n = sp_.GetPieceSize();
    eot_ = sp_.PieceToId(kEotPiece);
    if (eot_ == sp_.unk_id() && sp_.IdToPiece(eot_) != kEotPiece) eot_ = sp_.eos_id();
    KILN_CHECK(eot_ >= 0 && eot_ < n, "{}: sentencepiece model has neither a '<|endoftext|>' piece nor an eos id",
               origin);
    for (int b = 0; b < 256; ++b) {
      const int id = sp_.PieceToId(fmt::format("<0x{:02X}>", b));
      KILN_CHECK(id != sp_.unk_id() && sp_.IsByte(id),
                 "{}: sentencepiece model lacks byte-fallback piece <0x{:02X}> (train with byte_fallback=true)",
                 origin, b);
      byte_id_[b] = id;
    }
    table_.resize(n);
    for (int id = 0; id < n; ++id) {
      const std::string piece = sp_.IdToPiece(id);
      if (id == eot_) {
        table_[id] = std::string(kEotPiece);
      } else if (sp_.IsByte(id)) {
        table_[id] = std::string(1, static_cast<char>(std::stoi(piece.substr(3, 2), nullptr, 16)));
      } else if (sp_.IsUnknown(id)) {
        table_[id] = "\xEF\xBF\xBD";  // U+FFFD; unreachable with byte fallback on valid UTF-8
      } else if (sp_.IsControl(id)) {
        table_[id] = "";
      } else {
        std::string s;
        for (size_t i = 0; i < piece.size();) {
          if (std::string_view(piece).substr(i, 3) == kSpaceSymbol) {
            s.push_back(' ');
            i += 3;
          } else {
            s.push_back(piece[i++]);
          }
        }
        table_[id] = std::move(s);
      }
    }
  }

  std::string kind() const override { return "sentencepiece"; }
  int vocab_size() const override { return static_cast<int>(table_.size()); }
  int eot_id() const override { return eot_; }

  std::vector<int32_t> encode(std::string_view text) const override {
    require_utf8(text, "sentencepiece tokenizer input");
    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 4);
    std::vector<int> ids;
    size_t start = 0;
    auto flush = [&](size_t end) {
      if (end > start) {
        ids.clear();
        const auto st = sp_.Encode(text.substr(start, end - start), &ids);
        KILN_CHECK(st.ok(), "sentencepiece encode failed: {}", st.ToString());
        out.insert(out.end(), ids.begin(), ids.end());
      }
    };
    for (size_t i = 0; i < text.size();) {
      if (text[i] == '\n') {
        flush(i);
        out.push_back(byte_id_['\n']);
        start = ++i;
      } else if (text.substr(i, 3) == kSpaceSymbol) {
        flush(i);
        for (unsigned char c : kSpaceSymbol) out.push_back(byte_id_[c]);
        i += 3;
        start = i;
      } else {
        ++i;
      }
    }
    flush(text.size());
    return out;
  }

  std::string decode(std::span<const int32_t> ids) const override {
    std::string out;
    for (int32_t id : ids) {
      KILN_CHECK(id >= 0 && id < vocab_size(), "sentencepiece tokenizer: id {} out of range [0, {})",
                 id, vocab_size());
      out += table_[id];
    }
    return out;
  }

  std::string hash() const override {
    return hash_hex(fnv1a64(model_bytes_, fnv1a64("sentencepiece\n")));
  }

  void save(const fs::path& dir) const override {
    create_directory_for(dir);
    write_file_atomic(dir / "tokenizer.model", model_bytes_);
    write_tokenizer_json(dir, *this, {{"model", "tokenizer.model"}});
  }

  std::map<std::string, std::string> hf_files() const override {
    // The same model file; no bos piece (kiln trains none), eos = the separator.
    return {{"tokenizer.model", model_bytes_},
            {"tokenizer_config.json", hf_tokenizer_config("LlamaTokenizer", "", sp_.IdToPiece(eot_))}};
  }

 private:
  std::string model_bytes_;
  sentencepiece::SentencePieceProcessor sp_;
  int eot_ = 0;
  std::array<int32_t, 256> byte_id_{};
  std::vector<std::string> table_;
};

// Reservoir sample (Vitter's algorithm R) of the training lines, drawn with Philox.
class LineSampler {
 public:
  LineSampler(int64_t capacity, uint64_t seed) : cap_(capacity), rng_(seed, 0x5e17) {}
  void add(std::string_view line) {
    if (line.empty()) return;
    if (static_cast<int64_t>(lines_.size()) < cap_) {
      lines_.emplace_back(line);
    } else {
      const uint64_t r = (static_cast<uint64_t>(rng_.next_u32()) << 32) | rng_.next_u32();
      const uint64_t j = static_cast<uint64_t>((static_cast<unsigned __int128>(r) * (seen_ + 1)) >> 64);
      if (j < static_cast<uint64_t>(cap_)) lines_[j].assign(line);
    }
    ++seen_;
  }
  // Splits `text` (valid UTF-8, no '\n') at U+2581 and into pieces of <= kMaxLine bytes.
  void add_line(std::string_view text) {
    size_t pos;
    while ((pos = text.find(kSpaceSymbol)) != std::string_view::npos) {
      add_line(text.substr(0, pos));
      text.remove_prefix(pos + kSpaceSymbol.size());
    }
    while (text.size() > kMaxLine) {
      size_t cut = kMaxLine;
      while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
      add(text.substr(0, cut));
      text.remove_prefix(cut);
    }
    add(text);
  }
  std::vector<std::string>& lines() { return lines_; }

 private:
  int64_t cap_;
  Philox rng_;
  uint64_t seen_ = 0;
  std::vector<std::string> lines_;
};

class VectorIterator final : public sentencepiece::SentenceIterator {
 public:
  explicit VectorIterator(const std::vector<std::string>& v) : v_(v) {}
  bool done() const override { return i_ >= v_.size(); }
  void Next() override { ++i_; }
  const std::string& value() const override { return v_[i_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::vector<std::string>& v_;
  size_t i_ = 0;
};

void sample_file(const fs::path& path, const std::string& separator, LineSampler& sampler) {
  InputFile f(path);
  std::string buf;
  std::vector<char> chunk(1 << 20);
  int64_t consumed = 0;  // offset of buf[0] in the (decompressed) text
  bool eof = false;
  while (!eof) {
    const size_t got = f.read(chunk.data(), chunk.size());
    eof = got == 0;
    buf.append(chunk.data(), static_cast<size_t>(got));
    // Keep only complete lines (or, for an over-long line, its whole UTF-8 characters).
    size_t end = eof ? buf.size() : buf.rfind('\n');
    if (end == std::string::npos) {
      if (buf.size() < kMaxLine * 4) continue;
      end = buf.size();
    } else if (!eof) {
      end += 1;
    }
    const Utf8Check chk = utf8_check(std::string_view(buf).substr(0, end));
    KILN_CHECK(!chk.error && (chk.valid_len == end || !eof), "{}: invalid UTF-8 at byte offset {}",
               path.string(), consumed + static_cast<int64_t>(chk.valid_len));
    end = chk.valid_len;
    std::string_view text(buf.data(), end);
    size_t nl;
    while ((nl = text.find('\n')) != std::string_view::npos || (!text.empty())) {
      std::string_view line = text.substr(0, nl == std::string_view::npos ? text.size() : nl);
      text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
      if (!separator.empty()) {
        size_t p;
        while ((p = line.find(separator)) != std::string_view::npos) {
          sampler.add_line(line.substr(0, p));
          line.remove_prefix(p + separator.size());
        }
      }
      sampler.add_line(line);
    }
    buf.erase(0, end);
    consumed += static_cast<int64_t>(end);
  }
}

/// Trains a BPE model on the sampled lines.
std::unique_ptr<Tokenizer> train_on_sample(LineSampler& sampler, const SentencePieceTrainOptions& options) {
  // sentencepiece gives every "required" character (those making up character_coverage
  // of the text) its own piece and fails when they outnumber the vocabulary; coverage
  // cannot go below 0.98. With byte fallback rare characters can go to bytes anyway, so
  // when the sample has more distinct characters than half of the non-byte vocabulary,
  // the rarest ones are removed from the training sample (they encode as bytes).
  {
    std::unordered_map<char32_t, int64_t> counts;
    for (const auto& line : sampler.lines())
      for (size_t i = 0; i < line.size();) ++counts[utf8_next(line, i)];
    const size_t budget = static_cast<size_t>(std::max(2, (options.vocab_size - 258) / 2));
    if (counts.size() > budget) {
      std::vector<std::pair<int64_t, char32_t>> freq;
      for (const auto& [c, n] : counts) freq.emplace_back(n, c);
      std::sort(freq.begin(), freq.end(), std::greater<>());  // ties: larger code point first
      std::unordered_set<char32_t> keep;
      for (size_t k = 0; k < budget; ++k) keep.insert(freq[k].second);
      for (auto& line : sampler.lines()) {
        std::string kept;
        for (size_t i = 0; i < line.size();) {
          const size_t start = i;
          if (keep.count(utf8_next(line, i))) kept.append(line, start, i - start);
        }
        line = std::move(kept);
      }
      auto& lines = sampler.lines();
      lines.erase(std::remove_if(lines.begin(), lines.end(), [](const std::string& l) { return l.empty(); }),
                  lines.end());
    }
  }
  const std::unordered_map<std::string, std::string> args = {
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(options.vocab_size)},
      {"byte_fallback", "true"},
      {"normalization_rule_name", "identity"},
      {"add_dummy_prefix", "false"},
      {"remove_extra_whitespaces", "false"},
      {"allow_whitespace_only_pieces", "true"},
      {"split_by_whitespace", "true"},
      {"character_coverage", "0.9995"},
      {"unk_id", "0"},
      {"bos_id", "-1"},
      {"eos_id", "1"},
      {"pad_id", "-1"},
      {"eos_piece", std::string(kEotPiece)},
      {"hard_vocab_limit", "false"},
      {"max_sentence_length", std::to_string(kMaxLine * 4)},
      {"input_sentence_size", "0"},  // kiln samples above
      {"num_threads", std::to_string(std::max(1, options.num_threads))},
      {"minloglevel", "2"},
  };
  VectorIterator it(sampler.lines());
  std::string model;
  const auto st = sentencepiece::SentencePieceTrainer::Train(args, &it, &model);
  KILN_CHECK(st.ok(), "sentencepiece training failed: {}", st.ToString());
  return std::make_unique<SentencePieceTokenizer>(std::move(model), "trained sentencepiece model");
}

}  // namespace

std::unique_ptr<Tokenizer> train_sentencepiece(const std::vector<fs::path>& inputs,
                                               const SentencePieceTrainOptions& options) {
  KILN_CHECK(!inputs.empty(), "sentencepiece training: no input files");
  KILN_CHECK(options.vocab_size >= 260,
             "sentencepiece vocab_size {} too small: needs 256 byte pieces + unk + eot + at least 2 more",
             options.vocab_size);
  LineSampler sampler(std::max<int64_t>(1, options.max_sentences), options.seed);
  for (const auto& p : inputs) sample_file(p, options.separator, sampler);
  KILN_CHECK(!sampler.lines().empty(), "sentencepiece training: inputs {} hold no text",
             inputs.front().string());
  return train_on_sample(sampler, options);
}

std::unique_ptr<Tokenizer> train_sentencepiece_on_texts(const TextVisitor& for_each_text,
                                                        const SentencePieceTrainOptions& options) {
  KILN_CHECK(options.vocab_size >= 260,
             "sentencepiece vocab_size {} too small: needs 256 byte pieces + unk + eot + at least 2 more",
             options.vocab_size);
  LineSampler sampler(std::max<int64_t>(1, options.max_sentences), options.seed);
  for_each_text([&](std::string_view text) {
    require_utf8(text, "sentencepiece training text");
    size_t nl;
    while ((nl = text.find('\n')) != std::string_view::npos) {
      sampler.add_line(text.substr(0, nl));
      text.remove_prefix(nl + 1);
    }
    sampler.add_line(text);
  });
  KILN_CHECK(!sampler.lines().empty(), "sentencepiece training: the texts are empty");
  return train_on_sample(sampler, options);
}

std::unique_ptr<Tokenizer> load_sentencepiece_model(const fs::path& model_file) {
  return std::make_unique<SentencePieceTokenizer>(read_small_file(model_file), model_file.string());
}

}  // namespace kiln::data
