// Where a run starts: resuming a checkpoint (--resume: "auto", the newest complete one of
// the run directory, or a checkpoint directory), checked to be the same run (model, seed,
// data, batch shape), with a rollback's newer checkpoints moved aside; or, without one,
// fresh weights (model.init_from's, or random ones).
#include "checkpoint/checkpoint.h"
#include "comm/ledger.h"
#include "config/components.h"
#include "core/json_util.h"
#include "model_io/lora_io.h"
#include "model_io/model_io.h"
#include "train/trainer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <map>

namespace kiln {

namespace fs = std::filesystem;

namespace {
// The leaves of a model's state object by dotted path ("n_head", "moe.top_k").
void flatten(const nlohmann::json& j, const std::string& prefix,
             std::map<std::string, nlohmann::json>& out) {
  for (const auto& [key, value] : j.items()) {
    const std::string path = prefix.empty() ? key : prefix + "." + key;
    if (value.is_object())
      flatten(value, path, out);
    else
      out[path] = value;
  }
}

// Names the keys in which `config` differs from the one saved in checkpoint `dir`.
void print_config_changes(const fs::path& dir, const TrainConfig& config) {
  std::ifstream in(dir / "config.toml");
  const std::string saved((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::vector<std::string> keys = config_keys_that_differ(saved, config.to_toml());
  const size_t shown = std::min<size_t>(keys.size(), 8);
  fmt::print("kiln: note: the config differs from the checkpoint's{}{}{} (see {}/config.toml)\n",
             keys.empty() ? "" : " in ",
             fmt::join(keys.begin(), keys.begin() + static_cast<ptrdiff_t>(shown), ", "),
             keys.size() > shown ? fmt::format(" and {} more", keys.size() - shown) : "",
             dir.string());
}
}  // namespace

std::optional<fs::path> Trainer::resume_dir() const {
  const fs::path ckpt_root = run_dir_ / "ckpt";
  if (options_.resume.empty()) return std::nullopt;
  if (options_.resume != "auto") return fs::path(options_.resume);
  std::optional<fs::path> dir = checkpoint::find_latest_checkpoint(ckpt_root);
  // Checkpoints that all fail verification are not a fresh start: training from scratch
  // would bury them (find_latest_checkpoint has said what is wrong with each).
  KILN_CHECK(dir || checkpoint::list_checkpoint_dirs(ckpt_root).empty(),
             "--resume auto: {} holds checkpoints but none is complete and intact (see the "
             "warnings above); repair or move them, or choose another run.dir", ckpt_root.string());
  if (!dir && options_.verbose)
    fmt::print("kiln: --resume auto: no checkpoint in {}, starting fresh\n", ckpt_root.string());
  return dir;
}

void Trainer::start() {
  const std::optional<fs::path> dir = resume_dir();
  if (dir) {
    load_checkpoint(*dir);
    if (is_rank0()) abandon_newer_checkpoints(*dir);
    const CommSite site("ckpt.barrier resume");
    world_->barrier();
    return;
  }
  const fs::path ckpt_root = run_dir_ / "ckpt";
  KILN_CHECK(checkpoint::list_checkpoint_dirs(ckpt_root).empty(),
             "{} already holds checkpoints: pass --resume auto to continue, or choose another "
             "run.dir", ckpt_root.string());
  init_weights();
}

void Trainer::init_weights(bool peft_adapters) {
  // A LoRA fine-tune's adapters start as PEFT's (B = 0, docs/lora.md), on the base that
  // model.init_from gives (or the seed's random one).
  const bool lora = one_step_->lora_plan() != nullptr;
  const bool from_file = !config_.model.init_from.empty();
  one_step_->init_start_weights(static_cast<uint64_t>(config_.train.seed));
  if (options_.verbose)
    for (const std::string& entry : config_.model.init_parts)
      fmt::print("kiln: model.init_parts: {}\n", entry);  // PREFIX=PATH, checked and loaded
  const ModelOptions options = model_options_from(config_);
  // The adapters from a PEFT folder, on either base.
  if (const LoraSection& l = config_.train.lora; lora && peft_adapters && !l.init_from.empty()) {
    const nn::LoraSpec spec{l.rank, static_cast<float>(l.alpha), l.rslora, 0.f};
    const auto adapters = open_peft_folder(l.init_from, options, *one_step_->lora_plan(), spec);
    one_step_->load_weights(*adapters, TrainStep::Load::Adapters);
    if (options_.verbose) fmt::print("kiln: LoRA adapters from {}\n", l.init_from);
  }
  if (!from_file) return;
  if (!one_step_->model().buffers().empty() &&
      fs::exists(fs::path(config_.model.init_from) / "manifest.json"))  // a kiln checkpoint's
    load_buffers(checkpoint::CheckpointReader(config_.model.init_from));
  if (options_.verbose) fmt::print("kiln: initialised from {}\n", config_.model.init_from);
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

/// The manifest state's integers.
struct Trainer::ResumePoint {
  int64_t seed = 0, seq_len = 0, global_batch = 0;
  int64_t step = 0, optimizer_step = 0;
  int64_t loader_epoch = 0, loader_index = 0;
};

Trainer::ResumePoint Trainer::read_resume_point(const checkpoint::CheckpointReader& reader) {
  const auto& st = reader.state();
  const std::string where = (reader.dir() / "manifest.json").string() + ": state";
  auto integer = [&](const nlohmann::json& obj, const char* key, int64_t lo, int64_t hi) {
    return json_integer_field(obj, key, where, lo, hi);
  };
  ResumePoint p;
  p.seed = integer(st, "seed", INT64_MIN, INT64_MAX);
  p.seq_len = integer(st, "seq_len", 1, INT32_MAX);
  p.global_batch = integer(st, "global_batch", 1, INT32_MAX);
  p.step = integer(st, "step", 0, INT64_MAX);
  p.optimizer_step = integer(st, "optimizer_step", 0, p.step);
  KILN_CHECK(st.is_object() && st.contains("loader"), "{}: no \"loader\"", where);
  p.loader_epoch = integer(st.at("loader"), "epoch", 0, INT64_MAX);
  p.loader_index = integer(st.at("loader"), "index", 0, INT64_MAX);
  return p;
}

void Trainer::restore_from(const checkpoint::CheckpointReader& reader) {
  const fs::path& dir = reader.dir();
  const auto& st = reader.state();
  const ResumePoint saved = read_resume_point(reader);
  check_same_lora(reader);  // first: a LoRA mismatch also shows as other frozen parameters
  check_same_run(reader, saved);
  if (one_step_->lora_plan()) init_weights(false);  // the base: the checkpoint holds the adapters
  load_parameters(reader);
  AdamW& optimizer = one_step_->optimizer();
  if (!load_optimizer_from_checkpoint(reader, optimizer) && options_.verbose)
    fmt::print("kiln: {} holds no moving average of the weights (no 'ema.' tensors): "
               "train.ema_decay = {} starts it from the checkpoint's weights\n", dir.string(),
               config_.train.ema_decay);
  optimizer.set_step_count(saved.optimizer_step);
  step_ = saved.step;
  if (scaler().enabled && st.contains("loss_scale")) {
    scaler().scale = st.at("loss_scale").get<double>();
    scaler().good_steps = st.value("loss_scale_good_steps", int64_t{0});
    scaler().skipped_steps = st.value("skipped_steps", int64_t{0});
  }
  train_data_->set_state({saved.loader_epoch, saved.loader_index});
  if (st.at("config_hash").get<std::string>() != config_.hash() && options_.verbose)
    print_config_changes(dir, config_);
  if (options_.verbose) fmt::print("kiln: resuming from {} (step {})\n", dir.string(), step_);
}

void Trainer::check_same_run(const checkpoint::CheckpointReader& reader,
                             const ResumePoint& saved) const {
  const fs::path& dir = reader.dir();
  const auto& st = reader.state();
  // The same model: every hyper-parameter the model records (n_head, say, changes no
  // tensor shape but every result), but the training-only ones (ModelKey::training_only:
  // a balancing loss's coefficient, say), which a resume may change. A key the checkpoint
  // does not record (written before it existed) is taken to agree.
  const Model& model = one_step_->model();
  const ModelKeys keys = model_arch(model.arch()).keys;
  std::map<std::string, nlohmann::json> now, then;
  flatten(model.config_json(), "", now);
  flatten(st.at("model"), "", then);
  for (const auto& [key, value] : now) {
    const ModelKey* k = find_model_key(keys, key);
    const auto it = then.find(key);
    KILN_CHECK((k && k->training_only) || it == then.end() || it->second == value,
               "{}: saved with model.{} = {}, this run has {}; resume needs the same model "
               "(start a new run with model.init_from to change it)", dir.string(), key,
               it->second.dump(), value.dump());
  }
  // What fixes the data order must not change mid-run: the seed (the epoch's shuffle) and
  // the data set (the token stream); batch shape below.
  KILN_CHECK(saved.seed == config_.train.seed,
             "{}: train.seed is {} but the checkpoint was saved with {}: the current epoch's data "
             "order depends on it (resume with --set train.seed={}, or start a new run)",
             dir.string(), config_.train.seed, saved.seed, saved.seed);
  if (st.contains("data"))  // absent in checkpoints written before it was recorded
    KILN_CHECK(st.at("data") == train_data_->fingerprint(),
               "{}: {} holds other data than the checkpoint's ({} vs {}): resuming would "
               "read other samples (use the same data, or start a new run)", dir.string(),
               describe_data(config_), train_data_->fingerprint().dump(), st.at("data").dump());
  // The same frozen parameters: which ones have optimizer state depends on it (checkpoints
  // from before freezing existed froze none).
  const auto saved_frozen = st.value("frozen", std::vector<std::string>{});
  const std::vector<std::string>& frozen = one_step_->param_tally().frozen_names;
  auto missing = [](const std::vector<std::string>& a, const std::vector<std::string>& b) {
    std::vector<std::string> out;  // in a, not in b
    for (const std::string& n : a)
      if (std::find(b.begin(), b.end(), n) == b.end()) out.push_back(n);
    return out;
  };
  KILN_CHECK(saved_frozen == frozen,
             "{}: train.freeze differs from the checkpoint's: frozen now but trained there [{}], "
             "trained now but frozen there [{}]; resume needs the same frozen parameters (start "
             "a new run with model.init_from to change them)", dir.string(),
             fmt::join(missing(frozen, saved_frozen), ", "),
             fmt::join(missing(saved_frozen, frozen), ", "));
  KILN_CHECK(saved.seq_len == config_.train.seq_len && saved.global_batch == config_.train.global_batch,
             "{}: saved with global_batch {} and seq_len {}, this run has {} and {}; exact resume "
             "needs the same batch shape", dir.string(), saved.global_batch, saved.seq_len,
             config_.train.global_batch, config_.train.seq_len);
}

const nlohmann::json& Trainer::lora_state() const {
  if (lora_state_.is_null() && one_step_->lora_plan()) {
    const LoraSection& l = config_.train.lora;
    const nlohmann::json base = config_.model.init_from.empty()
                                    ? nlohmann::json{{"seed", config_.train.seed}}
                                    : weights_identity(fs::absolute(config_.model.init_from));
    lora_state_ = {{"rank", l.rank}, {"alpha", l.alpha}, {"rslora", l.rslora},
                   {"init_from", l.init_from},
                   {"dropout", l.dropout}, {"targets", l.targets},
                   {"adapted", one_step_->lora_plan()->adapted().size()}, {"base", base},
                   {"train_dtype", config_.train.dtype}};  // a merge's default dtype
  }
  return lora_state_;
}

void Trainer::check_same_lora(const checkpoint::CheckpointReader& reader) const {
  const std::string dir = reader.dir().string();
  const auto& st = reader.state();
  const bool saved = is_lora_checkpoint(reader), now = one_step_->lora_plan() != nullptr;
  KILN_CHECK(!saved || now, "{}: holds LoRA adapters (train.lora.rank = {}) but this run sets "
             "no train.lora: resume with the checkpoint's train.lora keys", dir,
             saved ? st.at("lora").value("rank", int64_t{0}) : 0);
  KILN_CHECK(saved || !now, "{}: holds a whole model, not LoRA adapters: start a new LoRA run "
             "from it (model.init_from = {})", dir, dir);
  if (!now) return;
  const nlohmann::json& then = st.at("lora");
  const nlohmann::json& mine = lora_state();
  for (const char* key : {"rank", "alpha", "rslora", "targets"})
    KILN_CHECK(then.contains(key) && then.at(key) == mine.at(key), "{}: saved with "
               "train.lora.{} = {}, this run has {}; resume needs the same adapters", dir, key,
               then.value(key, nlohmann::json()).dump(), mine.at(key).dump());
  // The base: the same files (their crc32) or the same random one (the seed).
  const nlohmann::json& b0 = then.value("base", nlohmann::json::object());
  const nlohmann::json& b1 = mine.at("base");
  auto describe = [](const nlohmann::json& b) {
    return b.contains("path") ? fmt::format("{} (crc32 {})", b.value("path", ""),
                                            b.value("crc32", ""))
                              : fmt::format("the random base of train.seed = {}",
                                            b.value("seed", nlohmann::json()).dump());
  };
  KILN_CHECK(b0.value("crc32", nlohmann::json()) == b1.value("crc32", nlohmann::json()) &&
                 b0.value("seed", nlohmann::json()) == b1.value("seed", nlohmann::json()),
             "{}: its adapters were trained on {}, this run's base is {} ({}): resume on the "
             "same base (model.init_from)", dir, describe(b0), describe(b1),
             weights_difference(b0, b1));
}

void Trainer::load_parameters(const checkpoint::CheckpointReader& reader) {
  const fs::path& dir = reader.dir();
  // Whatever layout wrote it: each rank reads the ranges it holds. Low-precision
  // parameters come from "lowp.<name>" when it was saved in this dtype (bitwise resume),
  // else rounded from the fp32 values; fp32 masters from the fp32 values. A LoRA
  // checkpoint holds the adapters only: the frozen base comes from init_weights().
  const bool adapters_only = one_step_->lora_plan() != nullptr;
  std::vector<float> buf;
  for (const AdamWSegment& seg : one_step_->data_parallel().load_segments()) {
    if (adapters_only && !seg.spec.trainable) continue;
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
  const AdamW& optimizer = one_step_->optimizer();
  for (size_t i = 0; i < optimizer.segments().size(); ++i) {
    const Tensor master = optimizer.master(i);
    if (!master) continue;
    const AdamWSegment& seg = optimizer.segments()[i];
    buf.resize(static_cast<size_t>(seg.size()));
    read_param_range(reader, seg.spec.name, seg.spec, seg.begin, seg.end, buf.data(), DType::F32);
    backend_->copy_from_host(backend_->default_stream(), master, buf.data());
  }
  load_buffers(reader);
}

void Trainer::load_buffers(const checkpoint::CheckpointReader& reader) {
  std::vector<std::string> missing = load_model_buffers(reader, one_step_->model());
  if (Fp8Plan* fp8 = one_step_->fp8_plan()) {  // delayed scaling's amax histories
    std::vector<float> buf;
    for (const Fp8Plan::StateTensor& t : fp8->state()) {
      if (!reader.has(t.name)) {
        missing.push_back(t.name);
        continue;
      }
      KILN_CHECK(reader.global_shape(t.name) == t.shape, "{}: tensor '{}' has shape {}, "
                 "train.fp8_amax_history_len = {} expects {}", reader.dir().string(), t.name,
                 reader.global_shape(t.name).str(), config_.train.fp8_amax_history_len,
                 t.shape.str());
      buf.resize(static_cast<size_t>(t.shape.numel()));
      reader.read(t.name, buf.data(), DType::F32);
      upload_f32(*backend_, t.value, buf.data());
    }
  }
  if (!missing.empty() && options_.verbose)
    fmt::print("kiln: note: {} holds no {}: {} from zero\n", reader.dir().string(),
               fmt::join(missing, ", "), missing.size() == 1 ? "it starts" : "they start");
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

}  // namespace kiln
