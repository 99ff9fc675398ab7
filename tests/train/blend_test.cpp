// data.blend in the trainer: exact resume, the per-data-set figures, a blend of one equal to
// data.dir, each data set's samples once per its epoch, and the errors.
#include "data/loader.h"
#include "support/error_of.h"
#include "train/train_data.h"
#include "trainer_fixture.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

namespace kiln {
namespace {

namespace fs = std::filesystem;
using testing::error_of;
using testing::make_dataset;
using testing::quiet;
using testing::read_metrics;
using testing::TempDir;
using testing::tiny_config;

TrainConfig blend_config(const fs::path& a, const fs::path& b, const fs::path& run, int64_t steps) {
  TrainConfig c = tiny_config("", run, steps);
  c.data.dir.clear();
  c.data.blend = {"0.25", a.string(), "0.75", b.string()};
  return c;
}

// 30 updates straight and 15 + resume + 15 give bit-identical losses; tokens per data set
// follow the weights exactly; each data set's val loss is logged.
TEST(Blend, TrainsAndResumesExactlyWithPerDatasetFigures) {
  TempDir tmp;
  const fs::path a = make_dataset(tmp.path, "a", 5), b = make_dataset(tmp.path, "b", 6);
  { Trainer(blend_config(a, b, tmp.path / "x", 30), quiet()).run(); }
  { Trainer(blend_config(a, b, tmp.path / "y", 30), quiet("", 15)).run(); }
  {
    Trainer t(blend_config(a, b, tmp.path / "y", 30), quiet("auto"));
    EXPECT_EQ(t.step(), 15);
    t.run();
  }
  const auto x = read_metrics(tmp.path / "x"), y = read_metrics(tmp.path / "y");
  ASSERT_EQ(x.size(), 30u);
  ASSERT_EQ(y.size(), 30u);
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(x[i]["loss"].get<double>(), y[i]["loss"].get<double>()) << "step " << i + 1;
    EXPECT_EQ(x[i]["tokens_by_data"], y[i]["tokens_by_data"]) << "step " << i + 1;
  }
  // 30 updates x 4 samples = 120 samples: 30 of a, 90 of b, 16 tokens each.
  EXPECT_EQ(x.back()["tokens_by_data"][a.string()].get<int64_t>(), 30 * 16);
  EXPECT_EQ(x.back()["tokens_by_data"][b.string()].get<int64_t>(), 90 * 16);
  const auto& val = x[9]["val_loss_by_data"];
  ASSERT_TRUE(val.contains(a.string()) && val.contains(b.string())) << x[9].dump();
  EXPECT_GT(val[a.string()].get<double>(), 0.0);
  EXPECT_NE(val[a.string()].get<double>(), val[b.string()].get<double>());
  EXPECT_TRUE(x[9].contains("val_loss"));
  EXPECT_EQ(x[9]["val_loss_by_data"], y[9]["val_loss_by_data"]);
}

// A blend of one data set reads exactly what data.dir reads.
TEST(Blend, OneDatasetEqualsDataDir) {
  TempDir tmp;
  const fs::path a = make_dataset(tmp.path, "a", 5);
  { Trainer(tiny_config(a, tmp.path / "dir", 12), quiet()).run(); }
  TrainConfig c = tiny_config("", tmp.path / "blend", 12);
  c.data.dir.clear();
  c.data.blend = {"1", a.string()};
  { Trainer(c, quiet()).run(); }
  const auto x = read_metrics(tmp.path / "dir"), y = read_metrics(tmp.path / "blend");
  ASSERT_EQ(x.size(), y.size());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(x[i]["loss"].get<double>(), y[i]["loss"].get<double>());
}

// Within a data set no sample repeats until all of it was drawn: the first S samples drawn
// from it are a permutation of its S samples, and so are the next S.
// Random letters, so that every sample's tokens are unique (and name it).
fs::path random_dataset(const fs::path& root, const std::string& name, unsigned seed, int bytes) {
  std::mt19937 rng(seed);
  std::string text;
  for (int i = 0; i < bytes; ++i) text.push_back(static_cast<char>('a' + rng() % 26));
  std::ofstream(root / (name + ".txt")) << text;
  data::PrepareOptions o;
  o.inputs = {root / (name + ".txt")};
  o.out_dir = root / name;
  o.tokenizer = "byte";
  data::prepare_dataset(o);
  return o.out_dir;
}

TEST(Blend, EachDatasetRunsThroughItsOwnEpochs) {
  TempDir tmp;
  const fs::path a = random_dataset(tmp.path, "a", 1, 1000), b = random_dataset(tmp.path, "b", 2, 3000);
  const int T = 16;
  data::DataLoader la(a, "train", T, 0, false), lb(b, "train", T, 0, false);
  std::map<std::vector<int32_t>, std::pair<int, int64_t>> which;  // sample tokens -> (set, sample)
  for (auto [l, d] : {std::pair{&la, 0}, std::pair{&lb, 1}})
    for (int64_t i = 0; i < l->samples_per_epoch(); ++i) {
      std::vector<int32_t> row(T + 1);
      l->read_sample(i, row.data());
      which.emplace(row, std::pair{d, i});
    }
  auto blend = open_blend_data({{a.string(), 1.0}, {b.string(), 2.0}}, "train", T, 7, true);
  std::vector<std::vector<int64_t>> drawn(2);
  std::vector<int32_t> in(4 * T), tg(4 * T);
  // Weights 1:2: two epochs of a take 6 S_a draws, two of b 3 S_b.
  const int64_t draws = std::max(6 * la.samples_per_epoch(), 3 * lb.samples_per_epoch()) + 8;
  for (int64_t n = 0; n < draws / 4; ++n) {
    blend->next_batch(in.data(), tg.data(), 4, 0, 1);
    for (int r = 0; r < 4; ++r) {
      std::vector<int32_t> row(in.begin() + r * T, in.begin() + (r + 1) * T);
      row.push_back(tg[static_cast<size_t>((r + 1) * T - 1)]);
      const auto it = which.find(row);
      ASSERT_NE(it, which.end()) << "a drawn sample is in neither data set";
      drawn[static_cast<size_t>(it->second.first)].push_back(it->second.second);
    }
  }
  for (auto [d, l] : {std::pair{0, &la}, std::pair{1, &lb}}) {
    const auto& v = drawn[static_cast<size_t>(d)];
    const auto s = static_cast<size_t>(l->samples_per_epoch());
    ASSERT_GE(v.size(), 2 * s) << "data set " << d;
    for (size_t e = 0; e < 2; ++e)
      EXPECT_EQ(std::set<int64_t>(v.begin() + e * s, v.begin() + (e + 1) * s).size(), s)
          << "data set " << d << " epoch " << e;
  }
}

// Data parallelism: ranks 0 and 1 of 2, each with micro_batch B, read together what one
// rank reads with 2 B, batch after batch; and a state taken and set resumes the stream.
TEST(Blend, RanksSplitTheGlobalBatchAndStateResumes) {
  TempDir tmp;
  const fs::path a = random_dataset(tmp.path, "a", 1, 1000), b = random_dataset(tmp.path, "b", 2, 3000);
  const int T = 16, B = 3;
  const std::vector<data::BlendPart> parts = {{a.string(), 0.4}, {b.string(), 0.6}};
  auto one = open_blend_data(parts, "train", T, 9, true);
  auto r0 = open_blend_data(parts, "train", T, 9, true), r1 = open_blend_data(parts, "train", T, 9, true);
  std::vector<int32_t> in(2 * B * T), tg(2 * B * T), in0(B * T), tg0(B * T), in1(B * T), tg1(B * T);
  for (int step = 0; step < 40; ++step) {
    one->next_batch(in.data(), tg.data(), 2 * B, 0, 1);
    r0->next_batch(in0.data(), tg0.data(), B, 0, 2);
    r1->next_batch(in1.data(), tg1.data(), B, 1, 2);
    in0.insert(in0.end(), in1.begin(), in1.end());
    EXPECT_EQ(in0, in) << "step " << step;
    in0.resize(B * T);
  }
  // Weights that normalize alike are the same blend (a resume accepts them).
  EXPECT_EQ(open_blend_data({{a.string(), 4.0}, {b.string(), 6.0}}, "train", T, 9, true)->fingerprint(),
            one->fingerprint());
  auto resumed = open_blend_data(parts, "train", T, 9, true);
  resumed->set_state(one->state());
  std::vector<int32_t> in2(2 * B * T), tg2(2 * B * T);
  one->next_batch(in.data(), tg.data(), 2 * B, 0, 1);
  resumed->next_batch(in2.data(), tg2.data(), 2 * B, 0, 1);
  EXPECT_EQ(in, in2);
  EXPECT_EQ(tg, tg2);
}

TEST(Blend, BadBlendsAreOneLineErrors) {
  TempDir tmp;
  const fs::path a = make_dataset(tmp.path, "a", 5);
  TrainConfig both = tiny_config(a, tmp.path / "r1", 2);
  both.data.blend = {"1", a.string()};
  EXPECT_NE(error_of([&] { Trainer(both, quiet()); }).find("data.dir and data.blend are both set"),
            std::string::npos);
  // A data set without a val split under eval.every: the error names that one.
  const fs::path noval = random_dataset(tmp.path, "noval", 4, 2000);
  const std::string v = error_of([&] { Trainer(blend_config(a, noval, tmp.path / "r4", 2), quiet()); });
  EXPECT_NE(v.find("but data.blend's " + noval.string() + " has no val split"), std::string::npos) << v;
  TrainConfig missing = blend_config(a, tmp.path / "nope", tmp.path / "r2", 2);
  const std::string m = error_of([&] { Trainer(missing, quiet()); });
  EXPECT_NE(m.find("nope"), std::string::npos) << m;
  // Another tokenizer: the same text through sentencepiece.
  data::PrepareOptions o;
  o.inputs = {tmp.path / "a.txt"};
  o.out_dir = tmp.path / "sp";
  o.tokenizer = "sentencepiece";
  o.vocab_size = 300;
  o.val_fraction = 0.1;
  data::prepare_dataset(o);
  const std::string t = error_of([&] { Trainer(blend_config(a, o.out_dir, tmp.path / "r3", 2), quiet()); });
  EXPECT_NE(t.find("were prepared with different tokenizers"), std::string::npos) << t;
  for (const std::string& e : {m, t}) EXPECT_EQ(e.find('\n'), std::string::npos) << e;
}

}  // namespace
}  // namespace kiln
