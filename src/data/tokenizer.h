// Tokenizers: text <-> token ids.
//
// Four kinds, all behind one interface and saved/loaded the same way:
//   "byte"          ids 0..255 are the bytes, 256 is end-of-text (vocab 257).
//   "sentencepiece" BPE trained on the corpus with libsentencepiece, configured so that
//                   decode(encode(x)) == x for any valid UTF-8 x (see sp_tokenizer.cpp).
//   "gpt2"          OpenAI's byte-level BPE (the algorithm of gpt-2/src/encoder.py),
//                   implemented here; reads encoder.json + vocab.bpe (OpenAI) or
//                   vocab.json + merges.txt (Hugging Face). end-of-text = "<|endoftext|>".
//   "hf"            Hugging Face's tokenizer.json for byte-level BPE (GPT-2's, Llama 3's):
//                   BPE model, added tokens, ByteLevel / Split regex pre-tokenizers (see
//                   hf_tokenizer.cpp). Its separator is "<|begin_of_text|>" when present,
//                   else "<|endoftext|>", else "<|end_of_text|>".
//
// byte, sentencepiece and gpt2 decode their end-of-text id to the text "<|endoftext|>" and
// never parse that text back into the id (it is encoded as ordinary text, as encoder.py
// does). hf, as Hugging Face's tokenizers, matches every added token's content in the text
// first (so "<|endoftext|>" in a GPT-2 text is id 50256) and decodes it to its content.
// A saved tokenizer is a directory holding `tokenizer.json` ({"kind", "files", "vocab_size",
// "eot_id", "hash"}) plus the kind's model files (for hf: `hf_tokenizer.json`, Hugging
// Face's file under a name that does not clash with kiln's); see docs/formats.md.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  /// "byte", "sentencepiece", "gpt2" or "hf".
  virtual std::string kind() const = 0;
  /// Number of ids, end-of-text included; every id is in [0, vocab_size()).
  virtual int vocab_size() const = 0;
  /// The document separator placed before each document by `prepare` (and the start of
  /// `kiln sample`'s prompt): the end-of-text id, or hf's "<|begin_of_text|>".
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
  /// Hugging Face's files for this tokenizer, file name -> content (see
  /// export_hf_tokenizer); empty for a kind that has none (byte).
  virtual std::map<std::string, std::string> hf_files() const = 0;
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

/// Calls its argument once per text (valid UTF-8): how a caller hands texts it reads itself
/// (JSONL records) to train_sentencepiece_on_texts.
using TextVisitor = std::function<void(const std::function<void(std::string_view)>& add)>;
/// Trains as train_sentencepiece, on the texts `for_each_text` passes (each split into
/// lines at '\n'; options.separator is not used). Throws kiln::Error when a text is not
/// valid UTF-8, all are empty, or the trainer fails.
std::unique_ptr<Tokenizer> train_sentencepiece_on_texts(const TextVisitor& for_each_text,
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

/// Loads Hugging Face's tokenizer.json (the "hf" kind): `path` is the file, or a directory
/// holding it (a kiln saved-tokenizer directory's hf_tokenizer.json is preferred there).
/// Throws a one-line kiln::Error naming the file and the JSON field for anything malformed
/// or unsupported (only byte-level BPE is), e.g.
/// "x/tokenizer.json: model.type = 'WordPiece': only BPE is supported".
std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::filesystem::path& path);

/// The pre-tokens of an hf tokenizer `t` for valid UTF-8 `text`, as raw bytes in order: added
/// tokens whole, the rest split by its pre_tokenizer steps (before byte-level BPE). Their
/// concatenation is `text` unless a Split removes text. Exposed for tests; throws
/// kiln::Error when `t` is not of the hf kind.
std::vector<std::string> hf_pretokens(const Tokenizer& t, std::string_view text);

/// Writes Hugging Face's files for `t` into `dir` (created if needed), each atomically:
///   gpt2:          tokenizer.json converted from kiln's GPT-2 tables (BPE, ByteLevel,
///                  "<|endoftext|>" as a special added token);
///   hf:            the tokenizer.json it was loaded from, byte for byte;
///   sentencepiece: its tokenizer.model (the serialized ModelProto);
/// plus tokenizer_config.json with bos_token / eos_token. Throws kiln::Error for the byte
/// kind ("byte tokenizer: Hugging Face has no file for it") or on I/O failure (path named).
void export_hf_tokenizer(const Tokenizer& t, const std::filesystem::path& dir);

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
