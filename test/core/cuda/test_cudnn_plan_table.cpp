// The real cuDNN in CI: every attention graph mtnlg builds -- every shipped recipe's
// problem at its tensor-parallel split, every shape the CUDA tests run, forward and
// backward, p 0 / 0.1, bf16 and fp16, the backward with the fp32 dQ accumulator and
// deterministic, and the grouped-query shapes of Llama 3 8B / 70B and the tests (bf16, p 0
// and 0.1), and context parallelism's blocks (the "cp" group) -- built by the production builders (core/cuda/cudnn_attention.cu) and
// planned by the toolkit's libcudnn without a GPU (cuDNN >= 9.8's offline planning) for an
// H100 and an H200 (core/cuda/cudnn_device.cpp: their data-sheet properties). Graphs with
// a planted mistake must be refused. Each plan's workspace goes into
// <build>/cudnn_plan_table/<gpu>-<group>.tsv. Under the emulated backend (test_core_emu, the ctest
// entry core.cudnn-plans), the emulated cuDNN must answer every case as the real library
// does: planned or refused, and the same workspace bytes.
//
// Hidden tag: the planning compiles kernels (a second or two per plan), so it runs once,
// as its own ctest entry, not in every core.unit run. Skipped, saying why, where the
// toolkit's cuDNN is missing or older than 9.8.
#ifdef MTNLG_HAVE_CUDA
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "config/recipe.hpp"
#include "core/cuda/cudnn_attention.hpp"
#include "core/cuda/cudnn_device.hpp"
#include "core/cuda/device.hpp"
#include "test/core/cuda/cuda_test_util.hpp"

using namespace mtnlg;
using cuda::SdpaGraph;
using test::emulated_device;
using test::gpu_ready;

namespace {

struct Problem {
  std::string from;  // a recipe file or a test
  int64_t B, T, H, D;
  int64_t G = 0;  // key/value heads (query groups); 0: as many as heads
};

// Every shipped recipe at its tp split: micro batch, sequence, local heads, head size. Left
// out: the long-context recipes with context parallelism (their ranks attend in blocks:
// the group "cp", cp_problems below) and the mixture-of-experts ones.
std::vector<Problem> recipe_problems() {
  std::vector<Problem> out;
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(std::string(MTNLG_SOURCE_DIR) + "/recipes"))
    if (e.path().extension() == ".yaml") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const auto& f : files) {
    const Recipe r = load_recipe(f.string());
    if (r.cp() > 1 || r.model.moe.enabled()) continue;
    const int64_t heads = r.model.num_attention_heads;
    out.push_back({f.filename().string(), r.training.micro_batch_size, r.model.seq_length, heads / r.tp(),
                   r.model.head_dim(), r.model.query_groups() / r.tp()});
  }
  return out;
}

// The shapes the [gpu] tests run the flash form at (test/core/cuda/test_cuda_ops.cpp,
// test/core/ops/op_cases.cpp, test/model/test_gpt_gpu.cpp) on the emulator and on a GPU,
// with the head sizes 160 (the 530B at tp 8) and 256.
std::vector<Problem> test_problems() {
  return {{"test: device keys", 2, 16, 2, 8},
          {"test: forms agree", 2, 23, 2, 64},
          {"test: dropout per key", 2, 40, 2, 32},
          {"test: real shapes (emulated)", 2, 203, 3, 64},
          {"test: real shapes (emulated)", 1, 160, 2, 128},
          {"test: real shapes (emulated)", 1100, 2, 60, 8},
          {"test: real shapes (GPU)", 4, 1024, 104, 64},
          {"test: real shapes (GPU)", 1, 2048, 8, 128},
          {"test: real shapes (GPU)", 1100, 20, 60, 16},
          {"test: rejects / supported", 2, 16, 2, 64},
          {"test: op table", 2, 7, 2, 8},
          {"test: model on the GPU", 2, 8, 2, 8},
          {"test: head size 160", 2, 40, 2, 160},
          {"test: head size 256", 2, 40, 2, 256}};
}

// Grouped-query attention (K and V with fewer heads; docs/specs/cudnn-sdpa.md): Llama 3
// 8B (32 heads, 8 groups, head 128, seq 8192, micro batch 1) at tp 1, 2, 4, 8, Llama 3
// 70B (64 heads, 8 groups) at tp 8, and the shapes the CUDA tests run (the op table's 2
// groups of 4 heads and MQA, the Llama model on the GPU with 3 samples): bf16 only, p 0
// and 0.1 (the deterministic backward at p 0), to keep the table's time small (every plan
// compiles its kernels).
std::vector<Problem> gqa_problems() {
  return {{"Llama 3 8B tp 1", 1, 8192, 32, 128, 8},     {"Llama 3 8B tp 2", 1, 8192, 16, 128, 4},
          {"Llama 3 8B tp 4", 1, 8192, 8, 128, 2},      {"Llama 3 8B tp 8", 1, 8192, 4, 128, 1},
          {"Llama 3 70B tp 8", 1, 8192, 8, 128, 1},     {"test: op table GQA", 2, 7, 8, 8, 2},
          {"test: op table MQA", 2, 7, 4, 8, 1},        {"test: llama on the GPU", 3, 128, 4, 64, 2},
          {"test: llama on the GPU", 3, 128, 4, 128, 1}};
}

// Context parallelism on CUDA (docs/specs/cudnn-sdpa.md, "Blocks"): B samples of L = 2c
// local rows per rank of `cp`, H local heads in G groups of head size D. The p2p ring's
// blocks: the diagonal (L x L causal), a lower rank's first chunk (L x c, no mask), the
// second chunk's queries against a higher rank's K/V (c x L, no mask); all_gather's: a
// chunk's c x c causal diagonal and the c x kc prefixes before it (k < 2 cp) against the
// gathered K/V. The recipes with context parallelism (Llama 3 8B 32k at tp 4 cp 2, 128k at
// tp 8 cp 8), GPT-2 124M's heads at cp 2 of 2048 and the shapes the cp tests run.
struct CpProblem {
  std::string from;
  int64_t B, L, H, D, G, cp;
  bool p2p_only = false;  // a recipe's: its own cp_comm_type (p2p), not all_gather's blocks too
};
std::vector<CpProblem> cp_problems() {
  return {{"llama3-8b-32k.yaml (cp 2)", 1, 16384, 8, 128, 2, 2, true},
          {"llama3-8b-128k.yaml (cp 8)", 1, 16384, 4, 128, 1, 8, true},
          {"GPT-2 124M heads, cp 2 of 2048", 1, 1024, 12, 64, 0, 2},
          {"test: cp blocks", 2, 8, 2, 8, 0, 4},
          {"test: cp blocks GQA", 2, 8, 4, 8, 2, 4},
          {"test: cp blocks MQA", 1, 16, 4, 16, 1, 2}};
}

struct Case {
  std::string from;
  SdpaGraph g;
  bool planted = false;  // must be refused
};

std::string describe(const SdpaGraph& g) {
  std::string s = fmt::format("{} {} B {} T {} H {} D {} p {}", g.forward ? "fwd" : "bwd", to_string(g.dt), g.B, g.T,
                              g.H, g.D, g.dropout_p);
  if (!g.forward) s += g.deterministic ? " deterministic" : " dQ-accumulator";
  if (g.G > 0 && g.G != g.H) s += fmt::format(" G {}", g.G);
  if (g.split)
    s +=
        fmt::format(" block {}x{} {} of rows {}/{}", g.T, g.Tkv, g.causal ? "causal" : "unmasked", g.q_rows, g.kv_rows);
  if (g.flaw == SdpaGraph::Flaw::stats_sub_for_add) s += " [planted: SUB for ADD in the statistics]";
  if (g.flaw == SdpaGraph::Flaw::fp32_probs) s += " [planted: P in fp32 to the second matmul]";
  if (g.flaw == SdpaGraph::Flaw::grouped_unsummed) s += " [planted: dK, dV not summed over the group]";
  return s;
}

// Every cp problem's blocks (cuda::cp_block_graphs: the graphs the training calls plan)
// for p2p and all_gather (a recipe's for its p2p only: all_gather's prefixes of the
// 128k recipe alone were a fifth of the table's time), forward and both backwards, bf16 and fp16 (bf16 only when
// grouped), p 0 (the blocks take no dropout).
std::vector<Case> cp_cases() {
  std::vector<Case> cases;
  for (const CpProblem& pr : cp_problems()) {
    const bool grouped = pr.G > 0 && pr.G != pr.H;
    for (DType dt : {DType::bf16, DType::f16})
      for (int64_t gather : {int64_t{0}, pr.cp})
        for (bool det : {false, true}) {
          if ((grouped && dt != DType::bf16) || (gather && pr.p2p_only)) continue;
          cuda::set_deterministic_attention(det);
          for (const SdpaGraph& g : cuda::cp_block_graphs(dt, pr.B, pr.L, pr.H, pr.D, pr.G, gather))
            if (det == false || !g.forward) cases.push_back({pr.from + (gather ? " all_gather" : " p2p"), g});
        }
  }
  cuda::set_deterministic_attention(false);
  return cases;
}

// The cases of one group: "recipes", "tests" (every graph of those problems), "cp"
// (context parallelism's blocks) or "planted".
std::vector<Case> cases_of(const std::string& group) {
  std::vector<Case> cases;
  if (group == "planted") {
    // The statistics as max - log(sum), P handed over in fp32, a head size that is no
    // multiple of 8 (both directions).
    SdpaGraph bad;
    bad.B = 2, bad.T = 64, bad.H = 2, bad.D = 64;
    bad.flaw = SdpaGraph::Flaw::stats_sub_for_add;
    cases.push_back({"planted", bad, true});
    bad.flaw = SdpaGraph::Flaw::fp32_probs;
    cases.push_back({"planted", bad, true});
    bad.dropout_p = 0.1;
    cases.push_back({"planted", bad, true});
    bad.flaw = SdpaGraph::Flaw::none;
    bad.dropout_p = 0;
    bad.D = 100;
    cases.push_back({"planted", bad, true});
    bad.forward = false;
    cases.push_back({"planted", bad, true});
    // A grouped backward (2 groups of 2 heads) whose dK and dV skip the sum over the
    // group's query heads.
    bad.D = 64, bad.H = 4, bad.G = 2;
    bad.flaw = SdpaGraph::Flaw::grouped_unsummed;
    cases.push_back({"planted", bad, true});
    // A context-parallel block (unmasked, 64 queries against 32 keys) with the first two
    // mistakes, and a causal one that is not square (refused before cuDNN is asked).
    SdpaGraph blk;
    blk.split = true, blk.causal = false;
    blk.B = 1, blk.T = 64, blk.Tkv = 32, blk.q_rows = 64, blk.kv_rows = 64, blk.H = 2, blk.D = 64;
    blk.flaw = SdpaGraph::Flaw::stats_sub_for_add;
    cases.push_back({"planted", blk, true});
    blk.flaw = SdpaGraph::Flaw::fp32_probs;
    cases.push_back({"planted", blk, true});
    blk.flaw = SdpaGraph::Flaw::none;
    blk.causal = true;
    cases.push_back({"planted", blk, true});
    return cases;
  }
  if (group == "cp") return cp_cases();
  std::vector<Problem> problems = group == "recipes" ? recipe_problems() : test_problems();
  if (group == "tests")
    for (const Problem& pr : gqa_problems()) problems.push_back(pr);
  std::set<std::tuple<bool, DType, int64_t, int64_t, int64_t, int64_t, int64_t, double, bool>> seen;
  for (const Problem& pr : problems) {
    const bool grouped = pr.G > 0 && pr.G != pr.H;
    for (DType dt : {DType::bf16, DType::f16})
      // One non-zero p: in the table of 2026-11-28 (cuDNN 9.19, both GPUs) p 0.2 was answered
      // exactly as p 0.1 in all 144 pairs (plan, workspace, accumulator), at a third of the
      // table's time.
      for (double p : {0.0, 0.1})
        for (int kind = 0; kind < 3; ++kind) {  // forward, backward with the accumulator, deterministic
          if (grouped && (dt != DType::bf16 || (kind == 2 && p > 0))) continue;
          SdpaGraph g;
          g.forward = kind == 0;
          g.deterministic = kind == 2;
          g.dt = dt;
          g.B = pr.B, g.T = pr.T, g.H = pr.H, g.D = pr.D, g.G = pr.G;
          g.dropout_p = p;
          if (seen.insert({g.forward, dt, g.B, g.T, g.H, g.G, g.D, p, g.deterministic}).second)
            cases.push_back({pr.from, g});
        }
  }
  return cases;
}

bool backend_is_emulated() { return cuda::cudnn_description("").find("emulated") != std::string::npos; }

// The device-property JSON a GPU's cuDNN serialized (test/fixtures/cudnn/<key>.json, saved
// by the GPU proof), else the data sheet's; `source` says which.
std::string device_json(const cuda::CudnnDevice& d, std::string* source) {
  const std::string saved = std::string(MTNLG_SOURCE_DIR) + "/test/fixtures/cudnn/" + d.key + ".json";
  if (std::ifstream f(saved); f) {
    *source = saved + " (serialized on the GPU)";
    return std::string(std::istreambuf_iterator<char>(f), {});
  }
  *source = "core/cuda/cudnn_device.cpp (data sheet)";
  return cuda::cudnn_device_json(d);
}

}  // namespace

// One section per (device, group), so that a part can be run alone (`-c h100 -c planted`);
// ctest runs them all.
void plan_table(const cuda::CudnnDevice& dev, const std::string& group) {
  const std::string real = cuda::cudnn_description("installed");
  if (real.rfind("cuDNN unavailable", 0) == 0) {
    WARN("skipped: the toolkit's cuDNN is missing here (" << real << ")");
    return;
  }
  const std::string driver = cuda::load_plan_driver(std::string(MTNLG_BINARY_DIR) + "/libmtnlg_cuda_standin.so");
  REQUIRE(driver.empty());
  const std::vector<Case> cases = cases_of(group);
  std::string source;
  const std::string json = device_json(dev, &source);

  // The real library's answers, planned by a few threads (each plan compiles kernels).
  struct Row {
    const Case* c;
    cuda::SdpaPlan real, emulated;
  };
  std::vector<Row> rows;
  for (const Case& c : cases) rows.push_back({&c, {}, {}});
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i; (i = next++) < rows.size();) rows[i].real = cuda::plan_offline(rows[i].c->g, json, "installed");
  };
  const unsigned n_threads = std::clamp(std::thread::hardware_concurrency(), 1u, 8u);
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < n_threads; ++t) pool.emplace_back(worker);
  for (auto& t : pool) t.join();

  const bool emulated = backend_is_emulated();
  if (emulated)
    for (Row& r : rows) r.emulated = cuda::plan_offline(r.c->g, json, "");

  // The table: one row per case, beside the build.
  std::filesystem::create_directories(std::string(MTNLG_BINARY_DIR) + "/cudnn_plan_table");
  const std::string path = std::string(MTNLG_BINARY_DIR) + "/cudnn_plan_table/" + dev.key + "-" + group + ".tsv";
  std::ofstream tsv(path);
  tsv << "# " << real << ", planned offline for " << dev.name << "; device properties: " << source << "\n"
      << "from\tgraph\tplanned\tworkspace_bytes\tdq_accumulator_bytes\temulated_planned\temulated_workspace\t"
         "refusal\n";
  for (const Row& r : rows)
    tsv << r.c->from << '\t' << describe(r.c->g) << '\t' << r.real.planned << '\t' << r.real.workspace << '\t'
        << r.real.accumulator << '\t' << (emulated ? std::to_string(r.emulated.planned) : "-") << '\t'
        << (emulated ? std::to_string(r.emulated.workspace) : "-") << '\t' << r.real.why << '\n';
  tsv.close();
  INFO(real << ": " << rows.size() << " plans for " << dev.key << ", table in " << path);

  for (const Row& r : rows) {
    INFO(dev.key << ": " << r.c->from << ": " << describe(r.c->g) << ": " << (r.real.planned ? "planned" : r.real.why));
    if (r.c->planted) {
      CHECK_FALSE(r.real.planned);
    } else {
      CHECK(r.real.planned);
    }
    if (emulated) {
      INFO("emulated: " << (r.emulated.planned ? "planned" : r.emulated.why));
      CHECK(r.emulated.planned == r.real.planned);
      CHECK(r.emulated.workspace == r.real.workspace);
      CHECK(r.emulated.accumulator == r.real.accumulator);
    }
  }
  if (!emulated)
    WARN("the emulated cuDNN's agreement is checked by test_core_emu (this backend is " << cuda::cudnn_description("")
                                                                                        << ")");
  // What cuDNN 9's default costs against the deterministic backward: GPT-2 124M at micro
  // batch 8 needs ~192 MiB of dP workspace deterministic, ~0.4 MiB + the 24 MiB accumulator
  // otherwise.
  for (const Row& r : rows)
    if (r.c->from == "gpt2-124m.yaml" && !r.c->g.forward && r.real.planned) {
      if (r.c->g.deterministic)
        CHECK(r.real.workspace > (int64_t{150} << 20));
      else
        CHECK(r.real.device_bytes() < (int64_t{64} << 20));
    }
}

TEST_CASE(
    "the real cuDNN plans every attention graph offline for H100 and H200, refuses planted mistakes, "
    "and the emulated cuDNN agrees",
    "[.cudnn-plans]") {
  for (const char* key : {"h100", "h200"}) SECTION(key) {
      const cuda::CudnnDevice* dev = cuda::cudnn_device(key);
      REQUIRE(dev);
      for (const char* group : {"planted", "tests", "recipes", "cp"}) SECTION(group) {
          plan_table(*dev, group);
        }
    }
}

// The same graphs as the trainer's calls plan them, on the emulated backend: what
// plan_offline answers is what fused_attention_supported (the handle's plans) answers.
TEST_CASE("offline plans and the backend's plans agree on the emulated cuDNN", "[gpu]") {
  if (!backend_is_emulated()) return;
  const std::string json = cuda::cudnn_device_json(*cuda::cudnn_device("h100"));
  for (int64_t D : {8, 64, 100, 160, 256, 264})
    for (bool det : {false, true}) {
      INFO("D " << D << (det ? " deterministic" : ""));
      SdpaGraph f, b;
      f.D = b.D = D;
      b.forward = false;
      b.deterministic = det;
      const bool offline = cuda::plan_offline(f, json).planned && cuda::plan_offline(b, json).planned;
      std::string why;
      cuda::set_deterministic_attention(det);
      CHECK(cuda::fused_attention_supported(DType::bf16, 1, 1, 1, D, 0.0, &why) == offline);
    }
  cuda::set_deterministic_attention(false);
  // A device the emulated cuDNN does not model is refused, saying so.
  cuda::CudnnDevice a100 = *cuda::cudnn_device("h100");
  a100.device_version = 800;
  const cuda::SdpaPlan r = cuda::plan_offline(SdpaGraph{}, cuda::cudnn_device_json(a100));
  CHECK_FALSE(r.planned);
  CHECK_THAT(r.why, Catch::Matchers::Contains("sm90"));
}

// On a real GPU: cuDNN's own description of it, written to cudnn_device_this_gpu.json in the
// working directory (the repository root, where the proof runs).
// The GPU proof copies it to test/fixtures/cudnn/h100.json or h200.json (docs/GPU.md),
// after which the plan table above plans for the real device instead of its data sheet.
TEST_CASE("cuDNN serializes this GPU's device properties for the offline plan table", "[gpu][cudnn-device]") {
  if (!gpu_ready()) return;
  const std::string json = cuda::device_json_of_gpu(cuda::backend_device());
  INFO(json);
  CHECK(json.find("deviceVer") != std::string::npos);
  CHECK(json.find("multiProcessorCount") != std::string::npos);
  // It plans like the data sheet's (the emulated GPU is sm90 too).
  const cuda::SdpaPlan mine = cuda::plan_offline(SdpaGraph{}, json);
  const cuda::SdpaPlan sheet = cuda::plan_offline(SdpaGraph{}, cuda::cudnn_device_json(*cuda::cudnn_device("h100")));
  CHECK(mine.planned == sheet.planned);
  if (!emulated_device()) std::ofstream("cudnn_device_this_gpu.json") << json << "\n";
}
#endif
