#include "data/prepare.h"

#include "core/error.h"
#include "data/position_index.h"
#include "data/chat.h"
#include "data/input_file.h"
#include "data/prepare_staging.h"
#include "data/shard.h"
#include "data/tokenize_inputs.h"
#include "data/tokenizer.h"
#include "data/utf8.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <memory>

namespace kiln::data {

namespace fs = std::filesystem;

namespace {

bool is_cut_space(char c, bool spaces_only) {
  return c == ' ' || (!spaces_only && (c == '\n' || c == '\t' || c == '\r'));
}
bool is_cut_solid(char c) { return c >= 0x21 && c <= 0x7E; }

// Streams `path` once, checking it is valid UTF-8. Returns its (decompressed) size in bytes.
int64_t validate_utf8_file(const fs::path& path) {
  InputFile f(path);
  std::vector<char> chunk(1 << 20);
  std::string carry;  // an incomplete character at the end of the previous chunk
  int64_t offset = 0;  // offset of carry[0] in the (decompressed) text
  while (true) {
    const size_t got = f.read(chunk.data(), chunk.size());
    if (got == 0) break;
    carry.append(chunk.data(), got);
    const Utf8Check c = utf8_check(carry);
    KILN_CHECK(!c.error, "{}: invalid UTF-8 at byte offset {}", path.string(),
               offset + static_cast<int64_t>(c.valid_len));
    offset += static_cast<int64_t>(c.valid_len);
    carry.erase(0, c.valid_len);
  }
  KILN_CHECK(carry.empty(), "{}: invalid UTF-8 at byte offset {} (truncated character at end of file)",
             path.string(), offset);
  return offset;
}

}  // namespace

std::unique_ptr<Tokenizer> make_tokenizer(const PrepareOptions& o) {
  const auto& files = o.tokenizer_files;
  // A kiln saved-tokenizer directory (for hf: one holding hf_tokenizer.json, since
  // Hugging Face's own directories hold a tokenizer.json too).
  if (files.size() == 1 && fs::is_directory(files[0]) && fs::exists(files[0] / "tokenizer.json") &&
      (o.tokenizer != "hf" || fs::exists(files[0] / "hf_tokenizer.json"))) {
    auto tok = load_tokenizer(files[0]);
    KILN_CHECK(tok->kind() == o.tokenizer, "{}: holds a '{}' tokenizer but '{}' was asked for",
               files[0].string(), tok->kind(), o.tokenizer);
    return tok;
  }
  if (o.tokenizer == "byte") {
    KILN_CHECK(files.empty(), "the byte tokenizer takes no tokenizer files (got {})", files[0].string());
    return make_byte_tokenizer();
  }
  if (o.tokenizer == "gpt2") {
    KILN_CHECK(!files.empty(),
               "the gpt2 tokenizer needs tokenizer files (encoder.json + vocab.bpe or vocab.json + merges.txt)");
    return load_gpt2_tokenizer(files);
  }
  if (o.tokenizer == "hf") {
    KILN_CHECK(files.size() == 1, "the hf tokenizer needs one tokenizer file: Hugging Face's tokenizer.json "
               "or its directory (got {})", files.size());
    return load_hf_tokenizer(files[0]);
  }
  if (!files.empty()) {
    KILN_CHECK(files.size() == 1, "sentencepiece takes one .model file, got {} files", files.size());
    return load_sentencepiece_model(files[0]);
  }
  SentencePieceTrainOptions so;
  so.vocab_size = o.vocab_size;
  so.separator = o.separator;
  so.max_sentences = o.sp_max_sentences;
  if (o.input_format == "jsonl") {
    return train_sentencepiece_on_texts(
        [&](const std::function<void(std::string_view)>& add) {
          for_each_jsonl_text(o.inputs, o.text_key, add);
        },
        so);
  }
  return train_sentencepiece(o.inputs, so);
}

namespace {

// Removes the staging directory, and the files already moved out of it, unless disarmed;
// then the output directory too when this run created it and it is left empty.
struct Cleanup {
  fs::path staging;
  std::vector<fs::path> moved;
  fs::path created_out;
  bool armed = true;
  ~Cleanup() {
    if (!armed) return;
    std::error_code ec;
    for (const auto& p : moved) fs::remove(p, ec);
    if (!staging.empty()) fs::remove_all(staging, ec);
    if (!created_out.empty() && fs::is_empty(created_out, ec)) fs::remove(created_out, ec);
  }
};

}  // namespace

void stream_documents(const fs::path& path, const std::string& separator,
                      const std::function<void(std::string_view, bool)>& on_piece, size_t chunk_bytes,
                      bool cut_before_spaces_only) {
  InputFile f(path);
  chunk_bytes = std::max<size_t>(chunk_bytes, 16);
  const size_t max_pending = 16 * chunk_bytes;
  const size_t hold = separator.empty() ? 0 : separator.size() - 1;
  std::vector<char> chunk(chunk_bytes);
  std::string buf;
  bool in_doc = false;  // whether the current document emitted text yet
  auto emit = [&](std::string_view s) {
    if (s.empty()) return;
    on_piece(s, !in_doc);
    in_doc = true;
  };
  while (true) {
    const size_t got = f.read(chunk.data(), chunk.size());
    const bool eof = got == 0;
    buf.append(chunk.data(), got);
    size_t start = 0;
    if (!separator.empty()) {
      size_t p;
      while ((p = buf.find(separator, start)) != std::string::npos) {
        emit(std::string_view(buf).substr(start, p - start));
        in_doc = false;
        start = p + separator.size();
      }
    }
    if (eof) {
      emit(std::string_view(buf).substr(start));
      break;
    }
    const size_t limit = buf.size() - std::min(hold, buf.size() - start);
    size_t cut = 0;
    for (size_t p = std::min(limit, buf.size() - 1); p > start; --p) {
      if (is_cut_space(buf[p], cut_before_spaces_only) && is_cut_solid(buf[p - 1])) {
        cut = p;
        break;
      }
    }
    if (cut == 0 && limit - start > max_pending) {
      // No clean point in a huge run: cut at a character boundary (before a lead byte; the
      // buffer's last character may be incomplete, so never after it).
      cut = std::min(limit, buf.size() - 1);
      while (cut > start && (static_cast<unsigned char>(buf[cut]) & 0xC0) == 0x80) --cut;
    }
    if (cut > start) {
      emit(std::string_view(buf).substr(start, cut - start));
      start = cut;
    }
    buf.erase(0, start);
  }
}

namespace {

void check_options(const PrepareOptions& o) {
  KILN_CHECK(!o.inputs.empty(), "prepare: no input files");
  KILN_CHECK(o.input_format == "text" || o.input_format == "jsonl" || o.input_format == "chat",
             "prepare: unknown input format '{}' (expected text, jsonl or chat)", o.input_format);
  KILN_CHECK(o.tokenizer == "byte" || o.tokenizer == "gpt2" || o.tokenizer == "sentencepiece" || o.tokenizer == "hf",
             "prepare: unknown tokenizer '{}' (expected byte, sentencepiece, gpt2 or hf)", o.tokenizer);
  KILN_CHECK(!o.out_dir.empty(), "prepare: no output directory");
  KILN_CHECK(o.shard_tokens >= 1 && o.shard_tokens <= INT32_MAX,
             "prepare: shard_tokens {} outside [1, 2^31-1]", o.shard_tokens);
  KILN_CHECK(std::isfinite(o.val_fraction) && o.val_fraction >= 0.0 && o.val_fraction < 1.0,
             "prepare: val_fraction {} outside [0, 1)", o.val_fraction);
  KILN_CHECK(o.vocab_size >= 0, "prepare: negative vocab_size {}", o.vocab_size);
  KILN_CHECK(o.threads >= 0, "prepare: negative thread count {}", o.threads);
  if (o.tokenizer == "byte") {
    KILN_CHECK(o.vocab_size == 0 || o.vocab_size >= 257,
               "prepare: vocab_size {} too small for the byte tokenizer (needs 257: 256 bytes + eot)",
               o.vocab_size);
  }
  if (o.tokenizer == "sentencepiece" && o.tokenizer_files.empty()) {
    KILN_CHECK(o.vocab_size >= 260,
               "prepare: vocab_size {} too small for sentencepiece (needs >= 260: 256 byte pieces, unk, eot and merges)",
               o.vocab_size);
  }
  KILN_CHECK(utf8_valid(o.separator), "prepare: the separator is not valid UTF-8");
  if (o.input_format != "text") {
    KILN_CHECK(o.separator.empty(), "prepare: a separator is for text input (a JSONL record is one document)");
    KILN_CHECK(!o.text_key.empty(), "prepare: an empty text key");
  }
  if (o.input_format == "chat") {
    parse_chat_template(o.chat_template);
    KILN_CHECK(o.tokenizer == "hf", "prepare: chat data needs the hf tokenizer (a tokenizer.json with the "
               "template's special tokens), not '{}'", o.tokenizer);
    KILN_CHECK(o.chat_overlong == "split" || o.chat_overlong == "drop",
               "prepare: chat_overlong '{}' (expected split or drop)", o.chat_overlong);
    KILN_CHECK(o.chat_max_tokens >= 0, "prepare: negative chat_max_tokens {}", o.chat_max_tokens);
  }
  choose_shard_format(o.shard_format, 0);  // a bad name fails before any work
}

// Checks every input; returns the text inputs' decompressed bytes (0 for jsonl, whose
// lines are checked one by one as they are read).
int64_t check_inputs(const PrepareOptions& o) {
  int64_t bytes = 0;
  for (const auto& in : o.inputs) {
    KILN_CHECK(fs::exists(in), "{}: no such input file", in.string());
    KILN_CHECK(fs::is_regular_file(in), "{}: not a regular file", in.string());
    KILN_CHECK(fs::file_size(in) > 0 || o.input_format != "text", "{}: empty input file", in.string());
    if (o.input_format == "text") bytes += validate_utf8_file(in);
  }
  return bytes;
}

// Creates out_dir (if needed) and a staging directory inside it, registered in `cleanup`.
fs::path make_staging(const PrepareOptions& o, Cleanup& cleanup) {
  std::error_code ec;
  if (!fs::exists(o.out_dir, ec)) cleanup.created_out = o.out_dir;
  fs::create_directories(o.out_dir, ec);
  KILN_CHECK(!ec && fs::is_directory(o.out_dir), "{}: cannot create output directory ({})",
             o.out_dir.string(), ec ? ec.message() : "not a directory");
  KILN_CHECK(!fs::exists(o.out_dir / "meta.json") && !fs::exists(o.out_dir / shard_name("train", 0)) &&
                 !fs::exists(o.out_dir / shard_name("val", 0)),
             "{}: already holds a prepared dataset or its shards (remove them first)", o.out_dir.string());
  // Staging areas of interrupted runs (their process gone) are removed; a live one's kept.
  for (fs::directory_iterator it(o.out_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const long pid = name.starts_with(".kiln-prepare-") ? std::atol(name.c_str() + 14) : 0;
    std::error_code rm;
    if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) fs::remove_all(it->path(), rm);
  }
  ec.clear();
  const fs::path staging = o.out_dir / fmt::format(".kiln-prepare-{}", ::getpid());
  fs::remove_all(staging, ec);
  KILN_CHECK(fs::create_directory(staging, ec) && !ec, "{}: output directory is not writable ({})",
             o.out_dir.string(), ec.message());
  cleanup.staging = staging;
  const fs::path probe = staging / "probe";
  std::ofstream pf(probe);
  KILN_CHECK(pf.good(), "{}: output directory is not writable", o.out_dir.string());
  pf.close();
  fs::remove(probe, ec);
  return staging;
}

}  // namespace

PrepareSummary prepare_dataset(const PrepareOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  // 1. options and inputs, output directory and staging area.
  check_options(o);
  PrepareSummary summary;
  summary.input_bytes = check_inputs(o);
  Cleanup cleanup;
  const fs::path staging = make_staging(o, cleanup);

  // 2. tokenizer.
  const std::unique_ptr<Tokenizer> tok = make_tokenizer(o);
  KILN_CHECK(o.vocab_size == 0 || o.tokenizer == "sentencepiece" || o.vocab_size >= tok->vocab_size(),
             "prepare: vocab_size {} too small for the {} tokenizer ({} ids)", o.vocab_size, tok->kind(),
             tok->vocab_size());
  const ShardFormat format = choose_shard_format(o.shard_format, tok->vocab_size());

  // 3. tokenize into staging chunks of shard_tokens.
  if (o.input_format == "chat") check_chat_tokens(*tok, parse_chat_template(o.chat_template));
  StagingSink stream(staging, format, o.shard_tokens, tok->eot_id(), o.input_format == "chat");
  const int64_t documents = tokenize_inputs(o, *tok, stream, summary);
  stream.finish();
  KILN_CHECK(documents > 0 || summary.bad_lines == 0, "{}{}: no good record: {} bad line{}, the first: {}",
             o.inputs.front().string(), o.inputs.size() > 1 ? " and the other inputs" : "", summary.bad_lines,
             summary.bad_lines == 1 ? "" : "s", summary.bad_line_examples.front());
  KILN_CHECK(documents > 0, "{}{}: the inputs hold no documents ({})", o.inputs.front().string(),
             o.inputs.size() > 1 ? " and the other inputs" : "",
             o.input_format == "text" ? "only separators?" : "no record with text");

  // 4. split by tokens.
  const int64_t total = stream.total();
  const int64_t n_val =
      o.val_fraction > 0 ? std::max<int64_t>(1, static_cast<int64_t>(std::ceil(o.val_fraction * total))) : 0;
  KILN_CHECK(total - n_val >= 1, "{}: only {} tokens, too few for a val_fraction of {}",
             o.inputs.front().string(), total, o.val_fraction);

  // 5. final shards and document indexes (in staging).
  DatasetMeta meta;
  meta.tokenizer_kind = tok->kind();
  meta.tokenizer_hash = tok->hash();
  meta.vocab_size = tok->vocab_size();
  meta.eot_id = tok->eot_id();
  meta.format = format;
  meta.documents = documents;
  write_splits(stream, staging, total - n_val, format, o.shard_tokens, meta);
  tok->save(staging / "tokenizer");

  // Commit: move shards, indexes and tokenizer files into out_dir, then meta.json. Another
  // prepare into the same directory may have finished meanwhile: then this one stops.
  KILN_CHECK(!fs::exists(o.out_dir / "meta.json"), "{}: another kiln prepare wrote a dataset there while this one "
             "ran; this one's output is discarded", o.out_dir.string());
  std::error_code ec;
  auto move_in = [&](const fs::path& src) {
    const fs::path dst = o.out_dir / src.filename();
    fs::rename(src, dst, ec);
    KILN_CHECK(!ec, "cannot move {} to {}: {}", src.string(), dst.string(), ec.message());
    cleanup.moved.push_back(dst);
  };
  for (const auto& [name, split] : meta.splits) {
    for (const auto& s : split.shards) move_in(staging / s.file);
    move_in(staging / split.doc_index.file);
    if (!split.loss_index.file.empty()) move_in(staging / split.loss_index.file);
  }
  for (const auto& e : fs::directory_iterator(staging / "tokenizer")) move_in(e.path());
  write_dataset_meta(o.out_dir, meta);
  cleanup.moved.clear();
  fs::remove_all(staging, ec);
  cleanup.armed = false;

  summary.meta = std::move(meta);
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return summary;
}

}  // namespace kiln::data
