#include "data/prepare.h"

#include "core/error.h"
#include "data/shard.h"
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

// Streams `path` once, checking it is valid UTF-8. Returns its size in bytes.
int64_t validate_utf8_file(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  KILN_CHECK(f.good(), "{}: cannot open for reading", path.string());
  std::vector<char> chunk(1 << 20);
  std::string carry;  // an incomplete character at the end of the previous chunk
  int64_t offset = 0;  // file offset of carry[0]
  while (true) {
    f.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
    KILN_CHECK(!f.bad(), "{}: read error", path.string());
    const auto got = static_cast<size_t>(f.gcount());
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

std::string shard_name(const char* prefix, int64_t i) { return fmt::format("{}_{:06d}.bin", prefix, i); }

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
  return train_sentencepiece(o.inputs, so);
}

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
  std::ifstream f(path, std::ios::binary);
  KILN_CHECK(f.good(), "{}: cannot open for reading", path.string());
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
    f.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
    KILN_CHECK(!f.bad(), "{}: read error", path.string());
    const auto got = static_cast<size_t>(f.gcount());
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

PrepareSummary prepare_dataset(const PrepareOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  // 1. options and inputs.
  KILN_CHECK(!o.inputs.empty(), "prepare: no input files");
  KILN_CHECK(o.tokenizer == "byte" || o.tokenizer == "gpt2" || o.tokenizer == "sentencepiece" || o.tokenizer == "hf",
             "prepare: unknown tokenizer '{}' (expected byte, sentencepiece, gpt2 or hf)", o.tokenizer);
  KILN_CHECK(!o.out_dir.empty(), "prepare: no output directory");
  KILN_CHECK(o.shard_tokens >= 1 && o.shard_tokens <= INT32_MAX,
             "prepare: shard_tokens {} outside [1, 2^31-1]", o.shard_tokens);
  KILN_CHECK(std::isfinite(o.val_fraction) && o.val_fraction >= 0.0 && o.val_fraction < 1.0,
             "prepare: val_fraction {} outside [0, 1)", o.val_fraction);
  KILN_CHECK(o.vocab_size >= 0, "prepare: negative vocab_size {}", o.vocab_size);
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
  choose_shard_format(o.shard_format, 0);  // a bad name fails before any work
  PrepareSummary summary;
  for (const auto& in : o.inputs) {
    KILN_CHECK(fs::exists(in), "{}: no such input file", in.string());
    KILN_CHECK(fs::is_regular_file(in), "{}: not a regular file", in.string());
    KILN_CHECK(fs::file_size(in) > 0, "{}: empty input file", in.string());
    summary.input_bytes += validate_utf8_file(in);
  }
  // Output directory and staging area.
  std::error_code ec;
  Cleanup cleanup;
  if (!fs::exists(o.out_dir, ec)) cleanup.created_out = o.out_dir;
  fs::create_directories(o.out_dir, ec);
  KILN_CHECK(!ec && fs::is_directory(o.out_dir), "{}: cannot create output directory ({})",
             o.out_dir.string(), ec ? ec.message() : "not a directory");
  KILN_CHECK(!fs::exists(o.out_dir / "meta.json") && !fs::exists(o.out_dir / shard_name("train", 0)) &&
                 !fs::exists(o.out_dir / shard_name("val", 0)),
             "{}: already holds a prepared dataset (remove it first)", o.out_dir.string());
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
  {
    const fs::path probe = staging / "probe";
    std::ofstream pf(probe);
    KILN_CHECK(pf.good(), "{}: output directory is not writable", o.out_dir.string());
    pf.close();
    fs::remove(probe, ec);
  }

  // 2. tokenizer.
  const std::unique_ptr<Tokenizer> tok = make_tokenizer(o);
  KILN_CHECK(o.vocab_size == 0 || o.tokenizer == "sentencepiece" || o.vocab_size >= tok->vocab_size(),
             "prepare: vocab_size {} too small for the {} tokenizer ({} ids)", o.vocab_size, tok->kind(),
             tok->vocab_size());
  const ShardFormat format = choose_shard_format(o.shard_format, tok->vocab_size());
  const int32_t eot = tok->eot_id();

  // 3. tokenize into staging chunks of shard_tokens.
  const int64_t S = o.shard_tokens;
  std::vector<int64_t> chunk_tokens;
  std::unique_ptr<ShardWriter> writer;
  int64_t total = 0;
  auto push = [&](std::span<const int32_t> ids) {
    while (!ids.empty()) {
      if (!writer) {
        writer = std::make_unique<ShardWriter>(staging / shard_name("stage", static_cast<int64_t>(chunk_tokens.size())), format);
      }
      const size_t take = static_cast<size_t>(std::min<int64_t>(S - writer->count(), static_cast<int64_t>(ids.size())));
      writer->write(ids.first(take));
      ids = ids.subspan(take);
      total += static_cast<int64_t>(take);
      if (writer->count() == S) {
        writer->finish();
        chunk_tokens.push_back(S);
        writer.reset();
      }
    }
  };
  int64_t documents = 0;
  for (const auto& in : o.inputs) {
    stream_documents(in, o.separator, [&](std::string_view piece, bool new_doc) {
      if (new_doc) {
        ++documents;
        push(std::span<const int32_t>(&eot, 1));
      }
      const std::vector<int32_t> ids = tok->encode(piece);
      push(ids);
    }, 1 << 20, /*cut_before_spaces_only=*/tok->kind() == "hf");
  }
  if (writer) {
    chunk_tokens.push_back(writer->count());
    writer->finish();
    writer.reset();
  }
  KILN_CHECK(documents > 0, "{}: the inputs hold no documents (only separators?)", o.inputs.front().string());

  // 4. split by tokens.
  const int64_t n_val =
      o.val_fraction > 0 ? std::max<int64_t>(1, static_cast<int64_t>(std::ceil(o.val_fraction * total))) : 0;
  KILN_CHECK(total - n_val >= 1, "{}: only {} tokens, too few for a val_fraction of {}",
             o.inputs.front().string(), total, o.val_fraction);
  const int64_t split_at = total - n_val;

  // 5. final shards (in staging).
  DatasetMeta meta;
  meta.tokenizer_kind = tok->kind();
  meta.tokenizer_hash = tok->hash();
  meta.vocab_size = tok->vocab_size();
  meta.eot_id = eot;
  meta.format = format;
  meta.documents = documents;
  SplitInfo& train = meta.splits["train"];
  std::vector<int32_t> buf;
  // Copies stream tokens [begin, end) from the staging chunks into `w`.
  auto copy_range = [&](int64_t begin, int64_t end, ShardWriter& w) {
    while (begin < end) {
      const int64_t k = begin / S;
      ShardReader r(staging / shard_name("stage", k));
      const int64_t stop = std::min(end, (k + 1) * S);
      for (int64_t p = begin; p < stop;) {
        const int64_t n = std::min<int64_t>(stop - p, 1 << 20);
        buf.resize(static_cast<size_t>(n));
        r.read(p - k * S, n, buf.data());
        w.write(buf);
        p += n;
      }
      begin = stop;
    }
  };
  for (int64_t k = 0; k * S < split_at; ++k) {
    const int64_t begin = k * S, end = std::min(split_at, begin + chunk_tokens[k]);
    const fs::path dst = staging / shard_name("train", k);
    if (end - begin == chunk_tokens[k]) {
      fs::rename(staging / shard_name("stage", k), dst);
    } else {
      ShardWriter w(dst, format);
      copy_range(begin, end, w);
      w.finish();
    }
    train.shards.push_back({dst.filename().string(), end - begin});
    train.tokens += end - begin;
  }
  if (n_val > 0) {
    SplitInfo& val = meta.splits["val"];
    for (int64_t v = 0, begin = split_at; begin < total; ++v, begin += S) {
      const int64_t end = std::min(total, begin + S);
      const fs::path dst = staging / shard_name("val", v);
      ShardWriter w(dst, format);
      copy_range(begin, end, w);
      w.finish();
      val.shards.push_back({dst.filename().string(), end - begin});
      val.tokens += end - begin;
    }
  }
  for (size_t k = 0; k < chunk_tokens.size(); ++k) fs::remove(staging / shard_name("stage", static_cast<int64_t>(k)), ec);
  tok->save(staging / "tokenizer");

  // Commit: move shards and tokenizer files into out_dir, then meta.json.
  auto move_in = [&](const fs::path& src) {
    const fs::path dst = o.out_dir / src.filename();
    fs::rename(src, dst, ec);
    KILN_CHECK(!ec, "cannot move {} to {}: {}", src.string(), dst.string(), ec.message());
    cleanup.moved.push_back(dst);
  };
  for (const auto& [name, split] : meta.splits)
    for (const auto& s : split.shards) move_in(staging / s.file);
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
