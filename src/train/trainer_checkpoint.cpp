// Trainer checkpoints: what exact resume needs, nothing more. The model, the optimizer's
// moments, moving average of the weights (train.ema_decay) and step count, the data
// loader's position, the update count and the seed (every random draw — dropout masks,
// data order, samples — is a function of the seed and the update count), plus the
// resolved config and the tokenizer for `kiln sample`. Reading them back:
// trainer_resume.cpp.
#include "checkpoint/checkpoint.h"
#include "model_io/model_io.h"
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
  check_replicas();
  // Every rank writes the slices it holds (named global tensors, any layout can read
  // them back); rank 0 commits the manifest once all rank files are on disk.
  checkpoint::CheckpointWriter writer(dir, world_->rank(), world_->size());
  if (is_rank0()) {
    fs::create_directories(root);
    writer.discard_stale_tmp_dir();  // what an interrupted save of this step left
  }
  world_->barrier();
  std::vector<std::vector<float>> keep;
  add_tensors(writer, keep);
  writer.write_rank_files();
  world_->barrier();
  if (is_rank0()) {
    auto extra = train_data_->checkpoint_files();
    extra["config.toml"] = config_.to_toml();
    writer.commit(checkpoint_state(), extra);
    checkpoint_policy().prune(root);
    if (options_.verbose) fmt::print("kiln: saved checkpoint {}\n", dir.string());
  }
  world_->barrier();
}

void Trainer::check_replicas() {
  const DataParallel& dp = one_step_->data_parallel();
  Communicator& replicas = mesh_->dp_cp_comm();  // the dp x cp group
  if (replicas.size() > 1 && config_.parallel.zero_stage < 3)  // replicas must not have drifted
    check_same_on_all_ranks(replicas, "parameters (data-parallel replicas)",
                            dp.replica_hash());
  // The experts: replicated over the expert-data-parallel group only.
  Communicator& experts = mesh_->edp_comm();
  if (mesh_->ep() > 1 && experts.size() > 1 && config_.parallel.zero_stage < 3)
    check_same_on_all_ranks(experts, "expert parameters (expert-data-parallel replicas)",
                            dp.expert_replica_hash());
  if (mesh_->tp() > 1)
    check_same_on_all_ranks(mesh_->comm(Axis::TP), "replicated parameters (tensor-parallel "
                            "replicas)", dp.tp_replica_hash());
  one_step_->check_tied_copies();  // GPT-2's wte on the first and last pipeline stage
}

void Trainer::add_tensors(checkpoint::CheckpointWriter& writer,
                          std::vector<std::vector<float>>& keep) {
  // Parameters as fp32 global tensors (the master weights under mixed precision, so a
  // resume, a reshard or an export loses nothing); the low-precision copies too, under
  // "lowp.<name>", so that a resume is bitwise exact; the optimizer's state
  // (add_optimizer_segment: its moments and, with train.ema_decay, "ema.<name>"); the
  // model's buffers (Model::buffers).
  // Each element is written once: a replica (ZeRO stage 0 over dp x cp, or for an
  // expert-parallel tensor over its expert-data-parallel group; a replicated tensor over
  // tp) by its first holder only.
  const bool dp_writes = config_.parallel.zero_stage > 0 || mesh_->dp_cp_comm().rank() == 0;
  const bool edp_writes = config_.parallel.zero_stage > 0 || mesh_->edp_comm().rank() == 0;
  const int tp_rank = mesh_->coord()[Axis::TP];
  const AdamW& optimizer = one_step_->optimizer();
  const auto& segs = optimizer.segments();
  for (size_t i = 0; i < segs.size(); ++i) {
    const AdamWSegment& seg = segs[i];
    if (!(seg.spec.slice.ep_sharded() ? edp_writes : dp_writes) ||
        !(seg.spec.slice.tp_sharded() || tp_rank == 0))
      continue;
    if (seg.spec.tied_copy) continue;  // written by its owner's stage, the same bits
    const Tensor master = optimizer.master(i);
    keep.push_back(download_f32(*backend_, master ? master : seg.param));
    add_param_range(writer, seg.spec.name, seg.spec, DType::F32, seg.begin, seg.end,
                    keep.back().data());
    if (master) {
      keep.emplace_back(static_cast<size_t>((seg.param.nbytes() + 3) / 4));
      backend_->copy_to_host(backend_->default_stream(), keep.back().data(), seg.param);
      add_param_range(writer, "lowp." + seg.spec.name, seg.spec, seg.param.dtype(), seg.begin,
                      seg.end, keep.back().data());
    }
    add_optimizer_segment(writer, optimizer, i, keep);
  }
  // Frozen parameters: their values (in the model dtype, which fp32 holds exactly) and
  // no optimizer state; whole on every dp replica below ZeRO-3, so dp rank 0 writes them.
  const bool dp_writes_frozen = config_.parallel.zero_stage == 3 || mesh_->dp_cp_comm().rank() == 0;
  for (const AdamWSegment& seg : one_step_->data_parallel().frozen_segments()) {
    if (!dp_writes_frozen || !(seg.spec.slice.tp_sharded() || tp_rank == 0) || seg.spec.tied_copy)
      continue;
    keep.push_back(download_f32(*backend_, seg.param));
    add_param_range(writer, seg.spec.name, seg.spec, DType::F32, seg.begin, seg.end,
                    keep.back().data());
  }
  // Buffers (a MoE selection bias): whole and the same on every dp and tp replica.
  if (mesh_->dp_cp_comm().rank() == 0 && tp_rank == 0)
    add_model_buffers(writer, one_step_->model(), keep);
}

nlohmann::json Trainer::checkpoint_state() const {
  const Model& model = one_step_->model();
  const LossScaler& scaler = one_step_->scaler();
  const data::LoaderState ls = train_data_->state();
  return {
      {"step", step_},
      {"optimizer_step", one_step_->optimizer().step_count()},
      {"loader", {{"epoch", ls.epoch}, {"index", ls.index}}},
      {"seed", config_.train.seed},
      {"data", train_data_->fingerprint()},
      {"global_batch", config_.train.global_batch},
      {"seq_len", config_.train.seq_len},
      {"config_hash", config_.hash()},
      {"arch", model.arch()},
      {"model", model.config_json()},
      {"frozen", one_step_->param_tally().frozen_names},
      {"layout", {{"world_size", world_->size()}, {"dp", mesh_->dp()}, {"cp", mesh_->cp()}, {"tp", mesh_->tp()},
                  {"pp", mesh_->pp()}, {"ep", mesh_->ep()},
                  {"virtual_stages", config_.parallel.virtual_stages},
                  {"sequence_parallel", config_.parallel.sequence_parallel},
                  {"zero_stage", config_.parallel.zero_stage}}},
      {"loss_scale", scaler.scale},
      {"loss_scale_good_steps", scaler.good_steps},
      {"skipped_steps", scaler.skipped_steps},
  };
}

CheckpointPolicy Trainer::checkpoint_policy() const {
  const int64_t steps = config_.train.steps;
  return CheckpointPolicy(config_.checkpoint, steps,
                          options_.exit_interval > 0 ? std::min(options_.exit_interval, steps) : steps);
}

}  // namespace kiln
