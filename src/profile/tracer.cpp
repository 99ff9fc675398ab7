#include "profile/tracer.h"

#include "core/error.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <system_error>

#include <unistd.h>

namespace kiln::profile {

namespace fs = std::filesystem;

namespace {
// Thread ids are process-wide (shared by every Tracer): 1, 2, ... in order of first use.
std::atomic<uint32_t> g_next_tid{1};
thread_local uint32_t t_tid = 0;
// Virtual tracks live far above any thread id.
constexpr uint32_t kFirstVirtualTrack = 1u << 20;

void write_file_atomically(const fs::path& path, const std::string& text) {
  const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  std::error_code ec;
  fs::create_directories(dir, ec);
  const fs::path tmp = dir / fmt::format(".{}.tmp.{}", path.filename().string(), ::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    KILN_CHECK(out.good(), "cannot write trace file {} (temporary {})", path.string(), tmp.string());
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    out.flush();
    if (!out.good()) {
      out.close();
      fs::remove(tmp, ec);
      KILN_FAIL("cannot write trace file {}: write failed (disk full?)", path.string());
    }
  }
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    KILN_FAIL("cannot write trace file {}: rename failed", path.string());
  }
}

nlohmann::json metadata_event(const char* what, int pid, uint32_t tid, const std::string& name) {
  return {{"name", what}, {"ph", "M"}, {"pid", pid}, {"tid", tid}, {"args", {{"name", name}}}};
}
}  // namespace

Tracer::Tracer() = default;

Tracer& Tracer::global() {
  static Tracer* t = new Tracer();  // never destroyed: usable from other static destructors
  return *t;
}

void Tracer::set_rank(int rank) {
  std::lock_guard<std::mutex> lk(mu_);
  rank_ = rank;
}

uint32_t Tracer::thread_id() {
  if (t_tid == 0) t_tid = g_next_tid.fetch_add(1, std::memory_order_relaxed);
  return t_tid;
}

void Tracer::set_thread_name(std::string name) {
  const uint32_t tid = thread_id();
  std::lock_guard<std::mutex> lk(mu_);
  track_names_[tid] = std::move(name);
}

uint32_t Tracer::track_id(std::string_view name) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = virtual_tracks_.find(name);
  if (it != virtual_tracks_.end()) return it->second;
  const uint32_t id = kFirstVirtualTrack + static_cast<uint32_t>(virtual_tracks_.size());
  virtual_tracks_.emplace(std::string(name), id);
  track_names_[id] = std::string(name);
  return id;
}

int64_t Tracer::to_ns(Clock::time_point t) const {
  // steady_clock is CLOCK_MONOTONIC on Linux: one clock for every process of a node, so
  // the traces of ranks on one machine line up when merged.
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

void Tracer::record(TraceEvent e) {
  if (!enabled()) return;
  if (e.tid == 0) e.tid = thread_id();
  std::lock_guard<std::mutex> lk(mu_);
  events_.push_back(std::move(e));
}

void Tracer::record_complete(std::string_view name, std::string_view category,
                             Clock::time_point start, Clock::time_point end, double flops,
                             double bytes, std::string detail, uint32_t tid) {
  if (!enabled()) return;
  TraceEvent e;
  e.name = std::string(name);
  e.category = std::string(category);
  e.phase = 'X';
  e.ts_ns = to_ns(start);
  e.dur_ns = std::max<int64_t>(0, to_ns(end) - e.ts_ns);
  e.tid = tid != 0 ? tid : thread_id();
  e.flops = flops;
  e.bytes = bytes;
  e.detail = std::move(detail);
  std::lock_guard<std::mutex> lk(mu_);
  events_.push_back(std::move(e));
}

void Tracer::record_counter(std::string_view name,
                            std::vector<std::pair<std::string, double>> values) {
  if (!enabled()) return;
  TraceEvent e;
  e.name = std::string(name);
  e.category = "counter";
  e.phase = 'C';
  e.ts_ns = now_ns();
  e.tid = thread_id();
  e.args = std::move(values);
  std::lock_guard<std::mutex> lk(mu_);
  events_.push_back(std::move(e));
}

std::vector<TraceEvent> Tracer::events() const {
  std::lock_guard<std::mutex> lk(mu_);
  return events_;
}

size_t Tracer::size() const {
  std::lock_guard<std::mutex> lk(mu_);
  return events_.size();
}

void Tracer::clear() {
  std::lock_guard<std::mutex> lk(mu_);
  events_.clear();
}

std::string Tracer::to_json() const {
  std::lock_guard<std::mutex> lk(mu_);
  nlohmann::json list = nlohmann::json::array();
  // Metadata first: the process (rank) and every track that holds an event.
  list.push_back(metadata_event("process_name", rank_, 0, fmt::format("rank {}", rank_)));
  list.push_back({{"name", "process_sort_index"}, {"ph", "M"}, {"pid", rank_}, {"tid", 0},
                  {"args", {{"sort_index", rank_}}}});
  std::set<uint32_t> tids;
  for (const auto& e : events_) tids.insert(e.tid);
  for (uint32_t tid : tids) {
    auto it = track_names_.find(tid);
    list.push_back(metadata_event("thread_name", rank_, tid,
                                  it != track_names_.end() ? it->second
                                                           : fmt::format("thread {}", tid)));
  }
  for (const auto& e : events_) {
    nlohmann::json j;
    j["name"] = e.name;
    j["cat"] = e.category;
    j["ph"] = std::string(1, e.phase);
    j["ts"] = static_cast<double>(e.ts_ns) / 1e3;
    if (e.phase == 'X') j["dur"] = static_cast<double>(e.dur_ns) / 1e3;
    if (e.phase == 'i') j["s"] = "t";
    j["pid"] = rank_;
    j["tid"] = e.tid;
    nlohmann::json args = nlohmann::json::object();
    if (e.flops > 0) args["flops"] = e.flops;
    if (e.bytes > 0) args["bytes"] = e.bytes;
    if (!e.detail.empty()) args["shape"] = e.detail;
    for (const auto& [k, v] : e.args) args[k] = v;
    if (!args.empty() || e.phase == 'C') j["args"] = std::move(args);
    list.push_back(std::move(j));
  }
  nlohmann::json doc;
  doc["traceEvents"] = std::move(list);
  doc["displayTimeUnit"] = "ms";
  doc["otherData"] = {{"producer", "kiln"}, {"rank", rank_}};
  return doc.dump();
}

void Tracer::write_trace(const fs::path& path) const { write_file_atomically(path, to_json()); }

void Tracer::record_collective(std::string_view name, int64_t bytes, Clock::time_point start,
                               Clock::time_point end, std::string_view track) {
  if (!enabled()) return;
  record_complete(name, "comm", start, end, 0.0, static_cast<double>(bytes), {},
                  track_id(track));
}

void trace_collective(std::string_view name, int64_t bytes, Clock::time_point start,
                      Clock::time_point end, std::string_view track) {
  Tracer::global().record_collective(name, bytes, start, end, track);
}

void trace_collective_done(std::string_view name, int64_t bytes, double seconds,
                           std::string_view track) {
  Tracer& t = Tracer::global();
  if (t.enabled()) t.record_collective_done(name, bytes, seconds, track);
}

void trace_counter(std::string_view name, std::vector<std::pair<std::string, double>> values) {
  Tracer& t = Tracer::global();
  if (!t.enabled()) return;
  t.record_counter(name, std::move(values));
}

void merge_trace_files(const std::vector<fs::path>& inputs, const fs::path& output) {
  nlohmann::json all = nlohmann::json::array();
  for (const auto& p : inputs) {
    std::ifstream in(p);
    KILN_CHECK(in.good(), "merge traces: cannot read {}", p.string());
    nlohmann::json doc;
    try {
      in >> doc;
    } catch (const std::exception& e) {
      KILN_FAIL("merge traces: {} is not JSON: {}", p.string(), e.what());
    }
    KILN_CHECK(doc.is_object() && doc.contains("traceEvents") && doc["traceEvents"].is_array(),
               "merge traces: {} has no traceEvents array", p.string());
    for (auto& e : doc["traceEvents"]) all.push_back(std::move(e));
  }
  nlohmann::json doc;
  doc["traceEvents"] = std::move(all);
  doc["displayTimeUnit"] = "ms";
  write_file_atomically(output, doc.dump());
}

}  // namespace kiln::profile
