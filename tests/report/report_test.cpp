// kiln report: the SVG chart generator, reading a run directory (ranks, torn lines),
// the HTML (self-contained, expected polylines, escaped config, a mixture-of-experts
// section for a MoE run only) and, when Debian's chromium is installed, a headless
// screenshot of the page that must not be blank.
#include "report/report.h"

#include "core/error.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unistd.h>

namespace kiln::report {
namespace {

namespace fs = std::filesystem;

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / fmt::format("kiln_report_{}_{}", name, ::getpid());
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t i = s.find(what); i != std::string::npos; i = s.find(what, i + what.size())) ++n;
  return n;
}

// The points attribute of the polyline whose data-series is `name` ("" when absent).
std::string polyline_points(const std::string& html, const std::string& name) {
  const std::string key = "<polyline class=\"series\" data-series=\"" + name + "\"";
  const size_t at = html.find(key);
  if (at == std::string::npos) return {};
  const size_t end = html.find("/>", at);
  const size_t p = html.find(" points=\"", at);
  if (p == std::string::npos || p > end) return {};
  const size_t b = p + 9;
  return html.substr(b, html.find('"', b) - b);
}

// A synthetic run: 2 ranks, 60 steps, val loss every 20, memory by category, two sessions
// (updates 1-30 for 100 s from t = 1e9, then resumed at 30 for 50 s from t = 1e9 + 1000),
// a rollback to 30, a sample at update 40, two checkpoints (the second incomplete), a
// torn last line (as a crash leaves it), and a config with characters HTML must escape.
fs::path make_run() {
  const fs::path dir = temp_dir("run");
  std::ofstream m(dir / "metrics.jsonl");
  for (int rank = 0; rank < 2; ++rank)
    for (int step = 1; step <= 60; ++step) {
      nlohmann::json r;
      r["step"] = step;
      r["rank"] = rank;
      r["loss"] = 10.8 * std::exp(-step / 30.0) + 2.0 + 0.05 * rank;
      r["lr"] = 6e-4 * 0.5 * (1 + std::cos(M_PI * step / 60.0));
      r["grad_norm"] = 1.0 + 3.0 / step;
      r["tokens_per_s"] = 1500.0 + 10.0 * std::sin(step) - 100.0 * rank;
      r["mfu"] = 0.30 + 0.01 * std::sin(step);
      r["step_time_s"] = 1.3;
      r["tokens"] = step * 2048;
      r["peak_mem_bytes"] = 600 << 20;
      r["mem_parameters_bytes"] = 53 << 20;
      r["mem_gradients_bytes"] = 53 << 20;
      r["mem_optimizer_state_bytes"] = 106 << 20;
      r["mem_activations_bytes"] = (300 + step) << 20;
      r["mem_comm_buffers_bytes"] = 0;
      r["mem_temporaries_bytes"] = 2 << 20;
      if (step % 20 == 0) r["val_loss"] = 10.8 * std::exp(-step / 30.0) + 2.2;
      const bool resumed = step > 30;
      r["session_start"] = resumed ? 1e9 + 1000 : 1e9;
      r["session_first_step"] = resumed ? 30 : 0;
      r["time"] = resumed ? 1e9 + 1000 + 50.0 * (step - 30) / 30 : 1e9 + 100.0 * step / 30;
      m << r.dump() << "\n";
      if (rank == 0 && step == 30)
        m << R"({"step": 30, "event": "rollback", "resumed_from": "ckpt/step_00000030", "abandoned_steps": [40]})"
          << "\n";
      if (rank == 0 && step == 40)
        m << R"({"step": 40, "event": "sample", "text": "And God said <let there be light>"})" << "\n";
    }
  m << "{\"step\": 61, \"loss\": 2.0, \"lr";  // torn
  m.close();
  std::ofstream(dir / "config.toml") << "# a < b & c\n[model]\nn_layer = 6\n[train]\nsteps = 60\n";
  fs::create_directories(dir / "ckpt/step_00000030");
  std::ofstream(dir / "ckpt/step_00000030/manifest.json") << "{}";
  std::ofstream(dir / "ckpt/step_00000030/rank_00000.safetensors") << std::string(2 << 20, 'x');
  fs::create_directories(dir / "ckpt/step_00000060");  // no manifest: incomplete
  return dir;
}

TEST(SvgChart, SeriesAxesAndEdgeCases) {
  Series a{"a", {{0, 1}, {1, 2}, {2, 1.5}}};
  Series b{"b <&>", {{0, 0.5}, {1, NAN}, {2, 3}}};  // NaN dropped, name escaped
  ChartOptions o;
  o.title = "t";
  const std::string svg = svg_line_chart({a, b}, o);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_EQ(count(svg, "<polyline"), 2);
  EXPECT_NE(svg.find("data-series=\"b &lt;&amp;&gt;\""), std::string::npos);
  EXPECT_EQ(count(svg, "</svg>"), 1);

  // One point: drawn as a marker too.
  const std::string one = svg_line_chart({Series{"p", {{3, 4}}}}, o);
  EXPECT_EQ(count(one, "<circle"), 1);
  // Nothing: "no data", no polyline.
  const std::string none = svg_line_chart({Series{"e", {}}}, o);
  EXPECT_NE(none.find("no data"), std::string::npos);
  EXPECT_EQ(count(none, "<polyline"), 0);
  // Long series are thinned to max_points.
  Series big{"big", {}};
  for (int i = 0; i < 10000; ++i) big.points.push_back({double(i), std::sin(i * 0.01)});
  o.max_points = 500;
  const std::string thin = svg_line_chart({big}, o);
  const std::string pts = polyline_points(thin, "big");
  EXPECT_EQ(count(pts, ",") , 500);
}

TEST(Report, HtmlHasEveryChartAndTheConfig) {
  const fs::path dir = make_run();
  const RunData run = load_run(dir);
  ASSERT_EQ(run.records.size(), 2u);
  EXPECT_EQ(run.records.at(0).size(), 62u);  // 60 updates, a rollback and a sample
  EXPECT_EQ(run.records.at(1).size(), 60u);
  ASSERT_EQ(run.warnings.size(), 1u);  // the torn line
  const fs::path out = write_report(dir);
  EXPECT_EQ(out, dir / "report.html");
  const std::string html = read_file(out);

  for (int rank = 0; rank < 2; ++rank) {
    for (const char* s : {"train loss", "val loss", "learning rate", "gradient norm", "tokens/s",
                          "MFU", "step time", "parameters", "gradients", "optimizer_state",
                          "activations", "temporaries", "peak total"}) {
      const std::string name = fmt::format("{} (rank {})", s, rank);
      EXPECT_FALSE(polyline_points(html, name).empty()) << name;
    }
    // comm_buffers is always 0 here: no series for it.
    EXPECT_TRUE(polyline_points(html, fmt::format("comm_buffers (rank {})", rank)).empty());
    EXPECT_EQ(count(polyline_points(html, fmt::format("train loss (rank {})", rank)), ","), 60);
    EXPECT_EQ(count(polyline_points(html, fmt::format("val loss (rank {})", rank)), ","), 3);
  }
  // Self-contained: no script, no external stylesheet, image or font.
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("<link"), std::string::npos);
  EXPECT_EQ(html.find("src="), std::string::npos);
  EXPECT_EQ(html.find("url("), std::string::npos);
  EXPECT_GE(count(html, "<svg"), 8);
  EXPECT_NE(html.find("# a &lt; b &amp; c"), std::string::npos);  // the config, escaped
  EXPECT_NE(html.find("n_layer = 6"), std::string::npos);
  EXPECT_NE(html.find("skipped a malformed line"), std::string::npos);
  // The run: wall time over both sessions (100 s + 50 s), tokens, events, samples, checkpoints.
  EXPECT_NE(html.find("<td>2.5 min (150 s)</td>"), std::string::npos);
  EXPECT_NE(html.find("<td>tokens seen</td><td>122880</td>"), std::string::npos);
  EXPECT_NE(html.find("start at update 0 (2001-09-09 01:46:40 UTC)"), std::string::npos);
  EXPECT_NE(html.find("resume at update 30 (2001-09-09 02:03:20 UTC)"), std::string::npos);
  EXPECT_NE(html.find("rollback to update 30: resumed from ckpt/step_00000030, abandoned [40]"),
            std::string::npos);
  EXPECT_NE(html.find("<td>40</td><td><pre>And God said &lt;let there be light&gt;</pre>"),
            std::string::npos);
  EXPECT_NE(html.find("<td>ckpt/step_00000030</td><td>2.0</td><td>yes</td>"), std::string::npos);
  EXPECT_NE(html.find("<td>ckpt/step_00000060</td><td>0.0</td><td><span class=\"warn\">no"),
            std::string::npos);
  EXPECT_TRUE(polyline_points(html, "unigram baseline (val, 6.2)").empty());  // none given
  EXPECT_EQ(html.find("Mixture of experts"), std::string::npos);  // a dense run
  fs::remove_all(dir);
}

TEST(Report, BaselineIsAFlatLineOverTheLossChart) {
  const fs::path dir = make_run();
  RunData run = load_run(dir);
  run.baseline_loss = 6.2;
  run.baseline_name = "unigram baseline (val, 6.2)";
  const std::string html = render_report(run);
  const std::string points = polyline_points(html, "unigram baseline (val, 6.2)");
  ASSERT_FALSE(points.empty());
  EXPECT_EQ(count(points, ","), 2);  // two points, at the same height
  const size_t space = points.find(' ');
  const std::string first = points.substr(0, space), second = points.substr(space + 1);
  EXPECT_EQ(first.substr(first.find(',') + 1), second.substr(second.find(',') + 1));
  fs::remove_all(dir);
}

// The trainer's data-parallel format: only rank 0 writes metrics.jsonl, with every
// rank's memory in "mem_by_rank", peaks in mem_peak_* keys and comm_wait_s.
TEST(Report, MemoryByRankFromTheTrainersArray) {
  const fs::path dir = temp_dir("dp");
  {
    std::ofstream m(dir / "metrics.jsonl");
    for (int step = 1; step <= 10; ++step) {
      nlohmann::json r;
      r["step"] = step;
      r["loss"] = 5.0 - 0.1 * step;
      r["comm_wait_s"] = 0.01 * step;
      r["peak_mem_bytes"] = 900 << 20;
      r["mem_parameters_bytes"] = 100 << 20;
      r["mem_peak_parameters_bytes"] = 100 << 20;
      nlohmann::json arr = nlohmann::json::array();
      for (int rank = 0; rank < 4; ++rank)
        arr.push_back({{"parameters", (100 - rank) << 20}, {"peak_parameters", 100 << 20},
                       {"activations", (200 + step) << 20}, {"comm_buffers", 0},
                       {"peak", (900 + rank) << 20}});
      r["mem_by_rank"] = arr;
      m << r.dump() << "\n";
    }
  }
  const std::string html = render_report(load_run(dir));
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(count(polyline_points(html, fmt::format("parameters (rank {})", rank)), ","), 10);
    EXPECT_EQ(count(polyline_points(html, fmt::format("activations (rank {})", rank)), ","), 10);
    EXPECT_FALSE(polyline_points(html, fmt::format("peak total (rank {})", rank)).empty());
    EXPECT_TRUE(polyline_points(html, fmt::format("peak_parameters (rank {})", rank)).empty());
    EXPECT_NE(html.find(fmt::format("Memory, rank {}", rank)), std::string::npos);
  }
  EXPECT_TRUE(polyline_points(html, "peak_parameters (rank 0)").empty());
  EXPECT_FALSE(polyline_points(html, "communication wait (rank 0)").empty());
  fs::remove_all(dir);
}

// A mixture-of-experts run as the trainer writes it (add_moe_record): 20 updates, 3 MoE
// layers of 8 experts, top-2 of 4096 tokens (mean 1024 slots per expert); with `bias`,
// DeepSeek-V3's selection bias range and a dropped fraction (token dropping).
fs::path make_moe_run(const std::string& name, bool bias) {
  const fs::path dir = temp_dir(name);
  std::ofstream m(dir / "metrics.jsonl");
  for (int step = 1; step <= 20; ++step) {
    nlohmann::json r;
    r["step"] = step;
    r["loss"] = 6.0 - 0.1 * step;
    r["moe_aux_loss"] = 0.02 + 0.001 / step;
    r["moe_z_loss"] = 0.001 + 0.0005 / step;
    const double spread = 600.0 / step;  // layer l: 1024 -/+ (l + 1) * spread
    nlohmann::json by_layer = nlohmann::json::array();
    for (int l = 0; l < 3; ++l)  // [min, mean, max], as the trainer writes it
      by_layer.push_back({1024 - (l + 1) * spread, 1024.0, 1024 + (l + 1) * spread});
    r["moe_tokens_per_expert_by_layer"] = by_layer;
    r["moe_tokens_per_expert"] = {
        {"min", 1024 - 3 * spread}, {"mean", 1024.0}, {"max", 1024 + 3 * spread}};
    if (bias) r["moe_expert_bias"] = {{"min", -0.001 * step}, {"max", 0.0005 * step}};
    if (bias) r["moe_dropped_fraction"] = 0.5 / step;
    m << r.dump() << "\n";
  }
  return dir;
}

TEST(Report, MixtureOfExpertsSection) {
  const fs::path dir = make_moe_run("moe", true);
  const std::string html = render_report(load_run(dir));
  EXPECT_NE(html.find("<h2>Mixture of experts</h2>"), std::string::npos);
  for (const char* s : {"aux loss", "z-loss", "max / mean", "min / mean", "bias max", "bias min",
                        "dropped fraction"})
    EXPECT_EQ(count(polyline_points(html, fmt::format("{} (rank 0)", s)), ","), 20) << s;
  EXPECT_EQ(count(polyline_points(html, "train loss (rank 0)"), ","), 20);  // the LM loss, apart
  // The load imbalance at step 1 (1024 + 1800) / 1024 = 2.758 lies above step 20's 1.088.
  const std::string ratio = polyline_points(html, "max / mean (rank 0)");
  const double y_first = std::stod(ratio.substr(ratio.find(',') + 1));
  const double y_last = std::stod(ratio.substr(ratio.rfind(',') + 1));
  EXPECT_LT(y_first, y_last);  // SVG y grows downwards
  // The bias range crosses zero: its tick there reads 0, not a rounding residue like 3.5e-18.
  EXPECT_NE(html.find("text-anchor=\"end\" fill=\"#444\">0</text>"), std::string::npos);
  EXPECT_EQ(html.find("e-1"), std::string::npos);
  // The last update: the values line and each layer's load (spread 30 at step 20).
  EXPECT_NE(html.find("At update 20: aux loss 0.02005, z-loss 0.001025, selection bias from "
                      "-0.02 to 0.01, 2.5% of the slots dropped."), std::string::npos);
  EXPECT_NE(html.find("<tr><td>0</td><td>994</td><td>1024</td><td>1054</td><td>1.029</td>"
                      "<td>0.971</td></tr>"), std::string::npos);
  EXPECT_NE(html.find("<tr><td>2</td><td>934</td><td>1024</td><td>1114</td><td>1.088</td>"
                      "<td>0.912</td></tr>"), std::string::npos);
  EXPECT_NE(html.find("<tr><td>all</td><td>934</td><td>1024</td><td>1114</td><td>1.088</td>"
                      "<td>0.912</td></tr>"), std::string::npos);
  fs::remove_all(dir);

  // Without the auxiliary-loss-free bias: no bias chart, no bias in the line.
  const fs::path plain = make_moe_run("moe_plain", false);
  const std::string no_bias = render_report(load_run(plain));
  EXPECT_NE(no_bias.find("<h2>Mixture of experts</h2>"), std::string::npos);
  EXPECT_TRUE(polyline_points(no_bias, "bias max (rank 0)").empty());
  EXPECT_TRUE(polyline_points(no_bias, "dropped fraction (rank 0)").empty());
  EXPECT_EQ(no_bias.find("selection bias"), std::string::npos);
  EXPECT_NE(no_bias.find("At update 20: aux loss 0.02005, z-loss 0.001025.</div>"),
            std::string::npos);
  fs::remove_all(plain);
}

// A run on data.blend as the trainer writes it: 12 updates of 64 tokens, 1 in 4 samples
// from "data/a&b" (a name HTML must escape), the rest from "data/c"; val losses at 6 and 12.
TEST(Report, DataBlendSection) {
  const fs::path dir = temp_dir("blend");
  {
    std::ofstream m(dir / "metrics.jsonl");
    for (int step = 1; step <= 12; ++step) {
      nlohmann::json r = {{"step", step}, {"loss", 5.0 - 0.1 * step}};
      r["tokens_by_data"] = {{"data/a&b", 16 * step}, {"data/c", 48 * step}};
      if (step % 6 == 0) r["val_loss_by_data"] = {{"data/a&b", 4.0 - 0.1 * step}, {"data/c", 3.0}};
      m << r.dump() << "\n";
    }
  }
  const std::string html = render_report(load_run(dir));
  EXPECT_NE(html.find("<h2>Data blend</h2>"), std::string::npos);
  EXPECT_EQ(count(polyline_points(html, "data/a&amp;b"), ","), 12);  // the share chart's
  EXPECT_EQ(count(html, "<polyline class=\"series\" data-series=\"data/a&amp;b\""), 2);  // and val loss
  EXPECT_NE(html.find("<tr><td>data/a&amp;b</td><td>192</td><td>25.00%</td><td>2.8000</td></tr>"),
            std::string::npos);
  EXPECT_NE(html.find("<tr><td>data/c</td><td>576</td><td>75.00%</td><td>3.0000</td></tr>"), std::string::npos);
  fs::remove_all(dir);
  // A run on one data set: no section.
  const fs::path plain = make_moe_run("no_blend", false);
  EXPECT_EQ(render_report(load_run(plain)).find("Data blend"), std::string::npos);
  fs::remove_all(plain);
}

TEST(Report, RankFromFileNameAndErrors) {
  const fs::path dir = temp_dir("ranks");
  std::ofstream(dir / "metrics.jsonl") << "{\"step\": 1, \"loss\": 3.0}\n";
  std::ofstream(dir / "metrics_rank2.jsonl") << "{\"step\": 1, \"loss\": 3.5}\n";
  const RunData run = load_run(dir);
  EXPECT_EQ(run.records.size(), 2u);
  EXPECT_TRUE(run.records.count(0));
  EXPECT_TRUE(run.records.count(2));
  const std::string html = render_report(run);
  EXPECT_NE(html.find("no config.toml"), std::string::npos);
  EXPECT_THROW(load_run(dir / "missing"), Error);
  const fs::path empty = temp_dir("empty");
  EXPECT_THROW(load_run(empty), Error);
  fs::remove_all(dir);
  fs::remove_all(empty);
}

// ---- a minimal PNG reader (8-bit RGB / RGBA, not interlaced: what chromium writes) ----
struct Image {
  int width = 0, height = 0, channels = 0;
  std::vector<uint8_t> pixels;  // rows of width * channels bytes
};

uint32_t be32(const uint8_t* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | p[3];
}

bool decode_png(const std::string& file, Image* img, std::string* why) {
  const auto* d = reinterpret_cast<const uint8_t*>(file.data());
  static const uint8_t sig[8] = {137, 80, 78, 71, 13, 10, 26, 10};
  if (file.size() < 8 || std::memcmp(d, sig, 8) != 0) return *why = "not a PNG", false;
  size_t pos = 8;
  std::string idat;
  int depth = 0, color = 0, interlace = 0;
  while (pos + 12 <= file.size()) {
    const uint32_t len = be32(d + pos);
    const std::string type(file.data() + pos + 4, 4);
    if (pos + 12 + len > file.size()) return *why = "truncated chunk", false;
    const uint8_t* body = d + pos + 8;
    if (type == "IHDR") {
      img->width = static_cast<int>(be32(body));
      img->height = static_cast<int>(be32(body + 4));
      depth = body[8], color = body[9], interlace = body[12];
    } else if (type == "IDAT") {
      idat.append(reinterpret_cast<const char*>(body), len);
    } else if (type == "IEND") {
      break;
    }
    pos += 12 + len;
  }
  if (depth != 8 || (color != 2 && color != 6) || interlace != 0)
    return *why = fmt::format("unsupported PNG (depth {}, color {}, interlace {})", depth, color,
                              interlace), false;
  img->channels = color == 6 ? 4 : 3;
  const size_t stride = static_cast<size_t>(img->width) * img->channels;
  std::vector<uint8_t> raw((stride + 1) * img->height);
  uLongf n = raw.size();
  if (uncompress(raw.data(), &n, reinterpret_cast<const Bytef*>(idat.data()), idat.size()) != Z_OK ||
      n != raw.size())
    return *why = "zlib error", false;
  img->pixels.assign(stride * img->height, 0);
  const int bpp = img->channels;
  for (int y = 0; y < img->height; ++y) {
    const uint8_t filter = raw[y * (stride + 1)];
    const uint8_t* src = &raw[y * (stride + 1) + 1];
    uint8_t* row = &img->pixels[y * stride];
    const uint8_t* up = y > 0 ? &img->pixels[(y - 1) * stride] : nullptr;
    for (size_t x = 0; x < stride; ++x) {
      const int a = x >= static_cast<size_t>(bpp) ? row[x - bpp] : 0;
      const int b = up ? up[x] : 0;
      const int c = (up && x >= static_cast<size_t>(bpp)) ? up[x - bpp] : 0;
      int v = src[x];
      switch (filter) {
        case 0: break;
        case 1: v += a; break;
        case 2: v += b; break;
        case 3: v += (a + b) / 2; break;
        case 4: {
          const int p = a + b - c, pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
          v += (pa <= pb && pa <= pc) ? a : (pb <= pc ? b : c);
          break;
        }
        default: return *why = "bad filter", false;
      }
      row[x] = static_cast<uint8_t>(v);
    }
  }
  return true;
}

std::string find_chromium() {
  if (const char* e = std::getenv("KILN_CHROMIUM"); e && *e) return e;
  for (const char* p : {"/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"})
    if (fs::exists(p)) return p;
  return {};
}

TEST(Report, HeadlessChromiumScreenshotIsNotBlank) {
  const std::string chromium = find_chromium();
  if (chromium.empty())
    GTEST_SKIP() << "chromium not installed (apt-get install -y chromium): screenshot check skipped";
  const fs::path dir = make_run();
  const fs::path html = write_report(dir);
  const fs::path png = dir / "shot.png";
  const std::string cmd = fmt::format(
      "timeout 90 {} --headless --no-sandbox --disable-gpu --hide-scrollbars "
      "--user-data-dir={} --screenshot={} --window-size=1200,2000 file://{} > {} 2>&1",
      chromium, (dir / "profile").string(), png.string(), fs::absolute(html).string(),
      (dir / "chromium.log").string());
  const int rc = std::system(cmd.c_str());
  ASSERT_TRUE(rc == 0 && fs::exists(png)) << "chromium failed (" << rc << "): " << cmd << "\n"
                                          << read_file(dir / "chromium.log");
  Image img;
  std::string why;
  ASSERT_TRUE(decode_png(read_file(png), &img, &why)) << why;
  EXPECT_EQ(img.width, 1200);
  EXPECT_EQ(img.height, 2000);
  // Not blank: many non-white pixels (text, axes, lines), and coloured ones (the series:
  // the palette's blue/orange/green, far from grey).
  int64_t non_white = 0, colored = 0;
  for (int64_t i = 0; i < int64_t(img.width) * img.height; ++i) {
    const uint8_t* p = &img.pixels[i * img.channels];
    const int mx = std::max({p[0], p[1], p[2]}), mn = std::min({p[0], p[1], p[2]});
    non_white += mn < 235;
    colored += mx - mn > 80;
  }
  const double total = double(img.width) * img.height;
  EXPECT_GT(non_white / total, 0.01) << non_white << " non-white pixels";
  EXPECT_GT(colored, 2000) << colored << " coloured pixels";
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kiln::report
