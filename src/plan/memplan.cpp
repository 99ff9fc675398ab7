#include "plan/memplan.h"

#include "backend/cpu/gemm.h"
#include "backend/meta/meta_backend.h"
#include "config/components.h"
#include "core/error.h"
#include "data/meta.h"
#include "models/registry.h"
#include "optim/adamw.h"
#include "parallel/data_parallel.h"
#include "parallel/mesh.h"
#include "parallel/pipeline_schedule.h"
#include "plan/planned_ep_group.h"
#include "plan/scratch_models.h"
#include "model_io/model_io.h"
#include "train/train_data.h"
#include "train/train_step.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <memory>

namespace kiln::plan {

namespace fs = std::filesystem;

const RankMemory& MemPlan::max_rank() const {
  return *std::max_element(ranks.begin(), ranks.end(), [](const RankMemory& a, const RankMemory& b) {
    return a.peak_total < b.peak_total;
  });
}

bool MemPlan::ranks_differ() const {
  for (const auto& r : ranks)
    if (r.peak != ranks.front().peak || r.peak_total != ranks.front().peak_total) return true;
  return false;
}

TrainConfig resolve_for_planning(TrainConfig c, int world_size) {
  KILN_CHECK(world_size >= 1, "memplan: --world-size must be >= 1, got {}", world_size);
  const int cp_tp_pp = c.parallel.cp * c.parallel.tp * c.parallel.pp;
  KILN_CHECK(world_size % cp_tp_pp == 0,
             "{}: parallel.cp x parallel.tp x parallel.pp = {} does not divide the world size {}",
             c.source, cp_tp_pp, world_size);
  const int dp = world_size / cp_tp_pp;
  KILN_CHECK(c.parallel.dp == 0 || c.parallel.dp == dp,
             "{}: parallel.dp = {} but the world size {} over cp x tp x pp = {} leaves {}",
             c.source, c.parallel.dp, world_size, cp_tp_pp, dp);
  KILN_CHECK((dp * c.parallel.cp) % c.parallel.ep == 0,
             "{}: parallel.ep = {} does not divide dp x cp = {} (the expert-parallel groups are "
             "carved out of the dp x cp ranks)", c.source, c.parallel.ep, dp * c.parallel.cp);
  KILN_CHECK(c.model.n_layer > 0 && c.model.n_head > 0 && c.model.n_embd > 0 && c.model.block_size > 0,
             "{}: the model shape is incomplete (set model.preset or model.n_layer, n_head, n_embd, "
             "block_size)", c.source);
  if (model_arch(c.model.arch).takes_images) {
    // Image models: the image size, channels and classes from the data set when unset.
    if (!c.data.dir.empty() && fs::exists(fs::path(c.data.dir) / "meta.json")) {
      const auto data = open_train_data(c.data.dir, "train", std::max(1, c.train.seq_len), 0,
                                        /*shuffle=*/false, data::Packing::None,
                                        pair_layout_of(c));
      data->check_arch(c);
      data->fill_model_keys(c);
    }
  } else if (c.model.vocab_size == 0) {
    const fs::path dir = tokenizer_data_dir(c);
    KILN_CHECK(!dir.empty() && fs::exists(dir / "meta.json"),
               "{}: model.vocab_size is needed to plan without a data set (set it, use a "
               "model.preset, or point data.dir at a prepared data set)", c.source);
    c.model.vocab_size = data::read_dataset_meta(dir).vocab_size;
  }
  if (c.train.global_batch == 0) c.train.global_batch = c.train.micro_batch * dp;
  (void)c.grad_accum_steps(dp);  // throws naming train.global_batch when it does not divide
  return c;
}

namespace {

// A family key of the config's [model] (e.g. llama's moe.num_experts), 0 when the arch has none.
double family_key(const TrainConfig& c, const char* key) {
  const auto it = c.model.family.find(key);
  return it == c.model.family.end() ? 0.0 : it->second;
}

// One rank's step. When `plan` is given, its model description, FLOPs per token and the
// rank's collectives are set from the step.
RankMemory dry_run(const TrainConfig& c, const MemPlanOptions& o, int rank,
                   std::shared_ptr<MetaScratchModel> scratch, MemPlan* plan = nullptr) {
  // The mesh (parallel/mesh.h): rank = ((pp * dp + d) * cp + c) * tp + t.
  const int tp_size = c.parallel.tp, pp_size = c.parallel.pp, cp_size = c.parallel.cp;
  const int dp_size = o.world_size / (cp_size * tp_size * pp_size);
  const int cp_rank = (rank / tp_size) % cp_size, dp_rank = (rank / (tp_size * cp_size)) % dp_size;
  MetaBackendOptions mo;
  mo.device = o.backend == "cuda" ? Device::cuda(0) : Device::cpu();
  mo.scratch = std::move(scratch);
  auto be = make_meta_backend(mo);
  // The dp x cp group (the dp group when cp = 1).
  const int dp_cp_size = dp_size * cp_size;
  SimulatedCommunicator comm(dp_cp_size, dp_rank * cp_size + cp_rank,
                             cp_size > 1 ? "world/dp_cp" : "world/dp",
                             dp_cp_size == 1 ? 0 : o.completion_polls);
  // Tensor-parallel collectives are blocking (the layers wait for them): they complete
  // when called.
  SimulatedCommunicator tp_comm(tp_size, rank % tp_size, "world/tp", 0);
  // Pipeline messages complete when posted: each stage's activations in flight are the
  // schedule's, not a neighbour's pace.
  SimulatedCommunicator pp_comm(pp_size, rank / (tp_size * cp_size * dp_size), "world/pp", 0);
  // Ring attention's shifts likewise (the layers wait for each hop).
  SimulatedCommunicator cp_comm(cp_size, cp_rank, "world/cp", 0);
  // Expert parallelism: the ep and edp groups as the mesh lays them out. The dispatch's
  // all-to-alls are blocking; the MoE layers receive the rows of the modelled routing
  // (plan/planned_ep_group.h).
  const DeviceMesh mesh(o.world_size, rank, MeshSizes{.dp = dp_size, .cp = cp_size, .tp = tp_size,
                                                      .pp = pp_size, .ep = c.parallel.ep});
  const auto index_in = [rank](const std::vector<int>& group) {
    return static_cast<int>(std::find(group.begin(), group.end(), rank) - group.begin());
  };
  const std::vector<int> ep_ranks = mesh.ep_ranks(rank), edp_ranks = mesh.edp_ranks(rank);
  const int ep_size = mesh.ep(), edp_size = static_cast<int>(edp_ranks.size());
  SimulatedCommunicator ep_comm(ep_size, index_in(ep_ranks), "world/ep", 0);
  SimulatedCommunicator edp_comm(edp_size, index_in(edp_ranks), "world/edp",
                                 edp_size == 1 ? 0 : o.completion_polls);
  std::unique_ptr<PlannedEpGroup> ep_group;
  if (ep_size > 1) {
    const int64_t tokens = int64_t{c.train.micro_batch} * (c.train.seq_len / cp_size);
    ep_group = std::make_unique<PlannedEpGroup>(
        ep_comm, o.moe_routing, tokens, static_cast<int>(family_key(c, "moe.top_k")),
        static_cast<int64_t>(family_key(c, "moe.num_experts")));
  }

  // The trainer's own step object: model, ZeRO wrapper and AdamW (fp32 master weights
  // for low-precision parameters) as the trainer builds them. Initial weights are copied
  // from the host: nothing to allocate, nothing to plan.
  TrainStep step(c, *be, {.dp_cp = comm,
                          .tp = tp_size > 1 ? &tp_comm : nullptr,
                          .pp = pp_size > 1 ? &pp_comm : nullptr,
                          .cp = cp_size > 1 ? &cp_comm : nullptr,
                          .ep = ep_size > 1 ? &ep_comm : nullptr,
                          .edp = ep_size > 1 ? &edp_comm : nullptr,
                          .ep_group = ep_group.get()});
  if (plan) {
    plan->model = step.model().describe();
    plan->flops_per_token = step.model().flops_per_token(c.train.seq_len);
  }
  if (c.log.peak_tflops <= 0 && o.backend == "cpu") {
    // The trainer measures the fp32 GEMM peak (backend/probe.cpp): three 1024x1024
    // temporaries and one GEMM, whose oneDNN scratchpad the backend keeps.
    const int64_t n = 1024;
    Tensor a = be->empty(Shape{n, n}, DType::F32, MemCategory::Temporaries);
    Tensor w = be->empty(Shape{n, n}, DType::F32, MemCategory::Temporaries);
    Tensor out = be->empty(Shape{n, n}, DType::F32, MemCategory::Temporaries);
    be->linear_forward(be->default_stream(), out, a, w, Tensor());
  }
  // One update on zero tokens (the Meta backend computes nothing); each collective is
  // labelled with the phase it was issued in.
  struct Phases final : StepObserver {
    std::vector<SimulatedCommunicator*> comms;
    explicit Phases(std::vector<SimulatedCommunicator*> c) : comms(std::move(c)) {}
    void on_phase(StepPhase p) override {
      if (p == StepPhase::Data) return;  // copies: the current label stays
      const char* label = p == StepPhase::GradSync ? "finish" : p == StepPhase::Done ? "optimizer"
                                                                               : step_phase_name(p);
      for (SimulatedCommunicator* x : comms) x->set_phase(label);
    }
  } phases({&comm, &tp_comm, &cp_comm, &ep_comm, &edp_comm});
  step.set_observer(&phases);
  const BatchShape& shape = step.batch_shape();  // zeros: token 0, pixel 0.0, label 0
  const int64_t per_micro = std::max(shape.required_bytes(), shape.targets.numel() * 4);
  const std::vector<int32_t> host(static_cast<size_t>(step.grad_accum_steps() * per_micro / 4 + 1), 0);
  for (SimulatedCommunicator* x : phases.comms) x->set_phase("optimizer");
  step.run(host.data(), host.data(), 0);
  if (plan) {
    plan->comm_calls = comm.calls();
    plan->tp_calls = tp_comm.calls();
    plan->cp_calls = cp_comm.calls();
  }

  const MemoryStats st = be->allocator().stats();
  RankMemory r;
  r.rank = rank;
  for (int i = 0; i < kNumMemCategories; ++i) {
    r.peak[static_cast<size_t>(i)] = st.peak[static_cast<size_t>(i)];
    r.end[static_cast<size_t>(i)] = st.current[static_cast<size_t>(i)];
  }
  r.peak_total = st.total_peak;
  return r;
}

std::shared_ptr<MetaScratchModel> make_scratch(const MemPlanOptions& o, MoeRoutingModel moe) {
  if (o.backend == "cpu") return cpu_scratch_model(o.cpu_threads, moe);
  if (o.backend == "cuda") return cuda_scratch_model();
  KILN_CHECK(o.backend == "none", "memplan: backend must be cpu, cuda or none, got '{}'", o.backend);
  return nullptr;
}

}  // namespace

MemPlan plan_memory(const TrainConfig& config, const MemPlanOptions& o) {
  MemPlan p;
  p.config = resolve_for_planning(config, o.world_size);
  p.world_size = o.world_size;
  p.tp = p.config.parallel.tp;
  p.pp = p.config.parallel.pp;
  p.cp = p.config.parallel.cp;
  p.dp = o.world_size / (p.cp * p.tp * p.pp);
  p.accum = p.config.grad_accum_steps(p.dp);
  std::vector<int> ranks = o.ranks;
  const int W = o.world_size;
  if (ranks.empty()) {
    if (W <= 16) {
      for (int r = 0; r < W; ++r) ranks.push_back(r);
    } else {
      ranks = {0, 1, W / 2, W - 2, W - 1};
    }
  }
  p.moe_experts = static_cast<int64_t>(family_key(p.config, "moe.num_experts"));
  p.moe_top_k = p.moe_experts > 0 ? static_cast<int>(family_key(p.config, "moe.top_k")) : 0;
  p.moe_routing = o.moe_routing;
  auto scratch = make_scratch(o, {o.moe_routing, p.moe_top_k});
  MemPlanOptions eff = o;
  if (eff.completion_polls < 0)
    eff.completion_polls = o.backend == "cpu" ? std::numeric_limits<int>::max() : 1;
  p.comm_model = eff.completion_polls == std::numeric_limits<int>::max()
                     ? "collectives complete only when waited for (communication falls behind)"
                     : fmt::format("collectives complete {} hook(s) after they start (communication "
                                   "keeps pace)", eff.completion_polls);
  p.scratch_model = scratch ? scratch->name() : "none";
  if (o.backend == "cpu" && p.config.train.dtype != "fp32")
    p.scratch_model += "; " + cpu::Gemm::path_description(parse_dtype(p.config.train.dtype));
  for (int r : ranks) {
    KILN_CHECK(r >= 0 && r < W, "memplan: rank {} is not a rank of a world of {}", r, W);
    const bool first = r == ranks.front();
    p.ranks.push_back(dry_run(p.config, eff, r, scratch, first ? &p : nullptr));
  }
  p.upper = p.ranks.front();
  if (o.upper_bound && p.dp * p.cp > 1 && p.config.parallel.zero_stage >= 2 &&
      eff.completion_polls != std::numeric_limits<int>::max()) {
    MemPlanOptions never = eff;
    never.completion_polls = std::numeric_limits<int>::max();
    p.upper = dry_run(p.config, never, p.ranks.front().rank, scratch);
  }
  if (p.moe_experts > 0 && o.compare_routing) {
    const MoeRouting other =
        o.moe_routing == MoeRouting::Worst ? MoeRouting::Balanced : MoeRouting::Worst;
    MemPlanOptions with_other = eff;
    with_other.moe_routing = other;
    p.moe_other = dry_run(p.config, with_other, p.ranks.front().rank,
                          make_scratch(o, {other, p.moe_top_k}));
  }
  return p;
}

// ---- layouts that fit -------------------------------------------------------------------

std::vector<std::string> Layout::sets() const {
  std::vector<std::string> s = {
      fmt::format("parallel.dp={}", dp),
      fmt::format("parallel.cp={}", cp),
      fmt::format("parallel.tp={}", tp),
      fmt::format("parallel.sequence_parallel={}", sequence_parallel ? "true" : "false"),
      fmt::format("parallel.pp={}", pp)};
  if (pp > 1) {
    s.push_back(fmt::format("parallel.pp_schedule={}", pp_schedule));
    s.push_back(fmt::format("parallel.virtual_stages={}", virtual_stages));
  }
  s.push_back(fmt::format("parallel.zero_stage={}", zero_stage));
  s.push_back(fmt::format("train.micro_batch={}", micro_batch));
  s.push_back(fmt::format("train.global_batch={}", global_batch));
  s.push_back(fmt::format("train.activation_checkpointing={}", checkpointing));
  return s;
}

namespace {

// The pipeline settings to try: (pp, virtual stages, schedule).
struct PipelineChoice {
  int pp = 1, virtual_stages = 1;
  std::string schedule;
};

std::vector<PipelineChoice> pipeline_choices(const TrainConfig& base, int world, bool vary,
                                             bool stages_ok) {
  const auto& par = base.parallel;
  if (!vary) return {{par.pp, par.virtual_stages, par.pp_schedule}};
  std::vector<PipelineChoice> out = {{1, 1, "1f1b"}};
  const int layers = base.model.n_layer;
  for (int pp = 2; stages_ok && pp <= world && pp <= layers; pp *= 2) {
    if (world % pp != 0 || layers % pp != 0) continue;
    out.push_back({pp, 1, par.pp_schedule == "interleaved" ? std::string("1f1b") : par.pp_schedule});
    if (layers % (2 * pp) == 0) out.push_back({pp, 2, "interleaved"});
  }
  return out;
}

}  // namespace

std::array<int, 5> simplicity(const Layout& l) {
  const int recompute = l.checkpointing == "none" ? 0 : l.checkpointing == "selective" ? 1 : 2;
  return {recompute, l.zero_stage, l.cp * l.tp * l.pp * l.virtual_stages,
          l.sequence_parallel ? 1 : 0, -l.micro_batch};
}

std::vector<Layout> search_layouts(const TrainConfig& config, const MemPlanOptions& options,
                                   const CostModel& cost, int64_t usable_bytes,
                                   const SearchSpace& space, std::string* refusal) {
  // Varying pp too, the configured layout is only a starting point: resolved as one rank
  // (the global batch kept, micro_batch x world when unset); each layout's own dry run
  // checks it against the world.
  TrainConfig start = config;
  if (space.vary_pp) {
    if (start.train.global_batch == 0) start.train.global_batch = start.train.micro_batch * options.world_size;
    start.parallel.dp = 0;
    start.parallel.cp = start.parallel.tp = start.parallel.pp = start.parallel.virtual_stages = 1;
    start.parallel.sequence_parallel = false;
  }
  // (As parallel.ep ranks when experts are split: ep must divide the dp x cp ranks.)
  TrainConfig base =
      resolve_for_planning(start, space.vary_pp ? std::max(1, start.parallel.ep) : options.world_size);
  base.parallel.dp = 0;  // derived per layout
  const int W = options.world_size;
  const int heads = base.model.n_head;
  // Grouped-query attention's key/value heads (a family key, e.g. llama's; 0 = n_head).
  const auto kv = base.model.family.find("n_kv_head");
  const int kv_heads = kv != base.model.family.end() && kv->second > 0 ? static_cast<int>(kv->second)
                                                                       : heads;
  std::vector<Layout> out;
  MemPlanOptions o = options;
  o.upper_bound = false;
  o.compare_routing = false;
  const ModelArch arch = model_arch(base.model.arch);
  // An axis the model does not run on (ModelArch::single_layout_reason, e.g. tp for a
  // llama with mixture-of-experts blocks) stays at 1.
  auto refused = [&](std::string_view axis) {
    return arch.single_layout_reason &&
           !arch.single_layout_reason(model_options_from(base), axis).empty();
  };
  const bool tp_ok = arch.tensor_parallel && !refused("tp");
  // Ring attention has no dropout.
  const bool cp_ok = arch.context_parallel && base.model.dropout == 0.0 && !refused("cp");
  const bool pp_ok = arch.stages && !refused("pp");
  for (const PipelineChoice& pc : pipeline_choices(base, W, space.vary_pp, pp_ok))
  for (int cp = 1; cp <= (cp_ok ? W : 1); cp *= 2)
  for (int tp = 1; tp * cp * pc.pp <= W && (tp == 1 || tp_ok); tp *= 2) {
    if (W % (cp * tp * pc.pp) != 0 || heads % tp != 0 || kv_heads % tp != 0) continue;
    if (base.train.seq_len % (2 * cp) != 0 && cp > 1) continue;
    const int dp = W / (cp * tp * pc.pp);
    if ((dp * cp) % base.parallel.ep != 0) continue;  // ep (as configured) divides dp x cp
    // The first rank of every stage (pp outermost in the mesh): only the stages differ
    // by more than the zero padding of the last slices.
    o.ranks.clear();
    for (int stage = 0; stage < (space.vary_pp ? pc.pp : 1); ++stage) o.ranks.push_back(stage * (W / pc.pp));
    for (const bool sp : {false, true}) {
      if (sp && tp == 1) continue;
      for (int mb = base.train.micro_batch; mb >= 1; mb /= 2) {
        if (base.train.global_batch % (mb * dp) != 0) continue;  // a smaller one may divide
        if (sp && (int64_t{mb} * base.train.seq_len / cp) % tp != 0) break;
        for (int stage = 0; stage <= (pc.pp > 1 ? 2 : 3); ++stage) {
          for (const char* ck : {"none", "selective", "full"}) {
            TrainConfig c = base;
            c.parallel.cp = cp;
            c.parallel.tp = tp;
            c.parallel.pp = pc.pp;
            c.parallel.virtual_stages = pc.virtual_stages;
            c.parallel.pp_schedule = pc.schedule;
            c.parallel.sequence_parallel = sp;
            c.train.micro_batch = mb;
            c.parallel.zero_stage = stage;
            c.train.activation_checkpointing = ck;
            Layout l;
            try {
              const MemPlan p = plan_memory(c, o);
              l.memory = p.max_rank();
              l.accum = p.accum;
              l.flops_per_token = p.flops_per_token;
              l.time = estimate_step_time(p, cost);
            } catch (const Error& e) {
              // A combination the trainer refuses (e.g. micro-batches per schedule).
              if (refusal != nullptr && refusal->empty()) *refusal = e.what();
              continue;
            }
            l.dp = dp;
            l.cp = cp;
            l.tp = tp;
            l.sequence_parallel = sp;
            l.pp = pc.pp;
            l.virtual_stages = pc.virtual_stages;
            l.pp_schedule = pc.schedule;
            l.zero_stage = stage;
            l.checkpointing = ck;
            l.micro_batch = mb;
            l.global_batch = base.train.global_batch;
            l.peak_bytes = l.memory.peak_total;
            l.fits = l.peak_bytes <= usable_bytes;
            out.push_back(l);
          }
        }
        if (mb == 1) break;
      }
    }
  }
  // Fitting first; then the fastest; among equal times the one that communicates less,
  // then the larger micro-batch (fewer, larger kernels), then the smaller peak.
  std::stable_sort(out.begin(), out.end(), [](const Layout& a, const Layout& b) {
    if (a.fits != b.fits) return a.fits;
    const double ta = std::round(a.time.step * 1e6), tb = std::round(b.time.step * 1e6);
    if (ta != tb) return ta < tb;
    if (a.time.comm_total != b.time.comm_total) return a.time.comm_total < b.time.comm_total;
    if (a.micro_batch != b.micro_batch) return a.micro_batch > b.micro_batch;
    return a.peak_bytes < b.peak_bytes;
  });
  // Within kTieFraction of the fastest that fits, the simplest first (less the model does
  // not see: docs/plan.md, "Ties").
  const auto fastest = std::find_if(out.begin(), out.end(), [](const Layout& l) { return l.fits; });
  if (fastest != out.end()) {
    const double limit = fastest->time.step * (1.0 + kTieFraction);
    const auto end = std::find_if(fastest, out.end(),
                                  [&](const Layout& l) { return !l.fits || l.time.step > limit; });
    std::stable_sort(fastest, end, [](const Layout& a, const Layout& b) {
      return simplicity(a) < simplicity(b);
    });
  }
  return out;
}

}  // namespace kiln::plan
