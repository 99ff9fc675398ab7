#include "data/tokenizer.h"

#include "core/error.h"
#include "core/json_util.h"
#include "data/tokenizer_internal.h"
#include "data/utf8.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <system_error>

namespace kiln::data {

namespace fs = std::filesystem;

void write_file_atomic(const fs::path& path, std::string_view bytes) {
  fs::path tmp = path;
  tmp += ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    KILN_CHECK(f.good(), "cannot write {}", tmp.string());
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    f.flush();
    if (!f.good()) {
      f.close();
      std::error_code ec;
      fs::remove(tmp, ec);
      KILN_FAIL("cannot write {} (disk full?)", tmp.string());
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    KILN_FAIL("cannot rename {} to {}", tmp.string(), path.string());
  }
}

std::string read_small_file(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  KILN_CHECK(f.good(), "cannot read {}", path.string());
  std::ostringstream ss;
  ss << f.rdbuf();
  KILN_CHECK(!f.bad(), "error reading {}", path.string());
  return ss.str();
}

void require_utf8(std::string_view text, std::string_view what) {
  const Utf8Check c = utf8_check(text);
  KILN_CHECK(!c.error && c.valid_len == text.size(), "{}: invalid UTF-8 at byte offset {}", what,
             c.valid_len);
}

void create_directory_for(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  KILN_CHECK(!ec && fs::is_directory(dir), "cannot create directory {}", dir.string());
}

std::string hash_hex(uint64_t h) {
  char buf[17];
  return std::string(hex64(h, buf));
}

void write_tokenizer_json(const fs::path& dir, const Tokenizer& tok,
                          const std::map<std::string, std::string>& files) {
  nlohmann::json j;
  j["kind"] = tok.kind();
  j["files"] = nlohmann::json::object();
  for (const auto& [role, name] : files) j["files"][role] = name;
  j["vocab_size"] = tok.vocab_size();
  j["eot_id"] = tok.eot_id();
  j["hash"] = tok.hash();
  write_file_atomic(dir / "tokenizer.json", j.dump(2) + "\n");
}

void export_hf_tokenizer(const Tokenizer& t, const fs::path& dir) {
  const auto files = t.hf_files();
  KILN_CHECK(!files.empty(), "{} tokenizer: Hugging Face has no file for it (export a gpt2, hf or "
             "sentencepiece tokenizer)", t.kind());
  create_directory_for(dir);
  for (const auto& [name, content] : files) write_file_atomic(dir / name, content);
}

std::unique_ptr<Tokenizer> load_tokenizer(const fs::path& dir) {
  const fs::path jpath = dir / "tokenizer.json";
  KILN_CHECK(fs::exists(jpath), "{}: no tokenizer.json (not a saved tokenizer)", dir.string());
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_small_file(jpath));
  } catch (const nlohmann::json::exception& e) {
    KILN_FAIL("{}: malformed JSON ({})", jpath.string(), e.what());
  }
  std::unique_ptr<Tokenizer> tok;
  std::string kind, hash;
  int vocab = 0, eot = 0;
  try {
    kind = j.at("kind").get<std::string>();
    hash = j.at("hash").get<std::string>();
    vocab = static_cast<int>(json_integer(j.at("vocab_size"), jpath.string(), "vocab_size", 1, INT32_MAX));
    eot = static_cast<int>(json_integer(j.at("eot_id"), jpath.string(), "eot_id", INT32_MIN, INT32_MAX));
    const auto& files = j.at("files");
    if (kind == "byte") {
      tok = make_byte_tokenizer();
    } else if (kind == "sentencepiece") {
      tok = load_sentencepiece_model(dir / files.at("model").get<std::string>());
    } else if (kind == "gpt2") {
      tok = load_gpt2_tokenizer({dir / files.at("vocab").get<std::string>(),
                                 dir / files.at("merges").get<std::string>()});
    } else if (kind == "hf") {
      tok = load_hf_tokenizer(dir / files.at("tokenizer").get<std::string>());
    } else {
      KILN_FAIL("{}: unknown tokenizer kind '{}' (expected byte, sentencepiece, gpt2 or hf)",
                jpath.string(), kind);
    }
  } catch (const nlohmann::json::exception& e) {
    KILN_FAIL("{}: missing or mistyped key ({})", jpath.string(), e.what());
  }
  KILN_CHECK(tok->hash() == hash, "{}: model files hash to {} but tokenizer.json records {}",
             jpath.string(), tok->hash(), hash);
  KILN_CHECK(tok->vocab_size() == vocab && tok->eot_id() == eot,
             "{}: vocab_size/eot_id {}/{} do not match the model's {}/{}", jpath.string(), vocab,
             eot, tok->vocab_size(), tok->eot_id());
  return tok;
}

}  // namespace kiln::data
