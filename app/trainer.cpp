#include "app/trainer.hpp"

#include <cblas.h>
#include <omp.h>
#include <sys/resource.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <nlohmann/json.hpp>

#include "app/blas_core.hpp"
#include "app/checkpointing.hpp"
#include "app/preflight.hpp"
#include "app/pipeline_executor.hpp"
#include "app/validation.hpp"
#include "core/log.hpp"
#include "core/progress.hpp"
#include "core/ops.hpp"
#include "core/rng.hpp"
#include "core/tensorboard.hpp"
#include "data/sample_source.hpp"
#include "model/gpt.hpp"
#include "model/partition.hpp"
#include "parallel/cost_model.hpp"
#include "parallel/grad_buckets.hpp"
#include "parallel/loss_scaler.hpp"
#include "parallel/optimizer.hpp"
#include "schedules/batch_schedule.hpp"
#include "schedules/lr_schedule.hpp"

namespace mtnlg::app {

namespace {

// Processes of this job on this node, from the launcher's environment.
int64_t local_ranks() {
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"}) {
    const char* s = std::getenv(v);
    if (s && std::atoll(s) > 0) return std::atoll(s);
  }
  if (const char* s = std::getenv("SLURM_STEP_TASKS_PER_NODE"))  // "4" or "4(x2)"
    if (std::atoll(s) > 0) return std::atoll(s);
  return 1;
}

int64_t default_threads() {
  int64_t cores = omp_get_num_procs();
  return std::max<int64_t>(1, cores / local_ranks());
}

int64_t peak_rss_bytes() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;
}

// Achieved single-process sgemm rate (TFLOP/s) on a square problem: the CPU's
// practical peak, used for MFU when no peak is given.
// " | ETA 1h02m" once 10 iterations of this process have run: the mean step time of the
// last 10 times the iterations left (the batch ramp makes early estimates low); "" before.
std::string eta_text(const std::vector<IterationStats>& done, int64_t remaining) {
  constexpr size_t kWindow = 10;
  if (done.size() < kWindow || remaining <= 0) return "";
  double sum = 0;
  for (size_t i = done.size() - kWindow; i < done.size(); ++i) sum += done[i].step_time_s;
  return " | ETA " + human_duration(sum / kWindow * static_cast<double>(remaining));
}

double measure_cpu_sgemm_tflops() {
  // Best of several single-GEMM timings: a busy machine slows some of them down, and
  // the peak is what the hardware can do, not what it did once.
  const int n = 768;
  std::vector<float> a(n * n, 1.0f), b(n * n, 0.5f), c(n * n, 0.0f);
  double best = 1e30;
  for (int rep = 0; rep < 6; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 2.0 * n * n * n / best / 1e12;
}

class MetricsWriter {
 public:
  MetricsWriter(const std::string& dir, bool active) : active_(active) {
    if (!active_) return;
    std::filesystem::create_directories(dir);
    out_.open(std::filesystem::path(dir) / "metrics.jsonl", std::ios::app);
    if (!out_) throw_runtime("{}/metrics.jsonl: cannot open for writing", dir);
  }
  void write(const IterationStats& s, const Recipe& r, double loss_scale) {
    if (!active_) return;
    nlohmann::json j = {{"iteration", s.iteration},
                        {"consumed_samples", s.consumed_samples},
                        {"consumed_tokens", s.consumed_tokens},
                        {"loss", s.loss},
                        {"lr", s.lr},
                        {"global_batch_size", s.global_batch_size},
                        {"grad_norm", s.grad_norm},
                        {"step_time_s", s.step_time_s},
                        {"tokens_per_s", s.tokens_per_s},
                        {"tflops_per_gpu", s.tflops_per_gpu},
                        {"mfu", s.mfu},
                        {"skipped", s.skipped_total},
                        {"nan_iterations", s.nan_total},
                        {"peak_memory_bytes", s.peak_memory_bytes},
                        {"bytes_sent_tp", s.bytes_tp},
                        {"bytes_sent_pp", s.bytes_pp},
                        {"bytes_sent_dp", s.bytes_dp}};
    if (r.training.precision == Precision::fp16) j["loss_scale"] = loss_scale;
    if (!std::isfinite(s.loss)) j["loss"] = nullptr;
    out_ << j.dump() << "\n";
    out_.flush();
    if (!out_) throw_write_failed("metrics.jsonl", "logging.dir");
  }

 private:
  bool active_;
  std::ofstream out_;
};

// ---- testing aid: MTNLG_FAULT_INJECT="rank=R:iteration=I:mode=throw|abort|kill" ---------
// Global rank R fails at the start of iteration I (1-based): throw a RuntimeError (the
// normal error path: message, MPI_Abort), std::abort(), or raise(SIGKILL) on itself (a
// dead process with no goodbye). Tests use it to prove a failing rank ends the job.
struct FaultInjection {
  int64_t rank = -1, iteration = -1;
  std::string mode;
  bool active() const { return rank >= 0; }
};

FaultInjection fault_injection_from_env() {
  FaultInjection f;
  const char* env = std::getenv("MTNLG_FAULT_INJECT");
  if (!env || !*env) return f;
  const std::string spec(env);
  auto bad = [&](const std::string& why) {
    throw_input("MTNLG_FAULT_INJECT=\"{}\": {}; expected rank=R:iteration=I:mode=throw|abort|kill|sigterm|sigusr1|nan|overflow",
                spec, why);
  };
  std::stringstream ss(spec);
  for (std::string part; std::getline(ss, part, ':');) {
    auto eq = part.find('=');
    if (eq == std::string::npos) bad("'" + part + "' is not key=value");
    std::string key = part.substr(0, eq), val = part.substr(eq + 1);
    if (key == "mode") {
      if (val != "throw" && val != "abort" && val != "kill" && val != "sigterm" && val != "sigusr1" && val != "nan" &&
          val != "overflow")
        bad("unknown mode '" + val + "'");
      f.mode = val;
    } else if (key == "rank" || key == "iteration") {
      char* end = nullptr;
      long long x = std::strtoll(val.c_str(), &end, 10);
      if (val.empty() || *end != '\0' || x < 0) bad("'" + val + "' is not a whole number");
      (key == "rank" ? f.rank : f.iteration) = x;
    } else {
      bad("unknown key '" + key + "'");
    }
  }
  if (f.rank < 0 || f.iteration < 1 || f.mode.empty()) bad("rank, iteration (>= 1) and mode are all required");
  return f;
}

// mode=nan: from that iteration on, this rank's gradients are non-finite (the step is
// skipped and counted; max_nonfinite_in_a_row of them stop the run).
bool inject_nan(const FaultInjection& f, int64_t rank, int64_t iteration) {
  return f.active() && f.mode == "nan" && f.rank == rank && iteration >= f.iteration;
}

// mode=overflow: at that one iteration this rank's gradients are +inf (an fp16 overflow:
// the step is skipped on every rank and the loss scale backs off; the run goes on).
bool inject_overflow(const FaultInjection& f, int64_t rank, int64_t iteration) {
  return f.active() && f.mode == "overflow" && f.rank == rank && iteration == f.iteration;
}

void maybe_inject_fault(const FaultInjection& f, int64_t rank, int64_t iteration) {
  if (!f.active() || f.rank != rank || f.iteration != iteration || f.mode == "nan" || f.mode == "overflow") return;
  // Slurm's preemption / time-limit signals, delivered to this process for real.
  if (f.mode == "sigterm" || f.mode == "sigusr1") {
    std::raise(f.mode == "sigterm" ? SIGTERM : SIGUSR1);
    return;
  }
  std::fprintf(stderr, "mtnlg: rank %lld: MTNLG_FAULT_INJECT %s at iteration %lld\n", static_cast<long long>(rank),
               f.mode.c_str(), static_cast<long long>(iteration));
  std::fflush(stderr);
  if (f.mode == "kill") std::raise(SIGKILL);
  if (f.mode == "abort") std::abort();
  throw_runtime("rank {}: fault injected by MTNLG_FAULT_INJECT at iteration {}", rank, iteration);
}

// --comm-report: every rank appends its own bytes sent per group this iteration to
// LOGDIR/bytes_rank<R>.jsonl (metrics.jsonl is rank 0's only). The byte convention
// is the ring model of parallel/communicator.hpp; docs/PLANNER.md ("Measured bytes")
// relates it to comm_bytes_per_iteration.
class CommReport {
 public:
  CommReport(const std::string& dir, const parallel::ProcessGroups& g, bool active) : g_(g) {
    if (!active) return;
    std::filesystem::create_directories(dir);
    auto path = std::filesystem::path(dir) / fmt::format("bytes_rank{}.jsonl", g.rank);
    out_.open(path, std::ios::trunc);
    if (!out_) throw_runtime("{}: cannot open for writing", path.string());
  }
  // Zero every group's counter at the start of an iteration.
  void reset() const {
    for (auto* c : {g_.tp.get(), g_.pp.get(), g_.dp.get(), g_.embedding.get(), g_.mp.get(), g_.world.get()})
      if (c) c->reset_bytes();
  }
  void write(int64_t iteration, int64_t global_batch, int64_t micro_batches, int64_t dp_buckets, int64_t dp_buckets_early) {
    if (!out_.is_open()) return;
    auto b = [](const std::shared_ptr<parallel::Communicator>& c) -> int64_t { return c ? c->bytes_sent() : 0; };
    nlohmann::json j = {{"iteration", iteration},        {"rank", g_.rank},
                        {"tp_rank", g_.coord.tp},        {"pp_rank", g_.coord.pp},
                        {"dp_rank", g_.coord.dp},        {"global_batch_size", global_batch},
                        {"micro_batches", micro_batches}, {"tp", b(g_.tp)},
                        {"pp", b(g_.pp)},                {"dp", b(g_.dp)},
                        {"embedding", b(g_.embedding)},  {"mp", b(g_.mp)},
                        {"world", b(g_.world)},          {"dp_buckets", dp_buckets},
                        {"dp_buckets_started_early", dp_buckets_early}};
    out_ << j.dump() << "\n";
    out_.flush();
    if (!out_) throw_write_failed(fmt::format("bytes_rank{}.jsonl", g_.rank), "logging.dir");
  }

 private:
  const parallel::ProcessGroups& g_;
  std::ofstream out_;
};

}  // namespace

TrainSummary train(const Recipe& r, const parallel::ProcessGroups& g, const TrainOptions& opts) {
  const auto t_start = std::chrono::steady_clock::now();
  validate_layout(r, g.topo.world());
  const FaultInjection fault = fault_injection_from_env();  // testing aid; InputError when malformed
  const int64_t tp = g.topo.tp(), pp = g.topo.pp(), dp = g.topo.dp();
  const int64_t T = r.model.seq_length, mbs = r.training.micro_batch_size;
  const bool rank0 = g.rank == 0;
  // Outputs writable, checkpoint root locked and not overwritten (issue 17, app/preflight.hpp).
  const TrainPreflight preflight = preflight_train(r, g);

  // CPU threads per process: the recipe's, or the cores shared out among the ranks on
  // this node (mpirun -np 8 on 2 cores must not run 16 spinning OpenMP threads).
  const int threads = static_cast<int>(r.training.num_threads > 0 ? r.training.num_threads : default_threads());
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);

  // ---- model: this rank's chunks --------------------------------------------------------
  model::GptConfig cfg = model::GptConfig::from_recipe(r);
  const std::vector<model::ChunkSpec> specs = model::partition_chunks(r, g.coord.pp);
  const int64_t v = static_cast<int64_t>(specs.size());
  model::ParamStore store;
  for (const auto& s : specs) model::declare_chunk_params(store, cfg, s, g.coord.tp, tp);
  // fp32 master weights and gradients; the compute copy in the activation dtype.
  store.finalize(DType::f32, cfg.dtype);
  store.initialize(cfg.seed, cfg.init_std, cfg.num_layers_total);
  std::vector<std::unique_ptr<model::GptChunk>> chunks;
  for (auto& s : specs) chunks.push_back(std::make_unique<model::GptChunk>(cfg, s, store, g));

  // ---- optimizer ------------------------------------------------------------------------
  std::vector<parallel::ParamSegment> segs;
  int64_t local_params = 0;
  for (auto& p : store.infos()) {
    parallel::ParamSegment s;
    s.offset = p.offset;
    s.numel = p.numel;
    s.weight_decay = p.weight_decay;
    bool dup_tp = p.tp_replicated && g.coord.tp != 0;
    bool dup_embedding = p.word_embedding && pp > 1 && g.coord.pp != 0;
    s.count_in_norm = !dup_tp && !dup_embedding;
    if (s.count_in_norm) local_params += p.numel;
    segs.push_back(s);
  }
  parallel::DistributedAdamW optim(r.optimizer, segs, store.numel(), g, r.parallel.use_distributed_optimizer,
                                   r.parallel.ddp_bucket_size);
  // fp16: dynamic loss scaling (Megatron's rules); bf16 and fp32 need none.
  std::optional<parallel::DynamicLossScaler> scaler;
  if (r.training.precision == Precision::fp16) scaler.emplace(parallel::loss_scaler_config(r.optimizer));
  int64_t total_params = local_params;
  if (g.mp && g.mp->size() > 1) g.mp->all_reduce(&total_params, 1, parallel::ReduceOp::sum);

  // ---- data -----------------------------------------------------------------------------
  const auto run = schedules::run_length(r.training, T);
  std::shared_ptr<const data::SampleSource> source;
  std::string cache_dir = r.data.cache_dir.empty() ? r.logging.dir + "/index-cache" : r.data.cache_dir;
  if (r.data.mock)
    source = data::make_mock_source(r.model.vocab_size, T, static_cast<uint64_t>(r.training.seed));
  else
    source = data::make_blend_source(r, 0, run.samples, cache_dir);
  data::Loader loader(source, mbs, g.coord.dp, dp);

  // ---- output ---------------------------------------------------------------------------
  if (rank0) {
    std::filesystem::create_directories(r.logging.dir);
    write_file_checked((std::filesystem::path(r.logging.dir) / "recipe.resolved.yaml").string(), to_yaml(r), "logging.dir");
  }
  MetricsWriter metrics(r.logging.dir, rank0);
  CommReport comm_report(r.logging.dir, g, opts.comm_report);
  std::unique_ptr<tb::TensorBoardWriter> tensorboard;
  if (rank0 && r.logging.tensorboard) tensorboard = std::make_unique<tb::TensorBoardWriter>(r.logging.dir);
  double peak_tflops = r.logging.peak_tflops;
  std::string peak_what = "logging.peak_tflops";
  if (peak_tflops <= 0) {
    peak_tflops = measure_cpu_sgemm_tflops();
    if (g.world && g.world->size() > 1) g.world->all_reduce(&peak_tflops, 1, parallel::ReduceOp::max);
    peak_what = "measured CPU sgemm rate, " + blas_description();
  }
  if (!opts.quiet) {
    log::info("mtnlg train: {} | layout tp={} pp={} dp={} (world {}){}{} | {} parameters ({} on this rank)", r.name, tp, pp, dp,
              g.topo.world(), v > 1 ? fmt::format(" interleaved v={}", v) : "",
              cfg.sequence_parallel ? " +sequence-parallel" : "", human_count(static_cast<double>(total_params)),
              human_count(static_cast<double>(store.numel())));
    log::info("model: {} layers, hidden {}, {} heads, seq {}, vocab {} (padded {}) | precision {} | recompute {}{}",
              r.model.num_layers, r.model.hidden_size, r.model.num_attention_heads, T, r.model.vocab_size,
              cfg.padded_vocab_size, to_string(r.training.precision), to_string(r.parallel.recompute_granularity),
              optim.zero1() ? " | ZeRO-1 distributed optimizer" : "");
    log::info("run: {} iterations, {} samples, {} tokens | data: {} | MFU peak {:.3f} TFLOP/s ({})", run.iterations,
              human_count(static_cast<double>(run.samples)), human_count(static_cast<double>(run.tokens)),
              r.data.mock                                            ? std::string("mock tokens")
              : r.data.blend.size() == 1 && !r.data.blend[0].weighted ? "one unweighted source " + r.data.blend[0].prefix
                                                                      : fmt::format("blend of {} sources", r.data.blend.size()), peak_tflops, peak_what);
  }

  // ---- loop -----------------------------------------------------------------------------
  PipelineExecutor exec(r, g, chunks);
  // Data-parallel gradient reduction (without ZeRO-1): one owner of the buckets and the
  // overlap. The chunks report each parameter whose gradient is final during the last
  // micro batch's backward; the tied embedding (pp > 1) and sequence-parallel partial
  // gradients are deferred until reduce_shared_grads has run.
  const bool emb_shared = pp > 1 && g.embedding && g.embedding->size() > 1;
  const bool sp_shared = tp > 1 && r.parallel.sequence_parallel;
  std::vector<parallel::DpParam> dp_params;
  for (const auto& p : store.infos())
    dp_params.push_back({p.offset, p.numel, (p.word_embedding && emb_shared) || (p.sp_grad_reduce && sp_shared)});
  parallel::DataParallelGrads ddp(std::move(dp_params), optim.zero1() ? nullptr : g.dp, optim.bucket_size());
  for (auto& c : chunks) c->set_grad_ready_hook([&ddp](int64_t offset) { ddp.param_ready(offset); });
  const bool overlap_dp = ddp.active();
  TrainSummary summary;
  int64_t consumed = 0, iteration = 0, skipped_total = 0, nan_total = 0, nonfinite_in_a_row = 0;
  // ---- checkpoints: resume, then save on schedule / on a stop signal / at the end --------
  install_stop_signal_handlers();
  CheckpointManager ckpt(r, g, {tp, pp, dp, v, optim.zero1()});
  std::vector<int64_t> per_source(source->source_names().size(), 0);
  if (auto st = ckpt.resume(store, optim)) {
    consumed = st->consumed_samples;
    iteration = st->iteration;
    skipped_total = st->skipped_total;
    nan_total = st->nan_total;
    if (st->per_source_samples.size() == per_source.size()) per_source = st->per_source_samples;
    // An fp16 checkpoint carries its scaler; from a bf16/fp32 one the scaler starts fresh.
    if (scaler && st->loss_scaler)
      scaler->load_state({st->loss_scale, st->loss_scale_good_steps, st->loss_scale_hysteresis, st->loss_scale_skipped});
  }
  store.sync_weights();  // the compute copy of the (initialised or loaded) master weights
  int64_t last_saved = iteration;
  Validation validation(r, g, store, cfg, specs, cache_dir, iteration);  // training.eval_interval
  auto save_now = [&]() {
    model::ckpt::TrainState st;
    st.iteration = iteration;
    st.consumed_samples = consumed;
    st.consumed_tokens = consumed * T;
    st.optimizer_steps = optim.steps_taken();
    st.per_source_samples = per_source;
    st.skipped_total = skipped_total;
    st.nan_total = nan_total;
    st.seed = static_cast<uint64_t>(r.training.seed);
    if (scaler) {
      const auto ss = scaler->state();
      st.loss_scaler = true;
      st.loss_scale = ss.scale;
      st.loss_scale_good_steps = ss.growth_tracker;
      st.loss_scale_hysteresis = ss.hysteresis_tracker;
      st.loss_scale_skipped = ss.skipped_steps;
    }
    st.layout = {tp, pp, dp, v, optim.zero1()};
    st.recipe_yaml = to_yaml(r);
    ckpt.save(st, store, optim);
    last_saved = iteration;
  };
  const uint64_t seed = static_cast<uint64_t>(r.training.seed);
  const int64_t total_iters = run.iterations;
  loader.prefetch(consumed, schedules::global_batch_size(r.training, T, consumed));
  while (iteration < total_iters) {
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t gbs = schedules::global_batch_size(r.training, T, consumed);
    data::Batch batch = loader.get(consumed, gbs);
    const int64_t after = consumed + gbs;
    if (iteration + 1 < total_iters) loader.prefetch(after, schedules::global_batch_size(r.training, T, after));
    const double lr = schedules::learning_rate(r.optimizer, after * T, run.tokens);
    comm_report.reset();  // every group's byte counter, this iteration only
    maybe_inject_fault(fault, g.rank, iteration + 1);

    store.zero_grads();
    const double loss_scale = scaler ? scaler->scale() : 1.0;
    ddp.begin(store.grads());
    StepLoss sl = exec.run_batch(batch, consumed, mix_key(seed, static_cast<uint64_t>(iteration), 0xD0), loss_scale);
    // Grad reductions the model leaves to the end of the step: the tied word embedding
    // between first and last stage, and sequence-parallel partial grads over tp.
    exec.reduce_shared_grads(store);
    ddp.finish();  // every dp bucket summed (ZeRO-1 reduce-scatters inside optim.step instead)
    if (inject_nan(fault, g.rank, iteration + 1)) ops::fill(store.grads(), std::nan(""));
    if (inject_overflow(fault, g.rank, iteration + 1)) ops::fill(store.grads(), INFINITY);
    parallel::StepResult st = optim.step(store.params(), store.grads(), lr, &store.weights(), loss_scale);
    const double loss = sl.loss;
    const bool nonfinite = st.skipped || !std::isfinite(loss);
    // fp16: an overflow is the scaler's business (skip, back off), not a failure --
    // unless the scale cannot back off any further.
    const bool overflow_handled = scaler && st.skipped && loss_scale > r.optimizer.min_loss_scale;
    if (scaler) scaler->update(st.skipped);
    if (nonfinite) {
      ++skipped_total;
      if (!overflow_handled) {
        ++nan_total;
        ++nonfinite_in_a_row;
      }
    } else {
      nonfinite_in_a_row = 0;
    }
    consumed = after;
    ++iteration;
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    IterationStats s;
    s.iteration = iteration;
    s.consumed_samples = consumed;
    s.consumed_tokens = consumed * T;
    s.global_batch_size = gbs;
    s.loss = loss;
    s.lr = lr;
    s.grad_norm = st.grad_norm;
    s.skipped = nonfinite;
    s.skipped_total = skipped_total;
    s.nan_total = nan_total;
    s.loss_scale = loss_scale;
    s.step_time_s = dt;
    s.tokens_per_s = static_cast<double>(gbs * T) / dt;
    const double flops = parallel::model_flops(r.model, cfg.padded_vocab_size, gbs);
    s.tflops_per_gpu = flops / dt / static_cast<double>(g.topo.world()) / 1e12;
    s.mfu = s.tflops_per_gpu / peak_tflops;
    s.peak_memory_bytes = peak_rss_bytes();
    s.bytes_tp = g.tp ? g.tp->bytes_sent() : 0;
    s.bytes_pp = g.pp ? g.pp->bytes_sent() : 0;
    s.bytes_dp = g.dp ? g.dp->bytes_sent() : 0;
    comm_report.write(iteration, gbs, batch.micro_batches, overlap_dp ? ddp.num_buckets() : 0,
                      overlap_dp ? ddp.started_early() : 0);
    if (opts.on_iteration) opts.on_iteration(s);
    summary.iterations.push_back(s);

    if (iteration % r.logging.log_interval == 0 || iteration == total_iters) {
      metrics.write(s, r, s.loss_scale);
      if (tensorboard)
        tensorboard->log_iteration({{"loss", s.loss},
                                    {"lr", s.lr},
                                    {"global_batch_size", static_cast<double>(s.global_batch_size)},
                                    {"tokens_per_s", s.tokens_per_s},
                                    {"tflops_per_gpu", s.tflops_per_gpu},
                                    {"mfu", s.mfu},
                                    {"grad_norm", s.grad_norm},
                                    {"skipped", static_cast<double>(s.skipped_total)},
                                    {"nan_iterations", static_cast<double>(s.nan_total)},
                                    {"loss_scale", s.loss_scale},
                                    {"peak_memory_gib", static_cast<double>(s.peak_memory_bytes) / 1073741824.0}},
                                   s.iteration, s.consumed_tokens);
      if (!opts.quiet)
        log::info(
            " iteration {:>7}/{:<7} | consumed tokens: {:>10} | elapsed time per iteration (ms): {:8.1f} | tokens/s: {:9.1f} | "
            "TFLOP/s/GPU: {:6.3f} | MFU: {:5.1f}% | learning rate: {:.3E} | global batch size: {:5} | lm loss: {:.6E} | "
            "grad norm: {:.3f}{} | skipped: {} | nan: {} | mem: {} MiB | comm MB tp/pp/dp: {:.3f}/{:.3f}/{:.3f}{}",
            iteration, total_iters, s.consumed_tokens, dt * 1e3, s.tokens_per_s, s.tflops_per_gpu, 100 * s.mfu, lr, gbs, loss,
            st.grad_norm, scaler ? fmt::format(" | loss scale: {:.1f}", loss_scale) : "", skipped_total, nan_total,
            s.peak_memory_bytes >> 20, s.bytes_tp / 1e6, s.bytes_pp / 1e6,
            s.bytes_dp / 1e6,  // rank 0's bytes sent this iteration (ring model, parallel/communicator.hpp)
            eta_text(summary.iterations, total_iters - iteration));
    }
    for (size_t k = 0; k < per_source.size() && k < batch.per_source_samples.size(); ++k)
      per_source[k] += batch.per_source_samples[k];
    validation.after_iteration(iteration, consumed * T, tensorboard.get(), opts.quiet);
    ckpt.poll();
    if (nonfinite_in_a_row >= r.training.max_nonfinite_in_a_row) {
      if (ckpt.enabled()) {  // updates were skipped, so the weights are still the last good ones
        save_now();
        ckpt.finish();
      }
      throw_runtime("iteration {}: {} non-finite losses/gradients in a row (training.max_nonfinite_in_a_row); lower the lr "
                    "or check the data",
                    iteration, nonfinite_in_a_row);
    }
    // Slurm's preemption (SIGTERM) and time-limit warning (--signal=USR1@...): every rank
    // learns whether any rank got one, so they all stop after the same iteration.
    int64_t stop = stop_signal_received() ? 1 : 0;
    if (g.world && g.world->size() > 1) g.world->all_reduce(&stop, 1, parallel::ReduceOp::max);
    if (stop) {
      if (!ckpt.enabled()) throw_stopped_without_checkpoint("a stop signal", iteration);
      log::info("stop signal received: saving and exiting after iteration {}", iteration);
      if (ckpt.enabled() && last_saved != iteration) save_now();
      summary.interrupted = true;
      break;
    }
    if (r.checkpoint.save_interval > 0 && iteration % r.checkpoint.save_interval == 0 && ckpt.enabled()) save_now();
    if (r.training.exit_duration_mins > 0) {
      double mins = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count() / 60.0;
      if (g.world && g.world->size() > 1) g.world->all_reduce(&mins, 1, parallel::ReduceOp::max);
      if (mins >= r.training.exit_duration_mins) {
        if (!ckpt.enabled()) throw_stopped_without_checkpoint("training.exit_duration_mins", iteration);
        log::info("exiting after {:.1f} minutes (training.exit_duration_mins = {})", mins, r.training.exit_duration_mins);
        if (ckpt.enabled() && last_saved != iteration) save_now();
        summary.interrupted = true;
        break;
      }
    }
  }
  if (ckpt.enabled() && last_saved != iteration) save_now();
  ckpt.finish();
  if (!summary.interrupted) validation.at_end(iteration, consumed * T, tensorboard.get(), opts.quiet);
  summary.consumed_samples = consumed;
  summary.consumed_tokens = consumed * T;
  if (!opts.quiet && !summary.iterations.empty()) {
    const auto& f = summary.iterations.front();
    const auto& l = summary.iterations.back();
    log::info("done: {} iterations, {} tokens in {} | loss {:.4f} -> {:.4f}", iteration,
              human_count(static_cast<double>(summary.consumed_tokens)),
              human_duration(std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count()), f.loss,
              l.loss);
  }
  return summary;
}

}  // namespace mtnlg::app
