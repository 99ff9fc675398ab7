// Data parallelism and ZeRO 0-3 with expert-parallel parameters (parallel/data_parallel.h):
// dense parameters reduced and sharded over the dp x cp group, expert-parallel ones over
// the expert-data-parallel (edp) group. A hand-built model (no forward: the test writes
// each rank's gradients itself, small integers, so that every sum is exact) has parts
// with a dense and an expert region, dense only, experts only, and a frozen region (its
// experts frozen too in a second pass: a frozen expert region), with a tp cut composed
// where the mesh has tp. For every mesh of the world size and every
// ZeRO stage, after one step's reduction:
//   - every gradient this rank updates is the sum over dp x cp (dense) or over its edp
//     group (experts), placed by global element;
//   - grad_sum_squares is the sum over the whole model's global gradient;
//   - the optimizer segments (and frozen segments), counted as the checkpoint writers
//     count them (below ZeRO-1 on rank 0 of the dp x cp or edp group; a tensor replicated
//     over tp on tp rank 0), cover every global element exactly once over the world;
//   - an update of the segments this rank owns reaches every rank's parameters (stages
//     1-2: all-gathered; stage 3: gathered), and the replicas hash alike over their group.
// Run alone (dp1, ep1), on 2 ranks (dp2 ep2) and 4 ranks (dp4 ep2, dp4 ep4, dp2 x cp2
// ep2, dp2 x tp2 ep2); each mesh skips on other world sizes.
#include "mpi_test_main.h"
#include "models/layered_model.h"
#include "parallel/data_parallel.h"
#include "parallel/mesh.h"
#include "world_test_util.h"

#include <gtest/gtest.h>
#include <fmt/format.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

namespace kiln {
namespace {

Backend& be() { return *testing::cpu_backend(); }

constexpr int64_t kExperts = 4;
constexpr uint64_t kSeed = 11;

struct Cut {
  int ep = 1, ep_index = 0;  // the ep cut of every expert tensor
  int tp = 1, tp_index = 0;  // the tp cut of the tensors marked for it
};

// Parts: "mixed" (dense, experts with a tp cut of dim 1), "dense" (tp cut of dim 0, and a
// replicated vector), "frozen" (experts, dense, a frozen vector), "experts" (experts only).
class ToyModel final : public LayeredModel {
 public:
  ToyModel(const ModelStorage& storage, const Cut& cut, bool freeze_experts = false)
      : LayeredModel(be(), storage) {
    add(0, "mixed.norm", {5}, false, -1);
    add(0, "mixed.experts", {kExperts, 6}, true, 1);
    add(1, "dense.proj", {4, 3}, false, 0);
    add(1, "dense.bias", {7}, false, -1);
    add(2, "frozen.experts", {kExperts, 2, 3}, true, -1);
    add(2, "frozen.norm", {3}, false, -1);
    add(2, "frozen.table", {6}, false, -1);
    add(3, "experts.w", {kExperts, 5}, true, -1);
    params_[6]->trainable = false;  // frozen.table
    if (freeze_experts) params_[4]->trainable = false;
    for (auto& p : params_) {
      if (p->slice.ep_parts == 0) {
        p->slice.ep_parts = cut.ep;
        p->slice.ep_index = cut.ep_index;
      }
      if (p->slice.parts == 0) {
        p->slice.parts = cut.tp;
        p->slice.index = cut.tp_index;
      }
    }
    std::vector<PartLayout> parts(4);
    const char* names[] = {"mixed", "dense", "frozen", "experts"};
    for (size_t k = 0; k < parts.size(); ++k) {
      parts[k].name = names[k];
      for (size_t i = 0; i < params_.size(); ++i)
        if (part_of_[i] == static_cast<int>(k)) parts[k].params.push_back(params_[i].get());
    }
    build(parts, {});
  }

  std::string arch() const override { return "toy"; }
  std::string describe() const override { return "toy"; }
  nlohmann::json config_json() const override { return {}; }
  BatchShape batch_shape(int, int) const override { return {}; }
  LossSum forward(const Batch&, float) override { return {}; }
  void backward() override {}
  void set_activation_checkpointing(nn::ActivationCheckpointing) override {}
  void set_dropout(bool, uint64_t, uint64_t) override {}
  double flops_per_token(int) const override { return 0.0; }
  int64_t num_parameters() const override { return trainable_elements(); }

 private:
  // A parameter of part `part`; `expert`: cut over ep on dim 0; `tp_dim` >= 0: cut over
  // tp there (ep_parts / parts 0 until the constructor sets them).
  void add(int part, const std::string& name, Shape shape, bool expert, int tp_dim) {
    auto p = std::make_unique<nn::Param>(name, shape, nn::Init::normal(1.f), false);
    p->slice.ep_parts = expert ? 0 : 1;
    p->slice.parts = tp_dim >= 0 ? 0 : 1;
    p->slice.dim = std::max(tp_dim, 0);
    params_.push_back(std::move(p));
    part_of_.push_back(part);
  }

  std::vector<std::unique_ptr<nn::Param>> params_;
  std::vector<int> part_of_;
};

struct Mesh {
  std::string name;
  MeshSizes sizes;
};

// Rank q (of the dp x cp group)'s gradient of element g of parameter i.
float grad_value(size_t i, int64_t g, int q) {
  return static_cast<float>((static_cast<int64_t>(i) * 7 + g * 3 + q * 5) % 11 - 5);
}

// The global gradient of element g of parameter p (number i): the sum over the dp x cp
// ranks, or for an expert tensor over the edp group holding g's expert.
double reduced(const ParamSpec& p, size_t i, int64_t g, int W, int ep) {
  const int owner = static_cast<int>(g / (p.shape.numel() / kExperts) / (kExperts / ep));
  double sum = 0;
  for (int q = 0; q < W; ++q)
    if (!p.slice.ep_sharded() || q % ep == owner) sum += grad_value(i, g, q);
  return sum;
}

size_t index_of(const Model& m, const std::string& name) {
  for (size_t i = 0; i < m.params().size(); ++i)
    if (m.params()[i].name == name) return i;
  ADD_FAILURE() << "no parameter " << name;
  return 0;
}

// The model's global elements, counted once each by the rule of the checkpoint writers.
void add_counts(const std::vector<AdamWSegment>& segs, const Model& m, bool whole_on_rank0,
                int dp_rank, int edp_rank, int tp_rank, std::vector<std::vector<float>>& counts) {
  for (const AdamWSegment& seg : segs) {
    const bool replica_writer = seg.spec.slice.ep_sharded() ? edp_rank == 0 : dp_rank == 0;
    if ((whole_on_rank0 && !replica_writer) || !(seg.spec.slice.tp_sharded() || tp_rank == 0))
      continue;
    auto& c = counts[index_of(m, seg.spec.name)];
    for (const auto& run : seg.spec.slice.global_runs(seg.spec.shape, seg.begin, seg.end))
      for (int64_t g = run.global_begin; g < run.global_end; ++g) c[static_cast<size_t>(g)] += 1;
  }
}

void run(const Mesh& mesh_row, int stage, bool freeze_experts) {
  Communicator& world = testing::world();
  const MeshSizes& z = mesh_row.sizes;
  if (world.size() != z.dp * z.cp * z.tp) return;  // a mesh of another world size
  SCOPED_TRACE(fmt::format("{} zero {}{}", mesh_row.name, stage,
                           freeze_experts ? " frozen experts" : ""));
  DeviceMesh mesh(world, z);
  Communicator& comm = mesh.dp_cp_comm();
  Communicator* expert = z.ep > 1 ? &mesh.edp_comm() : nullptr;
  Communicator* tp = z.tp > 1 ? &mesh.comm(Axis::TP) : nullptr;
  const int W = comm.size(), q = comm.rank(), tp_rank = tp ? tp->rank() : 0;
  const int edp_rank = mesh.edp_comm().rank();
  ASSERT_EQ(edp_rank, q / z.ep);
  const Cut cut{z.ep, q % z.ep, z.tp, tp_rank};
  ToyModel model(zero_model_storage(stage, W), cut, freeze_experts);
  for (const ModelPart& part : model.parts()) {
    // The expert region after the dense one; frozen experts close the frozen region.
    const bool frozen = freeze_experts && part.name == "frozen";
    EXPECT_EQ(part.expert_size > 0, part.name != "dense" && z.ep > 1 && !frozen) << part.name;
    EXPECT_EQ(part.frozen_expert_size > 0, frozen && z.ep > 1) << part.name;
    if (stage > 0) EXPECT_EQ(part.dense_size() % W, 0) << part.name;
  }
  DataParallel dp(model, comm, stage, /*bucket_mb=*/1e-5, tp, expert);
  dp.init_weights(kSeed);
  // One step: forward and backward hooks, each part's gradient written in its backward.
  const int P = static_cast<int>(model.parts().size());
  dp.begin_step(1);
  dp.begin_micro_step(0);
  for (int k = 0; k < P; ++k) dp.before_forward(k), dp.after_forward(k);
  for (int k = P - 1; k >= 0; --k) {
    dp.before_backward(k);
    for (size_t i = 0; i < model.params().size(); ++i) {
      const ParamSpec& p = model.params()[i];
      if (p.part != k || !p.trainable) continue;
      std::vector<float> g;
      for (int64_t x : p.slice.global_indices(p.shape)) g.push_back(grad_value(i, x, q));
      upload_f32(be(), model.grad(p), g.data());
    }
    dp.after_backward(k);
  }
  dp.finish_gradients();

  // The reduced gradients this rank updates, by global element.
  const auto segs = dp.optimizer_segments();
  ASSERT_FALSE(segs.empty());
  for (const AdamWSegment& seg : segs) {
    const size_t i = index_of(model, seg.spec.name);
    const auto mine = download_f32(be(), seg.grad);
    for (const auto& run : seg.spec.slice.global_runs(seg.spec.shape, seg.begin, seg.end))
      for (int64_t g = run.global_begin; g < run.global_end; ++g)
        ASSERT_EQ(mine[static_cast<size_t>(run.local_begin - seg.begin + g - run.global_begin)],
                  reduced(seg.spec, i, g, W, z.ep))
            << seg.spec.name << " element " << g;
  }

  // The norm's square: the whole model's global gradient once.
  double want = 0;
  for (size_t i = 0; i < model.params().size(); ++i) {
    const ParamSpec& p = model.params()[i];
    if (!p.trainable) continue;
    for (int64_t g = 0; g < p.shape.numel(); ++g) want += std::pow(reduced(p, i, g, W, z.ep), 2);
  }
  Tensor acc = be().empty(Shape{1}, DType::F64, MemCategory::Temporaries);
  dp.grad_sum_squares(acc);
  double got = 0;
  be().copy_to_host(be().default_stream(), &got, acc);
  EXPECT_EQ(got, want);

  // Every global element once over the world (trainable and frozen).
  std::vector<std::vector<float>> counts;
  for (const ParamSpec& p : model.params()) counts.emplace_back(p.shape.numel(), 0.f);
  add_counts(segs, model, stage == 0, q, edp_rank, tp_rank, counts);
  add_counts(dp.frozen_segments(), model, stage < 3, q, edp_rank, tp_rank, counts);
  for (size_t i = 0; i < counts.size(); ++i) {
    auto& c = counts[i];
    world.all_reduce(Tensor::view(c.data(), Shape{static_cast<int64_t>(c.size())}, DType::F32),
                     ReduceOp::Sum);
    for (size_t g = 0; g < c.size(); ++g)
      ASSERT_EQ(c[g], 1.f) << model.params()[i].name << " element " << g << " counted "
                           << c[g] << " times";
  }

  // An update (+1 to every element this rank owns) reaches every rank's parameters.
  for (const AdamWSegment& seg : segs) {
    auto v = download_f32(be(), seg.param);
    for (float& x : v) x += 1.f;
    upload_f32(be(), seg.param, v.data());
  }
  dp.after_optimizer_step();
  dp.gather_full_params();
  for (size_t i = 0; i < model.params().size(); ++i) {
    const ParamSpec& p = model.params()[i];
    const auto have = download_f32(be(), model.param(p));
    const auto idx = p.slice.global_indices(p.shape);
    for (size_t e = 0; e < idx.size(); ++e) {
      const float init = model.init_values(i, kSeed, idx[e], idx[e] + 1)[0];
      ASSERT_EQ(have[e], init + (p.trainable ? 1.f : 0.f)) << p.name << " element " << idx[e];
    }
  }
  dp.release_full_params();
  if (stage < 3) {
    check_same_on_all_ranks(comm, "dense replicas", dp.replica_hash());
    check_same_on_all_ranks(mesh.edp_comm(), "expert replicas", dp.expert_replica_hash());
    EXPECT_EQ(dp.expert_replica_hash().empty(), z.ep == 1);
  }
}

const Mesh kMeshes[] = {
    {"dp1", {.dp = 1}},
    {"dp2 ep2", {.dp = 2, .ep = 2}},
    {"dp4 ep2", {.dp = 4, .ep = 2}},
    {"dp4 ep4", {.dp = 4, .ep = 4}},
    {"dp2 cp2 ep2", {.dp = 2, .cp = 2, .ep = 2}},
    {"dp2 tp2 ep2", {.dp = 2, .tp = 2, .ep = 2}},
};

class EpDp : public ::testing::TestWithParam<int> {};

TEST_P(EpDp, ReducesShardsAndGathersByRegion) {
  for (const Mesh& m : kMeshes) {
    run(m, GetParam(), /*freeze_experts=*/false);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// Frozen expert-parallel parameters (LoRA's frozen experts, train.freeze): sharded and
// gathered over the edp group at stage 3, written once by their edp replicas' first.
TEST_P(EpDp, FrozenExpertsKeepARegionOverTheirGroup) {
  for (const Mesh& m : kMeshes) {
    run(m, GetParam(), /*freeze_experts=*/true);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(Zero, EpDp, ::testing::Values(0, 1, 2, 3));

}  // namespace
}  // namespace kiln
