// Tokenizers: text <-> token ids.
//
// Three kinds, all behind one interface and saved/loaded the same way:
//   "byte"          ids 0..255 are the bytes, 256 is end-of-text (vocab 257).
//   "sentencepiece" BPE trained on the corpus with libsentencepiece, configured so that
//                   decode(encode(x)) == x for any valid UTF-8 x (see sp_tokenizer.cpp).
//   "gpt2"          OpenAI's byte-level BPE (the algorithm of gpt-2/src/encoder.py),
//                   implemented here; reads encoder.json + vocab.bpe (OpenAI) or
//                   vocab.json + merges.txt (Hugging Face). end-of-text = "<|endoftext|>".
//
// Every kind decodes its end-of-text id to the text "<|endoftext|>"; no kind parses that
// text back into the end-of-text id (it is encoded as ordinary text, as encoder.py does).
// A saved tokenizer is a directory holding `tokenizer.json` ({"kind", "files", "vocab_size",
// "eot_id", "hash"}) plus the kind's model files; see docs/formats.md.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  /// "byte", "sentencepiece" or "gpt2".
  virtual std::string kind() const = 0;
  /// Number of ids, end-of-text included; every id is in [0, vocab_size()).
  virtual int vocab_size() const = 0;
  /// The end-of-text id (a separator placed before each document by `prepare`).
  virtual int eot_id() const = 0;
  /// Token ids of `text`, which must be valid UTF-8 (throws kiln::Error otherwise).
  /// Thread-safe.
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  /// The bytes of `ids` concatenated. The result may be invalid UTF-8 when the ids cut
  /// a character in two (byte-level kinds). Throws kiln::Error on an id out of range.
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  /// A stable hash of the tokenizer model, 16 lower-case hex digits (64-bit FNV-1a over
  /// the kind and a canonical form of the model). Equal hashes mean equal encodings.
  virtual std::string hash() const = 0;
  /// Writes tokenizer.json and the model files into `dir` (created if needed). Files are
  /// written to a temporary name and renamed. Throws kiln::Error naming the path on I/O
  /// failure.
  virtual void save(const std::filesystem::path& dir) const = 0;
};

/// The byte tokenizer: id b = byte b, eot = 256, vocab 257.
std::unique_ptr<Tokenizer> make_byte_tokenizer();

/// Options for training a sentencepiece BPE model.
struct SentencePieceTrainOptions {
  /// Target vocabulary size (end-of-text, unknown and the 256 byte-fallback pieces
  /// included). A small corpus may give fewer pieces (hard_vocab_limit = false).
  int vocab_size = 8192;
  /// At most this many lines are sampled (reservoir sampling) for training, so a
  /// multi-GB corpus is never held whole. Lines longer than 4096 bytes are cut in pieces.
  int64_t max_sentences = 1'000'000;
  /// If not empty, splits documents inside a file; the separator is not trained on.
  std::string separator;
  /// Seed of the line sampling.
  uint64_t seed = 0;
  int num_threads = 2;
};

/// Trains a sentencepiece BPE model on `inputs` (UTF-8 text files, streamed line by line).
/// Throws kiln::Error naming the file on unreadable/invalid input, or the trainer's message.
std::unique_ptr<Tokenizer> train_sentencepiece(const std::vector<std::filesystem::path>& inputs,
                                               const SentencePieceTrainOptions& options);

/// Loads a sentencepiece model file (`*.model`, a serialized ModelProto). Its eot id is
/// the piece "<|endoftext|>" when present, else its eos id; throws kiln::Error if neither
/// exists or the model lacks byte-fallback pieces.
std::unique_ptr<Tokenizer> load_sentencepiece_model(const std::filesystem::path& model_file);

/// Loads GPT-2's byte-level BPE from `files`: either one directory containing
/// encoder.json + vocab.bpe or vocab.json + merges.txt, or the two files themselves
/// (recognised by those names, or by extension .json / .bpe / .txt). Throws kiln::Error
/// naming the file when one is missing or malformed, ids are not dense, a merge refers to
/// an unknown token, or "<|endoftext|>" is absent.
std::unique_ptr<Tokenizer> load_gpt2_tokenizer(const std::vector<std::filesystem::path>& files);

/// Reads a tokenizer saved by Tokenizer::save (dir/tokenizer.json + model files). Checks
/// the recorded hash against the loaded model. Throws kiln::Error naming the file at fault.
std::unique_ptr<Tokenizer> load_tokenizer(const std::filesystem::path& dir);

/// GPT-2's pre-tokens of valid UTF-8 `text` (see gpt2_tokenizer.cpp), in order; their
/// concatenation is `text`. Exposed for tests.
std::vector<std::string> gpt2_pretokens(std::string_view text);

// --- helpers shared by the implementations (not part of the stable API) ---

/// Writes `bytes` to `path` via `path`.tmp + rename. Throws kiln::Error naming the path.
void write_file_atomic(const std::filesystem::path& path, std::string_view bytes);
/// Reads a whole (small) file. Throws kiln::Error naming the path.
std::string read_small_file(const std::filesystem::path& path);
/// Throws kiln::Error (naming `what`) unless `text` is valid UTF-8.
void require_utf8(std::string_view text, std::string_view what);

}  // namespace kiln::data
