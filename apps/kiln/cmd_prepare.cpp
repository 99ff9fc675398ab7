#include "apps/kiln/commands.h"
#include "core/error.h"
#include "data/image_dataset.h"
#include "data/prepare.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

namespace kiln::app {

void register_prepare(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "prepare", "Tokenize UTF-8 text into llm.c-format token shards, or (--format idx | imagefolder) turn "
                 "labelled images into image shards");
  auto opt = std::make_shared<data::PrepareOptions>();
  std::vector<std::string> inputs, tok_files;
  auto in = std::make_shared<std::vector<std::string>>();
  auto tf = std::make_shared<std::vector<std::string>>();
  auto format = std::make_shared<std::string>("text");
  auto shard_images = std::make_shared<int64_t>(100000);
  cmd->add_option("--input", *in, "Input text files (one file = one document); --format idx | imagefolder: the "
                                  "directory of IDX files or the image folder")->required();
  cmd->add_option("--format", *format, "text (default) | idx (MNIST-format images and labels: "
                                       "train-* and t10k-* [.gz]) | imagefolder ([train/, val/] "
                                       "<class>/*.png)")
      ->check(CLI::IsMember({"text", "idx", "imagefolder"}));
  cmd->add_option("--shard-images", *shard_images, "--format idx | imagefolder: images per shard (default 100000)");
  auto class_names = std::make_shared<std::string>();
  cmd->add_option("--class-names", *class_names, "--format idx: the classes' names in label order, "
                  "comma-separated (stored in meta.json)");
  cmd->add_option("--out", opt->out_dir, "Output directory for shards, meta.json and tokenizer")
      ->required();
  auto tokenizer = cmd->add_option("--tokenizer", opt->tokenizer,
                                   "sentencepiece | gpt2 | hf | byte (text; required)");
  // Options of text only: refused with --format idx | imagefolder rather than ignored.
  auto text_only = std::make_shared<std::vector<CLI::Option*>>();
  text_only->push_back(cmd->add_option("--vocab-size", opt->vocab_size, "Vocabulary size (sentencepiece)"));
  text_only->push_back(cmd->add_option("--val-fraction", opt->val_fraction,
                                       "Fraction held out for validation (text; images: the "
                                       "t10k-* files or the val/ folder are the val split)"));
  text_only->push_back(tokenizer);
  text_only->push_back(cmd->add_option("--tokenizer-files", *tf,
                  "gpt2: encoder.json + vocab.bpe, or vocab.json + merges.txt; hf: Hugging Face's "
                  "tokenizer.json or its directory; sentencepiece: a .model file"));
  text_only->push_back(cmd->add_option("--shard-format", opt->shard_format,
                  "kiln (default: uint16 v1, or kiln's uint32 v2 past 65,535 ids) | llmc (uint16 v1, "
                  "or llm.c's uint32 v7) | llmc-u32 (llm.c's uint32 v7 always)")
      ->check(CLI::IsMember({"kiln", "llmc", "llmc-u32"})));
  text_only->push_back(cmd->add_option("--shard-tokens", opt->shard_tokens, "Tokens per shard"));
  text_only->push_back(cmd->add_option("--separator", opt->separator,
                                       "Split documents inside a file at this string"));
  cmd->callback([opt, in, tf, format, shard_images, tokenizer, class_names, text_only] {
    if (*format != "text") {
      KILN_CHECK(in->size() == 1, "prepare --format {}: --input takes one directory, got {}",
                 *format, in->size());
      for (const CLI::Option* o : *text_only)
        KILN_CHECK(o->count() == 0, "prepare --format {}: {} is for text (images take none)",
                   *format, o->get_name());
      std::vector<std::string> names;  // split by hand: an empty name is an error, not skipped
      for (size_t b = 0; !class_names->empty() && b <= class_names->size();) {
        const size_t e = std::min(class_names->find(',', b), class_names->size());
        names.push_back(class_names->substr(b, e - b));
        b = e + 1;
      }
      const auto m = data::prepare_images({*format, (*in)[0], opt->out_dir, *shard_images, names});
      std::string splits;
      for (const auto& [name, shards] : m.splits)
        splits += fmt::format(" {}={} images ({} shards)", name, m.images(name), shards.size());
      fmt::print("kiln prepare: {}x{}x{} images, {} classes:{} -> {}\n", m.shape.height,
                 m.shape.width, m.shape.channels, m.classes, splits, opt->out_dir.string());
      return;
    }
    KILN_CHECK(tokenizer->count() > 0, "prepare: --tokenizer is required (sentencepiece | gpt2 | "
               "hf | byte) for text");
    KILN_CHECK(class_names->empty(), "prepare: --class-names is for --format idx");
    for (const auto& s : *in) opt->inputs.emplace_back(s);
    for (const auto& s : *tf) opt->tokenizer_files.emplace_back(s);
    const auto r = data::prepare_dataset(*opt);
    int64_t total = 0;
    std::string splits;
    for (const auto& [name, info] : r.meta.splits) {
      total += info.tokens;
      splits += fmt::format(" {}={} tokens ({} shard{})", name, info.tokens, info.shards.size(),
                            info.shards.size() == 1 ? "" : "s");
    }
    fmt::print("kiln prepare: {} document{}, {:.1f} MB -> {} tokens (vocab {}, {}){} in {:.1f} s -> {}\n",
               r.meta.documents, r.meta.documents == 1 ? "" : "s", r.input_bytes / 1e6, total, r.meta.vocab_size,
               r.meta.tokenizer_kind, splits, r.seconds, opt->out_dir.string());
  });
}

}  // namespace kiln::app
