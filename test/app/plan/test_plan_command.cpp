// `mtnlg plan` through the binary: JSON contract, human table, errors (exit 2, one
// line), search, and the SVG timeline rendered by headless Chromium.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "test/support/test_support.hpp"

using namespace mtnlg::test;

namespace {
std::string recipe(const std::string& name) { return source_dir() + "/recipes/" + name; }
int count_lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}
}  // namespace

TEST_CASE("plan --json has the interface keys", "[e2e]") {
  auto r = run_mtnlg("plan " + recipe("mtnlg-530b.yaml") +
                     " --gpus 2240 --gpu a100-80g --software megatron-deepspeed --json 2>/dev/null");
  REQUIRE(r.exit_code == 0);
  auto j = nlohmann::json::parse(r.out);
  for (const char* k : {"iteration_time_s", "tokens_per_s", "tflops_per_gpu", "model_tflops_per_gpu", "mfu",
                        "bubble_fraction", "peak_memory_gib", "fits", "stages"})
    CHECK(j.contains(k));
  CHECK(j["fits"].get<bool>());
  CHECK(j["software"] == "megatron-deepspeed");
  REQUIRE(j["stages"].size() == 35);
  CHECK(j["stages"][0].contains("memory_gib"));
  CHECK(j["stages"][0]["breakdown"].contains("activations_gib"));
  CHECK(j["iteration_time_s"].get<double>() == Approx(60.1).epsilon(0.05));
  CHECK(j["run"]["days"].get<double>() > 10);
}

TEST_CASE("plan prints a human table and honours --set and --tp/--pp/--dp", "[e2e]") {
  auto r = run_mtnlg("plan " + recipe("gpt3-175b.yaml") + " --dp 8 --gpu h100-80g");
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Matchers::Contains("iteration time"));
  CHECK_THAT(r.out, Catch::Matchers::Contains("tp8 pp16 dp8"));
  auto s = run_mtnlg("plan " + recipe("gpt3-175b.yaml") +
                     " --tp 4 --pp 8 --gpus 64 --set training.micro_batch_size=2 --json");
  REQUIRE(s.exit_code == 0);
  auto j = nlohmann::json::parse(s.out);
  CHECK(j["layout"]["tp"] == 4);
  CHECK(j["layout"]["dp"] == 2);
  CHECK(j["layout"]["micro_batch_size"] == 2);
}

// On this machine (no GPU, no driver) the installed cuDNN plans the recipe's attention
// graphs offline for the target GPU, through the driver stand-in beside the binary, and
// the bytes it asks for are in the plan's memory. Skipped, saying why, where the
// toolkit's cuDNN is missing.
TEST_CASE("plan asks the installed cuDNN for the recipe's attention and counts its workspace", "[e2e]") {
  const std::string base = "plan " + recipe("gpt2-124m.yaml") + " --gpu h100-80g --software mtnlg";
  auto r = run_mtnlg(base + " --json 2>/dev/null");
  REQUIRE(r.exit_code == 0);
  auto j = nlohmann::json::parse(r.out);
  REQUIRE(j.contains("cudnn"));
  if (!j["cudnn"]["planned"].get<bool>()) {
    const std::string why = j["cudnn"]["why"].get<std::string>();
    CHECK_THAT(why, Catch::Matchers::Contains("cuDNN") || Catch::Matchers::Contains("CUDA"));
    WARN("skipped: the installed cuDNN did not plan here: " << why);
    return;
  }
  // GPT-2 124M, micro batch 8, 12 heads of 64, sequence 1024 (docs/specs/cudnn-sdpa.md).
  CHECK(j["cudnn"]["forward_workspace_bytes"] == 256);
  CHECK(j["cudnn"]["backward_workspace_bytes"] == 256 + 8 * 12 * 1024 * 4);
  CHECK(j["cudnn"]["dq_accumulator_bytes"] == int64_t{8} * 12 * 1024 * 64 * 4);
  const double acc_gib = j["stages"][0]["breakdown"]["attention_workspace_gib"].get<double>();
  CHECK(acc_gib * (1 << 30) == Approx(256 + 8 * 12 * 1024 * 4 + 8 * 12 * 1024 * 64 * 4));
  // Deterministic: no accumulator, dP in the workspace; the allocator's peak grows by it.
  auto d = run_mtnlg(base + " --set training.deterministic_mode=true --json 2>/dev/null");
  REQUIRE(d.exit_code == 0);
  auto k = nlohmann::json::parse(d.out);
  REQUIRE(k["cudnn"]["planned"].get<bool>());
  const int64_t dp = int64_t{8} * 12 * 1024 * 1024 * 2;
  CHECK(k["cudnn"]["backward_workspace_bytes"] == 256 + 8 * 12 * 1024 * 4 + dp);
  CHECK(k["cudnn"]["dq_accumulator_bytes"] == 0);
  CHECK((k["allocator_peak_gib"].get<double>() - j["allocator_peak_gib"].get<double>()) * (1 << 30) ==
        Approx(double(dp) - 8.0 * 12 * 1024 * 64 * 4));
  // The human line, and a GPU without a device description.
  auto h = run_mtnlg(base + " 2>/dev/null");
  CHECK_THAT(h.out, Catch::Matchers::Contains("cuDNN attention  cuDNN 9.") &&
                        Catch::Matchers::Contains("plans it for h100-80g") &&
                        Catch::Matchers::Contains("24.00 MiB fp32 dQ accumulator"));
  auto a = run_mtnlg("plan " + recipe("gpt2-124m.yaml") + " --gpu a100-80g --software mtnlg 2>/dev/null");
  CHECK_THAT(a.out, Catch::Matchers::Contains("no device description of a100-80g"));
}

TEST_CASE("plan rejects impossible input with one line and exit 2", "[e2e]") {
  const std::string r530 = recipe("mtnlg-530b.yaml");
  struct Case {
    std::string args, expect;
  } cases[] = {
      {"plan " + r530 + " --gpus 100", "not divisible"},
      {"plan " + r530 + " --gpu v100", "a100-80g, h100-80g, h200-141g"},
      {"plan " + r530 + " --set parallel.tensor_model_parallel_size=3", "num_attention_heads"},
      {"plan " + r530 + " --set parallel.pipeline_model_parallel_size=4", "num_layers"},
      {"plan " + r530 + " --gpus 8 --search", "no layout of 8 GPUs"},
      {"plan " + r530 + " --gpus 2240 --dp 9", "does not equal"},
      // Llama 3 8B's 8 key/value groups cannot be split over 16 tensor ranks
      {"plan " + recipe("llama3-8b.yaml") + " --gpus 64 --tp 16 --pp 1", "num_query_groups (8)"},
  };
  for (auto& c : cases) {
    auto r = run_mtnlg(c.args);
    INFO(c.args << "\n" << r.out);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.out, Catch::Matchers::Contains(c.expect));
    CHECK(count_lines(r.out) == 1);
  }
}

TEST_CASE("plan --search ranks layouts of 4096 GPUs", "[e2e]") {
  auto r = run_mtnlg("plan " + recipe("mtnlg-530b.yaml") + " --gpus 4096 --search --json --top 3");
  REQUIRE(r.exit_code == 0);
  auto j = nlohmann::json::parse(r.out);
  CHECK(j["search"]["ranked"].size() == 3);
  CHECK(j["search"]["rejected"].contains("does not fit in GPU memory"));
  CHECK(j["gpus"] == 4096);
}

TEST_CASE("plan --svg renders a non-blank pipeline timeline in headless Chromium", "[e2e]") {
  if (run_command("command -v chromium >/dev/null 2>&1").exit_code != 0) {
    WARN("chromium not installed (scripts/install-deps.sh): skipping the render check");
    return;
  }
  TempDir dir("plan-svg");
  const std::string svg = (dir / "timeline.svg").string();
  auto r = run_mtnlg("plan " + recipe("tiny-mock.yaml") +
                     " --set parallel.pipeline_model_parallel_size=2 --set parallel.recompute_granularity=full --svg " +
                     svg);
  REQUIRE(r.exit_code == 0);
  const std::string png = (dir / "shot.png").string();
  auto shot = run_command("cd " + dir.str() +
                          " && timeout 120 chromium --headless --no-sandbox --disable-gpu "
                          "--user-data-dir=" +
                          dir.str() +
                          "/profile --hide-scrollbars --window-size=1510,200 "
                          "--screenshot=" +
                          png + " file://" + svg + " 2>&1");
  INFO(shot.out);
  REQUIRE(std::filesystem::exists(png));
  // Decode the PNG (8-bit RGB/RGBA, filters undone) and count coloured pixels: the
  // forward boxes are blue, the backward boxes green, so both must be present.
  write_file(dir / "count.py", R"PY(
import struct, sys, zlib
data = open(sys.argv[1], 'rb').read()
assert data[:8] == b'\x89PNG\r\n\x1a\n'
pos, idat, w = 8, b'', 0
while pos < len(data):
    n, kind = struct.unpack('>I4s', data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + n]
    if kind == b'IHDR':
        w, h, depth, ctype = struct.unpack('>IIBB', body[:10])
    elif kind == b'IDAT':
        idat += body
    pos += 12 + n
bpp = {2: 3, 6: 4}[ctype]
raw = zlib.decompress(idat)
stride = w * bpp
prev = bytearray(stride)
blue = green = 0
i = 0
for y in range(h):
    f = raw[i]; line = bytearray(raw[i + 1:i + 1 + stride]); i += 1 + stride
    for x in range(stride):
        a = line[x - bpp] if x >= bpp else 0
        b = prev[x]; c = prev[x - bpp] if x >= bpp else 0
        if f == 1: line[x] = (line[x] + a) & 255
        elif f == 2: line[x] = (line[x] + b) & 255
        elif f == 3: line[x] = (line[x] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c; pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    for x in range(0, stride, bpp):
        r, g, bl = line[x], line[x + 1], line[x + 2]
        if bl > 180 and r < 120: blue += 1
        if g > 140 and r < 100 and bl < 120: green += 1
    prev = line
print(blue, green)
)PY");
  auto cnt = run_command(python() + " " + (dir / "count.py").string() + " " + png);
  REQUIRE(cnt.exit_code == 0);
  int blue = 0, green = 0;
  REQUIRE(std::sscanf(cnt.out.c_str(), "%d %d", &blue, &green) == 2);
  INFO(cnt.out);
  CHECK(blue > 500);
  CHECK(green > 500);
}
