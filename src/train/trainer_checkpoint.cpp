// Trainer checkpoints: what exact resume needs, nothing more. The model, the optimizer's
// moments, moving average of the weights (train.ema_decay) and step count, the data
// loader's position, the update count and the seed (every random draw — dropout masks,
// data order, samples — is a function of the seed and the update count), plus the
// resolved config and the tokenizer for `kiln sample`.
#include "core/json_util.h"
#include "train/model_io.h"
#include "train/trainer.h"
#include "profile/tracer.h"

#include <fmt/format.h>

namespace kiln {

namespace fs = std::filesystem;

void Trainer::save_checkpoint() {
  auto scope = profile::trace_scope("checkpoint");
  const fs::path root = run_dir_ / "ckpt";
  const fs::path dir = root / checkpoint::checkpoint_dir_name(step_);
  // A checkpoint of this step may exist already (after a rollback, or a damaged one):
  // commit() replaces it atomically.
  Communicator& replicas = mesh_->dp_cp_comm();  // the dp x cp group
  if (replicas.size() > 1 && config_.parallel.zero_stage < 3)  // replicas must not have drifted
    check_same_on_all_ranks(replicas, "parameters (data-parallel replicas)",
                            dp_->replica_hash());
  if (mesh_->tp() > 1)
    check_same_on_all_ranks(mesh_->comm(Axis::TP), "replicated parameters (tensor-parallel "
                            "replicas)", dp_->tp_replica_hash());
  one_step_->check_tied_copies();  // GPT-2's wte on the first and last pipeline stage
  // Every rank writes the slices it holds (named global tensors, any layout can read
  // them back); rank 0 commits the manifest once all rank files are on disk.
  checkpoint::CheckpointWriter writer(dir, world_->rank(), world_->size());
  if (is_rank0_) {
    fs::create_directories(root);
    writer.discard_stale_tmp_dir();  // what an interrupted save of this step left
  }
  world_->barrier();
  std::vector<std::vector<float>> keep;
  // Parameters as fp32 global tensors (the master weights under mixed precision, so a
  // resume, a reshard or an export loses nothing); the low-precision copies too, under
  // "lowp.<name>", so that a resume is bitwise exact; the optimizer's state
  // (add_optimizer_segment: its moments and, with train.ema_decay, "ema.<name>").
  // Each element is written once: a replica (ZeRO stage 0 over dp, a replicated tensor
  // over tp) by its first holder only.
  const bool dp_writes = config_.parallel.zero_stage > 0 || replicas.rank() == 0;
  const auto& segs = optimizer_->segments();
  for (size_t i = 0; i < segs.size(); ++i) {
    const AdamWSegment& seg = segs[i];
    if (!dp_writes || !(seg.spec.tp.sharded() || tp_rank_ == 0)) continue;
    if (seg.spec.tied_copy) continue;  // written by its owner's stage, the same bits
    const Tensor master = optimizer_->master(i);
    keep.push_back(download_f32(*backend_, master ? master : seg.param));
    add_param_range(writer, seg.spec.name, seg.spec, DType::F32, seg.begin, seg.end,
                    keep.back().data());
    if (master) {
      keep.emplace_back(static_cast<size_t>((seg.param.nbytes() + 3) / 4));
      backend_->copy_to_host(backend_->default_stream(), keep.back().data(), seg.param);
      add_param_range(writer, "lowp." + seg.spec.name, seg.spec, seg.param.dtype(), seg.begin,
                      seg.end, keep.back().data());
    }
    add_optimizer_segment(writer, *optimizer_, i, keep);
  }
  writer.write_rank_files();
  world_->barrier();
  if (is_rank0_) {
    const data::LoaderState ls = train_data_->state();
    nlohmann::json state = {
        {"step", step_},
        {"optimizer_step", optimizer_->step_count()},
        {"loader", {{"epoch", ls.epoch}, {"index", ls.index}}},
        {"seed", config_.train.seed},
        {"data", train_data_->fingerprint()},
        {"global_batch", config_.train.global_batch},
        {"seq_len", seq_len_},
        {"config_hash", config_.hash()},
        {"arch", model_->arch()},
        {"model", model_->config_json()},
        {"layout", {{"world_size", world_->size()}, {"dp", dp_size_}, {"cp", mesh_->cp()}, {"tp", mesh_->tp()},
                    {"pp", mesh_->pp()}, {"virtual_stages", config_.parallel.virtual_stages},
                    {"sequence_parallel", config_.parallel.sequence_parallel},
                    {"zero_stage", config_.parallel.zero_stage}}},
        {"loss_scale", scaler().scale},
        {"loss_scale_good_steps", scaler().good_steps},
        {"skipped_steps", scaler().skipped_steps},
    };
    auto extra = train_data_->checkpoint_files();
    extra["config.toml"] = config_.to_toml();
    writer.commit(state, extra);
    checkpoint_policy().prune(root);
    if (options_.verbose) fmt::print("kiln: saved checkpoint {}\n", dir.string());
  }
  world_->barrier();
}

CheckpointPolicy Trainer::checkpoint_policy() const {
  const int64_t steps = config_.train.steps;
  return CheckpointPolicy(config_.checkpoint, steps,
                          options_.exit_interval > 0 ? std::min(options_.exit_interval, steps) : steps);
}

void Trainer::abandon_newer_checkpoints(const fs::path& resumed_from) {
  const fs::path root = run_dir_ / "ckpt";
  const auto moved = checkpoint::move_checkpoints_aside(root, step_);
  if (moved.empty()) return;
  // The abandoned run's metrics go with its checkpoints (the run's own metrics.jsonl
  // drops the steps after step_ when it reopens).
  const fs::path dest = moved.front().second.parent_path();
  std::error_code ec;
  if (fs::exists(run_dir_ / "metrics.jsonl", ec))
    fs::copy_file(run_dir_ / "metrics.jsonl", dest / "metrics.jsonl", ec);
  nlohmann::json steps = nlohmann::json::array();
  for (const auto& [from, to] : moved)
    steps.push_back(checkpoint::parse_checkpoint_dir_name(from.filename().string()).value_or(-1));
  rollback_record_ = {{"step", step_}, {"event", "rollback"}, {"resumed_from", resumed_from.string()},
                      {"abandoned_steps", steps}, {"moved_to", dest.string()}};
  fmt::print(stderr, "kiln: rollback: resuming at step {} from {}; the {} newer checkpoint(s) (steps "
             "{}) moved to {}\n", step_, resumed_from.string(), moved.size(), steps.dump(),
             dest.string());
}

void Trainer::load_checkpoint(const fs::path& dir) {
  checkpoint::CheckpointReader reader(dir);
  try {
    restore_from(reader);
  } catch (const nlohmann::json::exception& e) {
    KILN_FAIL("{}: the manifest's state is malformed ({})", (dir / "manifest.json").string(),
              e.what());
  }
}

void Trainer::restore_from(const checkpoint::CheckpointReader& reader) {
  const fs::path& dir = reader.dir();
  const auto& st = reader.state();
  // Integers of the state: in range or one line naming the key (json_util.h).
  const std::string where = (dir / "manifest.json").string() + ": state";
  auto integer = [&](const nlohmann::json& obj, const char* key, int64_t lo, int64_t hi) {
    return json_integer_field(obj, key, where, lo, hi);
  };
  const int64_t saved_seed = integer(st, "seed", INT64_MIN, INT64_MAX);
  const int64_t saved_seq_len = integer(st, "seq_len", 1, INT32_MAX);
  const int64_t saved_batch = integer(st, "global_batch", 1, INT32_MAX);
  const int64_t saved_step = integer(st, "step", 0, INT64_MAX);
  const int64_t saved_optimizer_step = integer(st, "optimizer_step", 0, saved_step);
  KILN_CHECK(st.is_object() && st.contains("loader"), "{}: no \"loader\"", where);
  const int64_t loader_epoch = integer(st.at("loader"), "epoch", 0, INT64_MAX);
  const int64_t loader_index = integer(st.at("loader"), "index", 0, INT64_MAX);
  // The same model: every hyper-parameter the model records (n_head, say, changes no
  // tensor shape but every result).
  const nlohmann::json now = model_->config_json();
  for (const auto& [key, value] : now.items())
    KILN_CHECK(st.at("model").contains(key) ? st.at("model").at(key) == value : true,
               "{}: saved with model.{} = {}, this run has {}; resume needs the same model "
               "(start a new run with model.init_from to change it)", dir.string(), key,
               st.at("model").at(key).dump(), value.dump());
  // What fixes the data order must not change mid-run: the seed (the epoch's shuffle) and
  // the data set (the token stream); batch shape below.
  KILN_CHECK(saved_seed == config_.train.seed,
             "{}: train.seed is {} but the checkpoint was saved with {}: the current epoch's data "
             "order depends on it (resume with --set train.seed={}, or start a new run)",
             dir.string(), config_.train.seed, saved_seed, saved_seed);
  if (st.contains("data"))  // absent in checkpoints written before it was recorded
    KILN_CHECK(st.at("data") == train_data_->fingerprint(),
               "{}: data.dir {} holds other data than the checkpoint's ({} vs {}): resuming would "
               "read other samples (use the same data, or start a new run)", dir.string(),
               config_.data.dir, train_data_->fingerprint().dump(), st.at("data").dump());
  KILN_CHECK(saved_seq_len == seq_len_ && saved_batch == config_.train.global_batch,
             "{}: saved with global_batch {} and seq_len {}, this run has {} and {}; exact resume "
             "needs the same batch shape", dir.string(), saved_batch, saved_seq_len,
             config_.train.global_batch, seq_len_);
  // Whatever layout wrote it: each rank reads the ranges it holds. Low-precision
  // parameters come from "lowp.<name>" when it was saved in this dtype (bitwise resume),
  // else rounded from the fp32 values; fp32 masters from the fp32 values.
  std::vector<float> buf;
  for (const AdamWSegment& seg : dp_->load_segments()) {
    KILN_CHECK(reader.has(seg.spec.name), "{}: no tensor '{}'", dir.string(), seg.spec.name);
    KILN_CHECK(reader.global_shape(seg.spec.name) == seg.spec.shape,
               "{}: tensor '{}' has shape {}, the model expects {}", dir.string(), seg.spec.name,
               reader.global_shape(seg.spec.name).str(), seg.spec.shape.str());
    const std::string lowp = "lowp." + seg.spec.name;
    if (seg.param.dtype() != DType::F32 && reader.has(lowp) && reader.dtype(lowp) == seg.param.dtype()) {
      std::vector<uint8_t> bytes(seg.param.nbytes());
      read_param_range(reader, lowp, seg.spec, seg.begin, seg.end, bytes.data(), seg.param.dtype());
      backend_->copy_from_host(backend_->default_stream(), seg.param, bytes.data());
    } else {
      buf.resize(static_cast<size_t>(seg.size()));
      read_param_range(reader, seg.spec.name, seg.spec, seg.begin, seg.end, buf.data(), DType::F32);
      upload_f32(*backend_, seg.param, buf.data());
    }
  }
  for (size_t i = 0; i < optimizer_->segments().size(); ++i) {
    const Tensor master = optimizer_->master(i);
    if (!master) continue;
    const AdamWSegment& seg = optimizer_->segments()[i];
    buf.resize(static_cast<size_t>(seg.size()));
    read_param_range(reader, seg.spec.name, seg.spec, seg.begin, seg.end, buf.data(), DType::F32);
    backend_->copy_from_host(backend_->default_stream(), master, buf.data());
  }
  if (!load_optimizer_from_checkpoint(reader, *optimizer_) && options_.verbose)
    fmt::print("kiln: {} holds no moving average of the weights (no 'ema.' tensors): "
               "train.ema_decay = {} starts it from the checkpoint's weights\n", dir.string(),
               config_.train.ema_decay);
  optimizer_->set_step_count(saved_optimizer_step);
  step_ = saved_step;
  if (fp16_ && st.contains("loss_scale")) {
    scaler().scale = st.at("loss_scale").get<double>();
    scaler().good_steps = st.value("loss_scale_good_steps", int64_t{0});
    scaler().skipped_steps = st.value("skipped_steps", int64_t{0});
  }
  train_data_->set_state({loader_epoch, loader_index});
  if (st.at("config_hash").get<std::string>() != config_.hash() && options_.verbose)
    fmt::print("kiln: note: the config differs from the checkpoint's (see {}/config.toml)\n",
               dir.string());
  if (options_.verbose) fmt::print("kiln: resuming from {} (step {})\n", dir.string(), step_);
}

}  // namespace kiln
