// Trainer checkpoints: what exact resume needs, nothing more. The model, the optimizer's
// moments and step count, the data loader's position, the update count and the seed
// (every random draw — dropout masks, data order, samples — is a function of the seed
// and the update count), plus the resolved config and the tokenizer for `kiln sample`.
#include "train/model_io.h"
#include "train/trainer.h"

#include <fmt/format.h>

namespace kiln {

namespace fs = std::filesystem;

void Trainer::save_checkpoint() {
  const fs::path root = run_dir_ / "ckpt";
  const fs::path dir = root / checkpoint::checkpoint_dir_name(step_);
  if (fs::exists(dir / checkpoint::kManifestName)) return;  // already saved at this step
  fs::create_directories(root);
  checkpoint::CheckpointWriter writer(dir, dp_rank_, dp_size_);
  std::vector<std::vector<float>> keep;
  add_model_to_checkpoint(writer, *model_, optimizer_.get(), keep);
  writer.write_rank_files();
  if (dp_rank_ == 0) {
    const data::LoaderState ls = train_loader_->state();
    nlohmann::json state = {
        {"step", step_},
        {"optimizer_step", optimizer_->step_count()},
        {"loader", {{"epoch", ls.epoch}, {"index", ls.index}}},
        {"seed", config_.train.seed},
        {"global_batch", config_.train.global_batch},
        {"seq_len", seq_len_},
        {"config_hash", config_.hash()},
        {"model", gpt2_config_json(model_->config())},
    };
    auto extra = tokenizer_files(*data::load_tokenizer(config_.data.dir));
    extra["config.toml"] = config_.to_toml();
    writer.commit(state, extra);
    const auto removed = checkpoint::prune_checkpoints(root, config_.checkpoint.keep);
    if (options_.verbose) fmt::print("kiln: saved checkpoint {}\n", dir.string());
    (void)removed;
  }
}

void Trainer::load_checkpoint(const fs::path& dir) {
  checkpoint::CheckpointReader reader(dir);
  const auto& st = reader.state();
  KILN_CHECK(st.at("seq_len").get<int>() == seq_len_ &&
                 st.at("global_batch").get<int>() == config_.train.global_batch,
             "{}: saved with global_batch {} and seq_len {}, this run has {} and {}; exact resume "
             "needs the same batch shape", dir.string(), st.at("global_batch").get<int>(),
             st.at("seq_len").get<int>(), config_.train.global_batch, seq_len_);
  load_model_from_checkpoint(reader, *model_, optimizer_.get());
  optimizer_->set_step_count(st.at("optimizer_step").get<int64_t>());
  step_ = st.at("step").get<int64_t>();
  train_loader_->set_state({st.at("loader").at("epoch").get<int64_t>(),
                            st.at("loader").at("index").get<int64_t>()});
  if (st.at("config_hash").get<std::string>() != config_.hash() && options_.verbose)
    fmt::print("kiln: note: the config differs from the checkpoint's (see {}/config.toml)\n",
               dir.string());
  if (options_.verbose) fmt::print("kiln: resuming from {} (step {})\n", dir.string(), step_);
}

}  // namespace kiln
