// Trainer checkpoints: what exact resume needs, nothing more. The model, the optimizer's
// moments, moving average of the weights (train.ema_decay) and step count, the data
// loader's position, the update count and the seed (every random draw — dropout masks,
// data order, samples — is a function of the seed and the update count), plus the
// resolved config and the tokenizer for `kiln sample`. Reading them back:
// trainer_resume.cpp.
#include "checkpoint/checkpoint.h"
#include "comm/ledger.h"
#include "model_io/model_io.h"
#include "train/trainer.h"
#include "profile/tracer.h"

#include <fmt/format.h>

#include <chrono>

namespace kiln {

namespace fs = std::filesystem;

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}
}  // namespace

void Trainer::save_checkpoint() {
  auto scope = profile::trace_scope("checkpoint");
  if (config_.checkpoint.async) {
    const auto t0 = Clock::now();
    // At most one save in flight: a save still writing is waited for first.
    const double waited = drain_background_save(/*last=*/false);
    SaveContents contents = capture_checkpoint();
    contents.wait_s = waited;
    contents.stall_s = seconds_since(t0);
    pending_save_ = std::make_unique<BackgroundSave>(std::move(contents));
    return;
  }
  SaveContents contents = capture_checkpoint();
  contents.writer->write_rank_files();
  const CommSite site("ckpt.barrier save");
  world_->barrier();
  if (is_rank0()) {
    commit_checkpoint(contents);
    if (options_.verbose) fmt::print("kiln: saved checkpoint {}\n", contents.writer->dir().string());
  }
  world_->barrier();
  host_copies_.release();  // kept between saves only for background ones
}

SaveContents Trainer::capture_checkpoint() {
  const fs::path root = run_dir_ / "ckpt";
  // A checkpoint of this step may exist already (after a rollback, or a damaged one):
  // commit() replaces it atomically.
  check_replicas();
  // Every rank writes the slices it holds (named global tensors, any layout can read
  // them back); rank 0 commits the manifest once all rank files are on disk.
  SaveContents c;
  c.step = step_;
  c.writer = std::make_unique<checkpoint::CheckpointWriter>(
      root / checkpoint::checkpoint_dir_name(step_), world_->rank(), world_->size());
  if (is_rank0()) {
    fs::create_directories(root);
    c.writer->discard_stale_tmp_dir();  // what an interrupted save of this step left
  }
  const CommSite site("ckpt.barrier capture");
  world_->barrier();
  host_copies_.reset();  // the previous save, if any, has finished with them
  add_tensors(*c.writer, host_copies_);
  if (is_rank0()) {
    c.state = checkpoint_state();
    c.extra = train_data_->checkpoint_files();
    c.extra["config.toml"] = config_.to_toml();
  }
  return c;
}

void Trainer::commit_checkpoint(SaveContents& contents) {
  contents.writer->commit(contents.state, contents.extra);
  checkpoint_policy().prune(run_dir_ / "ckpt");
}

double Trainer::drain_background_save(bool last) {
  if (!pending_save_) return 0.0;
  const double waited = pending_save_->wait();
  // Which rank failed, if any: the highest, as rank + 1 (0: none).
  std::vector<float> failed{pending_save_->error().empty() ? 0.f
                                                           : static_cast<float>(world_->rank() + 1)};
  if (world_->size() > 1) {
    const CommSite site("ckpt.all_reduce background save result");
    world_->all_reduce(Tensor::view(failed.data(), Shape{1}, DType::F32), ReduceOp::Max);
  }
  finish_background_save(static_cast<int>(failed[0]) - 1, last);
  return waited;
}

void Trainer::finish_background_save(int failed_rank, bool last) {
  const std::unique_ptr<BackgroundSave> save = std::move(pending_save_);
  SaveContents& c = save->contents();
  if (failed_rank < 0) {
    if (is_rank0()) {
      commit_checkpoint(c);
      if (options_.verbose)
        fmt::print("kiln: saved checkpoint {} (in the background: training stalled {:.2f} s, the "
                   "write took {:.2f} s)\n", c.writer->dir().string(), c.stall_s,
                   save->write_seconds());
      save_records_.push_back({{"step", c.step}, {"event", "checkpoint"}, {"async", true},
                               {"stall_s", c.stall_s}, {"write_s", save->write_seconds()},
                               {"wait_s", c.wait_s}});
    }
    return;
  }
  const std::string what =
      failed_rank == world_->rank()
          ? save->error()
          : fmt::format("rank {} could not write its part (its own message names the file)",
                        failed_rank);
  // The save a stop or the end of training waits for is the run's last: never only a warning.
  KILN_CHECK(config_.checkpoint.on_error == "warn" && !last,
             "checkpoint of step {} (written in the background) failed: {}", c.step, what);
  if (failed_rank == world_->rank() && !is_rank0())  // the line naming the file
    fmt::print(stderr, "kiln: rank {}: warning: checkpoint of step {} (written in the "
               "background) failed: {}\n", failed_rank, c.step, what);
  if (options_.verbose)
    fmt::print("kiln: warning: checkpoint of step {} (written in the background) failed: {}; "
               "training goes on (checkpoint.on_error = warn), the previous checkpoint stays "
               "the newest\n", c.step, what);
  if (is_rank0()) c.writer->discard_stale_tmp_dir();
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

void Trainer::add_tensors(checkpoint::CheckpointWriter& writer, HostCopies& copies) {
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
    add_param_range(writer, seg.spec.name, seg.spec, DType::F32, seg.begin, seg.end,
                    copies.copy(*backend_, master ? master : seg.param));
    if (master) {
      void* lowp = copies.raw(static_cast<size_t>(seg.param.nbytes()));
      backend_->copy_to_host(backend_->default_stream(), lowp, seg.param);
      add_param_range(writer, "lowp." + seg.spec.name, seg.spec, seg.param.dtype(), seg.begin,
                      seg.end, lowp);
    }
    add_optimizer_segment(writer, optimizer, i, copies);
  }
  // Frozen parameters: their values (in the model dtype, which fp32 holds exactly) and
  // no optimizer state; whole on every dp replica below ZeRO-3 (an expert-parallel one on
  // every edp replica), so its first holder writes it. A LoRA fine-tune's frozen base is
  // not saved: its state names it (lora_state).
  for (const AdamWSegment& seg : one_step_->data_parallel().frozen_segments()) {
    Communicator& replicas = seg.spec.slice.ep_sharded() ? mesh_->edp_comm() : mesh_->dp_cp_comm();
    const bool first_holder = config_.parallel.zero_stage == 3 || replicas.rank() == 0;
    if (one_step_->lora_plan() || !first_holder || seg.spec.tied_copy ||
        !(seg.spec.slice.tp_sharded() || tp_rank == 0))
      continue;
    add_param_range(writer, seg.spec.name, seg.spec, DType::F32, seg.begin, seg.end,
                    copies.copy(*backend_, seg.param));
  }
  // Buffers (a MoE selection bias): whole and the same on every dp and tp replica.
  if (mesh_->dp_cp_comm().rank() == 0 && tp_rank == 0)
    add_model_buffers(writer, one_step_->model(), copies);
  // Delayed fp8 scaling's amax histories: the same on every rank (Fp8Plan::end_step).
  if (const Fp8Plan* fp8 = one_step_->fp8_plan(); fp8 && world_->rank() == 0) {
    for (const Fp8Plan::StateTensor& t : fp8->state())
      writer.add_flat_range(t.name, t.shape, DType::F32, 0, t.shape.numel(),
                            copies.copy(*backend_, t.value));
  }
}

nlohmann::json Trainer::checkpoint_state() const {
  const Model& model = one_step_->model();
  const LossScaler& scaler = one_step_->scaler();
  const data::LoaderState ls = train_data_->state();
  nlohmann::json state = {
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
  if (!lora_state().is_null()) state["lora"] = lora_state();  // the adapters' base
  return state;
}

CheckpointPolicy Trainer::checkpoint_policy() const {
  const int64_t steps = config_.train.steps;
  return CheckpointPolicy(config_.checkpoint, steps,
                          options_.exit_interval > 0 ? std::min(options_.exit_interval, steps) : steps);
}

}  // namespace kiln
