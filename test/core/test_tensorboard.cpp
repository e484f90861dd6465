// Tests for the hand-written TensorBoard event-file writer (core/tensorboard.cpp):
// the TFRecord CRC masking, protobuf wire bytes written out by
// hand, TFRecord framing, and an [oracle] check that Debian's python3-protobuf (and
// TensorBoard itself, where installed) reads back exactly what was written.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <regex>
#include <sstream>

#include "core/crc32c.hpp"
#include "core/error.hpp"
#include "core/tensorboard.hpp"
#include "test/support/test_support.hpp"

using namespace mtnlg;
using namespace mtnlg::test;

namespace {

std::string bytes(std::initializer_list<int> b) {
  std::string s;
  for (int x : b) s.push_back(static_cast<char>(x));
  return s;
}

uint64_t le64(const std::string& s, size_t at) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[at + i]);
  return v;
}
uint32_t le32(const std::string& s, size_t at) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[at + i]);
  return v;
}

// Splits a tfevents file into record payloads, checking framing and CRCs.
std::vector<std::string> split_records(const std::string& file) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < file.size()) {
    REQUIRE(file.size() - pos >= 12);
    const uint64_t len = le64(file, pos);
    REQUIRE(le32(file, pos + 8) == tb::mask_crc(crc32c(file.data() + pos, 8)));
    REQUIRE(pos + 12 + len + 4 <= file.size());
    std::string data = file.substr(pos + 12, len);
    REQUIRE(le32(file, pos + 12 + len) == tb::mask_crc(crc32c(data)));
    out.push_back(std::move(data));
    pos += 12 + len + 4;
  }
  return out;
}

}  // namespace

TEST_CASE("masked crc is the TFRecord rotation plus constant and inverts", "[tensorboard]") {
  CHECK(tb::mask_crc(0) == 0xa282ead8u);
  // 1 rotated right by 15 is 1 << 17.
  CHECK(tb::mask_crc(1) == (1u << 17) + 0xa282ead8u);
  for (uint32_t c : {0u, 1u, 0xE3069283u, 0xffffffffu, 0x12345678u}) CHECK(tb::unmask_crc(tb::mask_crc(c)) == c);
}

TEST_CASE("protobuf varints and tags are encoded as the wire format says", "[tensorboard]") {
  auto v = [](uint64_t x) {
    std::string s;
    tb::put_varint(s, x);
    return s;
  };
  CHECK(v(0) == bytes({0x00}));
  CHECK(v(1) == bytes({0x01}));
  CHECK(v(127) == bytes({0x7f}));
  CHECK(v(128) == bytes({0x80, 0x01}));
  CHECK(v(300) == bytes({0xac, 0x02}));
  // int64 -1 is ten bytes: nine 0xff and a final 0x01.
  CHECK(v(static_cast<uint64_t>(int64_t{-1})) == bytes({0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}));
  std::string t;
  tb::put_tag(t, 5, 2);
  CHECK(t == bytes({0x2a}));
}

TEST_CASE("a scalar Event serializes to the hand-computed bytes", "[tensorboard]") {
  // Event{wall_time: 1.0, step: 5, summary{value{tag:"a", simple_value:1.0}}}
  const std::string want = bytes({0x09, 0,    0,   0,    0,   0, 0, 0xf0, 0x3f,  // wall_time (double 1.0)
                                  0x10, 0x05,                                    // step 5
                                  0x2a, 0x0a,                                    // summary, 10 bytes
                                  0x0a, 0x08,                                    // value, 8 bytes
                                  0x0a, 0x01, 'a',                               // tag "a"
                                  0x15, 0,    0,   0x80, 0x3f});                 // simple_value 1.0f
  CHECK(tb::encode_scalar_event(1.0, 5, {{"a", 1.0f}}) == want);

  const std::string version = bytes({0x09, 0, 0, 0, 0, 0, 0, 0xf0, 0x3f, 0x1a, 0x0d}) + "brain.Event:2";
  CHECK(tb::encode_file_version_event(1.0) == version);
}

TEST_CASE("a record frames the data with a length and two masked CRCs", "[tensorboard]") {
  const std::string data = "hello";
  const std::string rec = tb::encode_record(data);
  REQUIRE(rec.size() == 8 + 4 + data.size() + 4);
  CHECK(le64(rec, 0) == 5u);
  CHECK(le32(rec, 8) == tb::mask_crc(crc32c(rec.data(), 8)));
  CHECK(rec.substr(12, 5) == data);
  CHECK(le32(rec, 17) == tb::mask_crc(crc32c(data)));
}

TEST_CASE("event file names follow the TensorFlow convention", "[tensorboard]") {
  CHECK(tb::event_file_name(1700000000, "node17", 4242, 0) == "events.out.tfevents.1700000000.node17.4242.0");
}

TEST_CASE("the writer produces a version record then scalar records", "[tensorboard]") {
  TempDir tmp("tb-writer");
  const auto dir = tmp / "tb";  // does not exist yet: the writer creates it
  std::string path;
  {
    tb::TensorBoardWriter w(dir.string());
    path = w.path();
    w.scalar("train/loss", 10.5, 1);
    w.log_iteration({{"loss", 9.25}, {"lr", 1e-4}}, 2, 4096);
  }
  CHECK(std::filesystem::path(path).parent_path() == dir);
  const std::string name = std::filesystem::path(path).filename().string();
  CHECK(std::regex_match(name, std::regex(R"(events\.out\.tfevents\.\d{10}\.[^/]+\.\d+\.\d+)")));
  auto recs = split_records(read_file(path));
  REQUIRE(recs.size() == 4);  // version, one scalar, two log_iteration events
  CHECK(recs[0].find("brain.Event:2") != std::string::npos);
  CHECK(recs[1].find("train/loss") != std::string::npos);
  CHECK(recs[2].find("train/lr") != std::string::npos);
  CHECK(recs[3].find("train-vs-tokens/loss") != std::string::npos);

  // A second writer in the same process and second gets a different file.
  tb::TensorBoardWriter w2(dir.string());
  CHECK(w2.path() != path);
}

TEST_CASE("the writer names the path when it cannot create its directory", "[tensorboard]") {
  TempDir tmp("tb-bad");
  write_file(tmp / "file", "x");
  try {
    tb::TensorBoardWriter w((tmp / "file" / "sub").string());
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::Matchers::Contains("file/sub"));
    CHECK(e.exit_code() == 1);
  }
}

TEST_CASE("python3-protobuf reads back what the writer wrote", "[oracle][tensorboard]") {
  if (!python_has("google.protobuf")) FAIL("Debian python3-protobuf missing: run scripts/install-deps.sh");
  TempDir tmp("tb-oracle");
  struct W {
    std::string tag;
    double value;
    int64_t step;
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<W> written = {
      {"train/loss", 10.8125, 1},     {"train/lr", 3.0e-4, 1},           {"train/loss", nan, 2},
      {"train/grad_norm", -0.0, 3},   {"train/mfu", 0.41, 270000000000}, {"train/loss_scale", 65536.0, -1},
      {"train/tokens_per_s", 1e30, 7}};
  std::string path;
  {
    tb::TensorBoardWriter w(tmp.str());
    path = w.path();
    for (auto& x : written) w.scalar(x.tag, x.value, x.step);
    // Several values in one Event, and the tokens helper.
    w.log_iteration({{"loss", 7.5}, {"global_batch_size", 32}}, 9, 131072);
  }
  written.push_back({"train/global_batch_size", 32, 9});
  written.push_back({"train/loss", 7.5, 9});
  written.push_back({"train-vs-tokens/global_batch_size", 32, 131072});
  written.push_back({"train-vs-tokens/loss", 7.5, 131072});

  auto r = run_command(python() + " " + source_dir() + "/test/core/read_tfevents.py " + path);
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  std::vector<W> read, tb_read;
  std::istringstream in(r.out);
  std::string line;
  int versions = 0;
  bool tb_skipped = false;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string kind;
    std::getline(ls, kind, '\t');
    if (kind == "version") {
      std::string v;
      std::getline(ls, v);
      CHECK(v == "brain.Event:2");
      ++versions;
    } else if (kind == "scalar" || kind == "tb_scalar") {
      std::string step, tag, value;
      std::getline(ls, step, '\t');
      std::getline(ls, tag, '\t');
      std::getline(ls, value);
      (kind == "scalar" ? read : tb_read).push_back({tag, std::strtod(value.c_str(), nullptr), std::stoll(step)});
    } else if (line.rfind("tensorboard:", 0) == 0) {
      tb_skipped = true;
    }
  }
  CHECK(versions == 1);
  auto same = [](const W& a, const W& b) {
    const float fa = static_cast<float>(a.value), fb = static_cast<float>(b.value);
    const bool values_match = (std::isnan(fa) && std::isnan(fb)) || (fa == fb && std::signbit(fa) == std::signbit(fb));
    return a.tag == b.tag && a.step == b.step && values_match;
  };
  REQUIRE(read.size() == written.size());
  for (size_t i = 0; i < read.size(); ++i) {
    INFO("record " << i << ": " << written[i].tag << " step " << written[i].step);
    CHECK(same(read[i], written[i]));
  }
  if (tb_skipped) {
    WARN("python tensorboard package not importable: EventAccumulator cross-check skipped");
  } else {
    // EventAccumulator groups by tag; compare as multisets of (tag, step, value).
    CHECK(tb_read.size() == written.size());
    for (auto& w : written) {
      bool found = false;
      for (auto& t : tb_read) found = found || same(t, w);
      INFO(w.tag << " step " << w.step);
      CHECK(found);
    }
  }
}

TEST_CASE("the python reader rejects a file with a corrupted byte", "[oracle][tensorboard]") {
  if (!python_has("google.protobuf")) FAIL("Debian python3-protobuf missing: run scripts/install-deps.sh");
  TempDir tmp("tb-corrupt");
  std::string path;
  {
    tb::TensorBoardWriter w(tmp.str());
    path = w.path();
    w.scalar("train/loss", 3.25, 1);
  }
  std::string bytes_on_disk = read_file(path);
  bytes_on_disk[bytes_on_disk.size() - 6] ^= 0x01;  // inside the last record's float
  write_file(path, bytes_on_disk);
  auto r = run_command(python() + " " + source_dir() + "/test/core/read_tfevents.py " + path);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.out, Catch::Matchers::Contains("data CRC mismatch"));
}
