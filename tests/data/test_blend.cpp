// Weighted blends: the schedule's exactness and resumability, data.blend's parsing.
#include "core/error.h"
#include "data/blend.h"

#include <gtest/gtest.h>

#include <cmath>

using namespace kiln::data;

namespace {
std::string error_of(const std::vector<std::string>& list) {
  try {
    parse_blend(list, "t.toml: data.blend");
  } catch (const kiln::Error& e) {
    return e.what();
  }
  return "no error";
}
}  // namespace

TEST(BlendSchedule, CountsStayWithinOneOfTheirShareAndSeekReplays) {
  for (const std::vector<double>& w : {std::vector<double>{0.3, 0.7}, {1, 2, 3.5}, {5}, {1e-3, 1, 0.25, 0.25}}) {
    BlendSchedule s(w);
    double sum = 0;
    for (double x : w) sum += x;
    std::vector<int64_t> counts(w.size(), 0);
    for (int64_t n = 1; n <= 20'000; ++n) {
      const auto [d, k] = s.next();
      EXPECT_EQ(k, counts[static_cast<size_t>(d)]++);  // ordinals in order within a data set
      for (size_t i = 0; i < w.size(); ++i)
        ASSERT_LE(std::abs(static_cast<double>(counts[i]) - w[i] / sum * static_cast<double>(n)), 1.0)
            << "data set " << i << " after " << n;
    }
    EXPECT_EQ(s.counts(), counts);
    BlendSchedule t(w);
    t.seek(12'345);
    BlendSchedule u(w);
    for (int i = 0; i < 12'345; ++i) u.next();
    EXPECT_EQ(t.counts(), u.counts());
    EXPECT_EQ(t.next(), u.next());
  }
}

TEST(BlendSchedule, TwoToOneInterleaves) {
  BlendSchedule s({2, 1});
  std::string order;
  for (int i = 0; i < 9; ++i) order += static_cast<char>('a' + s.next().first);
  EXPECT_EQ(order, "abaabaaba");
}

TEST(ParseBlend, PairsOfWeightAndDirectory) {
  const auto parts = parse_blend({"0.3", "data/a", "7e-1", "data/b"}, "x");
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[1].dir, "data/b");
  EXPECT_DOUBLE_EQ(parts[1].weight, 0.7);
  EXPECT_NE(error_of({"0.3", "a", "0.7"}).find("t.toml: data.blend: expected weight and directory pairs"),
            std::string::npos);
  EXPECT_NE(error_of({}).find("got 0 entries"), std::string::npos);
  for (const char* bad : {"0", "-1", "nan", "inf", "0.3x", "", "data/a"})
    EXPECT_NE(error_of({bad, "a"}).find("entry 1 should be a positive weight"), std::string::npos) << bad;
  EXPECT_NE(error_of({"1", "a", "2", "a"}).find("a is listed twice"), std::string::npos);
  EXPECT_NE(error_of({"1", "data/a/", "2", "./data/a"}).find("./data/a is listed twice"), std::string::npos);
  EXPECT_NE(error_of({"1", ""}).find("entry 2 is an empty directory"), std::string::npos);
}
