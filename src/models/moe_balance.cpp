#include "models/moe_balance.h"

#include "core/error.h"

#include <algorithm>

namespace kiln {

MoeBalance::MoeBalance(Backend& be, const MoeBalanceSpec& spec,
                       std::vector<nn::MoeMlp*> layers, std::vector<bool> held)
    : be_(be), spec_(spec), L_(static_cast<int>(layers.size())), held_(std::move(held)) {
  KILN_CHECK(L_ > 0, "MoE balancing: no MoE layers");
  if (held_.empty()) held_.assign(static_cast<size_t>(L_), true);
  KILN_CHECK(held_.size() == layers.size(), "MoE balancing: {} held flags for {} MoE layers",
             held_.size(), L_);
  E_ = layers.front()->spec().num_experts;
  k_ = layers.front()->spec().top_k;
  capacity_factor_ = layers.front()->spec().capacity_factor;
  for (const nn::MoeMlp* m : layers)
    KILN_CHECK(m->spec().num_experts == E_ && m->spec().top_k == k_ &&
                   m->spec().capacity_factor == capacity_factor_,
               "MoE balancing: every MoE layer needs the same E, k and capacity factor ({}: E = "
               "{}, k = {}, capacity factor {})", m->router.name, m->spec().num_experts,
               m->spec().top_k, m->spec().capacity_factor);
  KILN_CHECK(spec.aux_type == MoeBalanceSpec::AuxType::PerLayer ||
                 layers.front()->spec().scoring == MoeScoring::Softmax,
             "MoE balancing: the hf auxiliary loss needs softmax scoring");
  auto f32 = [&](Shape s) { return be.empty(s, DType::F32, MemCategory::Activations); };
  sums_ = f32({2});
  load_sum_ = f32({L_, E_});
  dot_ = f32({1, 1});
  const Stream s = be.default_stream();
  be.fill(s, sums_, 0.f);
  be.fill(s, load_sum_, 0.f);
  if (!spec.expert_bias) return;
  bias_ = be.empty(Shape{L_, E_}, DType::F32, MemCategory::Parameters);
  be.fill(s, bias_, 0.f);
  for (int m = 0; m < L_; ++m) {
    layers[static_cast<size_t>(m)]->expert_bias = bias_.view_at(int64_t{m} * E_, Shape{E_});
    bias_names_.push_back(layers[static_cast<size_t>(m)]->expert_bias_name());
  }
}

MoeMicroStats MoeBalance::micro_stats() const {
  MoeMicroStats mb;
  mb.load = be_.empty(Shape{L_ + 1, E_}, DType::F32, MemCategory::Activations);
  mb.prob = be_.empty(Shape{L_, E_}, DType::F32, MemCategory::Activations);
  return mb;
}

void MoeBalance::begin_forward(MoeMicroStats& mb, int64_t N, int first, int end, bool count) {
  KILN_CHECK(0 <= first && first <= end && end <= L_, "MoE balancing: no MoE layers [{}, {})",
             first, end);
  KILN_CHECK(spec_.aux_type != MoeBalanceSpec::AuxType::Hf || spec_.aux_coef == 0.f ||
                 first == end || (first == 0 && end == L_),
             "MoE balancing: the hf auxiliary loss (moe.aux_loss_type \"hf\") couples every MoE "
             "layer and runs with the whole model as one pipeline chunk only (MoE layers [{}, "
             "{}) of {} here)", first, end, L_);
  mb.N = N;
  mb.first = first;
  mb.end = end;
  const Stream s = be_.default_stream();
  be_.fill(s, mb.load, 0.f);
  be_.fill(s, mb.prob, 0.f);
  if (count) ++micro_batches_;
}

nn::MoeBalancePass MoeBalance::pass(const MoeMicroStats& mb, int m) const {
  KILN_CHECK(m >= mb.first && m < mb.end && mb.N > 0,
             "MoE balancing: layer {} is not in the forward begun (MoE layers [{}, {}))", m,
             mb.first, mb.end);
  // The balancing group's size G: the aux's N is G N; a rank reports its term G times and
  // differentiates it G / Gc times (see the top of the header).
  const double G = group_size(), Gc = micro_group_size();
  const double E = static_cast<double>(E_), N = G * static_cast<double>(mb.N);
  const double k = static_cast<double>(k_), L = static_cast<double>(L_);
  const bool hf = spec_.aux_type == MoeBalanceSpec::AuxType::Hf;
  nn::MoeBalancePass p;
  p.load = mb.load.view_at(int64_t{m} * E_, Shape{E_});
  if (spec_.aux_coef != 0.f) {
    // dL/dp[n,e] = coef * per_count * c_e: the prob sums are scaled by it, so that the
    // micro-batch's aux is the dot product of the counts and the scaled sums.
    const double per_count = spec_.aux_coef * E / (hf ? L * N * L * N : N * N * k);
    p.prob = mb.prob.view_at(hf ? 0 : int64_t{m} * E_, Shape{E_});
    p.prob_scale = static_cast<float>(G * per_count);
    p.grad_load = hf ? mb.load.view_at(int64_t{L_} * E_, Shape{E_}) : p.load;
    p.aux_grad_scale = static_cast<float>(grad_scale_ * (G / Gc) * per_count);
  }
  if (spec_.z_coef != 0.f) {
    p.z = sums_.view_at(1, Shape{1});
    const double n = static_cast<double>(mb.N);
    p.z_scale = static_cast<float>(spec_.z_coef / n);
    p.z_grad_scale = static_cast<float>(grad_scale_ * spec_.z_coef / (Gc * n));
  }
  return p;
}

void MoeBalance::end_forward(MoeMicroStats& mb) {
  if (mb.first == mb.end) return;  // a chunk without MoE layers
  const Stream s = be_.default_stream();
  const int64_t first = int64_t{mb.first} * E_, rows = int64_t{mb.end - mb.first} * E_;
  const Tensor total = mb.load.view_at(int64_t{L_} * E_, Shape{E_});
  for (int m = mb.first; m < mb.end; ++m)
    be_.add(s, total, total, mb.load.view_at(int64_t{m} * E_, Shape{E_}));
  const Tensor load_sum = load_sum_.view_at(first, Shape{rows});
  be_.add(s, load_sum, load_sum, mb.load.view_at(first, Shape{rows}));
  if (capacity_factor_ > 0.0) dropped_ += dropped_slots(mb);  // the rank's own counts
  if (spec_.aux_coef == 0.f) return;
  // The counts and totals of the group's tokens, for the value below and for backward
  // (after the step's own counts went to load_sum_).
  if (group() && group()->size() > 1) group()->all_reduce_sum(s, mb.load);
  // aux = sum over the layers' (counts . scaled sums), or the totals' for hf: one dot
  // product as a [1, K] x [1, K]^T linear.
  if (spec_.aux_type == MoeBalanceSpec::AuxType::Hf)
    be_.linear_forward(s, dot_, total.reshape(Shape{1, E_}), mb.prob.view_at(0, Shape{1, E_}),
                       Tensor());
  else
    be_.linear_forward(s, dot_, mb.load.view_at(first, Shape{1, rows}),
                       mb.prob.view_at(first, Shape{1, rows}), Tensor());
  const Tensor aux = sums_.view_at(0, Shape{1});
  be_.add(s, aux, aux, dot_.reshape(Shape{1}));
}

double MoeBalance::dropped_slots(const MoeMicroStats& mb) const {
  const int64_t rows = int64_t{mb.end - mb.first} * E_;
  std::vector<float> load(static_cast<size_t>(rows));
  be_.copy_to_host(be_.default_stream(), load.data(),
                   mb.load.view_at(int64_t{mb.first} * E_, Shape{rows}));
  const double capacity = static_cast<double>(nn::moe_capacity(capacity_factor_, mb.N, k_, E_));
  double dropped = 0.0;
  for (float c : load) dropped += std::max(0.0, static_cast<double>(c) - capacity);
  return dropped;
}

MoeStats MoeBalance::take() {
  const Stream s = be_.default_stream();
  float sums[2];
  std::vector<float> load(static_cast<size_t>(L_ * E_));
  be_.copy_to_host(s, sums, sums_);
  be_.copy_to_host(s, load.data(), load_sum_);
  MoeStats out;
  out.micro_batches = micro_batches_;
  const double mb = micro_batches_ > 0 ? static_cast<double>(micro_batches_) : 1.0;
  out.aux_loss = sums[0] / mb;
  out.z_loss = sums[1] / mb;
  for (int m = 0; m < L_; ++m)
    out.tokens_per_expert.emplace_back(load.begin() + int64_t{m} * E_,
                                       load.begin() + int64_t{m + 1} * E_);
  if (capacity_factor_ > 0.0) out.dropped_slots = dropped_;
  dropped_ = 0.0;
  be_.fill(s, sums_, 0.f);
  be_.fill(s, load_sum_, 0.f);
  micro_batches_ = 0;
  return out;
}

void MoeBalance::update_bias(MoeStats& step) {
  if (!bias_) return;
  KILN_CHECK(step.tokens_per_expert.size() == static_cast<size_t>(L_),
             "MoE bias update: counts of {} layers for {} MoE layers",
             step.tokens_per_expert.size(), L_);
  const Stream s = be_.default_stream();
  std::vector<float> bias(static_cast<size_t>(L_ * E_));
  be_.copy_to_host(s, bias.data(), bias_);
  const float u = spec_.bias_update_rate;
  step.expert_bias.clear();
  for (int m = 0; m < L_; ++m) {
    float* b = bias.data() + int64_t{m} * E_;
    step.expert_bias.emplace_back(b, b + E_);  // another stage's layer: its zero row
    if (!held_[static_cast<size_t>(m)]) continue;
    const std::vector<double>& c = step.tokens_per_expert[static_cast<size_t>(m)];
    double mean = 0.0;
    for (double x : c) mean += x;
    mean /= static_cast<double>(E_);
    for (int64_t e = 0; e < E_; ++e) {
      const double load = c[static_cast<size_t>(e)];
      b[e] += load < mean ? u : load > mean ? -u : 0.f;
    }
    step.expert_bias.back().assign(b, b + E_);
  }
  be_.copy_from_host(s, bias_, bias.data());
}

std::vector<ModelBuffer> MoeBalance::buffers() const {
  std::vector<ModelBuffer> out;
  for (int m = 0; m < static_cast<int>(bias_names_.size()); ++m)
    if (held_[static_cast<size_t>(m)])
      out.push_back({bias_names_[static_cast<size_t>(m)], bias_.view_at(int64_t{m} * E_, Shape{E_})});
  return out;
}

}  // namespace kiln
