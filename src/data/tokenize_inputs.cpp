#include "data/tokenize_inputs.h"

#include "core/error.h"
#include "data/chat.h"
#include "data/input_file.h"
#include "data/jsonl.h"

#include <omp.h>

#include <chrono>
#include <utility>

namespace kiln::data {

namespace fs = std::filesystem;

namespace {

constexpr size_t kBatchBytes = size_t{8} << 20;
constexpr size_t kBatchItems = 16384;

/// One unit of work, in input order: a text piece, or a raw JSONL line.
struct Item {
  std::string text;
  bool starts_document = false;
  int32_t file = 0;  // index into the inputs
  int64_t line = 0;  // jsonl: the line number
};

/// Gathers items, tokenizes each batch in parallel and hands the tokens on in order.
class Batcher {
 public:
  Batcher(const PrepareOptions& o, const Tokenizer& tok, TokenSink& sink, PrepareSummary& summary)
      : o_(o), tok_(tok), sink_(sink), summary_(summary), jsonl_(o.input_format != "text"),
        chat_(o.input_format == "chat"), threads_(o.threads > 0 ? o.threads : omp_get_max_threads()),
        t0_(std::chrono::steady_clock::now()) {
    if (chat_) chat_template_ = parse_chat_template(o.chat_template);
  }

  /// `bytes_done` says how far the reading has come, for the progress report.
  void add(Item item, const std::function<int64_t()>& bytes_done) {
    bytes_ += item.text.size();
    items_.push_back(std::move(item));
    if (bytes_ >= kBatchBytes || items_.size() >= kBatchItems) flush(bytes_done);
  }

  void flush(const std::function<int64_t()>& bytes_done) {
    tokenize_batch();
    hand_on();
    items_.clear();
    bytes_ = 0;
    progress_.bytes_done = bytes_done();
    const double now = seconds();
    if (o_.on_progress && now - last_report_ >= o_.progress_interval_s) report(now);
  }

  void finish(const std::function<int64_t()>& bytes_done) {
    flush(bytes_done);
    if (o_.on_progress) report(seconds());
  }

  void set_bytes_total(int64_t n) { progress_.bytes_total = n; }
  int64_t documents() const { return progress_.documents; }

 private:
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }

  void report(double now) {
    progress_.seconds = now;
    last_report_ = now;
    o_.on_progress(progress_);
  }

  // Parses and encodes every item on the OpenMP threads; a failure is the item's error.
  void tokenize_batch() {
    ids_.assign(items_.size(), {});
    in_loss_.assign(items_.size(), {});
    errors_.assign(items_.size(), {});
    const auto n = static_cast<int64_t>(items_.size());
#pragma omp parallel for schedule(dynamic, 8) num_threads(threads_)
    for (int64_t i = 0; i < n; ++i) {
      try {
        tokenize_item(static_cast<size_t>(i));
      } catch (const std::exception& e) {
        errors_[static_cast<size_t>(i)] = e.what();
      }
    }
  }

  // Item i into ids_[i] (chat: and in_loss_[i]), or its error into errors_[i]: a chat
  // record is parsed, rendered and tokenized; a jsonl line's text is taken out first.
  void tokenize_item(size_t i) {
    Item& item = items_[i];
    if (chat_) {
      const ChatRecord rec = parse_chat_record(item.text);
      if (!rec.error.empty()) {
        errors_[i] = rec.error;
        return;
      }
      ChatTokens t = tokenize_chat(tok_, render_chat(rec.messages, chat_template_));
      ids_[i] = std::move(t.ids);
      in_loss_[i] = std::move(t.in_loss);
      return;
    }
    if (jsonl_) {
      JsonlText t = jsonl_text(item.text, o_.text_key);
      if (!t.error.empty()) {
        errors_[i] = std::move(t.error);
        return;
      }
      item.text = std::move(t.text);
    }
    ids_[i] = tok_.encode(item.text);
  }

  void hand_on() {
    for (size_t i = 0; i < items_.size(); ++i) {
      const Item& item = items_[i];
      const fs::path& file = o_.inputs[static_cast<size_t>(item.file)];
      if (!errors_[i].empty()) {
        KILN_CHECK(jsonl_, "{}: {}", file.string(), errors_[i]);  // text was validated up front
        const std::string where = fmt::format("{}:{}: {}", file.string(), item.line, errors_[i]);
        KILN_CHECK(!o_.strict, "{} (--strict)", where);
        if (summary_.bad_line_examples.size() < PrepareSummary::kMaxBadLineExamples)
          summary_.bad_line_examples.push_back(where);
        ++summary_.bad_lines;
        continue;
      }
      if (jsonl_ && !chat_ && item.text.empty()) {
        ++summary_.empty_texts;
        continue;
      }
      if (chat_ && o_.chat_max_tokens > 0 && static_cast<int64_t>(ids_[i].size()) + 1 > o_.chat_max_tokens) {
        ++summary_.overlong;
        if (o_.chat_overlong == "drop") continue;
      }
      if (item.starts_document) {
        ++progress_.documents;
        sink_.begin_document();
      }
      sink_.tokens(ids_[i], in_loss_[i]);
      progress_.tokens += static_cast<int64_t>(ids_[i].size()) + (item.starts_document ? 1 : 0);
    }
  }

  const PrepareOptions& o_;
  const Tokenizer& tok_;
  TokenSink& sink_;
  PrepareSummary& summary_;
  const bool jsonl_;  // jsonl or chat: items are raw lines
  const bool chat_;
  ChatTemplate chat_template_ = ChatTemplate::Llama3;
  const int threads_;
  const std::chrono::steady_clock::time_point t0_;
  std::vector<Item> items_;
  size_t bytes_ = 0;
  std::vector<std::vector<int32_t>> ids_;
  std::vector<std::vector<uint8_t>> in_loss_;
  std::vector<std::string> errors_;
  PrepareProgress progress_;
  double last_report_ = 0.0;
};

void read_text_inputs(const PrepareOptions& o, const Tokenizer& tok, Batcher& batcher, PrepareSummary& summary) {
  batcher.set_bytes_total(summary.input_bytes);  // validated up front: the decompressed size
  int64_t done = 0;
  const auto bytes_done = [&] { return done; };
  for (size_t f = 0; f < o.inputs.size(); ++f) {
    stream_documents(o.inputs[f], o.separator, [&](std::string_view piece, bool new_doc) {
      done += static_cast<int64_t>(piece.size());
      batcher.add({std::string(piece), new_doc, static_cast<int32_t>(f), 0}, bytes_done);
    }, 1 << 20, /*cut_before_spaces_only=*/tok.kind() == "hf");
  }
  done = summary.input_bytes;
  batcher.finish(bytes_done);
}

void read_jsonl_inputs(const PrepareOptions& o, Batcher& batcher, PrepareSummary& summary) {
  int64_t total = 0;
  for (const auto& in : o.inputs) total += static_cast<int64_t>(fs::file_size(in));
  batcher.set_bytes_total(total);
  int64_t finished = 0;  // on-disk bytes of the files read to the end
  const LineReader* current = nullptr;
  const auto bytes_done = [&] { return finished + (current ? current->file().consumed_bytes() : 0); };
  std::string line;
  for (size_t f = 0; f < o.inputs.size(); ++f) {
    LineReader reader(o.inputs[f]);
    current = &reader;
    while (reader.next(line)) {
      summary.input_bytes += static_cast<int64_t>(line.size()) + 1;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // a blank line: nothing
      batcher.add({std::move(line), true, static_cast<int32_t>(f), reader.line_number()}, bytes_done);
      line.clear();
    }
    batcher.flush(bytes_done);  // before `reader` goes
    current = nullptr;
    finished += static_cast<int64_t>(fs::file_size(o.inputs[f]));
  }
  batcher.finish(bytes_done);
}

}  // namespace

int64_t tokenize_inputs(const PrepareOptions& o, const Tokenizer& tok, TokenSink& sink, PrepareSummary& summary) {
  Batcher batcher(o, tok, sink, summary);
  if (o.input_format != "text") {
    read_jsonl_inputs(o, batcher, summary);
  } else {
    read_text_inputs(o, tok, batcher, summary);
  }
  return batcher.documents();
}

void for_each_jsonl_text(const std::vector<fs::path>& inputs, const std::string& key,
                         const std::function<void(std::string_view)>& on_text) {
  std::string line;
  for (const auto& path : inputs) {
    LineReader reader(path);
    while (reader.next(line)) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      const JsonlText t = jsonl_text(line, key);
      if (t.error.empty()) on_text(t.text);
    }
  }
}

}  // namespace kiln::data
