// The staging half of `kiln prepare` (prepare.h, steps 3 to 5): the token stream written
// into staging chunks as tokenize_inputs hands it on, then cut at the train/val split into
// the final shards and position indexes, all inside the staging directory that
// prepare_dataset moves into place at the end.
#pragma once

#include "data/meta.h"
#include "data/position_index.h"
#include "data/shard.h"
#include "data/tokenize_inputs.h"

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace kiln::data {

/// "<prefix>_NNNNNN.bin".
std::string shard_name(const char* prefix, int64_t i);

/// The token stream in staging chunks of `shard_tokens` tokens ("stage_NNNNNN.bin"), the
/// start of every document in a staging document index ("stream_docs.idx") and, for chat
/// data (`loss_spans`), the loss spans in a staging loss-span index ("stream_loss.idx").
/// Each document begins with `eot` (out of the loss).
class StagingSink final : public TokenSink {
 public:
  /// Throws kiln::Error naming the file when a staging file cannot be created.
  StagingSink(std::filesystem::path staging, ShardFormat format, int64_t shard_tokens, int32_t eot, bool loss_spans);

  void begin_document() override;
  void tokens(std::span<const int32_t> ids, std::span<const uint8_t> in_loss) override;
  /// Ends the stream: the last chunk and the staging indexes.
  void finish();

  std::filesystem::path chunk_path(size_t k) const { return staging_ / shard_name("stage", static_cast<int64_t>(k)); }
  const std::vector<int64_t>& chunk_tokens() const { return chunk_tokens_; }
  int64_t total() const { return total_; }
  std::filesystem::path doc_index_path() const { return staging_ / "stream_docs.idx"; }
  std::filesystem::path loss_index_path() const { return staging_ / "stream_loss.idx"; }
  bool has_loss_spans() const { return loss_ != nullptr; }

 private:
  void close_chunk();

  std::filesystem::path staging_;
  ShardFormat format_;
  int64_t S_;
  int32_t eot_;
  PositionIndexWriter docs_;
  std::unique_ptr<PositionIndexWriter> loss_;
  bool span_open_ = false;
  std::unique_ptr<ShardWriter> writer_;
  std::vector<int64_t> chunk_tokens_;
  int64_t total_ = 0;
};

/// Steps 4 and 5: cuts the staged stream at `split_at` into the final train and val shards
/// of `S` tokens and their position indexes (in `staging`), recording them in `meta`.
void write_splits(const StagingSink& stream, const std::filesystem::path& staging, int64_t split_at,
                  ShardFormat format, int64_t S, DatasetMeta& meta);

}  // namespace kiln::data
