#include "parallel/tp_traffic.h"

#include "nn/classifier.h"

namespace kiln {

TpTraffic tp_micro_step_traffic(const TpTrafficShape& s) {
  TpTraffic t;
  if (s.tp <= 1) return t;
  const int64_t L = s.n_layer, act = s.rows * s.n_embd * s.act_bytes;
  const int64_t replay = s.full_recompute ? 2 * L : 0;  // the blocks' forward, again
  const int64_t ends = int64_t{s.has_embedding} + int64_t{s.has_head};
  auto add = [&](Collective c, int64_t calls, int64_t bytes_each) {
    t.calls_of(c) += calls;
    t.bytes_of(c) += calls * bytes_each;
  };
  if (s.sequence_parallel) {
    add(Collective::ReduceScatter, 4 * L + ends + replay, act);
    add(Collective::AllGather, 6 * L + ends + replay, act);
  } else {
    add(Collective::AllReduce, 4 * L + ends + replay, act);
  }
  if (!s.has_head) return t;
  // The loss statistics: per chunk of R rows, every rank's [R, 3] fp32.
  const int64_t R = nn::classifier_chunk_rows(s.rows, s.padded_vocab / s.tp, s.classifier_chunk_mb);
  t.calls_of(Collective::AllGather) += (s.rows + R - 1) / R;
  t.bytes_of(Collective::AllGather) += s.tp * s.rows * 3 * 4;
  return t;
}

TpTraffic tp_update_traffic(const TpTrafficShape& s, int micro_steps) {
  TpTraffic t;
  if (s.tp <= 1) return t;
  const TpTraffic one = tp_micro_step_traffic(s);
  for (size_t c = 0; c < t.calls.size(); ++c) {
    t.calls[c] = one.calls[c] * micro_steps;
    t.bytes[c] = one.bytes[c] * micro_steps;
  }
  t.calls_of(Collective::AllReduce) += s.partial_grad_params;
  t.bytes_of(Collective::AllReduce) += s.partial_grad_elems * s.grad_bytes;
  // The norm's square, an fp64 [1] on the device (DataParallel::grad_sum_squares).
  t.calls_of(Collective::AllReduce) += 1;
  t.bytes_of(Collective::AllReduce) += 8;
  return t;
}

}  // namespace kiln
