#include "models/moe_balance.h"

#include "core/error.h"

#include <algorithm>

namespace kiln {

MoeBalance::MoeBalance(Backend& be, const MoeBalanceSpec& spec,
                       std::vector<nn::MoeMlp*> layers)
    : be_(be), spec_(spec), L_(static_cast<int>(layers.size())) {
  KILN_CHECK(L_ > 0, "MoE balancing: no MoE layers");
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
  load_ = f32({L_ + 1, E_});
  prob_ = f32({L_, E_});
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

void MoeBalance::begin_forward(int64_t N) {
  N_ = N;
  const Stream s = be_.default_stream();
  be_.fill(s, load_, 0.f);
  be_.fill(s, prob_, 0.f);
}

nn::MoeBalancePass MoeBalance::pass(int m) const {
  KILN_CHECK(m >= 0 && m < L_ && N_ > 0, "MoE balancing: no layer {} or no forward begun", m);
  // The "global" scope's group size G: the aux's N is G N and a rank's term counts G times.
  const double G = spec_.global && group_ ? static_cast<double>(group_->size()) : 1.0;
  const double E = static_cast<double>(E_), N = G * static_cast<double>(N_);
  const double k = static_cast<double>(k_), L = static_cast<double>(L_);
  const bool hf = spec_.aux_type == MoeBalanceSpec::AuxType::Hf;
  nn::MoeBalancePass p;
  p.load = load_.view_at(int64_t{m} * E_, Shape{E_});
  if (spec_.aux_coef != 0.f) {
    // dL/dp[n,e] = coef * per_count * c_e: the prob sums are scaled by it, so that the
    // micro-batch's aux is the dot product of the counts and the scaled sums.
    const double per_count = G * spec_.aux_coef * E / (hf ? L * N * L * N : N * N * k);
    p.prob = prob_.view_at(hf ? 0 : int64_t{m} * E_, Shape{E_});
    p.prob_scale = static_cast<float>(per_count);
    p.grad_load = hf ? load_.view_at(int64_t{L_} * E_, Shape{E_}) : p.load;
    p.aux_grad_scale = static_cast<float>(grad_scale_ * per_count);
  }
  if (spec_.z_coef != 0.f) {
    p.z = sums_.view_at(1, Shape{1});
    const double n = static_cast<double>(N_);
    p.z_scale = static_cast<float>(spec_.z_coef / n);
    p.z_grad_scale = static_cast<float>(grad_scale_ * spec_.z_coef / n);
  }
  return p;
}

void MoeBalance::end_forward() {
  const Stream s = be_.default_stream();
  const Tensor total = load_.view_at(int64_t{L_} * E_, Shape{E_});
  for (int m = 0; m < L_; ++m) be_.add(s, total, total, load_.view_at(int64_t{m} * E_, Shape{E_}));
  const Tensor layers = load_.view_at(0, Shape{L_, E_});
  be_.add(s, load_sum_, load_sum_, layers);
  ++micro_batches_;
  if (capacity_factor_ > 0.0) dropped_ += dropped_slots();  // the rank's own counts
  if (spec_.aux_coef == 0.f) return;
  // Global scope: the counts and totals of every rank's micro-batch, for the value below
  // and for backward (after the step's own counts went to load_sum_).
  if (spec_.global && group_ && group_->size() > 1) group_->all_reduce_sum(s, load_);
  // aux = sum over the layers' (counts . scaled sums), or the totals' for hf: one dot
  // product as a [1, K] x [1, K]^T linear.
  if (spec_.aux_type == MoeBalanceSpec::AuxType::Hf)
    be_.linear_forward(s, dot_, total.reshape(Shape{1, E_}), prob_.view_at(0, Shape{1, E_}),
                       Tensor());
  else
    be_.linear_forward(s, dot_, layers.reshape(Shape{1, L_ * E_}), prob_.reshape(Shape{1, L_ * E_}),
                       Tensor());
  const Tensor aux = sums_.view_at(0, Shape{1});
  be_.add(s, aux, aux, dot_.reshape(Shape{1}));
}

double MoeBalance::dropped_slots() const {
  std::vector<float> load(static_cast<size_t>(L_ * E_));
  be_.copy_to_host(be_.default_stream(), load.data(), load_.view_at(0, Shape{L_, E_}));
  const double capacity = static_cast<double>(nn::moe_capacity(capacity_factor_, N_, k_, E_));
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
    const std::vector<double>& c = step.tokens_per_expert[static_cast<size_t>(m)];
    double mean = 0.0;
    for (double x : c) mean += x;
    mean /= static_cast<double>(E_);
    float* b = bias.data() + int64_t{m} * E_;
    for (int64_t e = 0; e < E_; ++e) {
      const double load = c[static_cast<size_t>(e)];
      b[e] += load < mean ? u : load > mean ? -u : 0.f;
    }
    step.expert_bias.emplace_back(b, b + E_);
  }
  be_.copy_from_host(s, bias_, bias.data());
}

std::vector<ModelBuffer> MoeBalance::buffers() const {
  std::vector<ModelBuffer> out;
  for (int m = 0; m < static_cast<int>(bias_names_.size()); ++m)
    out.push_back({bias_names_[static_cast<size_t>(m)], bias_.view_at(int64_t{m} * E_, Shape{E_})});
  return out;
}

}  // namespace kiln
