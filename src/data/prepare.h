// `kiln prepare`: text, JSONL or chat files -> tokenizer + llm.c-style token shards +
// position indexes + meta.json.
//
// Pipeline (see docs/formats.md for the output layout, docs/data.md for the user's view):
//   1. validate: every input exists and is a non-empty regular file (plain, gzip or zstd,
//      input_file.h); text inputs are valid UTF-8 (the error names the file and byte
//      offset; JSONL lines are checked one by one as they are read); the options make
//      sense; out_dir can be created and written and does not already hold a dataset.
//   2. tokenizer: "byte"; "gpt2" from tokenizer_files; "hf" from Hugging Face's
//      tokenizer.json (tokenizer_files: the file or its directory); "sentencepiece" trained
//      on the inputs (JSONL: on the records' texts) or loaded from tokenizer_files.
//   3. tokenize (tokenize_inputs.h), streaming, on several threads with the output of one:
//      text files are read in 1 MiB chunks and cut only where a non-whitespace ASCII
//      character is followed by whitespace (a boundary of every GPT-2 pre-token and
//      sentencepiece piece) or at a document separator, so no character or pre-token is
//      split (a single run of > 16 MiB without such a point is cut at a character
//      boundary). For hf only before a space (' '): Llama 3's regex keeps punctuation and
//      the newlines after it together (".\n"), but no pre-token of GPT-2's or Llama 3's
//      regex holds a non-space followed by a space. A JSONL record's text, or a chat
//      record rendered by its template (chat.h), is one document. Each document is
//      preceded by the end-of-text id (llm.c's convention), so eot separates consecutive
//      documents. The stream goes to staging chunks (prepare_staging.h) with the
//      document starts and, for chat, the loss spans.
//   4. split by tokens: val = the last ceil(val_fraction * total) tokens of the stream
//      (at least one token, hence one val shard, when val_fraction > 0); train = the rest.
//   5. shards of shard_tokens tokens each (the last one shorter) and the position indexes
//      of each split are staged in a hidden directory inside out_dir and moved into place
//      only when everything succeeded; meta.json is written last. On any error the staging
//      directory is removed, so no partial shard is left behind.
#pragma once

#include "data/meta.h"
#include "data/tokenizer.h"

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace kiln::data {

/// How far step 3 (tokenize) has come; handed to PrepareOptions::on_progress.
struct PrepareProgress {
  int64_t documents = 0;    // documents tokenized
  int64_t tokens = 0;       // tokens written (separators included)
  int64_t bytes_done = 0;   // input bytes consumed (text: decompressed; jsonl: as on disk)
  int64_t bytes_total = 0;  // the same for all inputs
  double seconds = 0.0;     // since tokenizing began
};

struct PrepareOptions {
  /// Input files, plain or compressed (gzip, zstd: recognised by their first bytes).
  /// "text": UTF-8, one file = one document unless `separator` is set. "jsonl": one JSON
  /// object per line, its `text_key` string a document.
  std::vector<std::filesystem::path> inputs;
  /// "text", "jsonl" or "chat" (JSONL conversations, chat.h: rendered by
  /// `chat_template`, the loss on the assistant's turns; needs the hf tokenizer).
  std::string input_format = "text";
  /// chat: "llama3" or "chatml".
  std::string chat_template = "llama3";
  /// chat: a conversation of more tokens than this (its separator included) is overlong;
  /// 0: no limit. Overlong ones are counted, and kept (`chat_overlong` "split": the
  /// loader's windows cut them like any long document) or skipped ("drop").
  int64_t chat_max_tokens = 0;
  std::string chat_overlong = "split";
  /// jsonl: the key of the document text in each record.
  std::string text_key = "text";
  /// jsonl, chat: a bad line (invalid UTF-8 or JSON, no text_key, a text_key that is not a
  /// string; chat: parse_chat_record's reasons) is an error naming file:line, instead of
  /// being skipped and counted.
  bool strict = false;
  /// Tokenizing threads; 0: OpenMP's default (OMP_NUM_THREADS, else every core). The
  /// output does not depend on it.
  int threads = 0;
  /// Called from the calling thread about every `progress_interval_s` while tokenizing,
  /// and once at the end of it. May be empty.
  std::function<void(const PrepareProgress&)> on_progress;
  double progress_interval_s = 2.0;
  /// Output directory (created if missing; must not already hold meta.json or shards).
  std::filesystem::path out_dir;
  /// "byte", "sentencepiece", "gpt2" or "hf".
  std::string tokenizer = "gpt2";
  /// sentencepiece: the vocabulary size to train (>= 260). byte/gpt2: 0, or a check that
  /// must be >= the tokenizer's vocabulary size. meta.json records the tokenizer's size.
  int vocab_size = 0;
  /// Fraction of the tokens put in the val split, in [0, 1).
  double val_fraction = 0.0;
  /// gpt2: encoder.json + vocab.bpe or vocab.json + merges.txt (or their directory).
  /// hf: Hugging Face's tokenizer.json, or the directory holding it.
  /// sentencepiece: optional `*.model` file to use instead of training. Any kind: a
  /// directory written by Tokenizer::save (holding tokenizer.json).
  std::vector<std::filesystem::path> tokenizer_files;
  /// Shard layout (shard.h, choose_shard_format): "kiln" (uint16 v1 when the ids fit, else
  /// kiln's uint32 v2), "llmc" (uint16 v1, else llm.c's uint32 v7) or "llmc-u32" (v7).
  std::string shard_format = "kiln";
  /// Tokens per shard (the last shard of each split may be shorter); 1 .. 2^31-1.
  int64_t shard_tokens = 100'000'000;
  /// If not empty: splits documents inside a file (the separator itself is dropped, empty
  /// documents are skipped).
  std::string separator;
  /// sentencepiece training: at most this many lines are sampled.
  int64_t sp_max_sentences = 1'000'000;
};

/// The tokenizer `o` asks for: a saved one (a kiln tokenizer directory), byte, gpt2 or hf
/// from its files, a sentencepiece model file, or sentencepiece trained on `o.inputs`.
/// Throws kiln::Error naming the file or option at fault.
std::unique_ptr<Tokenizer> make_tokenizer(const PrepareOptions& o);

struct PrepareSummary {
  DatasetMeta meta;         // what meta.json says
  int64_t input_bytes = 0;  // bytes read from the inputs (decompressed)
  double seconds = 0.0;     // wall time
  /// jsonl: lines skipped as bad, the first kMaxBadLineExamples of them as
  /// "file:line: reason", and records whose text is empty (skipped, not documents).
  int64_t bad_lines = 0;
  std::vector<std::string> bad_line_examples;
  int64_t empty_texts = 0;
  /// chat: conversations over chat_max_tokens (dropped or kept, as chat_overlong says).
  int64_t overlong = 0;
  static constexpr size_t kMaxBadLineExamples = 10;
};

/// Runs the pipeline above. Throws kiln::Error (one line naming the file at fault) on bad
/// options or input; nothing is left in out_dir then except directories it created.
PrepareSummary prepare_dataset(const PrepareOptions& options);

/// Calls on_piece(text, starts_document) for the text of `path` in pieces cut as described
/// in step 3 above (only before ' ' with `cut_before_spaces_only`, as for hf); documents
/// split at `separator` (if not empty), empty ones skipped. Exposed for tests. Throws
/// kiln::Error naming the file on read errors.
void stream_documents(const std::filesystem::path& path, const std::string& separator,
                      const std::function<void(std::string_view, bool)>& on_piece,
                      size_t chunk_bytes = 1 << 20, bool cut_before_spaces_only = false);

}  // namespace kiln::data
