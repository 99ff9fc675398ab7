// The profiler's device-event timing and its per-kind table: ProfilingBackend in
// OpTiming::DeviceEvents over a fake device whose markers are host timestamps (the CPU
// has none) records every op only at flush(), at the marker times, with the classifier's
// ops named by their OpRegion; op_kind's grouping; the summary's kind table and idle row.
#include "backend/registry.h"
#include "models/gpt2/gpt2.h"
#include "optim/adamw.h"
#include "profile/profiling_backend.h"
#include "profile/summary.h"
#include "profile/tracer.h"
#include "support/forwarding_backend.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <cmath>
#include <set>
#include <thread>

namespace kiln {
namespace {

using profile::OpTiming;
using profile::ProfilingBackend;
using profile::Tracer;

// A CPU backend with timing markers: each marker is the host time it was recorded at.
class MarkerBackend final : public testing::ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  std::vector<std::chrono::steady_clock::time_point> marks;
  int releases = 0;
  int64_t record_marker(Stream) override {
    marks.push_back(std::chrono::steady_clock::now());
    return static_cast<int64_t>(marks.size()) - 1;
  }
  double marker_elapsed_ms(int64_t from, int64_t to) override {
    EXPECT_TRUE(from >= 0 && to < static_cast<int64_t>(marks.size()));
    return std::chrono::duration<double, std::milli>(marks[to] - marks[from]).count();
  }
  void release_markers() override {
    marks.clear();
    ++releases;
  }
  // A slow op, so that one duration is known to be large.
  void gelu_forward(Stream s, const Tensor& out, const Tensor& inp) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    ForwardingBackend::gelu_forward(s, out, inp);
  }
};

// One forward/backward/AdamW step of a tiny GPT-2 on `be`.
double step(Backend& be) {
  GPT2Config c;
  c.n_layer = 1, c.n_head = 2, c.n_embd = 16, c.vocab_size = 37, c.block_size = 8;
  c.padded_vocab_size = GPT2Config::pad_vocab(37, 16);
  GPT2 m(c, be);
  m.init_weights(3);
  AdamW opt(be, m.params(), m.param_buffer(), m.grad_buffer(), AdamWConfig{});
  std::vector<int32_t> tok(16), tgt(16);
  for (int i = 0; i < 16; ++i) tok[i] = (i * 7 + 3) % 37, tgt[i] = (i * 5 + 1) % 37;
  Tensor x = be.empty(Shape{2, 8}, DType::I32, MemCategory::Activations);
  Tensor y = be.empty(Shape{2, 8}, DType::I32, MemCategory::Activations);
  be.copy_from_host(be.default_stream(), x, tok.data());
  be.copy_from_host(be.default_stream(), y, tgt.data());
  m.zero_grad();
  const LossSum ls = m.forward(Batch::of_tokens(x, y), 1.f / 16);
  m.backward();
  opt.step(1e-3f);
  return ls.sum;
}

TEST(DeviceEvents, OpsRecordedAtFlushWithMarkerTimes) {
  auto cpu = make_backend("cpu");
  const double plain = step(*cpu);
  MarkerBackend marked(*cpu);
  Tracer sync_tracer, tracer;
  sync_tracer.enable();
  {
    ProfilingBackend pb(*cpu, sync_tracer, OpTiming::Synchronize);
    step(pb);
  }
  tracer.enable();
  ProfilingBackend pb(marked, tracer, OpTiming::DeviceEvents);
  EXPECT_EQ(step(pb), plain);
  EXPECT_EQ(tracer.size(), 0u) << "ops are recorded at flush(), not when called";
  EXPECT_EQ(marked.marks.size() % 2, 0u);
  const size_t ops = marked.marks.size() / 2;
  pb.flush();
  EXPECT_EQ(marked.releases, 1);
  const auto events = tracer.events();
  ASSERT_EQ(events.size(), ops);
  EXPECT_EQ(events.size(), sync_tracer.size()) << "one event per op in either mode";
  std::set<std::string> names;
  int64_t prev = events.front().ts_ns;
  bool slow_seen = false;
  for (const auto& e : events) {
    names.insert(e.name);
    EXPECT_GE(e.dur_ns, 0) << e.name;
    EXPECT_GE(e.ts_ns, prev) << e.name << ": device start times in issue order";
    prev = e.ts_ns;
    if (e.name == "gelu_forward") slow_seen = e.dur_ns >= 2'000'000;
  }
  EXPECT_TRUE(slow_seen) << "gelu_forward's 2 ms sleep is inside its markers";
  EXPECT_TRUE(names.count("linear_forward [classifier]")) << "the classifier's GEMMs by region";
  EXPECT_TRUE(names.count("softmax_cross_entropy [classifier]"));
  EXPECT_TRUE(names.count("linear_forward")) << "the blocks' GEMMs, without a region";
  EXPECT_TRUE(names.count("adamw_multi_step"));
  pb.flush();  // nothing pending: a no-op
  EXPECT_EQ(marked.releases, 1);
}

// The trainer's [profile] timing = "events": profile::profiled wraps the backend, and
// the window flushes it at the end of each profiled step, so the ops are in the summary
// and the trace; a bad timing is a one-line error naming the key.
TEST(DeviceEvents, ProfileWindowFlushesEachStep) {
  auto cpu = make_backend("cpu");
  auto marked = std::make_unique<MarkerBackend>(*cpu);
  MarkerBackend* raw = marked.get();
  auto pb = profile::profiled(std::move(marked), "events");
  Tracer& tracer = Tracer::global();
  const auto dir = std::filesystem::temp_directory_path() / "kiln_profile_events_window";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  {
    profile::ProfileWindow w({0, 2}, dir / "trace_rank0.json", profile::Peaks{}, tracer, false);
    w.set_backend(pb.get());
    for (int64_t s = 0; s < 2; ++s) {
      w.begin_step(s);
      step(*pb);
      EXPECT_GT(raw->marks.size(), 0u);
      w.end_step();
      EXPECT_EQ(raw->marks.size(), 0u) << "flushed at the step's end";
    }
    EXPECT_NE(w.summary_text().find("linear_forward [classifier]"), std::string::npos)
        << w.summary_text();
    EXPECT_NE(w.summary_text().find("idle"), std::string::npos);
  }
  EXPECT_EQ(raw->releases, 2);
  std::filesystem::remove_all(dir);
  EXPECT_THROW(profile::profiled(make_backend("cpu"), "gpu"), Error);
}

// On a backend without markers (the CPU), DeviceEvents times on the host at once.
TEST(DeviceEvents, WithoutMarkersTimesOnTheHost) {
  auto cpu = make_backend("cpu");
  Tracer tracer;
  tracer.enable();
  ProfilingBackend pb(*cpu, tracer, OpTiming::DeviceEvents);
  step(pb);
  EXPECT_GT(tracer.size(), 0u);
  const size_t n = tracer.size();
  pb.flush();
  EXPECT_EQ(tracer.size(), n);
}

TEST(Summary, OpKinds) {
  using profile::op_kind;
  EXPECT_EQ(op_kind("linear_forward", "forward"), "gemm");
  EXPECT_EQ(op_kind("linear_backward [classifier]", "backward"), "classifier");
  EXPECT_EQ(op_kind("softmax_cross_entropy", "loss"), "classifier");
  EXPECT_EQ(op_kind("attention_backward", "backward"), "attention");
  EXPECT_EQ(op_kind("layernorm_backward", "backward"), "norms");
  EXPECT_EQ(op_kind("rmsnorm_forward", "forward"), "norms");
  EXPECT_EQ(op_kind("adamw_multi_step", "optimizer"), "optimizer");
  EXPECT_EQ(op_kind("sum_squares", "optimizer"), "optimizer");
  EXPECT_EQ(op_kind("all_reduce", "comm"), "communication");
  EXPECT_EQ(op_kind("copy_to_host", "memory"), "memory");
  EXPECT_EQ(op_kind("gelu_backward", "backward"), "elementwise");
}

TEST(Summary, KindTableAndIdle) {
  std::vector<profile::TraceEvent> ev;
  auto X = [&](const char* name, const char* cat, int64_t ts, int64_t dur, double flops) {
    profile::TraceEvent e;
    e.name = name, e.category = cat, e.ts_ns = ts, e.dur_ns = dur, e.flops = flops;
    ev.push_back(e);
  };
  X("step 0", "step", 0, 10'000'000, 0);
  X("linear_forward", "forward", 0, 3'500'000, 3.5e9);             // 1000 GFLOP/s
  X("linear_forward [classifier]", "forward", 3'500'000, 2'000'000, 0);
  X("softmax_cross_entropy [classifier]", "loss", 5'500'000, 1'000'000, 0);
  X("all_reduce", "comm", 6'500'000, 1'000'000, 0);
  const auto s = profile::summarize(ev);
  ASSERT_EQ(s.kinds.size(), 3u);
  EXPECT_EQ(s.kinds[0].name, "gemm");
  EXPECT_EQ(s.kinds[1].name, "classifier");
  EXPECT_DOUBLE_EQ(s.kinds[1].total_ns, 3e6);
  EXPECT_EQ(s.kinds[1].calls, 2);
  EXPECT_EQ(s.kinds[2].name, "communication");
  const std::string table = profile::format_summary(s, profile::Peaks{});
  EXPECT_NE(table.find("idle"), std::string::npos) << table;
  EXPECT_NE(table.find("2.50"), std::string::npos) << table;   // idle ms/step: 10 - 7.5
  EXPECT_NE(table.find("1000.0"), std::string::npos) << table;  // gemm GFLOP/s
}

// idle is the steps' time no op covers: overlapping ops (a collective on its own track
// beside a GEMM) count once, ops outside every step (an evaluation) not at all.
TEST(Summary, IdleCountsCoveredTimeOnce) {
  std::vector<profile::TraceEvent> ev;
  auto X = [&](const char* name, const char* cat, int64_t ts, int64_t dur) {
    profile::TraceEvent e;
    e.name = name, e.category = cat, e.ts_ns = ts, e.dur_ns = dur;
    ev.push_back(e);
  };
  X("step 0", "step", 0, 10'000'000);
  X("linear_forward", "forward", 1'000'000, 4'000'000);   // [1, 5) ms
  X("all_reduce", "comm", 2'000'000, 6'000'000);          // [2, 8) ms, overlapping
  X("linear_forward", "forward", 9'000'000, 3'000'000);   // [9, 12): 1 ms inside
  X("linear_forward", "forward", 20'000'000, 5'000'000);  // after the step (evaluation)
  const auto s = profile::summarize(ev);
  EXPECT_DOUBLE_EQ(s.idle_ns, 2'000'000.0);  // [0, 1) and [8, 9)
  const std::string table = profile::format_summary(s, profile::Peaks{});
  EXPECT_NE(table.find("2.00"), std::string::npos) << table;
}

}  // namespace
}  // namespace kiln
