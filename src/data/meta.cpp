#include "data/meta.h"

#include "core/error.h"
#include "core/json_util.h"
#include "data/tokenizer.h"

#include <nlohmann/json.hpp>

namespace kiln::data {

namespace fs = std::filesystem;

namespace {
constexpr const char* kFormat = "kiln-token-shards";
constexpr int kFormatVersion = 1;

// j[key] = {split: {"file", count_key}} for the splits that have the index `member`.
void add_index_entries(nlohmann::ordered_json& j, const DatasetMeta& meta, const char* key, const char* count_key,
                       IndexFileInfo SplitInfo::*member) {
  nlohmann::ordered_json entries = nlohmann::ordered_json::object();
  for (const auto& [name, split] : meta.splits)
    if (!(split.*member).file.empty())
      entries[name] = {{"file", (split.*member).file}, {count_key, (split.*member).count}};
  if (!entries.empty()) j[key] = std::move(entries);
}
}  // namespace

void write_dataset_meta(const fs::path& dir, const DatasetMeta& meta) {
  nlohmann::ordered_json j;
  j["format"] = kFormat;
  j["format_version"] = kFormatVersion;
  j["tokenizer"] = {{"kind", meta.tokenizer_kind}, {"hash", meta.tokenizer_hash}};
  j["vocab_size"] = meta.vocab_size;
  j["eot_id"] = meta.eot_id;
  j["token_dtype"] = token_dtype_name(meta.dtype());
  j["shard_version"] = shard_version(meta.format);
  j["documents"] = meta.documents;
  nlohmann::ordered_json tokens = nlohmann::ordered_json::object();
  nlohmann::ordered_json shards = nlohmann::ordered_json::object();
  for (const auto& [name, split] : meta.splits) {
    tokens[name] = split.tokens;
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const auto& s : split.shards) list.push_back({{"file", s.file}, {"tokens", s.tokens}});
    shards[name] = std::move(list);
  }
  j["tokens"] = std::move(tokens);
  j["shards"] = std::move(shards);
  add_index_entries(j, meta, "doc_index", "documents", &SplitInfo::doc_index);
  add_index_entries(j, meta, "loss_index", "positions", &SplitInfo::loss_index);
  write_file_atomic(dir / "meta.json", j.dump(2) + "\n");
}

namespace {
// Per count, and per split's running sum (checked before each addition, so it stays below
// 2^49: no overflow whatever the number of shards).
constexpr int64_t kMaxTokens = int64_t{1} << 48;

// A file listed for split `split` must be a plain file name in the dataset directory: no
// path, no NUL (a name with one would be read as its prefix).
void check_plain_name(const std::string& file, const fs::path& meta, const std::string& split) {
  KILN_CHECK(!file.empty() && file.find('\0') == std::string::npos && file.find('/') == std::string::npos &&
                 file != "." && file != "..",
             "{}: split '{}' lists the file {}: not a plain file name", meta.string(), split,
             nlohmann::json(file).dump());
}

// j[key][split] ({"file", count_key} with a count of at least `min_count`), or none.
IndexFileInfo read_index_entry(const nlohmann::json& j, const fs::path& meta, const std::string& split,
                               const char* key, const char* count_key, int64_t min_count) {
  IndexFileInfo info;
  if (!j.contains(key) || !j.at(key).contains(split)) return info;
  const auto& d = j.at(key).at(split);
  info.file = d.at("file").get<std::string>();
  check_plain_name(info.file, meta, split);
  info.count = json_integer(d.at(count_key), meta.string(), fmt::format("{}.{}", key, count_key), min_count,
                            kMaxTokens);
  return info;
}
}  // namespace

DatasetMeta read_dataset_meta(const fs::path& dir) {
  KILN_CHECK(fs::is_directory(dir), "dataset directory {} does not exist", dir.string());
  const fs::path path = dir / "meta.json";
  KILN_CHECK(fs::exists(path), "{}: missing (not a dataset prepared by `kiln prepare`?)", path.string());
  DatasetMeta m;
  try {
    const auto j = nlohmann::json::parse(read_small_file(path));
    KILN_CHECK(!j.is_object() || j.value("format", std::string()) != "kiln-image-shards",
               "{}: an image dataset (kiln prepare --format idx); the language models read token "
               "datasets (kiln prepare --tokenizer ...)", path.string());
    KILN_CHECK(j.at("format").get<std::string>() == kFormat &&
                   json_integer(j.at("format_version"), path.string(), "format_version", INT32_MIN, INT32_MAX) ==
                       kFormatVersion,
               "{}: not a {} v{} file", path.string(), kFormat, kFormatVersion);
    m.tokenizer_kind = j.at("tokenizer").at("kind").get<std::string>();
    m.tokenizer_hash = j.at("tokenizer").at("hash").get<std::string>();
    m.vocab_size = static_cast<int>(json_integer(j.at("vocab_size"), path.string(), "vocab_size", 1, INT32_MAX));
    m.eot_id = static_cast<int>(json_integer(j.at("eot_id"), path.string(), "eot_id", INT32_MIN, INT32_MAX));
    const TokenDType dtype = parse_token_dtype(j.at("token_dtype").get<std::string>());
    m.format = dtype == TokenDType::U16 ? ShardFormat::U16 : ShardFormat::KilnU32;
    if (j.contains("shard_version"))  // always written; 1 or 2 before llm.c's version 7 was
      m.format = shard_format_of_version(
          json_integer(j.at("shard_version"), path.string(), "shard_version", INT32_MIN, INT32_MAX),
          path.string() + ": shard_version");
    KILN_CHECK(m.dtype() == dtype, "{}: shard_version {} does not hold token_dtype {}", path.string(),
               shard_version(m.format), token_dtype_name(dtype));
    m.documents = json_integer(j.at("documents"), path.string(), "documents", 0, kMaxTokens);
    for (const auto& [name, list] : j.at("shards").items()) {
      SplitInfo s;
      s.tokens = json_integer(j.at("tokens").at(name), path.string(), "tokens", 0, kMaxTokens);
      int64_t sum = 0;
      for (const auto& e : list) {
        const std::string file = e.at("file").get<std::string>();
        check_plain_name(file, path, name);
        s.shards.push_back({file,
                            json_integer(e.at("tokens"), path.string(), "shards[].tokens", 0, kMaxTokens)});
        KILN_CHECK(sum <= kMaxTokens, "{}: split '{}' lists more than 2^48 tokens", path.string(), name);
        sum += s.shards.back().tokens;
      }
      KILN_CHECK(sum == s.tokens, "{}: split '{}' lists shards of {} tokens but records {}",
                 path.string(), name, sum, s.tokens);
      s.doc_index = read_index_entry(j, path, name, "doc_index", "documents", 1);
      s.loss_index = read_index_entry(j, path, name, "loss_index", "positions", 0);
      m.splits[name] = std::move(s);
    }
  } catch (const nlohmann::json::exception& e) {
    KILN_FAIL("{}: malformed ({})", path.string(), e.what());
  } catch (const kiln::Error& e) {
    throw;
  }
  KILN_CHECK(m.vocab_size > 0 && m.eot_id >= 0 && m.eot_id < m.vocab_size,
             "{}: bad vocab_size {} / eot_id {}", path.string(), m.vocab_size, m.eot_id);
  KILN_CHECK(token_dtype_for_vocab(m.vocab_size) == m.dtype() || m.dtype() == TokenDType::U32,
             "{}: token dtype {} cannot hold vocab_size {}", path.string(), token_dtype_name(m.dtype()),
             m.vocab_size);
  return m;
}

}  // namespace kiln::data
