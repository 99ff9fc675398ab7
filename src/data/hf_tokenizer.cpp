// The "hf" kind: Hugging Face's tokenizer.json (the `tokenizers` library's serialization)
// for byte-level BPE, the kind GPT-2 and Llama 3 ship. Read from the file's own fields:
//
//   model          type "BPE": vocab {text: id}, merges as "a b" strings or [a, b] pairs
//                  (rank = index), ignore_merges (a pre-token that is itself a vocabulary
//                  token is emitted whole, as Llama 3's file asks); dropout null,
//                  byte_fallback false, no subword prefix/suffix.
//   added_tokens   [{id, content, special, lstrip, rstrip, single_word}]: matched in the
//                  raw text first (leftmost, then longest, as tokenizers' AddedVocabulary),
//                  special or not; the text between them goes through the pipeline below.
//                  Ids of model.vocab and added_tokens together must be dense 0..V-1.
//   normalizer     null only.
//   pre_tokenizer  ByteLevel (use_regex true = GPT-2's regex, kiln's hand-written splitter,
//                  data/byte_level_bpe.h, with \s = Unicode White_Space as tokenizers'
//                  Oniguruma: unlike the gpt2 kind, U+0085 is a space and U+FEFF not;
//                  add_prefix_space), Split (pattern {"Regex": ..}
//                  evaluated with ICU's regex, or {"String": ..}; behavior Removed, Isolated,
//                  MergedWithPrevious, MergedWithNext, Contiguous; invert), or a Sequence of
//                  them ending in a ByteLevel. ICU's \s is Unicode White_Space (VT and
//                  U+0085 included, U+FEFF not), as in Oniguruma, tokenizers' engine.
//   decoder        ByteLevel: ids -> bytes through bytes_to_unicode; added tokens decode to
//                  their content.
//   post_processor, truncation, padding: ignored (kiln adds its own document separator).
//
// Anything else is a one-line kiln::Error naming the field, e.g.
//   "tok/tokenizer.json: model.type = 'WordPiece': only BPE is supported".
//
// The document separator (eot_id(), placed before each document by `prepare`):
// "<|begin_of_text|>" when the vocabulary has it (Llama 3 begins every document with it),
// else "<|endoftext|>" (GPT-2), else "<|end_of_text|>".
#include "core/error.h"
#include "core/json_util.h"
#include "data/byte_level_bpe.h"
#include "data/tokenizer.h"
#include "data/tokenizer_internal.h"
#include "data/utf8.h"

#include <nlohmann/json.hpp>
#include <unicode/regex.h>
#include <unicode/utext.h>

#include <algorithm>
#include <memory>

namespace kiln::data {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct Added {
  int32_t id;
  std::string content;
  bool special;
};

enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

// One pre-tokenizer step: a Split or a ByteLevel.
// Steps of ICU's match engine one find() of a Split may take (RegexMatcher::setTimeLimit).
constexpr int32_t kRegexTimeLimit = 2000;

struct Step {
  bool byte_level = false;
  bool use_regex = true, add_prefix_space = false;  // ByteLevel
  std::unique_ptr<icu::RegexPattern> regex;         // Split
  Behavior behavior = Behavior::Isolated;
  bool invert = false;
};

class HfTokenizer final : public Tokenizer {
 public:
  HfTokenizer(std::string file_bytes, const std::string& where) : file_(std::move(file_bytes)) {
    json j;
    try {
      j = json::parse(file_);
    } catch (const json::exception& e) {
      KILN_FAIL("{}: malformed JSON ({})", where, e.what());
    }
    // kiln's own saved-tokenizer description has the same file name: say so instead of a
    // missing field.
    if (j.is_object() && j.contains("kind") && j["kind"].is_string() && !j.contains("model")) {
      const std::string kind = j["kind"].get<std::string>();
      KILN_FAIL("{}: is kiln's description of a saved '{}' tokenizer, not Hugging Face's "
                "tokenizer.json (pass --tokenizer {})", where, kind, kind);
    }
    std::string reading = "the file";  // the field being read, for type errors
    try {
      parse(j, where, reading);
    } catch (const json::exception& e) {
      KILN_FAIL("{}: {} has a field of the wrong type ({})", where, reading, e.what());
    }
    hash_ = hash_hex(fnv1a64(j.dump(), fnv1a64("hf\n")));
  }

  std::string kind() const override { return "hf"; }
  int vocab_size() const override { return bpe_->vocab_size(); }
  int eot_id() const override { return eot_; }

  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 4);
    pretokenize(text, [&](std::string_view piece, const Added* added) {
      if (added != nullptr) out.push_back(added->id);
      else bpe_->encode_piece(piece, out, ignore_merges_);
    });
    return out;
  }

  // Calls f(piece, added token or null) for the pre-tokens of text: added tokens matched
  // first (leftmost, longest), the text between them through the pre_tokenizer steps.
  template <class F>
  void pretokenize(std::string_view text, F&& f) const {
    require_utf8(text, "hf tokenizer input");
    size_t start = 0;  // text [start, i) is not yet split
    auto plain = [&](std::string_view t) {
      for (const std::string& p : split_plain(t)) f(p, nullptr);
    };
    for (size_t i = 0; i < text.size();) {
      const Added* hit = match_added(text, i);
      if (hit == nullptr) {
        ++i;
        continue;
      }
      plain(text.substr(start, i - start));
      f(std::string_view(hit->content), hit);
      i += hit->content.size();
      start = i;
    }
    plain(text.substr(start));
  }

  std::string decode(std::span<const int32_t> ids) const override {
    std::string out;
    for (int32_t id : ids) {
      KILN_CHECK(id >= 0 && id < vocab_size(), "hf tokenizer: id {} out of range [0, {})", id, vocab_size());
      const auto it = added_by_id_.find(id);
      out += it != added_by_id_.end() ? it->second : bpe_->bytes(id);
    }
    return out;
  }

  std::string hash() const override { return hash_; }

  void save(const fs::path& dir) const override {
    create_directory_for(dir);
    write_file_atomic(dir / kHfFileName, file_);
    write_tokenizer_json(dir, *this, {{"tokenizer", kHfFileName}});
  }

  std::map<std::string, std::string> hf_files() const override {
    return {{"tokenizer.json", file_}, {"tokenizer_config.json", hf_tokenizer_config("PreTrainedTokenizerFast", bos_, eos_)}};
  }

  static constexpr const char* kHfFileName = "hf_tokenizer.json";

 private:
  void parse(const json& j, const std::string& where, std::string& reading) {
    KILN_CHECK(j.is_object(), "{}: expected a JSON object", where);
    auto field = [&](const json& obj, const char* key, const std::string& path) -> const json& {
      const auto it = obj.find(key);
      KILN_CHECK(it != obj.end(), "{}: {}.{} is missing", where, path, key);
      return *it;
    };
    auto require_null_or = [&](const json& obj, const char* key, const json& ok, const std::string& path) {
      const auto it = obj.find(key);
      KILN_CHECK(it == obj.end() || it->is_null() || *it == ok, "{}: {}.{} = {}: not supported (only {})",
                 where, path, key, it->dump(), ok.dump());
    };
    // normalizer
    const auto norm = j.find("normalizer");
    KILN_CHECK(norm == j.end() || norm->is_null(), "{}: normalizer = {}: only null is supported", where,
               norm->is_object() && norm->contains("type") ? "'" + norm->at("type").get<std::string>() + "'"
                                                           : norm->dump());
    // model
    reading = "model";
    const json& model = field(j, "model", "tokenizer");
    KILN_CHECK(model.is_object(), "{}: model is not an object", where);
    const std::string type = model.value("type", "BPE");
    KILN_CHECK(type == "BPE", "{}: model.type = '{}': only BPE is supported", where, type);
    require_null_or(model, "dropout", nullptr, "model");
    require_null_or(model, "byte_fallback", false, "model");
    require_null_or(model, "continuing_subword_prefix", "", "model");
    require_null_or(model, "end_of_word_suffix", "", "model");
    ignore_merges_ = model.value("ignore_merges", false);
    const json& vocab = field(model, "vocab", "model");
    KILN_CHECK(vocab.is_object() && !vocab.empty(), "{}: model.vocab is not a non-empty object {{text: id}}", where);
    std::vector<std::string> tokens;
    std::vector<char> seen;
    // Ids cover 0..n-1 without holes (checked below), so none reaches the number of
    // entries: bounding by it first keeps a huge id from sizing the table.
    const auto added_list = j.find("added_tokens");
    const int64_t entries = static_cast<int64_t>(vocab.size()) +
                            (added_list != j.end() && added_list->is_array()
                                 ? static_cast<int64_t>(added_list->size()) : 0);
    auto put = [&](int64_t id, const std::string& text, const std::string& path) {
      KILN_CHECK(id >= 0 && id < entries && id < INT32_MAX,
                 "{}: {}: id {} out of range (model.vocab and added_tokens hold {} tokens, ids "
                 "0..{})", where, path, id, entries, entries - 1);
      if (id >= static_cast<int64_t>(tokens.size())) {
        tokens.resize(static_cast<size_t>(id) + 1);
        seen.resize(static_cast<size_t>(id) + 1, 0);
      }
      if (seen[id]) {
        KILN_CHECK(tokens[id] == text, "{}: {}: id {} is already '{}'", where, path, id, tokens[id]);
        return;
      }
      seen[id] = 1;
      tokens[id] = text;
    };
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      KILN_CHECK(it->is_number_integer(), "{}: model.vocab['{}'] is not an integer id", where, it.key());
      put(it->get<int64_t>(), it.key(), "model.vocab['" + it.key() + "']");
    }
    // added_tokens
    const auto at = j.find("added_tokens");
    if (at != j.end() && !at->is_null()) {
      KILN_CHECK(at->is_array(), "{}: added_tokens is not a list", where);
      for (size_t i = 0; i < at->size(); ++i) {
        const json& a = (*at)[i];
        const std::string path = fmt::format("added_tokens[{}]", i);
        reading = path;
        KILN_CHECK(a.is_object(), "{}: {} is not an object", where, path);
        const int64_t id = json_integer(field(a, "id", path), where, path + ".id");
        KILN_CHECK(id >= 0 && id < INT32_MAX, "{}: {}.id = {} out of range", where, path, id);
        Added t{static_cast<int32_t>(id), field(a, "content", path).get<std::string>(), a.value("special", false)};
        KILN_CHECK(!t.content.empty() && utf8_valid(t.content), "{}: {}.content is empty or not UTF-8", where, path);
        for (const char* k : {"lstrip", "rstrip", "single_word"})
          KILN_CHECK(!a.value(k, false), "{}: {}.{} = true: not supported", where, path, k);
        const auto in_vocab = vocab.find(t.content);
        KILN_CHECK(in_vocab == vocab.end() || *in_vocab == t.id,
                   "{}: {}: '{}' has id {} but model.vocab gives {}", where, path, t.content, t.id,
                   in_vocab->dump());
        put(t.id, t.content, path);
        added_by_id_[t.id] = t.content;
        added_.push_back(std::move(t));
      }
    }
    for (size_t id = 0; id < seen.size(); ++id)
      KILN_CHECK(seen[id], "{}: no token has id {} (model.vocab and added_tokens must cover 0..{})", where,
                 id, seen.size() - 1);
    // Longest first, so the first candidate that matches at a position is the longest.
    std::sort(added_.begin(), added_.end(),
              [](const Added& a, const Added& b) { return a.content.size() > b.content.size(); });
    for (size_t i = 0; i < added_.size(); ++i)
      added_first_[static_cast<unsigned char>(added_[i].content[0])].push_back(i);
    reading = "model.merges";
    const json& merges = field(model, "merges", "model");
    KILN_CHECK(merges.is_array(), "{}: model.merges is not a list", where);
    std::vector<std::pair<std::string, std::string>> pairs;
    pairs.reserve(merges.size());
    for (size_t i = 0; i < merges.size(); ++i) {
      const json& m = merges[i];
      if (m.is_string()) {
        const std::string s = m.get<std::string>();
        const size_t sp = s.find(' ');
        KILN_CHECK(sp != std::string::npos && sp > 0 && sp + 1 < s.size() && s.find(' ', sp + 1) == std::string::npos,
                   "{}: model.merges[{}] = '{}' is not 'a b'", where, i, s);
        pairs.emplace_back(s.substr(0, sp), s.substr(sp + 1));
      } else {
        KILN_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(),
                   "{}: model.merges[{}] = {} is neither 'a b' nor [a, b]", where, i, m.dump());
        pairs.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
      }
    }
    bpe_ = std::make_unique<ByteLevelBpe>(std::move(tokens), std::move(pairs), where + ": model");
    // pre_tokenizer
    reading = "pre_tokenizer";
    const json& pre = field(j, "pre_tokenizer", "tokenizer");
    if (pre.is_object() && pre.value("type", "") == "Sequence") {
      const json& list = field(pre, "pretokenizers", "pre_tokenizer");
      KILN_CHECK(list.is_array(), "{}: pre_tokenizer.pretokenizers is not a list", where);
      for (size_t i = 0; i < list.size(); ++i)
        steps_.push_back(parse_step(list[i], where, fmt::format("pre_tokenizer.pretokenizers[{}]", i)));
    } else {
      steps_.push_back(parse_step(pre, where, "pre_tokenizer"));
    }
    KILN_CHECK(!steps_.empty() && steps_.back().byte_level,
               "{}: pre_tokenizer: no ByteLevel step at its end (only byte-level BPE is supported)", where);
    // decoder
    reading = "decoder";
    const json& dec = field(j, "decoder", "tokenizer");
    KILN_CHECK(dec.is_object() && dec.value("type", "") == "ByteLevel", "{}: decoder = {}: only ByteLevel is supported",
               where, dec.is_object() ? "'" + dec.value("type", "?") + "'" : dec.dump());
    // Document separator, bos and eos (for tokenizer_config.json).
    auto id_of = [&](const char* t) { return bpe_->find(t); };
    const int32_t bot = id_of("<|begin_of_text|>"), gpt = id_of("<|endoftext|>"), eot = id_of("<|end_of_text|>");
    eot_ = bot >= 0 ? bot : gpt >= 0 ? gpt : eot;
    KILN_CHECK(eot_ >= 0, "{}: added_tokens: no document separator ('<|begin_of_text|>', '<|endoftext|>' or "
               "'<|end_of_text|>')", where);
    bos_ = bpe_->tokens()[static_cast<size_t>(eot_)];
    eos_ = bpe_->tokens()[static_cast<size_t>(eot >= 0 ? eot : gpt >= 0 ? gpt : eot_)];
  }

  static Step parse_step(const json& s, const std::string& where, const std::string& path) {
    KILN_CHECK(s.is_object() && s.contains("type"), "{}: {} is not a pre-tokenizer object", where, path);
    const std::string type = s.at("type").get<std::string>();
    Step step;
    if (type == "ByteLevel") {
      step.byte_level = true;
      step.use_regex = s.value("use_regex", true);
      step.add_prefix_space = s.value("add_prefix_space", false);
      return step;
    }
    KILN_CHECK(type == "Split", "{}: {}.type = '{}': only ByteLevel, Split and Sequence are supported", where,
               path, type);
    KILN_CHECK(s.contains("pattern") && s.at("pattern").is_object(), "{}: {}.pattern is missing", where, path);
    const json& p = s.at("pattern");
    const bool is_regex = p.contains("Regex");
    KILN_CHECK(is_regex || p.contains("String"), "{}: {}.pattern has neither Regex nor String", where, path);
    const std::string text = p.at(is_regex ? "Regex" : "String").get<std::string>();
    UErrorCode st = U_ZERO_ERROR;
    UParseError pe;
    step.regex.reset(icu::RegexPattern::compile(icu::UnicodeString::fromUTF8(text),
                                                is_regex ? 0 : UREGEX_LITERAL, pe, st));
    KILN_CHECK(U_SUCCESS(st), "{}: {}.pattern.{} = '{}': not a valid regex ({} at offset {})", where, path,
               is_regex ? "Regex" : "String", text, u_errorName(st), pe.offset);
    const std::string b = s.value("behavior", "");
    if (b == "Removed") step.behavior = Behavior::Removed;
    else if (b == "Isolated") step.behavior = Behavior::Isolated;
    else if (b == "MergedWithPrevious") step.behavior = Behavior::MergedWithPrevious;
    else if (b == "MergedWithNext") step.behavior = Behavior::MergedWithNext;
    else if (b == "Contiguous") step.behavior = Behavior::Contiguous;
    else KILN_FAIL("{}: {}.behavior = '{}': expected Removed, Isolated, MergedWithPrevious, MergedWithNext or Contiguous",
                   where, path, b);
    step.invert = s.value("invert", false);
    return step;
  }

  // The longest added token starting at text[i], or null.
  const Added* match_added(std::string_view text, size_t i) const {
    for (size_t k : added_first_[static_cast<unsigned char>(text[i])]) {
      const std::string& c = added_[k].content;
      if (text.compare(i, c.size(), c) == 0) return &added_[k];
    }
    return nullptr;
  }

  // Pre-tokenizes text (no added tokens in it) step by step.
  std::vector<std::string> split_plain(std::string_view text) const {
    if (text.empty()) return {};
    std::vector<std::string> pieces{std::string(text)}, next;
    for (const Step& s : steps_) {
      next.clear();
      for (const std::string& p : pieces) {
        if (s.byte_level) {
          const std::string q = s.add_prefix_space && p[0] != ' ' ? " " + p : p;
          if (s.use_regex)
            gpt2_pretokenize(q, [&](std::string_view x) { next.emplace_back(x); }, RegexSpace::WhiteSpace);
          else next.push_back(q);
        } else {
          split(s, p, next);
        }
      }
      pieces.swap(next);
    }
    return pieces;
  }

  static std::string icu_pattern(const Step& s) {
    std::string out;
    s.regex->pattern().toUTF8String(out);
    return out;
  }

  // tokenizers' Split: the pattern's matches and the text between them, combined by behavior.
  static void split(const Step& s, const std::string& text, std::vector<std::string>& out) {
    UErrorCode st = U_ZERO_ERROR;
    UText* ut = utext_openUTF8(nullptr, text.data(), static_cast<int64_t>(text.size()), &st);
    std::unique_ptr<icu::RegexMatcher> m(s.regex->matcher(st));
    KILN_CHECK(U_SUCCESS(st), "hf tokenizer: cannot run the Split regex ({})", u_errorName(st));
    m->reset(ut);
    // A pattern that backtracks catastrophically ((a*)*b on a run of a's) would run for
    // ever: ICU stops a find() after kRegexTimeLimit steps of its engine (about a
    // millisecond each), and that is a one-line error.
    m->setTimeLimit(kRegexTimeLimit, st);
    std::vector<std::pair<std::string_view, bool>> parts;  // (text, is a match)
    const std::string_view v(text);
    size_t prev = 0;
    while (m->find(st) && U_SUCCESS(st)) {
      const auto a = static_cast<size_t>(m->start64(st)), b = static_cast<size_t>(m->end64(st));
      if (a == b) continue;  // empty matches split nothing
      if (a > prev) parts.emplace_back(v.substr(prev, a - prev), s.invert);
      parts.emplace_back(v.substr(a, b - a), !s.invert);
      prev = b;
    }
    m.reset();
    utext_close(ut);
    KILN_CHECK(st != U_REGEX_TIME_OUT,
               "hf tokenizer: the Split regex /{}/ ran past its time limit on a piece of {} bytes "
               "(catastrophic backtracking: fix the pattern in tokenizer.json)",
               icu_pattern(s), text.size());
    KILN_CHECK(U_SUCCESS(st), "hf tokenizer: the Split regex failed ({})", u_errorName(st));
    if (prev < text.size()) parts.emplace_back(v.substr(prev), s.invert);
    std::string pending;  // MergedWithNext: matches waiting for the next part
    for (size_t i = 0; i < parts.size(); ++i) {
      const auto& [p, match] = parts[i];
      switch (s.behavior) {
        case Behavior::Removed:
          if (!match) out.emplace_back(p);
          break;
        case Behavior::Isolated: out.emplace_back(p); break;
        case Behavior::MergedWithPrevious:
          if (match && i > 0) out.back() += p;
          else out.emplace_back(p);
          break;
        case Behavior::MergedWithNext:
          if (match) pending += p;
          else out.emplace_back(pending + std::string(p)), pending.clear();
          break;
        case Behavior::Contiguous:
          if (match && i > 0 && parts[i - 1].second) out.back() += p;
          else out.emplace_back(p);
          break;
      }
    }
    if (!pending.empty()) out.push_back(pending);
  }

  std::string file_;
  std::unique_ptr<ByteLevelBpe> bpe_;
  bool ignore_merges_ = false;
  std::vector<Step> steps_;
  std::vector<Added> added_;                          // longest content first
  std::array<std::vector<size_t>, 256> added_first_;  // first byte -> indices into added_
  std::unordered_map<int32_t, std::string> added_by_id_;
  int32_t eot_ = 0;
  std::string bos_, eos_, hash_;
};

}  // namespace

std::vector<std::string> hf_pretokens(const Tokenizer& t, std::string_view text) {
  const auto* hf = dynamic_cast<const HfTokenizer*>(&t);
  KILN_CHECK(hf != nullptr, "hf_pretokens: a '{}' tokenizer is not of the hf kind", t.kind());
  std::vector<std::string> out;
  hf->pretokenize(text, [&](std::string_view p, const Added*) { out.emplace_back(p); });
  return out;
}

std::unique_ptr<Tokenizer> load_hf_tokenizer(const fs::path& path) {
  fs::path file = path;
  if (fs::is_directory(path)) {
    file = fs::exists(path / HfTokenizer::kHfFileName) ? path / HfTokenizer::kHfFileName : path / "tokenizer.json";
  }
  KILN_CHECK(fs::is_regular_file(file), "{}: no such file (expected Hugging Face's tokenizer.json)", file.string());
  return std::make_unique<HfTokenizer>(read_small_file(file), file.string());
}

std::string hf_tokenizer_config(const std::string& tokenizer_class, const std::string& bos,
                                const std::string& eos) {
  nlohmann::ordered_json j;
  j["tokenizer_class"] = tokenizer_class;
  j["bos_token"] = bos.empty() ? json(nullptr) : json(bos);
  j["eos_token"] = eos;
  j["add_bos_token"] = false;
  j["add_eos_token"] = false;
  j["clean_up_tokenization_spaces"] = false;
  return j.dump(2) + "\n";
}

std::string byte_level_hf_json(const ByteLevelBpe& bpe, const std::vector<HfAddedToken>& added) {
  nlohmann::ordered_json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = nlohmann::ordered_json::array();
  for (const auto& a : added) {
    j["added_tokens"].push_back({{"id", a.id}, {"content", a.content}, {"single_word", false}, {"lstrip", false},
                                 {"rstrip", false}, {"normalized", false}, {"special", a.special}});
  }
  j["normalizer"] = nullptr;
  const nlohmann::ordered_json byte_level = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  j["pre_tokenizer"] = byte_level;
  j["post_processor"] = byte_level;
  j["decoder"] = byte_level;
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  const auto& tokens = bpe.tokens();
  for (size_t id = 0; id < tokens.size(); ++id) vocab[tokens[id]] = id;
  nlohmann::ordered_json merges = nlohmann::ordered_json::array();
  for (const auto& [a, b] : bpe.merges()) merges.push_back(a + " " + b);
  j["model"] = {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
                {"continuing_subword_prefix", ""}, {"end_of_word_suffix", ""}, {"fuse_unk", false},
                {"byte_fallback", false}, {"vocab", std::move(vocab)}, {"merges", std::move(merges)}};
  return j.dump(2) + "\n";
}

}  // namespace kiln::data
