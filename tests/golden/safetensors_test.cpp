// Unit tests of the safetensors reader and writer (src/checkpoint/safetensors.h).
#include "checkpoint/safetensors.h"

#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using namespace kiln;
using namespace kiln::safetensors;

namespace {

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("kiln_st_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

std::vector<char> slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

void spit(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A raw file: 8-byte length, header text (unpadded), then `data_bytes` bytes of data.
void write_raw(const std::string& path, const std::string& header, size_t data_bytes,
               uint64_t claimed_len = UINT64_MAX) {
  std::vector<char> b(8);
  const uint64_t n = claimed_len == UINT64_MAX ? header.size() : claimed_len;
  for (int i = 0; i < 8; ++i) b[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  b.insert(b.end(), header.begin(), header.end());
  for (size_t i = 0; i < data_bytes; ++i) b.push_back(static_cast<char>(i));
  spit(path, b);
}

// Expects Reader(path) to throw a kiln::Error whose message contains every needle.
void expect_reject(const std::string& path, std::vector<std::string> needles) {
  try {
    Reader r(path);
    FAIL() << "accepted " << path << ", expected an error containing " << needles[0];
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << "message does not name the file: " << msg;
    for (const auto& n : needles)
      EXPECT_NE(msg.find(n), std::string::npos) << "message lacks '" << n << "': " << msg;
  }
}

}  // namespace

TEST(SafetensorsDType, NamesSizesAndMapping) {
  EXPECT_EQ(st_dtype_size(StDType::F32), 4u);
  EXPECT_EQ(st_dtype_size(StDType::BF16), 2u);
  EXPECT_EQ(st_dtype_size(StDType::F64), 8u);
  EXPECT_EQ(st_dtype_size(StDType::BOOL), 1u);
  EXPECT_EQ(st_dtype_name(StDType::F8_E4M3), "F8_E4M3");
  for (const char* n : {"BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16",
                        "I32", "U32", "F32", "F64", "I64", "U64"}) {
    auto t = parse_st_dtype(n);
    ASSERT_TRUE(t.has_value()) << n;
    EXPECT_EQ(st_dtype_name(*t), n);
  }
  EXPECT_FALSE(parse_st_dtype("f32").has_value());
  for (DType d : {DType::F32, DType::BF16, DType::F16, DType::I32})
    EXPECT_EQ(to_kiln_dtype(to_st_dtype(d)), d);
  EXPECT_FALSE(to_kiln_dtype(StDType::F64).has_value());
}

TEST_F(SafetensorsTest, RoundTripSeveralDTypesAndMetadata) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  std::vector<float> f32(3 * 5);
  for (auto& x : f32) x = nd(rng);
  std::vector<uint16_t> bf16(7), f16(9);
  std::vector<float> bf16_f(7), f16_f(9);
  for (size_t i = 0; i < bf16.size(); ++i) {
    bf16[i] = f32_to_bf16(nd(rng));
    bf16_f[i] = bf16_to_f32(bf16[i]);
  }
  for (size_t i = 0; i < f16.size(); ++i) {
    f16[i] = f32_to_f16(nd(rng));
    f16_f[i] = f16_to_f32(f16[i]);
  }
  std::vector<int32_t> i32 = {-3, 0, 7, 2147483647, -2147483647 - 1, 42};
  std::vector<double> f64 = {1.0 / 3.0, -2.5, 1e30};
  std::vector<uint8_t> u8 = {0, 1, 255};
  std::vector<int64_t> i64 = {-5, 1LL << 40};
  const float scalar = 3.25f;

  const std::string path = file("rt.safetensors");
  {
    Writer w(path);
    w.set_metadata("format", "pt");
    w.set_metadata("kiln.step", "123");
    w.set_metadata("quote\"and\\slash", "ünïcødé \n value");
    w.add_f32("a.f32", {3, 5}, f32);
    w.add("b.bf16", StDType::BF16, {7}, bf16.data(), bf16.size() * 2);
    w.add("c.f16", StDType::F16, {1, 9}, f16.data(), f16.size() * 2);
    w.add_i32("d.i32", {2, 3}, i32);
    w.add("e.f64", StDType::F64, {3}, f64.data(), f64.size() * 8);
    w.add("f.u8", StDType::U8, {3}, u8.data(), u8.size());
    w.add("g.i64", StDType::I64, {2}, i64.data(), i64.size() * 8);
    w.add("h.empty", StDType::F32, {0, 4}, nullptr, 0);
    w.add("i.scalar", StDType::F32, {}, &scalar, 4);
    EXPECT_EQ(w.size(), 9u);
    w.write();
  }
  // Nothing but the file itself is left in the directory (the temporary was renamed).
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator{}), 1);

  Reader r(path);
  EXPECT_EQ(r.path(), path);
  EXPECT_EQ(r.tensors().size(), 9u);
  EXPECT_EQ(r.data_offset() % 8, 0u) << "data section must start 8-byte aligned";
  EXPECT_EQ(r.file_size(), fs::file_size(path));
  for (const auto& t : r.tensors())
    EXPECT_EQ(t.begin % st_dtype_size(t.dtype), 0u) << t.name << " is not naturally aligned";
  EXPECT_EQ(r.metadata().size(), 3u);
  EXPECT_EQ(r.metadata("format"), "pt");
  EXPECT_EQ(r.metadata("kiln.step"), "123");
  EXPECT_EQ(r.metadata("quote\"and\\slash"), "ünïcødé \n value");
  EXPECT_THROW(r.metadata("nope"), Error);

  const TensorInfo& a = r.info("a.f32");
  EXPECT_EQ(a.dtype, StDType::F32);
  EXPECT_EQ(a.shape, (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(a.numel(), 15);
  EXPECT_EQ(a.nbytes(), 60u);
  EXPECT_EQ(r.read_f32("a.f32"), f32);
  EXPECT_EQ(r.read_f32("b.bf16"), bf16_f);
  EXPECT_EQ(r.read_f32("c.f16"), f16_f);
  EXPECT_EQ(r.read_i32("d.i32"), i32);
  auto e = r.read_f32("e.f64");
  for (size_t i = 0; i < f64.size(); ++i) EXPECT_EQ(e[i], static_cast<float>(f64[i]));
  EXPECT_EQ(r.read_i32("f.u8"), (std::vector<int32_t>{0, 1, 255}));
  EXPECT_THROW(r.read_i32("g.i64"), Error);  // 2^40 does not fit
  EXPECT_EQ(r.read_f32("h.empty").size(), 0u);
  EXPECT_EQ(r.info("h.empty").nbytes(), 0u);
  EXPECT_EQ(r.read_f32("i.scalar"), std::vector<float>{3.25f});
  EXPECT_EQ(r.info("i.scalar").shape.size(), 0u);

  // Raw bytes are exactly what went in.
  auto raw = r.read_bytes("b.bf16");
  ASSERT_EQ(raw.size(), bf16.size() * 2);
  EXPECT_EQ(std::memcmp(raw.data(), bf16.data(), raw.size()), 0);

  // Into kiln tensors: own dtype, and converted.
  Tensor t = r.read("c.f16");
  EXPECT_EQ(t.dtype(), DType::F16);
  EXPECT_EQ(t.shape(), (Shape{1, 9}));
  EXPECT_EQ(std::memcmp(t.raw(), f16.data(), 18), 0);
  Tensor t32 = r.read("b.bf16", DType::F32);
  for (size_t i = 0; i < bf16.size(); ++i) EXPECT_EQ(t32.data<float>()[i], bf16_f[i]);
  Tensor tbf = r.read("a.f32", DType::BF16);
  for (size_t i = 0; i < f32.size(); ++i) EXPECT_EQ(tbf.data<uint16_t>()[i], f32_to_bf16(f32[i]));
  Tensor ti = r.read("d.i32");
  EXPECT_EQ(ti.dtype(), DType::I32);
  EXPECT_EQ(ti.data<int32_t>()[3], 2147483647);
  EXPECT_THROW(r.read("e.f64"), Error);  // no kiln dtype for F64 ...
  Tensor tf64 = r.read("e.f64", DType::F32);  // ... unless converted
  EXPECT_EQ(tf64.data<float>()[0], static_cast<float>(f64[0]));

  // read_into checks the shape (unless reshaping) and the dtype pair.
  std::vector<float> buf(15);
  Tensor flat = Tensor::view(buf.data(), Shape{15}, DType::F32);
  EXPECT_THROW(r.read_into("a.f32", flat), Error);
  r.read_into("a.f32", flat, /*allow_reshape=*/true);
  EXPECT_EQ(buf, f32);
  std::vector<int32_t> ibuf(15);
  EXPECT_THROW(r.read_into("a.f32", Tensor::view(ibuf.data(), Shape{3, 5}, DType::I32)), Error);

  // An unknown tensor is an error naming the file and the tensor.
  try {
    r.info("no.such.tensor");
    FAIL();
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find(path), std::string::npos);
    EXPECT_NE(std::string(err.what()).find("no.such.tensor"), std::string::npos);
  }
  EXPECT_TRUE(r.contains("a.f32"));
  EXPECT_FALSE(r.contains("__metadata__"));

  // Reader is movable.
  Reader moved = std::move(r);
  EXPECT_EQ(moved.read_f32("a.f32"), f32);
}

TEST_F(SafetensorsTest, HeaderIsPaddedJsonThatListsEveryTensor) {
  const std::string path = file("pad.safetensors");
  Writer w(path);
  std::vector<float> v = {1, 2, 3};
  w.add_f32("x", {3}, v);
  w.set_metadata("k", "v");
  w.write();
  Reader r(path);
  EXPECT_EQ((8 + r.header_text().size()) % 8, 0u);
  // The stored header is the writer's JSON followed by spaces only.
  const std::string json = w.header_json();
  ASSERT_GE(r.header_text().size(), json.size());
  EXPECT_EQ(r.header_text().substr(0, json.size()), json);
  EXPECT_EQ(r.header_text().find_first_not_of(' ', json.size()), std::string::npos);
  EXPECT_NE(json.find("\"__metadata__\":{\"k\":\"v\"}"), std::string::npos) << json;
  EXPECT_NE(json.find("\"x\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]}"),
            std::string::npos)
      << json;
}

TEST_F(SafetensorsTest, NoMetadataAndNoTensors) {
  const std::string path = file("empty.safetensors");
  Writer(path).write();
  Reader r(path);
  EXPECT_TRUE(r.tensors().empty());
  EXPECT_TRUE(r.metadata().empty());
  EXPECT_EQ(r.file_size(), 16u);  // "{}" padded to 8 bytes
}

TEST_F(SafetensorsTest, BorrowedAndProducedTensorsAndOverwrite) {
  const std::string path = file("p.safetensors");
  std::vector<int32_t> borrowed = {1, 2, 3, 4};
  {
    Writer w(path);
    w.add_borrowed("b", StDType::I32, {2, 2}, borrowed.data(), 16);
    w.add_produced("p", StDType::F32, {2}, [](void* dst) {
      const float v[2] = {0.5f, -1.5f};
      std::memcpy(dst, v, 8);
    });
    // Replacing an entry keeps one tensor of that name.
    w.add_f32("r", {1}, {1.f});
    w.add_f32("r", {2}, {2.f, 3.f});
    EXPECT_EQ(w.size(), 3u);
    w.write();
  }
  {
    Reader r(path);
    EXPECT_EQ(r.read_i32("b"), borrowed);
    EXPECT_EQ(r.read_f32("p"), (std::vector<float>{0.5f, -1.5f}));
    EXPECT_EQ(r.read_f32("r"), (std::vector<float>{2.f, 3.f}));
  }
  // Writing again replaces the file atomically.
  Writer w2(path);
  w2.add_f32("only", {1}, {9.f});
  w2.write();
  Reader r2(path);
  EXPECT_EQ(r2.names(), std::vector<std::string>{"only"});
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator{}), 1);
}

TEST_F(SafetensorsTest, WriterRejectsBadInput) {
  const std::string path = file("w.safetensors");
  Writer w(path);
  std::vector<float> v(3);
  EXPECT_THROW(w.add("x", StDType::F32, {2, 2}, v.data(), 12), Error);  // 16 bytes needed
  EXPECT_THROW(w.add_f32("__metadata__", {3}, v), Error);
  EXPECT_THROW(w.add("neg", StDType::F32, {-1}, v.data(), 0), Error);
  EXPECT_THROW(w.add_produced("p", StDType::F32, {1}, nullptr), Error);

  // A producer that throws leaves no file and no temporary behind.
  Writer bad(path);
  bad.add_produced("p", StDType::F32, {1}, [](void*) { throw Error("device copy failed"); });
  EXPECT_THROW(bad.write(), Error);
  EXPECT_FALSE(fs::exists(path));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator{}), 0);

  // A missing directory is an error naming the file.
  Writer nodir(file("missing/dir/x.safetensors"));
  try {
    nodir.write();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("x.safetensors"), std::string::npos) << e.what();
  }
}

TEST_F(SafetensorsTest, RejectsMissingShortAndTruncatedFiles) {
  expect_reject(file("absent.safetensors"), {"cannot open"});

  const std::string tiny = file("tiny.safetensors");
  spit(tiny, {1, 0, 0});
  expect_reject(tiny, {"too short"});

  // Build a valid file, then cut it at various points.
  const std::string good = file("good.safetensors");
  Writer w(good);
  std::vector<float> v(100, 1.f);
  w.add_f32("weights", {10, 10}, v);
  w.add_f32("bias", {10}, std::vector<float>(10, 2.f));
  w.write();
  const auto bytes = slurp(good);
  ASSERT_NO_THROW(Reader{good});

  const std::string cut = file("cut.safetensors");
  // Inside the data section: the last tensor runs past the end.
  spit(cut, std::vector<char>(bytes.begin(), bytes.end() - 1));
  expect_reject(cut, {"past the end", "truncated"});
  // Inside the header.
  spit(cut, std::vector<char>(bytes.begin(), bytes.begin() + 20));
  expect_reject(cut, {"header length", "truncated"});
  // Header only.
  Reader rg(good);
  spit(cut, std::vector<char>(bytes.begin(), bytes.begin() + static_cast<long>(rg.data_offset())));
  expect_reject(cut, {"past the end"});
  // Trailing garbage after the last tensor.
  auto longer = bytes;
  longer.push_back(0);
  spit(cut, longer);
  expect_reject(cut, {"trailing"});
}

TEST_F(SafetensorsTest, RejectsCorruptHeaders) {
  const std::string p = file("bad.safetensors");
  auto check = [&](const std::string& header, size_t data_bytes,
                   std::vector<std::string> needles) {
    SCOPED_TRACE(header);
    write_raw(p, header, data_bytes);
    expect_reject(p, needles);
  };
  // A header length far beyond the limit (e.g. a file of another format).
  write_raw(p, "{}", 0, /*claimed_len=*/0x4141414141414141ull);
  expect_reject(p, {"exceeds the limit"});

  check("[1, 2]", 0, {"does not start with '{'"});
  check(" {}", 0, {"does not start with '{'"});
  check("{\"a\": {\"dtype\": \"F32\"", 0, {"not valid JSON"});
  check("{\"a\": 1}", 0, {"'a'", "not a JSON object"});
  check("{\"a\": {\"dtype\": \"F32\", \"shape\": [1]}}", 4, {"'a'", "lacks"});
  check("{\"a\": {\"dtype\": \"F31\", \"shape\": [1], \"data_offsets\": [0, 4]}}", 4,
        {"'a'", "unknown dtype 'F31'"});
  check("{\"a\": {\"dtype\": \"F32\", \"shape\": [-1], \"data_offsets\": [0, 4]}}", 4,
        {"'a'", "non-negative"});
  check("{\"a\": {\"dtype\": \"F32\", \"shape\": [1.5], \"data_offsets\": [0, 4]}}", 4,
        {"'a'", "non-negative"});
  check("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 4]}}", 4,
        {"'a'", "needs 8 bytes"});
  check("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 0]}}", 4,
        {"'a'", "reversed"});
  check("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0]}}", 4,
        {"'a'", "two integers"});
  check("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
        " \"b\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [2, 6]}}",
        8, {"overlaps"});
  check("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
        " \"b\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 12]}}",
        12, {"'b'", "hole"});
  check("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
        " \"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}",
        8, {"'a' twice"});
  check("{\"__metadata__\": {\"k\": 1}}", 0, {"metadata value of 'k'"});
  check("{\"__metadata__\": [1]}", 0, {"__metadata__"});
  check("{\"a\": {\"dtype\": \"F32\", \"shape\": [4611686018427387904, 4], "
        "\"data_offsets\": [0, 4]}}",
        4, {"'a'", "overflows"});
  // Invalid UTF-8 inside a string.
  check(std::string("{\"a\xff\": 1}"), 0, {"not valid JSON"});
}

TEST_F(SafetensorsTest, AcceptsHandWrittenFilesOfOtherWriters) {
  // Keys in any order, data offsets in another order than the keys, padding spaces,
  // a tensor kiln has no dtype for, explicit null-free metadata.
  const std::string p = file("other.safetensors");
  const std::string header =
      "{\"z\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [4, 6]},"
      " \"__metadata__\": {\"format\": \"pt\"},"
      " \"a\": {\"shape\": [1], \"data_offsets\": [0, 4], \"dtype\": \"F32\"}}     ";
  write_raw(p, header, 6);
  Reader r(p);
  EXPECT_EQ(r.names(), (std::vector<std::string>{"a", "z"}));
  EXPECT_EQ(r.metadata("format"), "pt");
  EXPECT_EQ(r.read_i32("z"), (std::vector<int32_t>{4, 5}));
}
