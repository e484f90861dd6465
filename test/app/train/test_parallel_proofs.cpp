// Proofs of the 3D-parallel trainer beyond layout invariance (test_train_layouts.cpp):
//
//  1. Accounting: every rank's bytes sent per group and iteration (`mtnlg train
//     --comm-report` -> bytes_rank<R>.jsonl) equal a closed form derived from the
//     model's collectives (expected_bytes below), and, with the extras the planner
//     leaves out removed, the busiest rank equals cost::comm_bytes_per_iteration
//     (docs/PLANNER.md, "Measured bytes").
//  2. Faults: a rank that throws, aborts or is SIGKILLed ends the whole mpirun job
//     non-zero within 30 s (MTNLG_FAULT_INJECT), naming the rank when it can speak.
//  3. Impossible layouts exit 2 before anything is allocated, naming the constraint.
// The real-Slurm proof is in test_slurm_local.cpp.
#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "config/recipe.hpp"
#include "planner/cost_model.hpp"
#include "test/support/test_support.hpp"

using namespace mtnlg;

namespace {

std::string recipe_path() { return test::source_dir() + "/recipes/tiny-ramp.yaml"; }

std::string join_sets(const std::vector<std::string>& sets) {
  std::string s;
  for (auto& x : sets) s += " --set " + x;
  return s;
}

using test::mpirun;  // "sh test/support/mpi/mpirun.sh NP "

// One iteration's line of bytes_rank<R>.jsonl.
struct RankBytes {
  int64_t rank = 0, tp_rank = 0, pp_rank = 0, dp_rank = 0, gbs = 0, micro_batches = 0;
  double tp = 0, pp = 0, dp = 0, embedding = 0, mp = 0, world = 0;
};

// Ring-model shares (parallel/communicator.hpp): all-reduce 2(n-1)/n S, reduce-scatter /
// all-gather (n-1)/n S of the whole buffer.
double ar(double bytes, int64_t n) { return n > 1 ? 2.0 * double(n - 1) / double(n) * bytes : 0.0; }
double sg(double bytes, int64_t n) { return n > 1 ? double(n - 1) / double(n) * bytes : 0.0; }

struct Expected {
  double tp = 0, pp = 0, dp = 0, embedding = 0, mp = 0, world = 0;
  // Parts the planner's formula does not model (subtracted before comparing with it).
  double tp_extra = 0, dp_extra = 0;
};

// Bytes one rank sends in one iteration, derived from where the model, executor and
// optimizer call collectives (fp32 on the CPU: 4 bytes per element).
Expected expected_bytes(const Recipe& r, int64_t world, const RankBytes& at) {
  const int64_t t = r.tp(), p = r.pp(), d = world / (t * p);
  const int64_t v = r.parallel.num_layers_per_virtual_pipeline_stage > 0
                        ? r.model.num_layers / p / r.parallel.num_layers_per_virtual_pipeline_stage
                        : 1;
  const int64_t lc = r.model.num_layers / (p * v);  // layers per model chunk
  const double b = double(r.training.micro_batch_size), s = double(r.model.seq_length), h = double(r.model.hidden_size);
  const double f = double(r.model.ffn_hidden_size > 0 ? r.model.ffn_hidden_size : 4 * r.model.hidden_size);
  const double V = double(r.model.padded_vocab_size(t));
  const double maxpos =
      double(r.model.max_position_embeddings > 0 ? r.model.max_position_embeddings : r.model.seq_length);
  const double m = double(at.gbs) / (b * double(d));
  const double A = b * s * h * 4;  // one micro batch's activations, fp32
  const bool sp = r.parallel.sequence_parallel && t > 1;
  const bool full = r.parallel.recompute_granularity == RecomputeGranularity::full;
  const bool first = at.pp_rank == 0, last = at.pp_rank == p - 1;
  Expected e;

  // tp: per layer 2 collectives forward + 2 backward (+2 for the recomputed forward),
  // each an all-reduce of A, or under SP an all-gather + reduce-scatter pair of the same
  // total. Embedding: the vocab-parallel lookup's all-reduce (SP: reduce-scatter forward,
  // all-gather backward). Head: final LayerNorm output entering the column-parallel
  // logits GEMM (all-reduce backward; SP: all-gather forward + reduce-scatter backward)
  // and the cross-entropy's max / sum-exp / target-logit all-reduces of b*s fp32 each.
  // SP also all-reduces the partial grads of the replicated params once per iteration.
  if (t > 1) {
    double per_mb = double(v * lc) * (full ? 6 : 4) * ar(A, t);
    if (first) per_mb += ar(A, t);
    if (last) per_mb += ar(A, t) + 3 * ar(b * s * 4, t);
    e.tp = m * per_mb;
    e.tp_extra = last ? m * ar(A, t) : 0.0;
    if (sp) {
      double n_rep = double(v * lc) * 6 * h + (first ? maxpos * h : 0) + (last ? 2 * h : 0);
      e.tp += ar(4 * n_rep, t);
      e.tp_extra += ar(4 * n_rep, t);
    }
  }
  // pp: an activation forward per chunk except out of the last virtual stage, a gradient
  // backward per chunk except out of the first one (SP: local rows only).
  if (p > 1) {
    const double msg = sp ? A / double(t) : A;
    e.pp = m * double((v - (last ? 1 : 0)) + (v - (first ? 1 : 0))) * msg;
  }
  // dp: the whole gradient buffer of this rank; ZeRO-1 reduce-scatters and all-gathers
  // the buffer padded to a multiple of d and all-reduces the shard norms (one double).
  const double layer_params = (4 * h * h + 2 * h * f + 3 * h + f) / double(t) + 6 * h;
  double numel = double(v * lc) * layer_params;
  if (first) numel += V / double(t) * h + maxpos * h;
  if (last) numel += 2 * h + (p > 1 ? V / double(t) * h : 0);
  if (d > 1) {
    if (r.parallel.use_distributed_optimizer) {
      const double padded = std::ceil(numel / double(d)) * double(d);
      e.dp = 2 * sg(4 * padded, d) + ar(8, d);
      e.dp_extra = e.dp - 2 * sg(4 * numel, d);
    } else {
      e.dp = ar(4 * numel, d);
    }
  }
  // The tied word embedding's gradient between the first and the last stage.
  if (p > 1 && (first || last)) e.embedding = ar(4 * V / double(t) * h, 2);
  e.mp = ar(8, t * p);  // grad-norm partial sums (one double)
  // Batch loss and token count (two doubles, pipeline_executor.cpp) and the unanimous
  // skip flag for a non-finite grad norm (one int64, optimizer.cpp).
  e.world = ar(16, world) + ar(8, world);
  return e;
}

std::vector<RankBytes> read_rank_bytes(const std::filesystem::path& dir, int world) {
  std::vector<RankBytes> out;
  for (int rk = 0; rk < world; ++rk) {
    std::ifstream in(dir / ("bytes_rank" + std::to_string(rk) + ".jsonl"));
    INFO("bytes_rank" << rk << ".jsonl");
    REQUIRE(in);
    for (std::string line; std::getline(in, line);) {
      auto j = nlohmann::json::parse(line);
      RankBytes b;
      b.rank = j["rank"];
      b.tp_rank = j["tp_rank"];
      b.pp_rank = j["pp_rank"];
      b.dp_rank = j["dp_rank"];
      b.gbs = j["global_batch_size"];
      b.micro_batches = j["micro_batches"];
      b.tp = j["tp"];
      b.pp = j["pp"];
      b.dp = j["dp"];
      b.embedding = j["embedding"];
      b.mp = j["mp"];
      b.world = j["world"];
      REQUIRE(b.rank == rk);
      out.push_back(b);
    }
  }
  return out;
}

// Counters are rounded to whole bytes when read.
bool same_bytes(double got, double want) { return std::fabs(got - want) <= 1.0 + 1e-12 * std::fabs(want); }

}  // namespace

TEST_CASE("train --comm-report: every rank's bytes per group equal the planner's formulas", "[mpi]") {
  struct Case {
    const char* name;
    int np;
    std::vector<std::string> sets;
  };
  const std::string tp2 = "parallel.tensor_model_parallel_size=2", pp2 = "parallel.pipeline_model_parallel_size=2";
  const std::vector<Case> cases = {
      {"tp2", 2, {tp2}},
      {"pp2", 2, {pp2}},
      {"dp2", 2, {}},
      {"tp2-pp2-dp2", 8, {tp2, pp2}},
      {"tp2-pp2-dp2-zero1", 8, {tp2, pp2, "parallel.use_distributed_optimizer=true"}},
      {"tp2-dp2-sp", 4, {tp2, "parallel.sequence_parallel=true"}},
      // middle stages, interleaving (v = 2) and recompute (2 more tp collectives per layer)
      {"pp4-v2", 4, {"parallel.pipeline_model_parallel_size=4", "parallel.num_layers_per_virtual_pipeline_stage=1"}},
      {"tp2-pp2-recompute", 4, {tp2, pp2, "parallel.recompute_granularity=full"}},
  };
  for (const auto& c : cases) {
    SECTION(c.name) {
      std::vector<std::string> sets = c.sets;
      sets.push_back("training.train_iters=3");  // iterations 1-2 at batch 8 (ramp), 3 at 16
      sets.push_back("training.num_threads=1");
      const Recipe r = load_recipe(recipe_path(), sets);
      test::TempDir dir(std::string("comm-") + c.name);
      const std::string cmd = mpirun(c.np) + MTNLG_BINARY + " train " + recipe_path() + " --quiet --comm-report" +
                              join_sets(sets) + " --set logging.dir=" + dir.str();
      auto res = test::run_command("timeout -k 5 180 " + cmd);
      INFO(c.name << ": " << cmd << "\n" << res.out);
      REQUIRE(res.exit_code == 0);
      const auto rows = read_rank_bytes(dir.path(), c.np);
      REQUIRE(rows.size() == size_t(3 * c.np));

      const cost::Layout layout = cost::layout_from_recipe(r, c.np);
      std::map<int64_t, cost::CommBytes> busiest;  // iteration index -> max over ranks, planner's terms only
      std::map<int64_t, int64_t> gbs_of;
      int64_t row = 0;
      for (const auto& got : rows) {
        const int64_t it = row++ % 3;
        const Expected want = expected_bytes(r, c.np, got);
        INFO("rank " << got.rank << " (tp " << got.tp_rank << ", pp " << got.pp_rank << ", dp " << got.dp_rank
                     << ") iteration " << it + 1 << ", global batch " << got.gbs);
        CHECK(got.micro_batches == got.gbs / (r.training.micro_batch_size * layout.dp));
        CHECK(same_bytes(got.tp, want.tp));
        CHECK(same_bytes(got.pp, want.pp));
        CHECK(same_bytes(got.dp, want.dp));
        CHECK(same_bytes(got.embedding, want.embedding));
        CHECK(same_bytes(got.mp, want.mp));
        CHECK(same_bytes(got.world, want.world));
        auto& bz = busiest[it];
        bz.tp = std::max(bz.tp, got.tp - want.tp_extra);
        bz.pp = std::max(bz.pp, got.pp);
        bz.dp = std::max(bz.dp, got.dp - want.dp_extra);
        gbs_of[it] = got.gbs;
      }
      CHECK(gbs_of[0] < gbs_of[2]);  // the ramp really changed the batch (and so m)
      for (auto& [it, bz] : busiest) {
        const cost::CommBytes plan = cost::comm_bytes_per_iteration(r, layout, gbs_of[it]);
        INFO("iteration " << it + 1 << ": planner tp/pp/dp " << plan.tp << "/" << plan.pp << "/" << plan.dp
                          << ", measured (busiest rank, planner's terms) " << bz.tp << "/" << bz.pp << "/" << bz.dp);
        CHECK(same_bytes(bz.tp, plan.tp));
        CHECK(same_bytes(bz.dp, plan.dp));
        CHECK(same_bytes(bz.pp, plan.pp));
      }
    }
  }
}

TEST_CASE("train: the log line reports the bytes sent per group", "[mpi]") {
  test::TempDir dir("comm-log");
  auto res = test::run_command("timeout -k 5 120 " + mpirun(2) + MTNLG_BINARY + " train " + recipe_path() +
                               " --set training.train_iters=1 --set training.num_threads=1"
                               " --set parallel.tensor_model_parallel_size=2 --set logging.dir=" +
                               dir.str());
  INFO(res.out);
  REQUIRE(res.exit_code == 0);
  // tp2, micro batches 8, 8 layers: 8 * ((8*4 + 2) * A + 3 * 64) bytes with A = 2048.
  CHECK_THAT(res.out, Catch::Matchers::Contains("comm MB tp/pp/dp: 0.559/0.000/0.000"));
}

// ---- faults -------------------------------------------------------------------------

namespace {

test::RunResult run_with_fault(const std::string& fault, test::TempDir& dir) {
  // 4 ranks as tp2 x pp2: rank 3 is a last-stage rank that peers wait for in tp
  // all-reduces and pipeline receives. `timeout --verbose` bounds a hang at 30 s and
  // says so ("timeout: sending signal"); mpirun's own status can be 137 for a SIGKILLed
  // rank, so the exit code alone cannot tell.
  const std::string cmd = "MTNLG_FAULT_INJECT=" + fault + " timeout --verbose -k 5 30 " + mpirun(4) + MTNLG_BINARY +
                          " train " + recipe_path() +
                          " --quiet --set training.num_threads=1 --set parallel.tensor_model_parallel_size=2"
                          " --set parallel.pipeline_model_parallel_size=2 --set logging.dir=" +
                          dir.str();
  auto res = test::run_command(cmd);
  UNSCOPED_INFO(cmd << "\nexit " << res.exit_code << "\n" << res.out);
  return res;
}

}  // namespace

TEST_CASE("train: a rank that throws ends the whole job non-zero, naming the rank", "[mpi]") {
  test::TempDir dir("fault-throw");
  auto res = run_with_fault("rank=3:iteration=2:mode=throw", dir);
  CHECK(res.exit_code != 0);
  CHECK_THAT(res.out, !Catch::Matchers::Contains("timeout: sending signal"));
  CHECK_THAT(res.out, Catch::Matchers::Contains("error on rank 3"));
  CHECK_THAT(res.out, Catch::Matchers::Contains("fault injected by MTNLG_FAULT_INJECT at iteration 2"));
}

TEST_CASE("train: a rank killed with SIGKILL or aborting ends the whole job non-zero", "[mpi]") {
  for (const char* mode : {"kill", "abort"}) {
    SECTION(mode) {
      test::TempDir dir(std::string("fault-") + mode);
      auto res = run_with_fault(std::string("rank=3:iteration=2:mode=") + mode, dir);
      CHECK(res.exit_code != 0);
      CHECK_THAT(res.out, !Catch::Matchers::Contains("timeout: sending signal"));
      CHECK_THAT(res.out, Catch::Matchers::Contains("rank 3: MTNLG_FAULT_INJECT " + std::string(mode)));
    }
  }
}

TEST_CASE("train: a malformed MTNLG_FAULT_INJECT is an input error", "[e2e]") {
  test::TempDir dir("fault-bad");
  auto res = test::run_command("MTNLG_FAULT_INJECT=rank=1:mode=explode " + std::string(MTNLG_BINARY) + " train " +
                               recipe_path() + " --quiet --set logging.dir=" + dir.str());
  CHECK(res.exit_code == 2);
  CHECK_THAT(res.out, Catch::Matchers::Contains("MTNLG_FAULT_INJECT"));
  CHECK_THAT(res.out, Catch::Matchers::Contains("unknown mode 'explode'"));
}

// ---- impossible layouts --------------------------------------------------------------

TEST_CASE("train: an impossible layout exits 2 before allocating anything, naming the constraint", "[mpi]") {
  struct Bad {
    const char* name;
    int np;
    const char* sets;
    const char* message;
  };
  const Bad bad[] = {
      {"world not tp*pp*dp", 3, "--set parallel.tensor_model_parallel_size=2",
       "world size 3 is not divisible by tensor_model_parallel_size x pipeline_model_parallel_size = 2 x 1"},
      {"heads % tp", 4, "--set parallel.tensor_model_parallel_size=3",
       "model.num_attention_heads (4) must be divisible by parallel.tensor_model_parallel_size (3)"},
      {"layers % pp", 3, "--set parallel.pipeline_model_parallel_size=3",
       "model.num_layers (8) must be divisible by parallel.pipeline_model_parallel_size (3)"},
      {"layers % (pp*v)", 2,
       "--set parallel.pipeline_model_parallel_size=2 --set parallel.num_layers_per_virtual_pipeline_stage=3",
       "layers per pipeline stage (4) must be divisible by num_layers_per_virtual_pipeline_stage (3)"},
      {"microbatches vs interleaving", 8,
       "--set parallel.pipeline_model_parallel_size=4 --set parallel.num_layers_per_virtual_pipeline_stage=1 "
       "--set training.micro_batch_size=2",
       "microbatches per batch (2) must be a multiple of pipeline_model_parallel_size (4)"},
  };
  for (const auto& c : bad) {
    SECTION(c.name) {
      test::TempDir dir("bad-layout");
      const auto logdir = dir / "run";
      const std::string cmd = "timeout --verbose -k 5 60 " + mpirun(c.np) + MTNLG_BINARY + " train " + recipe_path() +
                              " " + c.sets + " --set logging.dir=" + logdir.string();
      auto res = test::run_command(cmd);
      INFO(c.name << ": " << cmd << "\n" << res.out);
      CHECK(res.exit_code == 2);
      CHECK_THAT(res.out, Catch::Matchers::Contains(c.message));
      CHECK(!std::filesystem::exists(logdir));  // nothing written: it stopped before any setup
    }
  }
}

// ---- data-parallel buckets reduced as soon as they are ready --------------------------

namespace {}  // namespace

TEST_CASE("train: dp gradient buckets start during the backward, same losses, deterministic", "[mpi]") {
  const std::string base = " --quiet --set training.num_threads=1 --set training.train_iters=4";
  test::TempDir ref_dir("buckets-ref");
  auto ref = test::run_command("timeout -k 5 120 " + std::string(MTNLG_BINARY) + " train " + recipe_path() + base +
                               " --set logging.dir=" + ref_dir.str());
  INFO(ref.out);
  REQUIRE(ref.exit_code == 0);
  const auto want = test::read_losses(ref_dir.path());
  REQUIRE(want.size() == 4);
  // pp2 with two model chunks per rank (v = 2) and dp2: chunk 1's gradients are final
  // while chunk 0 still runs its backward; small buckets (2000 elements) give many.
  const std::string layout =
      " --set parallel.pipeline_model_parallel_size=2 --set parallel.num_layers_per_virtual_pipeline_stage=2"
      " --set parallel.ddp_bucket_size=2000 --comm-report";
  std::vector<std::vector<double>> runs;
  for (int rep = 0; rep < 2; ++rep) {
    test::TempDir dir("buckets-" + std::to_string(rep));
    auto res = test::run_command("timeout -k 5 180 " + mpirun(4) + MTNLG_BINARY + " train " + recipe_path() + base +
                                 layout + " --set logging.dir=" + dir.str());
    INFO(res.out);
    REQUIRE(res.exit_code == 0);
    runs.push_back(test::read_losses(dir.path()));
    for (int rk = 0; rk < 4; ++rk) {
      std::ifstream in(dir / ("bytes_rank" + std::to_string(rk) + ".jsonl"));
      std::string line;
      REQUIRE(std::getline(in, line));
      auto j = nlohmann::json::parse(line);
      INFO("rank " << rk << ": " << line);
      CHECK(j["dp_buckets"].get<int64_t>() > 4);
      // Buckets of the chunk finished first are all-reduced before the step's end.
      CHECK(j["dp_buckets_started_early"].get<int64_t>() > 0);
      CHECK(j["dp_buckets_started_early"].get<int64_t>() < j["dp_buckets"].get<int64_t>());
    }
  }
  REQUIRE(runs[0].size() == want.size());
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i)
    worst = std::max(worst, std::fabs(runs[0][i] - want[i]) / std::fabs(want[i]));
  INFO("worst relative loss difference " << worst);
  CHECK(worst <= 1e-5);
  CHECK(runs[0] == runs[1]);  // bit-identical run to run
}
