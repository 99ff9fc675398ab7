#include "apps/kiln/commands.h"
#include "core/error.h"
#include "data/image_dataset.h"
#include "data/pair_dataset.h"
#include "data/prepare.h"

#include <fmt/format.h>

#include <glob.h>

#include <algorithm>
#include <charconv>
#include <tuple>
#include <filesystem>
#include <vector>

namespace kiln::app {

namespace {

// `pattern` itself when it names a file or has no wildcard (a missing file is reported by
// prepare), else the files it matches, sorted (glob(3)); none is an error.
std::vector<std::filesystem::path> expand_glob(const std::string& pattern) {
  if (pattern.find_first_of("*?[") == std::string::npos || std::filesystem::exists(pattern)) return {pattern};
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::filesystem::path> out;
  for (size_t i = 0; rc == 0 && i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  globfree(&g);
  KILN_CHECK(!out.empty(), "prepare: --input '{}' matches no file", pattern);
  return out;
}

// One line on stderr per report: documents/s, tokens/s, MB/s and the ETA from the bytes.
void print_progress(const data::PrepareProgress& p) {
  const double s = std::max(p.seconds, 1e-9);
  const double frac = p.bytes_total > 0 ? static_cast<double>(p.bytes_done) / static_cast<double>(p.bytes_total) : 1.0;
  const double eta = frac > 0 ? p.seconds * (1.0 - frac) / frac : 0.0;
  fmt::print(stderr, "kiln prepare: {:.0f}% {} documents {} tokens | {:.0f} documents/s {:.3g} tokens/s "
             "{:.2f} MB/s | ETA {:.0f} s\n", 100.0 * frac, p.documents, p.tokens, p.documents / s,
             p.tokens / s, p.bytes_done / s / 1e6, eta);
}

// The records skipped or cut: empty texts, overlong conversations, and bad lines (a count
// and the first examples), on stderr.
void report_bad_lines(const data::PrepareSummary& r, const std::string& overlong) {
  if (r.empty_texts > 0) fmt::print(stderr, "kiln prepare: skipped {} records with empty text\n", r.empty_texts);
  if (r.overlong > 0)
    fmt::print(stderr, "kiln prepare: {} conversations over --max-tokens: {}\n", r.overlong,
               overlong == "drop" ? "dropped" : "kept (the training windows cut them)");
  if (r.bad_lines == 0) return;
  fmt::print(stderr, "kiln prepare: skipped {} bad line{} (--strict makes one an error); the first:\n",
             r.bad_lines, r.bad_lines == 1 ? "" : "s");
  for (const auto& e : r.bad_line_examples) fmt::print(stderr, "  {}\n", e);
}

// --image-size: "N" (N x N) or "HxW", each side 1 .. 16384.
std::pair<int, int> parse_size(const std::string& s) {
  const size_t x = s.find('x');
  auto side = [&](const std::string& t) {
    int v = 0;
    const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
    KILN_CHECK(ec == std::errc() && end == t.data() + t.size() && v >= 1 && v <= 1 << 14,
               "prepare: --image-size '{}': expected N or HxW, sides 1 .. 16384", s);
    return v;
  };
  if (x == std::string::npos) return {side(s), side(s)};
  return {side(s.substr(0, x)), side(s.substr(x + 1))};
}

// --format llava: LLaVA pair files to image shards with captions (data/pair_dataset.h).
// `tok` carries --out, --val-fraction and the tokenizer's options; the text formats' other
// options (`text_only`) are refused.
void prepare_llava(data::PrepareOptions tok, data::PreparePairsOptions pairs,
                   const std::vector<std::string>& in, const std::vector<std::string>& tf,
                   const CLI::Option& tokenizer, const std::vector<CLI::Option*>& text_only) {
  KILN_CHECK(in.size() == 1, "prepare --format llava: --input takes one pair file (the train "
             "split's; --val-input the val split's), got {}", in.size());
  for (const CLI::Option* o : text_only)
    KILN_CHECK(o->count() == 0 || o == &tokenizer || o->get_name() == "--tokenizer-files" ||
                   o->get_name() == "--val-fraction" || o->get_name() == "--vocab-size",
               "prepare --format llava: {} is for text", o->get_name());
  pairs.val_fraction = tok.val_fraction;
  KILN_CHECK(tokenizer.count() > 0, "prepare --format llava: --tokenizer is required (byte | "
             "gpt2 | hf | sentencepiece)");
  const std::vector<std::string> kinds = {"byte", "gpt2", "hf", "sentencepiece"};
  KILN_CHECK(std::find(kinds.begin(), kinds.end(), tok.tokenizer) != kinds.end(),
             "prepare --format llava: unknown tokenizer '{}' (expected byte, gpt2, hf or "
             "sentencepiece)", tok.tokenizer);
  for (const auto& s : tf) tok.tokenizer_files.emplace_back(s);
  // sentencepiece without a .model file: trained on the train split's conversations.
  const bool trains = tok.tokenizer == "sentencepiece" && tok.tokenizer_files.empty();
  KILN_CHECK(tok.vocab_size == 0 || trains,  // (0: --vocab-size not given)
             "prepare --format llava: --vocab-size sizes a sentencepiece tokenizer trained on "
             "the pairs; the {} tokenizer{} has its own", tok.tokenizer,
             tok.tokenizer_files.empty() ? "" : " of --tokenizer-files");
  std::unique_ptr<data::Tokenizer> t;
  if (trains) {
    KILN_CHECK(tok.vocab_size > 0, "prepare --format llava: sentencepiece needs --vocab-size "
               "(trained on the pairs) or its .model file (--tokenizer-files)");
    data::SentencePieceTrainOptions so;
    so.vocab_size = tok.vocab_size;
    so.max_sentences = tok.sp_max_sentences;
    t = data::train_pairs_tokenizer(in[0], so);
    if (t->vocab_size() < tok.vocab_size)
      fmt::print(stderr, "kiln prepare: note: the sentencepiece tokenizer has {} pieces, fewer "
                 "than --vocab-size {}: the conversations hold no more\n", t->vocab_size(),
                 tok.vocab_size);
  } else {
    t = data::make_tokenizer(tok);
  }
  pairs.input = in[0];
  pairs.out_dir = tok.out_dir;
  pairs.tokenizer = t.get();
  const data::PreparePairsSummary r = data::prepare_pairs(pairs);
  for (const std::string& e : r.skipped_examples) fmt::print(stderr, "kiln prepare: skipped {}\n", e);
  if (r.truncated > 0)
    fmt::print(stderr, "kiln prepare: note: {} record{} cut to --caption-tokens {} ({} before "
               "their first answer): what they say past it is not learned\n", r.truncated,
               r.truncated == 1 ? "" : "s", r.meta.captions.tokens, r.answerless);
  std::string splits;
  for (const auto& [name, shards] : r.meta.splits)
    splits += fmt::format(" {}={} pairs ({} shards)", name, r.meta.images(name), shards.size());
  fmt::print("kiln prepare: {}x{}x{} images, {} caption tokens ({}, vocab {}):{}; {} cut to {} "
             "tokens, {} bad skipped -> {}\n", r.meta.shape.height, r.meta.shape.width,
             r.meta.shape.channels, r.meta.captions.tokens, t->kind(), t->vocab_size(), splits,
             r.truncated, r.meta.captions.tokens, r.skipped, tok.out_dir.string());
}

}  // namespace

void register_prepare(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "prepare", "Tokenize UTF-8 text, JSONL or chat conversations into llm.c-format token shards, "
                 "(--format idx | imagefolder) turn labelled images into image shards, or "
                 "(--format llava) image-text pairs into image shards with captions");
  auto opt = std::make_shared<data::PrepareOptions>();
  std::vector<std::string> inputs, tok_files;
  auto in = std::make_shared<std::vector<std::string>>();
  auto tf = std::make_shared<std::vector<std::string>>();
  auto format = std::make_shared<std::string>("text");
  auto shard_images = std::make_shared<int64_t>(100000);
  cmd->add_option("--input", *in, "Input files, plain, gzip or zstd, or quoted globs ('data/*.jsonl.zst'): "
                                  "text (one file = one document), JSONL or chat JSONL; --format idx | imagefolder: the "
                                  "directory of IDX files or the image folder; --format llava: one pair "
                                  "file (JSON or JSONL, no glob)")->required();
  cmd->add_option("--format", *format, "text (default) | jsonl (one JSON object per line, --text-key its "
                                       "document) | chat (JSONL conversations {\"messages\": [{\"role\", "
                                       "\"content\"}]}, --chat-template; the loss on the assistant's turns) | "
                                       "idx (MNIST-format images and labels: "
                                       "train-* and t10k-* [.gz]) | imagefolder ([train/, val/] "
                                       "<class>/*.png) | llava (LLaVA image-text pairs: a JSON or "
                                       "JSONL file, PNG images; docs/data.md)")
      ->check(CLI::IsMember({"text", "jsonl", "chat", "idx", "imagefolder", "llava"}));
  auto pairs = std::make_shared<data::PreparePairsOptions>();
  auto llava_only = std::make_shared<std::vector<CLI::Option*>>();
  llava_only->push_back(cmd->add_option("--val-input", pairs->val_input,
                                        "llava: the val split's pair file"));
  llava_only->push_back(cmd->add_option("--images", pairs->images,
                                        "llava: the folder image paths are relative to (default: "
                                        "each pair file's folder)"));
  llava_only->push_back(cmd->add_option("--caption-tokens", pairs->caption_tokens,
                                        "llava: token slots per record (default 512); a longer "
                                        "record is cut (counted)"));
  auto image_size = std::make_shared<std::string>();
  llava_only->push_back(cmd->add_option("--image-size", *image_size,
                                        "llava: N or HxW: every image resized to it (PIL's "
                                        "bilinear; default: the first image's size, kept)"));
  llava_only->push_back(cmd->add_option("--channels", pairs->channels,
                                        "llava: 1 (gray) or 3 (RGB) for every image (default: "
                                        "the first readable image's)"));
  llava_only->push_back(cmd->add_flag("--skip-bad", pairs->skip_bad,
                                      "llava: skip and count bad records instead of the error"));
  cmd->add_option("--shard-images", *shard_images, "--format idx | imagefolder | llava: images per shard (default 100000)");
  auto class_names = std::make_shared<std::string>();
  cmd->add_option("--class-names", *class_names, "--format idx: the classes' names in label order, "
                  "comma-separated (stored in meta.json)");
  cmd->add_option("--out", opt->out_dir, "Output directory for shards, meta.json and tokenizer")
      ->required();
  auto tokenizer = cmd->add_option("--tokenizer", opt->tokenizer,
                                   "sentencepiece | gpt2 | hf | byte (required for text, jsonl and chat; chat "
                                   "needs hf)");
  // Options of text and jsonl only: refused with --format idx | imagefolder rather than ignored.
  auto text_only = std::make_shared<std::vector<CLI::Option*>>();
  text_only->push_back(cmd->add_option("--vocab-size", opt->vocab_size, "Vocabulary size (sentencepiece)"));
  text_only->push_back(cmd->add_option("--val-fraction", opt->val_fraction,
                                       "Fraction held out for validation (text, jsonl, chat; llava without "
                                       "--val-input: each record with this probability; images: the "
                                       "t10k-* files or the val/ folder are the val split)"));
  text_only->push_back(tokenizer);
  text_only->push_back(cmd->add_option("--tokenizer-files", *tf,
                  "gpt2: encoder.json + vocab.bpe, or vocab.json + merges.txt; hf: Hugging Face's "
                  "tokenizer.json or its directory; sentencepiece: a .model file"));
  text_only->push_back(cmd->add_option("--shard-format", opt->shard_format,
                  "kiln (default: uint16 v1, or kiln's uint32 v2 past 65,535 ids) | llmc (uint16 v1, "
                  "or llm.c's uint32 v7) | llmc-u32 (llm.c's uint32 v7 always)")
      ->check(CLI::IsMember({"kiln", "llmc", "llmc-u32"})));
  text_only->push_back(cmd->add_option("--shard-tokens", opt->shard_tokens, "Tokens per shard"));
  text_only->push_back(cmd->add_option("--separator", opt->separator,
                                       "Split documents inside a file at this string (text)"));
  // Options of JSONL input (jsonl and chat), of jsonl only (--text-key) and of chat only:
  // refused with another format.
  auto jsonl_only = std::make_shared<std::vector<CLI::Option*>>();
  auto chat_only = std::make_shared<std::vector<CLI::Option*>>();
  auto text_key = cmd->add_option("--text-key", opt->text_key, "jsonl: the key of each record's text (default text)");
  text_only->push_back(text_key);
  chat_only->push_back(cmd->add_option("--chat-template", opt->chat_template,
                                       "chat: llama3 (default; Llama 3 Instruct's) | chatml")
                           ->check(CLI::IsMember({"llama3", "chatml"})));
  chat_only->push_back(cmd->add_option("--max-tokens", opt->chat_max_tokens,
                                       "chat: a conversation of more tokens (with its separator) is overlong "
                                       "(default 0: no limit)")
                           ->check(CLI::Range(int64_t{0}, int64_t{1} << 40)));
  chat_only->push_back(cmd->add_option("--overlong", opt->chat_overlong,
                                       "chat: split (default: kept; the training windows cut it) | drop")
                           ->check(CLI::IsMember({"split", "drop"})));
  jsonl_only->push_back(cmd->add_flag("--strict", opt->strict,
                                      "jsonl, chat: a bad line is an error (default: skipped, counted and "
                                      "reported)"));
  for (auto* o : *jsonl_only) text_only->push_back(o);
  for (auto* o : *chat_only) text_only->push_back(o);
  text_only->push_back(cmd->add_option("--threads", opt->threads,
                                       "Tokenizing threads (default: OMP_NUM_THREADS, else every core); the "
                                       "output does not depend on it"));
  cmd->callback([opt, in, tf, format, shard_images, tokenizer, class_names, text_only, jsonl_only, chat_only,
                 text_key, pairs, llava_only, image_size] {
    if (*format == "llava") {
      KILN_CHECK(class_names->empty(), "prepare: --class-names is for --format idx");
      pairs->shard_images = *shard_images;
      if (!image_size->empty()) std::tie(pairs->image_height, pairs->image_width) = parse_size(*image_size);
      return prepare_llava(*opt, *pairs, *in, *tf, *tokenizer, *text_only);
    }
    for (const CLI::Option* o : *llava_only)
      KILN_CHECK(o->count() == 0, "prepare --format {}: {} is for --format llava", *format,
                 o->get_name());
    if (*format == "idx" || *format == "imagefolder") {
      KILN_CHECK(in->size() == 1, "prepare --format {}: --input takes one directory, got {}",
                 *format, in->size());
      for (const CLI::Option* o : *text_only)
        KILN_CHECK(o->count() == 0, "prepare --format {}: {} is for text (images take none)",
                   *format, o->get_name());
      std::vector<std::string> names;  // split by hand: an empty name is an error, not skipped
      for (size_t b = 0; !class_names->empty() && b <= class_names->size();) {
        const size_t e = std::min(class_names->find(',', b), class_names->size());
        names.push_back(class_names->substr(b, e - b));
        b = e + 1;
      }
      const auto m = data::prepare_images({*format, (*in)[0], opt->out_dir, *shard_images, names});
      std::string splits;
      for (const auto& [name, shards] : m.splits)
        splits += fmt::format(" {}={} images ({} shards)", name, m.images(name), shards.size());
      fmt::print("kiln prepare: {}x{}x{} images, {} classes:{} -> {}\n", m.shape.height,
                 m.shape.width, m.shape.channels, m.classes, splits, opt->out_dir.string());
      return;
    }
    KILN_CHECK(tokenizer->count() > 0, "prepare: --tokenizer is required (sentencepiece | gpt2 | "
               "hf | byte) for text and jsonl");
    KILN_CHECK(class_names->empty(), "prepare: --class-names is for --format idx");
    for (const CLI::Option* o : *chat_only)
      KILN_CHECK(o->count() == 0 || *format == "chat", "prepare --format {}: {} is for --format chat", *format,
                 o->get_name());
    for (const CLI::Option* o : *jsonl_only)
      KILN_CHECK(o->count() == 0 || *format != "text", "prepare --format text: {} is for --format jsonl or chat",
                 o->get_name());
    KILN_CHECK(text_key->count() == 0 || *format == "jsonl", "prepare --format {}: --text-key is for --format jsonl{}",
               *format, *format == "chat" ? " (a chat record's text is its \"messages\")" : "");
    opt->input_format = *format;
    for (const auto& s : *in)
      for (auto& path : expand_glob(s)) opt->inputs.push_back(std::move(path));
    for (const auto& s : *tf) opt->tokenizer_files.emplace_back(s);
    opt->on_progress = print_progress;
    const auto r = data::prepare_dataset(*opt);
    report_bad_lines(r, opt->chat_overlong);
    int64_t total = 0;
    std::string splits;
    for (const auto& [name, info] : r.meta.splits) {
      total += info.tokens;
      splits += fmt::format(" {}={} tokens ({} shard{})", name, info.tokens, info.shards.size(),
                            info.shards.size() == 1 ? "" : "s");
    }
    fmt::print("kiln prepare: {} document{}, {:.1f} MB -> {} tokens (vocab {}, {}){} in {:.1f} s -> {}\n",
               r.meta.documents, r.meta.documents == 1 ? "" : "s", r.input_bytes / 1e6, total, r.meta.vocab_size,
               r.meta.tokenizer_kind, splits, r.seconds, opt->out_dir.string());
  });
}

}  // namespace kiln::app
