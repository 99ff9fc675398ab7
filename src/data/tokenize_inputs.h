// Step 3 of `kiln prepare` (prepare.h): the inputs' documents, tokenized on several
// threads, handed on in input order.
//
// Work is gathered in batches of input order (text: the pieces stream_documents cuts;
// jsonl: raw lines); each batch is parsed and tokenized by OpenMP threads, one item
// each, then its tokens go to the sink in order. An item's tokens depend only on its
// text, and the pieces do not depend on the batch, so the output is the same for any
// number of threads. Memory: one batch (about 8 MiB of input) and its tokens.
#pragma once

#include "data/prepare.h"
#include "data/tokenizer.h"

#include <cstdint>
#include <span>

namespace kiln::data {

/// Receives the token stream: begin_document() before each document's first tokens.
class TokenSink {
 public:
  virtual ~TokenSink() = default;
  virtual void begin_document() = 0;
  /// `in_loss`: for chat input, whether each id is in the loss (1) or not (0); empty for
  /// text and jsonl (every target trains).
  virtual void tokens(std::span<const int32_t> ids, std::span<const uint8_t> in_loss) = 0;
};

/// Reads `o.inputs` as `o.input_format` and sends the tokens of every document to `sink`.
/// Fills `summary`'s input_bytes, bad_lines, bad_line_examples, empty_texts and overlong; returns
/// the number of documents. Throws kiln::Error naming the file (and line) on read errors,
/// and on a bad line with `o.strict`.
int64_t tokenize_inputs(const PrepareOptions& o, const Tokenizer& tok, TokenSink& sink,
                        PrepareSummary& summary);

/// Calls on_text for the text of each good record of the JSONL files (bad lines skipped):
/// what sentencepiece trains on. Throws kiln::Error naming the file on read errors.
void for_each_jsonl_text(const std::vector<std::filesystem::path>& inputs, const std::string& key,
                         const std::function<void(std::string_view)>& on_text);

}  // namespace kiln::data
