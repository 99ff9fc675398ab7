#include "data/prepare_staging.h"

#include "core/error.h"

#include <fmt/format.h>

#include <algorithm>

namespace kiln::data {

namespace fs = std::filesystem;

std::string shard_name(const char* prefix, int64_t i) { return fmt::format("{}_{:06d}.bin", prefix, i); }

StagingSink::StagingSink(fs::path staging, ShardFormat format, int64_t shard_tokens, int32_t eot, bool loss_spans)
    : staging_(std::move(staging)), format_(format), S_(shard_tokens), eot_(eot),
      docs_(staging_ / "stream_docs.idx", PositionIndexKind::DocumentStarts) {
  if (loss_spans) loss_ = std::make_unique<PositionIndexWriter>(loss_index_path(), PositionIndexKind::LossSpans);
}

void StagingSink::begin_document() {
  docs_.add(total_);
  const uint8_t out_of_loss = 0;
  tokens(std::span<const int32_t>(&eot_, 1),
         loss_ ? std::span<const uint8_t>(&out_of_loss, 1) : std::span<const uint8_t>());
}

void StagingSink::tokens(std::span<const int32_t> ids, std::span<const uint8_t> in_loss) {
  if (loss_) {
    KILN_CHECK(in_loss.size() == ids.size(), "prepare: {} ids with {} loss flags", ids.size(), in_loss.size());
    for (size_t i = 0; i < ids.size(); ++i)
      if ((in_loss[i] != 0) != span_open_) {
        loss_->add(total_ + static_cast<int64_t>(i));  // a span begins or ends here
        span_open_ = !span_open_;
      }
  }
  while (!ids.empty()) {
    if (!writer_) writer_ = std::make_unique<ShardWriter>(chunk_path(chunk_tokens_.size()), format_);
    const auto take = static_cast<size_t>(std::min<int64_t>(S_ - writer_->count(), static_cast<int64_t>(ids.size())));
    writer_->write(ids.first(take));
    ids = ids.subspan(take);
    total_ += static_cast<int64_t>(take);
    if (writer_->count() == S_) close_chunk();
  }
}

void StagingSink::finish() {
  if (writer_) close_chunk();
  docs_.finish(std::max<int64_t>(total_, 1));
  if (loss_) {
    if (span_open_) loss_->add(total_);
    loss_->finish(total_);
  }
}

void StagingSink::close_chunk() {
  chunk_tokens_.push_back(writer_->count());
  writer_->finish();
  writer_.reset();
}

namespace {

// The staged document index cut at `split_at` into train_docs.idx and val_docs.idx (val
// starts a document at 0 whatever), recorded in `meta`.
void cut_doc_index(const StagingSink& stream, const fs::path& staging, int64_t split_at, DatasetMeta& meta) {
  constexpr auto kDocs = PositionIndexKind::DocumentStarts;
  const bool has_val = split_at < stream.total();
  PositionIndexWriter train_docs(staging / "train_docs.idx", kDocs);
  std::unique_ptr<PositionIndexWriter> val_docs;
  if (has_val) val_docs = std::make_unique<PositionIndexWriter>(staging / "val_docs.idx", kDocs);
  scan_position_index(stream.doc_index_path(), kDocs, -1, -1, [&](int64_t start) {
    if (start < split_at) {
      train_docs.add(start);
    } else {
      if (val_docs->count() == 0 && start > split_at) val_docs->add(0);
      val_docs->add(start - split_at);
    }
  });
  if (val_docs && val_docs->count() == 0) val_docs->add(0);
  SplitInfo& train = meta.splits["train"];
  train.doc_index = {"train_docs.idx", train_docs.count()};
  train_docs.finish(train.tokens);
  if (val_docs) {
    SplitInfo& val = meta.splits["val"];
    val.doc_index = {"val_docs.idx", val_docs->count()};
    val_docs->finish(val.tokens);
  }
  std::error_code ec;
  fs::remove(stream.doc_index_path(), ec);
}

// The staged loss spans cut at `split_at` into train_loss.idx and val_loss.idx (a span
// across the cut becomes two), recorded in `meta`.
void cut_loss_index(const StagingSink& stream, const fs::path& staging, int64_t split_at, DatasetMeta& meta) {
  constexpr auto kSpans = PositionIndexKind::LossSpans;
  const bool has_val = split_at < stream.total();
  PositionIndexWriter train(staging / "train_loss.idx", kSpans);
  std::unique_ptr<PositionIndexWriter> val;
  if (has_val) val = std::make_unique<PositionIndexWriter>(staging / "val_loss.idx", kSpans);
  int64_t begin = -1;  // of the span being read
  scan_position_index(stream.loss_index_path(), kSpans, -1, -1, [&](int64_t bound) {
    if (begin < 0) {
      begin = bound;
      return;
    }
    if (begin < split_at) train.add(begin), train.add(std::min(bound, split_at));
    if (bound > split_at) val->add(std::max(begin, split_at) - split_at), val->add(bound - split_at);
    begin = -1;
  });
  SplitInfo& t = meta.splits["train"];
  t.loss_index = {"train_loss.idx", train.count()};
  train.finish(t.tokens);
  if (val) {
    SplitInfo& v = meta.splits["val"];
    v.loss_index = {"val_loss.idx", val->count()};
    val->finish(v.tokens);
  }
  std::error_code ec;
  fs::remove(stream.loss_index_path(), ec);
}

}  // namespace

void write_splits(const StagingSink& stream, const fs::path& staging, int64_t split_at, ShardFormat format,
                  int64_t S, DatasetMeta& meta) {
  const int64_t total = stream.total();
  std::vector<int32_t> buf;
  // Copies stream tokens [begin, end) from the staging chunks into `w`.
  auto copy_range = [&](int64_t begin, int64_t end, ShardWriter& w) {
    while (begin < end) {
      const int64_t k = begin / S;
      ShardReader r(stream.chunk_path(static_cast<size_t>(k)));
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
  const auto& chunk_tokens = stream.chunk_tokens();
  SplitInfo& train = meta.splits["train"];
  for (int64_t k = 0; k * S < split_at; ++k) {
    const int64_t begin = k * S, end = std::min(split_at, begin + chunk_tokens[static_cast<size_t>(k)]);
    const fs::path dst = staging / shard_name("train", k);
    if (end - begin == chunk_tokens[static_cast<size_t>(k)]) {
      fs::rename(stream.chunk_path(static_cast<size_t>(k)), dst);
    } else {
      ShardWriter w(dst, format);
      copy_range(begin, end, w);
      w.finish();
    }
    train.shards.push_back({dst.filename().string(), end - begin});
    train.tokens += end - begin;
  }
  if (split_at < total) {
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
  std::error_code ec;
  for (size_t k = 0; k < chunk_tokens.size(); ++k) fs::remove(stream.chunk_path(k), ec);
  cut_doc_index(stream, staging, split_at, meta);
  if (stream.has_loss_spans()) cut_loss_index(stream, staging, split_at, meta);
}


}  // namespace kiln::data
