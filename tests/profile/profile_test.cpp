// The profiler: a tiny GPT-2 forward/backward/AdamW step through ProfilingBackend with
// tracing on; the trace written, parsed back and validated as Chrome trace-event JSON
// (fields, phases, durations, B/E nesting, named tracks per rank and thread, one event
// per Backend call); nothing recorded while disabled; the cost formulas; the summary
// table and the profiled window.
#include "backend/registry.h"
#include "models/gpt2/gpt2.h"
#include "optim/adamw.h"
#include "profile/profiling_backend.h"
#include "profile/summary.h"
#include "profile/tracer.h"
#include "support/forwarding_backend.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>
#include <unistd.h>

namespace kiln {
namespace {

namespace fs = std::filesystem;
using profile::ProfilingBackend;
using profile::Tracer;
using testing::CountingBackend;

GPT2Config tiny() {
  GPT2Config c;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 32;
  c.vocab_size = 61;
  c.padded_vocab_size = GPT2Config::pad_vocab(61, 16);
  c.block_size = 16;
  c.dropout = 0.1f;  // exercises dropout_forward/backward too
  return c;
}

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / fmt::format("kiln_profile_{}_{}", name, ::getpid());
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// One training step (tokens -> loss -> grads -> AdamW) of the tiny model on `be`;
// returns the loss.
double train_step(Backend& be, bool with_decode = false) {
  const GPT2Config c = tiny();
  GPT2 m(c, be);
  m.init_weights(7);
  AdamW opt(be, m.params(), m.param_buffer(), m.grad_buffer(), AdamWConfig{});
  const int B = 2, T = 8;
  std::vector<int32_t> tok(B * T), tgt(B * T);
  for (int i = 0; i < B * T; ++i) tok[i] = (i * 7 + 3) % c.vocab_size, tgt[i] = (i * 5 + 1) % c.vocab_size;
  Tensor x = be.empty(Shape{B, T}, DType::I32, MemCategory::Activations);
  Tensor y = be.empty(Shape{B, T}, DType::I32, MemCategory::Activations);
  be.copy_from_host(be.default_stream(), x, tok.data());
  be.copy_from_host(be.default_stream(), y, tgt.data());
  m.zero_grad();
  m.set_dropout(true, 11, 0);
  const LossSum ls = m.forward(Batch::of_tokens(x, y), 1.f / (B * T));
  const double loss = ls.sum / static_cast<double>(ls.targets);
  m.backward();
  const double norm = std::sqrt(read_sum_squares(be, m.grad_buffer()));
  opt.step(1e-3f, clip_scale(norm, 1.0));
  if (with_decode) {
    m.set_dropout(false, 0, 0);
    m.begin_decode(1, 4);
    Tensor t1 = be.empty(Shape{1, 2}, DType::I32, MemCategory::Activations);
    Tensor logits = be.empty(Shape{1, c.padded_vocab_size}, DType::F32, MemCategory::Activations);
    be.copy_from_host(be.default_stream(), t1, tok.data());
    m.decode(t1, logits);
    m.end_decode();
  }
  return loss;
}

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  EXPECT_TRUE(in.good()) << p;
  return nlohmann::json::parse(in);
}

struct TraceCheck {
  std::map<std::string, int> x_counts;  // complete events by name
  std::set<std::pair<int, int>> tracks;  // (pid, tid) of non-metadata events
  std::map<std::pair<int, int>, std::string> thread_names;
  std::map<int, std::string> process_names;
};

// Validates a Chrome trace document (the rules of the Trace Event Format that Perfetto
// and chrome://tracing rely on) and collects what the tests compare.
void validate_into(const nlohmann::json& doc, TraceCheck& r) {
  EXPECT_TRUE(doc.is_object());
  EXPECT_TRUE(doc.contains("traceEvents"));
  EXPECT_TRUE(doc["traceEvents"].is_array());
  if (doc.contains("displayTimeUnit")) {
    EXPECT_TRUE(doc["displayTimeUnit"] == "ms" || doc["displayTimeUnit"] == "ns");
  }
  const std::set<std::string> phases = {"X", "B", "E", "M", "C", "i", "I"};
  std::map<std::pair<int, int>, std::vector<std::string>> open;  // B/E stacks per track
  for (const auto& e : doc["traceEvents"]) {
    SCOPED_TRACE(e.dump());
    ASSERT_TRUE(e.is_object());
    ASSERT_TRUE(e.contains("ph") && e["ph"].is_string());
    const std::string ph = e["ph"];
    EXPECT_TRUE(phases.count(ph)) << ph;
    ASSERT_TRUE(e.contains("name") && e["name"].is_string());
    ASSERT_TRUE(e.contains("pid") && e["pid"].is_number_integer());
    ASSERT_TRUE(e.contains("tid") && e["tid"].is_number_integer());
    const std::string name = e["name"];
    const std::pair<int, int> track{e["pid"].get<int>(), e["tid"].get<int>()};
    if (e.contains("args")) {
      EXPECT_TRUE(e["args"].is_object());
    }
    if (ph == "M") {
      ASSERT_TRUE(e.contains("args"));
      if (name == "process_name") {
        r.process_names[track.first] = e["args"]["name"].get<std::string>();
      } else if (name == "thread_name") {
        r.thread_names[track] = e["args"]["name"].get<std::string>();
      } else {
        EXPECT_TRUE(name == "process_sort_index" || name == "thread_sort_index") << name;
      }
      continue;
    }
    r.tracks.insert(track);
    ASSERT_TRUE(e.contains("ts") && e["ts"].is_number());
    EXPECT_GE(e["ts"].get<double>(), 0.0);
    EXPECT_TRUE(e.contains("cat") && e["cat"].is_string());
    if (ph == "X") {
      ASSERT_TRUE(e.contains("dur") && e["dur"].is_number());
      EXPECT_GE(e["dur"].get<double>(), 0.0);
      ++r.x_counts[name];
      if (e.contains("args")) {
        for (const char* k : {"flops", "bytes"})
          if (e["args"].contains(k)) {
            EXPECT_TRUE(e["args"][k].is_number());
            EXPECT_GE(e["args"][k].get<double>(), 0.0);
          }
      }
    } else if (ph == "C") {
      ASSERT_TRUE(e.contains("args"));
      for (const auto& [k, v] : e["args"].items()) EXPECT_TRUE(v.is_number()) << k;
    } else if (ph == "B") {
      open[track].push_back(name);
    } else if (ph == "E") {
      ASSERT_FALSE(open[track].empty()) << "E without B on track";
      open[track].pop_back();
    }
  }
  for (const auto& [track, stack] : open) EXPECT_TRUE(stack.empty()) << "unmatched B";
  // One named process per pid; every track that holds events is named.
  for (const auto& track : r.tracks) {
    EXPECT_TRUE(r.process_names.count(track.first)) << "pid " << track.first;
    EXPECT_TRUE(r.thread_names.count(track)) << "pid " << track.first << " tid " << track.second;
  }
}

TraceCheck validate_trace(const nlohmann::json& doc) {
  TraceCheck r;
  validate_into(doc, r);
  return r;
}

TEST(Tracer, DisabledRecordsNothing) {
  auto cpu = make_backend("cpu");
  Tracer tracer;
  ASSERT_FALSE(tracer.enabled());
  ProfilingBackend be(*cpu, tracer);
  train_step(be, /*with_decode=*/true);
  {
    profile::TraceScope scope(tracer, "optimizer");
    EXPECT_FALSE(scope.active());
  }
  tracer.record_counter("memory", {{"x", 1.0}});
  tracer.record_complete("x", "y", profile::Clock::now(), profile::Clock::now());
  EXPECT_EQ(tracer.size(), 0u);
  // The global helpers too.
  ASSERT_FALSE(Tracer::global().enabled());
  const size_t before = Tracer::global().size();
  {
    auto s = profile::trace_scope("data");
    EXPECT_FALSE(s.active());
  }
  profile::trace_collective("all_reduce", 1024, profile::Clock::now(), profile::Clock::now());
  profile::trace_counter("memory", {{"x", 1.0}});
  EXPECT_EQ(Tracer::global().size(), before);
  // An empty trace is still a valid document.
  const auto doc = nlohmann::json::parse(tracer.to_json());
  const TraceCheck r = validate_trace(doc);
  EXPECT_TRUE(r.x_counts.empty());
}

TEST(Tracer, ProfilingBackendLeavesResultsUnchanged) {
  auto cpu = make_backend("cpu");
  const double plain = train_step(*cpu);
  Tracer tracer;
  tracer.enable();
  ProfilingBackend be(*cpu, tracer);
  EXPECT_EQ(train_step(be), plain);
  EXPECT_EQ(be.name(), cpu->name());
  EXPECT_GT(tracer.size(), 0u);
}

TEST(Tracer, TinyGPT2TraceIsValidChromeJson) {
  auto cpu = make_backend("cpu");
  CountingBackend counting(*cpu);
  Tracer tracer;
  tracer.set_rank(3);
  tracer.set_thread_name("main");
  tracer.enable();
  ProfilingBackend be(counting, tracer);
  {
    profile::TraceScope step(tracer, "step 0", "step");
    profile::TraceScope fwd(tracer, "train_step");
    train_step(be, /*with_decode=*/true);
  }
  // Another thread with its own (named) track, a virtual track and a counter.
  std::thread worker([&] {
    tracer.set_thread_name("data");
    profile::TraceScope s(tracer, "data");
  });
  worker.join();
  const auto t0 = profile::Clock::now();
  tracer.record_complete("all_reduce", "comm", t0, t0 + std::chrono::microseconds(50), 0.0,
                         4096.0, {}, tracer.track_id("comm"));
  tracer.record_counter("memory_bytes", {{"parameters", 1e6}, {"activations", 2e6}});
  tracer.disable();

  const fs::path dir = temp_dir("trace");
  const fs::path path = dir / "trace_rank3.json";
  tracer.write_trace(path);
  ASSERT_TRUE(fs::exists(path));
  for (const auto& f : fs::directory_iterator(dir))  // no temporary left behind
    EXPECT_EQ(f.path().filename(), "trace_rank3.json");

  const auto doc = read_json(path);
  const TraceCheck r = validate_trace(doc);
  ASSERT_FALSE(HasFailure());

  // One event per Backend call, named after the method (and, inside an OpRegion, the
  // region: "linear_forward [classifier]").
  ASSERT_FALSE(counting.counts.empty());
  std::map<std::string, int64_t> by_method;
  for (const auto& [name, n] : r.x_counts) by_method[name.substr(0, name.find(" ["))] += n;
  EXPECT_GT(r.x_counts.count("linear_forward [classifier]"), 0u);
  for (const auto& [name, n] : counting.counts) {
    if (name == "synchronize") continue;  // a wait, not an op: not traced
    auto it = by_method.find(name);
    ASSERT_NE(it, by_method.end()) << "no event for op " << name;
    EXPECT_EQ(it->second, n) << name;
  }
  for (const char* op :
       {"embedding_forward", "embedding_backward", "layernorm_forward", "layernorm_backward",
        "linear_forward", "linear_backward", "attention_forward", "attention_backward",
        "attention_decode", "gelu_forward", "gelu_backward", "add", "dropout_forward",
        "dropout_backward", "softmax_cross_entropy [classifier]", "adamw_multi_step", "sum_squares",
        "copy_from_host", "fill"}) {
    EXPECT_GT(r.x_counts.count(op), 0u) << op;
  }
  // Tracks: one process "rank 3"; main, data and the comm virtual track are named.
  EXPECT_EQ(r.process_names.size(), 1u);
  EXPECT_EQ(r.process_names.at(3), "rank 3");
  std::set<std::string> names;
  for (const auto& [track, n] : r.thread_names) {
    EXPECT_EQ(track.first, 3);
    names.insert(n);
  }
  EXPECT_TRUE(names.count("main"));
  EXPECT_TRUE(names.count("data"));
  EXPECT_TRUE(names.count("comm"));
  EXPECT_GE(r.tracks.size(), 3u);

  // Op events carry FLOPs and bytes; linear backward does twice the forward's matmuls.
  double fwd = 0, bwd = 0;
  int with_cost = 0;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] != "X" || e["cat"] == "phase" || e["cat"] == "step") continue;
    if (e["cat"] == "comm") {
      EXPECT_EQ(e["args"]["bytes"], 4096.0);
      continue;
    }
    ASSERT_TRUE(e.contains("args")) << e.dump();
    EXPECT_TRUE(e["args"].contains("bytes")) << e.dump();
    EXPECT_TRUE(e["args"].contains("shape")) << e.dump();
    ++with_cost;
    // The training step's rows: N = B*T = 16 (the decode's calls have other N).
    const bool train_rows = e["args"]["shape"].get<std::string>().rfind("N=16 ", 0) == 0;
    if (e["name"] == "linear_forward" && train_rows) fwd += e["args"]["flops"].get<double>();
    if (e["name"] == "linear_backward" && train_rows) bwd += e["args"]["flops"].get<double>();
  }
  EXPECT_GT(with_cost, 20);
  EXPECT_GT(fwd, 0.0);
  EXPECT_NEAR(bwd / fwd, 2.0, 0.05);
  fs::remove_all(dir);
}

TEST(Tracer, ThreadSafeRecording) {
  Tracer tracer;
  tracer.enable();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      tracer.set_thread_name(fmt::format("worker {}", t));
      for (int i = 0; i < 500; ++i) profile::TraceScope s(tracer, "work", "test");
    });
  for (auto& th : threads) th.join();
  const auto events = tracer.events();
  EXPECT_EQ(events.size(), 2000u);
  std::set<uint32_t> tids;
  for (const auto& e : events) tids.insert(e.tid);
  EXPECT_EQ(tids.size(), 4u);
  const TraceCheck r = validate_trace(nlohmann::json::parse(tracer.to_json()));
  EXPECT_EQ(r.x_counts.at("work"), 2000);
  EXPECT_EQ(r.thread_names.size(), 4u);
}

TEST(Tracer, GlobalCollectiveHelper) {
  Tracer& g = Tracer::global();
  g.clear();
  g.enable();
  const auto t0 = profile::Clock::now();
  profile::trace_collective("reduce_scatter", 1 << 20, t0, t0 + std::chrono::milliseconds(2));
  profile::trace_collective("all_gather", 1 << 20, t0 + std::chrono::milliseconds(2),
                            t0 + std::chrono::milliseconds(3), "comm dp");
  {
    auto s = profile::trace_scope("optimizer");
    EXPECT_TRUE(s.active());
  }
  profile::trace_collective_done("broadcast", 64, 0.001);
  g.disable();
  const auto ev = g.events();
  ASSERT_EQ(ev.size(), 4u);
  EXPECT_EQ(ev[3].name, "broadcast");
  EXPECT_NEAR(ev[3].dur_ns, 1e6, 1e3);
  EXPECT_EQ(ev[3].tid, ev[0].tid);  // the default "comm" track
  EXPECT_EQ(ev[0].category, "comm");
  EXPECT_EQ(ev[0].bytes, double(1 << 20));
  EXPECT_NEAR(ev[0].dur_ns, 2e6, 1.0);
  EXPECT_NE(ev[0].tid, ev[1].tid);  // separate virtual tracks
  EXPECT_EQ(ev[2].name, "optimizer");
  EXPECT_EQ(ev[2].category, "phase");
  g.clear();
}

TEST(Tracer, MergeTraceFiles) {
  const fs::path dir = temp_dir("merge");
  for (int rank = 0; rank < 2; ++rank) {
    Tracer t;
    t.set_rank(rank);
    t.enable();
    { profile::TraceScope s(t, "forward"); }
    t.write_trace(dir / fmt::format("trace_rank{}.json", rank));
  }
  profile::merge_trace_files({dir / "trace_rank0.json", dir / "trace_rank1.json"},
                             dir / "trace.json");
  const TraceCheck r = validate_trace(read_json(dir / "trace.json"));
  EXPECT_EQ(r.process_names.size(), 2u);
  EXPECT_EQ(r.process_names.at(1), "rank 1");
  EXPECT_EQ(r.x_counts.at("forward"), 2);
  fs::remove_all(dir);
}

TEST(OpCost, Formulas) {
  auto be = make_backend("cpu");
  auto T = [&](Shape s, DType dt = DType::F32) { return be->empty(s, dt, MemCategory::Temporaries); };
  // linear: N = 4*8 rows, IC 16, OC 32.
  const Tensor inp = T({4, 8, 16}), w = T({32, 16}), b = T({32});
  auto lf = profile::cost::linear_forward(T({4, 8, 32}), inp, w, b);
  EXPECT_DOUBLE_EQ(lf.flops, 2.0 * 32 * 16 * 32 + 32 * 32);
  EXPECT_DOUBLE_EQ(lf.bytes, (32.0 * 16 + 32 * 16 + 32 * 32 + 32) * 4);
  EXPECT_EQ(lf.shape, "N=32 IC=16 OC=32");
  auto lb = profile::cost::linear_backward(inp, w, b, T({4, 8, 32}), inp, w);
  EXPECT_DOUBLE_EQ(lb.flops, 4.0 * 32 * 16 * 32 + 32 * 32);
  auto lb_nodinp = profile::cost::linear_backward(Tensor(), w, Tensor(), T({4, 8, 32}), inp, w);
  EXPECT_DOUBLE_EQ(lb_nodinp.flops, 2.0 * 32 * 16 * 32);
  // attention: B 2, T 8, C 16 (qkv 48), 4 heads: 2 * B * C * T * (T + 1).
  const Tensor qkv = T({2, 8, 48}), o = T({2, 8, 16}), l = T({2, 4, 8});
  const AttentionShape mha = AttentionShape::mha(4, 16);
  auto af = [&](const AttentionShape& a) {
    return profile::cost::attention_forward(o, l, qkv, a, DropoutSpec{});
  };
  EXPECT_DOUBLE_EQ(af(mha).flops, 2.0 * 2 * 16 * 8 * 9);
  EXPECT_DOUBLE_EQ(profile::cost::attention_backward(qkv, o, qkv, o, l, mha, DropoutSpec{}).flops,
                   5.0 * 2 * 16 * 8 * 9);
  // Bidirectional: every (query, key) pair, T*T per head.
  EXPECT_DOUBLE_EQ(af(AttentionShape::mha(4, 16, false)).flops, 2.0 * 2 * 2 * 16 * 8 * 8);
  // Brute force over causal pairs: 2 matmuls x 2 FLOPs x HD per (query, key) pair per head.
  double pairs = 0;
  for (int q = 0; q < 8; ++q) pairs += q + 1;
  EXPECT_DOUBLE_EQ(af(mha).flops, 2 * 2 * 4 * pairs * 2 * 4);
  // decode: 2 new tokens after 3 cached: pairs 4 + 5.
  const Tensor q2 = T({1, 2, 48});
  EXPECT_DOUBLE_EQ(profile::cost::attention_decode(o, o, o, q2, 3, mha).flops, 4.0 * 16 * 9);
  // adamw: 14 FLOPs and 7 fp32 words per element.
  const Tensor p = T({10});
  EXPECT_DOUBLE_EQ(profile::cost::adamw_step(p, p, p, p, Tensor(), AdamWParams{}).flops, 140.0);
  EXPECT_DOUBLE_EQ(profile::cost::adamw_step(p, p, p, p, Tensor(), AdamWParams{}).bytes, 7.0 * 4 * 10);
  EXPECT_DOUBLE_EQ(profile::cost::copy(100).bytes, 200.0);
  // cross-entropy over V = 50 of Vp = 64 columns with the gradient.
  const Tensor logits = T({6, 64});
  EXPECT_DOUBLE_EQ(
      profile::cost::softmax_cross_entropy(T({6}), logits, logits, T({6}), 50, -1, 1.f).flops,
      5.0 * 6 * 50);
}

TEST(Summary, TableAndShares) {
  std::vector<profile::TraceEvent> ev;
  auto X = [&](std::string name, std::string cat, int64_t ts, int64_t dur, double flops,
               double bytes) {
    profile::TraceEvent e;
    e.name = std::move(name);
    e.category = std::move(cat);
    e.ts_ns = ts;
    e.dur_ns = dur;
    e.flops = flops;
    e.bytes = bytes;
    ev.push_back(e);
  };
  X("step 0", "step", 0, 10'000'000, 0, 0);                       // 10 ms step
  X("forward", "phase", 0, 4'000'000, 0, 0);
  X("linear_forward", "forward", 0, 2'000'000, 2e8, 1e6);         // 100 GFLOP/s
  X("linear_forward", "forward", 2'000'000, 2'000'000, 2e8, 1e6);
  X("add", "forward", 4'000'000, 1'000'000, 1e6, 1.2e7);          // 12 GB/s
  const auto s = profile::summarize(ev);
  EXPECT_EQ(s.steps, 1);
  EXPECT_DOUBLE_EQ(s.step_ns, 1e7);
  ASSERT_EQ(s.ops.size(), 2u);
  EXPECT_EQ(s.ops[0].name, "linear_forward");
  EXPECT_EQ(s.ops[0].calls, 2);
  EXPECT_DOUBLE_EQ(s.ops[0].flops, 4e8);
  ASSERT_EQ(s.phases.size(), 1u);
  const std::string table = profile::format_summary(s, profile::Peaks{200e9, 24e9});
  EXPECT_NE(table.find("linear_forward"), std::string::npos) << table;
  EXPECT_NE(table.find("40.0%"), std::string::npos) << table;   // share of the step
  EXPECT_NE(table.find("100.0"), std::string::npos) << table;   // GFLOP/s
  EXPECT_NE(table.find("50.0%"), std::string::npos) << table;   // of the 200 GFLOP/s peak
  EXPECT_NE(table.find("memory"), std::string::npos) << table;  // add is bandwidth-bound
  EXPECT_NE(table.find("forward"), std::string::npos) << table;
}

TEST(ProfileWindow, RecordsOnlyTheWindow) {
  const fs::path dir = temp_dir("window");
  Tracer tracer;
  auto cpu = make_backend("cpu");
  ProfilingBackend be(*cpu, tracer);
  {
    profile::ProfileWindow w({1, 3}, dir / "trace_rank0.json", profile::Peaks{1e11, 1e10},
                             tracer, /*print=*/false);
    w.set_allocator(&be.allocator());
    for (int64_t step = 0; step < 5; ++step) {
      w.begin_step(step);
      EXPECT_EQ(tracer.enabled(), step >= 1 && step < 3) << step;
      {
        profile::TraceScope s(tracer, "forward");
        Tensor a = be.empty(Shape{64}, DType::F32, MemCategory::Activations);
        be.fill(be.default_stream(), a, 1.f);
        be.add(be.default_stream(), a, a, a);
      }
      w.end_step();
    }
    EXPECT_FALSE(tracer.enabled());
    EXPECT_NE(w.summary_text().find("add"), std::string::npos);
  }
  const TraceCheck r = validate_trace(read_json(dir / "trace_rank0.json"));
  EXPECT_EQ(r.x_counts.at("step 1"), 1);
  EXPECT_EQ(r.x_counts.at("step 2"), 1);
  EXPECT_EQ(r.x_counts.count("step 0"), 0u);
  EXPECT_EQ(r.x_counts.count("step 3"), 0u);
  EXPECT_EQ(r.x_counts.at("add"), 2);
  EXPECT_EQ(r.x_counts.at("forward"), 2);
  EXPECT_TRUE(fs::exists(dir / "trace_rank0.summary.txt"));
  fs::remove_all(dir);
}

TEST(ProfileWindow, CutShortWindowIsWrittenAtDestruction) {
  const fs::path dir = temp_dir("short");
  Tracer tracer;
  {
    profile::ProfileWindow w({0, 100}, dir / "t.json", {}, tracer, false);
    w.begin_step(0);
    { profile::TraceScope s(tracer, "data"); }
    w.end_step();
  }
  EXPECT_FALSE(tracer.enabled());
  const TraceCheck r = validate_trace(read_json(dir / "t.json"));
  EXPECT_EQ(r.x_counts.at("data"), 1);
  EXPECT_THROW(profile::ProfileWindow({3, 3}, dir / "x.json", {}, tracer, false), Error);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kiln
