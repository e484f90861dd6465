#include "app/train/trainer.hpp"

#include <cblas.h>
#include <omp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>
#include <nlohmann/json.hpp>

#include "app/train/checkpointing.hpp"
#include "app/train/fault_injection.hpp"
#include "app/train/forensics.hpp"
#include "app/process/preflight.hpp"
#include "app/train/micro_batch_graphs.hpp"
#include "app/train/pipeline_executor.hpp"
#include "app/train/run_reports.hpp"
#include "app/train/step_timing.hpp"
#include "app/train/straggler.hpp"
#include "app/process/module_configs.hpp"
#include "app/process/device_watchdog.hpp"
#include "app/process/placement.hpp"
#include "app/train/validation.hpp"
#include "core/blas_core.hpp"
#include "model/flops.hpp"
#include "core/log.hpp"
#include "core/mem_account.hpp"
#include "core/parse.hpp"
#include "core/progress.hpp"
#include "core/ops.hpp"
#include "core/rng.hpp"
#include "core/tensorboard.hpp"
#include "data/sample_source.hpp"
#include "model/gpt.hpp"
#include "model/partition.hpp"
#include "planner/cost_model.hpp"
#include "parallel/comm_time.hpp"
#include "parallel/flight_recorder.hpp"
#include "parallel/grad_buckets.hpp"
#include "parallel/watchdog.hpp"
#include "optimizer/loss_scaler.hpp"
#include "core/switches.hpp"
#include "optimizer/model_optimizer.hpp"
#include "schedules/batch_schedule.hpp"
#include "schedules/lr_schedule.hpp"

namespace mtnlg::app {

namespace {

int64_t default_threads() {
  int64_t cores = omp_get_num_procs();
  return std::max<int64_t>(1, cores / parallel::local_process_count());
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

// ---- the trainer's parts: each built complete by its constructor ----------------------
// The Trainer's member initializer list builds them in dependency order (see Trainer).

// CPU threads per process: the recipe's, or the cores shared out among the ranks on
// this node (mpirun -np 8 on 2 cores must not run 16 spinning OpenMP threads). Sets
// them for OpenMP and OpenBLAS; returns the count.
int set_cpu_threads(const Recipe& r) {
  const int threads = static_cast<int>(r.training.num_threads > 0 ? r.training.num_threads : default_threads());
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
  return threads;
}

// This rank's chunks' parameters, declared (no buffers yet).
model::ParamStore declared_params(const model::GptConfig& cfg, const std::vector<model::ChunkSpec>& specs,
                                  const parallel::ProcessGroups& g) {
  model::ParamStore store;
  for (const auto& s : specs) model::declare_chunk_params(store, cfg, s, g.coord.tp, g.topo.tp());
  return store;
}

// This rank's model: its chunks' parameters in one ParamStore (fp32 master weights and
// gradients, the compute copy in the activation dtype) on the training device
// (training.device), and the chunks. The process groups are placed on that device here
// (NCCL tensor groups on GPUs) before the chunks are built: `groups` is what every
// later part talks over. Not copyable or movable: the chunks hold references to `store`.
struct TrainModel {
  TrainModel(const Recipe& r, const parallel::ProcessGroups& g)
      : unplaced(with_expert_groups(r, g)),
        cfg(model_config(r, unplaced)),
        specs(model::partition_chunks(pipeline_split(r), unplaced.coord.pp)),
        store(declared_params(cfg, specs, unplaced)),
        device(select_device(r.training.device, "training.device")),
        groups(parallel::place_groups(unplaced, device)) {
    configure_determinism(device, r.training.deterministic_mode);  // before the chunks plan their attention
    store.finalize(DType::f32, cfg.dtype, device);
    store.initialize(cfg.seed, cfg.init_std, cfg.num_layers_total);
    for (auto& s : specs) chunks.push_back(std::make_unique<model::GptChunk>(cfg, s, store, groups));
  }
  TrainModel(const TrainModel&) = delete;
  TrainModel& operator=(const TrainModel&) = delete;
  int64_t v() const { return static_cast<int64_t>(specs.size()); }  // virtual chunks on this rank

  // An MoE model's process groups gain the expert grid's (collective over world).
  static parallel::ProcessGroups with_expert_groups(const Recipe& r, parallel::ProcessGroups g) {
    if (r.model.moe.enabled()) parallel::add_expert_groups(g, r.ep(), r.etp());
    return g;
  }
  // The model, with this rank's place in the expert grid (which experts it declares).
  static model::GptConfig model_config(const Recipe& r, const parallel::ProcessGroups& g) {
    model::GptConfig c = gpt_config(r, /*moe=*/true);
    c.moe.ep_size = g.ep_size;
    c.moe.ep_rank = g.ecoord.ep;
    c.moe.etp_size = g.etp_size;
    c.moe.etp_rank = g.ecoord.etp;
    return c;
  }

  parallel::ProcessGroups unplaced;  // the caller's groups and the expert grid's, on the host
  model::GptConfig cfg;
  std::vector<model::ChunkSpec> specs;
  model::ParamStore store;
  Device device;
  parallel::ProcessGroups groups;
  std::vector<std::unique_ptr<model::GptChunk>> chunks;
};

// Whether a parameter counts in the gradient norm and the model size: not a tp rank's
// copy of a tp-replicated one (tp rank > 0), nor a later stage's copy of the tied word
// embedding.
// Routed experts are counted in their own region (ModelAdamW: every expert once over the
// expert model-parallel group).
bool counted_once(const model::ParamInfo& p, const parallel::ProcessGroups& g) {
  if (p.expert) return true;
  const bool dup_tp = p.tp_replicated && g.coord.tp != 0;
  const bool dup_embedding = p.word_embedding && g.topo.pp() > 1 && g.coord.pp != 0;
  return !dup_tp && !dup_embedding;
}

// The optimizer's segments of one region: the routed experts' or the others'.
std::vector<optimizer::ParamSegment> param_segments(const model::ParamStore& store, const parallel::ProcessGroups& g,
                                                    bool experts) {
  std::vector<optimizer::ParamSegment> segs;
  for (const auto& p : store.infos()) {
    if (p.expert != experts) continue;
    optimizer::ParamSegment s;
    s.offset = p.offset;
    s.numel = p.numel;
    s.weight_decay = p.weight_decay;
    s.count_in_norm = counted_once(p, g);
    segs.push_back(s);
  }
  return segs;
}

// The model's size: the tp x pp ranks of data-parallel replica 0 and cp rank 0, and the
// routed experts of expert-data-parallel replica 0 (a host sum over world).
int64_t model_size(const model::ParamStore& store, const parallel::ProcessGroups& g) {
  int64_t total = 0;
  for (const auto& p : store.infos()) {
    const bool replica0 = p.expert ? g.ecoord.edp == 0 : g.coord.dp == 0 && g.coord.cp == 0;
    if (replica0 && counted_once(p, g)) total += p.numel;
  }
  if (g.world && g.world->size() > 1) g.world->all_reduce(&total, 1, parallel::ReduceOp::sum);
  return total;
}

// fp16: dynamic loss scaling (Megatron's rules); bf16 and fp32 need none.
std::optional<optimizer::DynamicLossScaler> loss_scaler_if_fp16(const Recipe& r) {
  if (r.training.precision != Precision::fp16) return std::nullopt;
  return optimizer::DynamicLossScaler(loss_scaler_config(r.optimizer));
}

struct TrainOptimizer {
  TrainOptimizer(const Recipe& r, const TrainModel& m)
      : adamw(adamw_config(r.optimizer), param_segments(m.store, m.groups, false),
              param_segments(m.store, m.groups, true), m.store.expert_offset(), m.store.numel(), m.groups,
              r.parallel.use_distributed_optimizer, r.parallel.ddp_bucket_size, m.store.device()),
        scaler(loss_scaler_if_fp16(r)),
        total_params(model_size(m.store, m.groups)) {}

  optimizer::ModelAdamW adamw;
  // Optional because it exists for fp16 only: its absence is how the step, the log line
  // and checkpoints know there is no loss scale.
  std::optional<optimizer::DynamicLossScaler> scaler;
  int64_t total_params;
};

std::shared_ptr<const data::SampleSource> training_source(const Recipe& r, int64_t seq, int64_t samples,
                                                          const std::string& cache_dir) {
  if (r.data.mock) return data::make_mock_source(r.model.vocab_size, seq, static_cast<uint64_t>(r.training.seed));
  return data::make_blend_source(blend_spec(r), 0, samples, cache_dir);
}

// The run's length, the training samples and this data-parallel rank's loader.
struct TrainData {
  TrainData(const Recipe& r, const parallel::ProcessGroups& g)
      : run(schedules::run_length(r.training, r.model.seq_length)),
        cache_dir(r.data.cache_dir.empty() ? r.logging.dir + "/index-cache" : r.data.cache_dir),
        source(training_source(r, r.model.seq_length, run.samples, cache_dir)),
        loader(source, r.training.micro_batch_size, g.coord.dp, g.topo.dp()) {}

  schedules::RunLength run;
  std::string cache_dir;
  std::shared_ptr<const data::SampleSource> source;
  data::Loader loader;
};

// Rank 0 creates logging.dir and writes recipe.resolved.yaml into it; returns logging.dir.
const std::string& run_dir_with_recipe(const Recipe& r, bool rank0) {
  if (rank0) {
    std::filesystem::create_directories(r.logging.dir);
    write_file_checked((std::filesystem::path(r.logging.dir) / "recipe.resolved.yaml").string(), to_yaml(r),
                       "logging.dir");
  }
  return r.logging.dir;
}

std::unique_ptr<tb::TensorBoardWriter> tensorboard_if_on(const Recipe& r, bool rank0) {
  if (!rank0 || !r.logging.tensorboard) return nullptr;
  return std::make_unique<tb::TensorBoardWriter>(r.logging.dir);
}

// The MFU denominator (TFLOP/s) and where it came from.
struct MfuPeak {
  double tflops = 0;
  std::string what;
};

MfuPeak mfu_peak(const Recipe& r, const parallel::ProcessGroups& g, Device device) {
  MfuPeak peak{r.logging.peak_tflops, "logging.peak_tflops"};
  if (peak.tflops <= 0 && device == Device::cuda) {
    // GPUs: the data-sheet dense bf16 peak whatever the precision (Megatron's MFU
    // convention), so fp32 and bf16 runs are compared against one number.
    const GpuPeak p = gpu_peak(describe_device(device));
    peak = {p.tflops, p.what};
    if (peak.tflops <= 0 && g.rank == 0)
      log::warn("MFU is not reported: {}; set logging.peak_tflops to this GPU's dense bf16 peak (TFLOP/s)", p.what);
  } else if (peak.tflops <= 0) {
    peak.tflops = measure_cpu_sgemm_tflops();
    if (g.world && g.world->size() > 1) g.world->all_reduce(&peak.tflops, 1, parallel::ReduceOp::max);
    peak.what = "measured CPU sgemm rate, " + mtnlg::blas_description();
  }
  return peak;
}

// The family and its switches, one phrase: "gpt: learned positions, LayerNorm, GELU, tied"
// or "llama: rope base 500000, RMSNorm, SwiGLU, 8 query groups, untied, no linear biases".
std::string architecture_line(const ModelConfig& m) {
  const bool llama = m.rope() || m.rmsnorm() || m.swiglu || m.query_groups() != m.num_attention_heads ||
                     m.untie_embeddings_and_output_weights || !m.add_bias_linear;
  std::string s = llama ? "llama: " : "gpt: ";
  s += m.rope() ? fmt::format("rope base {:g}{}{}{}", m.rotary_base,
                              m.rotary_percent < 1 ? fmt::format(" on {:g}% of each head", 100 * m.rotary_percent) : "",
                              m.rotary_interleaved ? " interleaved" : "",
                              m.use_rope_scaling ? fmt::format(" scaled x{:g} (Llama 3.1)", m.rope_scaling_factor) : "")
                : std::string("learned positions");
  s += m.rmsnorm() ? ", RMSNorm" : ", LayerNorm";
  s += m.swiglu ? ", SwiGLU" : ", GELU";
  s += fmt::format(", ffn {}", m.ffn_hidden_size);
  if (m.query_groups() != m.num_attention_heads) s += fmt::format(", {} query groups", m.query_groups());
  if (m.kv_channels > 0) s += fmt::format(", head size {}", m.head_dim());
  s += m.untie_embeddings_and_output_weights ? ", untied" : ", tied";
  if (!m.add_bias_linear) s += m.add_qkv_bias ? ", biases on q/k/v only" : ", no linear biases";
  if (m.qk_layernorm) s += ", q/k head norms";
  return s;
}

// The banner: the run, the layout, the model and the data, once at set-up.
void log_banner(const Recipe& r, const TrainModel& m, const TrainOptimizer& o, const TrainData& d,
                const MfuPeak& peak) {
  const parallel::Topology& t = m.groups.topo;
  log::info("mtnlg train: {} | layout tp={} pp={} dp={}{} (world {}){}{} | {} parameters ({} on this rank)", r.name,
            t.tp(), t.pp(), t.dp(),
            t.cp() > 1 ? fmt::format(" cp={} ({})", t.cp(), to_string(r.parallel.cp_comm_type)) : "", t.world(),
            m.v() > 1 ? fmt::format(" interleaved v={}", m.v()) : "",
            m.cfg.sequence_parallel ? " +sequence-parallel" : "", human_count(static_cast<double>(o.total_params)),
            human_count(static_cast<double>(m.store.numel())));
  log::info(
      "model: {} layers, hidden {}, {} heads, seq {}, vocab {} (padded {}) | {} on {} | attention {} | recompute "
      "{}{}{}",
      r.model.num_layers, r.model.hidden_size, r.model.num_attention_heads, r.model.seq_length, r.model.vocab_size,
      m.cfg.padded_vocab_size, to_string(r.training.precision), describe_device(m.device),
      m.chunks.front()->attention_note(), to_string(r.parallel.recompute_granularity),
      o.adamw.zero1() ? " | ZeRO-1 distributed optimizer" : "",
      r.training.enable_cuda_graph ? " | CUDA graphs per micro batch" : "");
  log::info("architecture: {}", architecture_line(r.model));
  if (r.model.moe.enabled())
    log::info("experts: {} per MoE layer, top {}; {} parameters, {} active per token", r.model.moe.num_experts,
              r.model.moe.moe_router_topk, human_count(model::parameter_count(r.model, m.cfg.padded_vocab_size)),
              human_count(model::active_parameter_count(r.model, m.cfg.padded_vocab_size)));
  log::info(
      "run: {} iterations, {} samples, {} tokens | data: {} | MFU peak {:.3f} TFLOP/s ({}); TFLOP/s and MFU count "
      "model FLOPs {} per iteration (recompute not counted)",
      d.run.iterations, human_count(static_cast<double>(d.run.samples)), human_count(static_cast<double>(d.run.tokens)),
      r.data.mock                                             ? std::string("mock tokens")
      : r.data.blend.size() == 1 && !r.data.blend[0].weighted ? "one unweighted source " + r.data.blend[0].prefix
                                                              : fmt::format("blend of {} sources", r.data.blend.size()),
      peak.tflops, peak.what, model::model_flops_formula(r.model));
}

// The run directory's files and reports, straggler detection, step timing, TensorBoard,
// the MFU peak, then the banner (unless quiet).
struct TrainOutputs {
  TrainOutputs(const Recipe& r, const TrainModel& m, const TrainOptimizer& o, const TrainData& d,
               const TrainOptions& opts)
      : metrics(run_dir_with_recipe(r, m.groups.rank == 0), m.groups.rank == 0, m.groups.topo),
        comm_report(r.logging.dir, m.groups, opts.comm_report),
        memory_report(r.logging.dir, m.groups, opts.memory_report),
        straggler(r.logging, m.groups),  // collective when on (host names): every rank builds it
        step_timing(r.logging, m.groups),
        tensorboard(tensorboard_if_on(r, m.groups.rank == 0)),
        peak(mfu_peak(r, m.groups, m.device)) {
    if (!opts.quiet) log_banner(r, m, o, d, peak);
  }

  MetricsWriter metrics;  // rank 0's metrics.jsonl
  CommReport comm_report;
  MemoryReport memory_report;
  StragglerDetector straggler;
  StepTiming step_timing;                              // logging.step_timing
  std::unique_ptr<tb::TensorBoardWriter> tensorboard;  // null unless on (rank 0 only)
  MfuPeak peak;
};

// One region's parameters (the routed experts' or the others'), in the region's offsets.
std::vector<parallel::DpParam> dp_params(const model::ParamStore& store, bool experts) {
  std::vector<parallel::DpParam> params;
  const int64_t base = experts ? store.expert_offset() : 0;
  for (const auto& p : store.infos())
    if (p.expert == experts)
      params.push_back({p.offset - base, p.numel, p.word_embedding, p.sp_grad_reduce, p.tp_grad_reduce});
  return params;
}

// A value, absent unless the optimizer is ZeRO-1's distributed one.
std::optional<parallel::Zero1Shard> zero1_shard(optimizer::DistributedAdamW& adamw) {
  if (!adamw.zero1()) return std::nullopt;
  return parallel::Zero1Shard{adamw.shard_begin(), adamw.shard_end(), adamw.zero1_buffer()};
}

// The gradient reductions of both regions of the flat buffer (ModelAdamW): the
// parameters of the attention grid over dp x cp (with tp's and the embedding's), an MoE
// model's routed experts over their replicas (edp).
class ModelGrads {
 public:
  ModelGrads(const Recipe& r, const TrainModel& m, optimizer::ModelAdamW& o)
      : expert_offset_(o.expert_offset()),
        dense_(dp_params(m.store, false), m.groups, r.parallel.sequence_parallel, o.bucket_size(),
               zero1_shard(o.dense())) {
    if (o.experts())
      experts_.emplace(dp_params(m.store, true), optimizer::ModelAdamW::expert_groups(m.groups), false, o.bucket_size(),
                       zero1_shard(*o.experts()));
  }
  void begin(Tensor& grads) {
    Tensor d = grads.flat(0, expert_offset_);
    dense_.begin(d);
    if (!experts_) return;
    Tensor e = grads.flat(expert_offset_, grads.numel() - expert_offset_);
    experts_->begin(e);
  }
  void param_ready(int64_t offset) {
    if (offset < expert_offset_)
      dense_.param_ready(offset);
    else if (experts_)
      experts_->param_ready(offset - expert_offset_);
  }
  void finish() {
    dense_.finish();
    if (experts_) experts_->finish();
  }
  int64_t overlapped_buckets() const {
    return dense_.overlapped_buckets() + (experts_ ? experts_->overlapped_buckets() : 0);
  }
  int64_t started_early() const { return dense_.started_early() + (experts_ ? experts_->started_early() : 0); }

 private:
  int64_t expert_offset_;
  parallel::DataParallelGrads dense_;
  std::optional<parallel::DataParallelGrads> experts_;
};

// The pipeline executor and the step's gradient reductions, one owner of all of them
// (parallel::DataParallelGrads): the dp buckets and their overlap, the tied embedding and
// sequence-parallel partial gradients, ZeRO-1's reduce-scatter into the optimizer's shard.
// The chunks report each parameter whose gradient is final during the last micro batch's
// backward (the hooks installed here). Not copyable or movable: the hooks point at `ddp`.
struct TrainStep {
  TrainStep(const Recipe& r, TrainModel& m, TrainOptimizer& o)
      : exec(r, m.groups, m.chunks), stats(Tensor::empty({3}, DType::f64, m.device)), ddp(r, m, o.adamw) {
    ModelGrads* grads = &ddp;
    for (auto& c : m.chunks) c->set_grad_ready_hook([grads](int64_t offset) { grads->param_ready(offset); });
  }
  TrainStep(const TrainStep&) = delete;
  TrainStep& operator=(const TrainStep&) = delete;

  PipelineExecutor exec;
  // The step's statistics on the device, read once per step: [loss sum, tokens, squared grad norm].
  Tensor stats;
  ModelGrads ddp;
};

// A checkpoint's layout (layout-free: a cp run's checkpoint loads under any other cp, tp,
// pp or dp).
model::ckpt::Layout checkpoint_layout(const parallel::ProcessGroups& g, int64_t v, bool zero1) {
  const parallel::Topology& t = g.topo;
  model::ckpt::Layout l{t.tp(), t.pp(), t.dp(), v, zero1, t.cp()};
  if (g.edp) {  // an MoE model: its experts' files
    l.ep = g.ep_size;
    l.etp = g.etp_size;
    l.edp = g.edp->size();
  }
  return l;
}

// The stop signals' handlers (app/train/checkpointing.hpp) go in first, then the
// checkpoint manager.
CheckpointManager checkpoints_with_stop_handlers(const Recipe& r, const parallel::ProcessGroups& g,
                                                 model::ckpt::Layout layout) {
  install_stop_signal_handlers();
  return CheckpointManager(r, g, layout);
}

// The progress a run starts from (saved in checkpoints): zeros, or the resumed checkpoint's.
struct StartPoint {
  int64_t consumed = 0, iteration = 0, skipped_total = 0, nan_total = 0;
  std::vector<int64_t> per_source;  // samples drawn from each blend source
};

// Resume (weights, optimizer, counters, the fp16 scaler), then the compute copy of the
// (initialised or loaded) master weights.
StartPoint resume_or_start(CheckpointManager& ckpt, TrainModel& m, TrainOptimizer& o, size_t sources) {
  StartPoint p;
  p.per_source.assign(sources, 0);
  if (auto st = ckpt.resume(m.store, o.adamw)) {
    p.consumed = st->consumed_samples;
    p.iteration = st->iteration;
    p.skipped_total = st->skipped_total;
    p.nan_total = st->nan_total;
    if (st->per_source_samples.size() == p.per_source.size()) p.per_source = st->per_source_samples;
    // An fp16 checkpoint carries its scaler; from a bf16/fp32 one the scaler starts fresh.
    if (o.scaler && st->loss_scaler)
      o.scaler->load_state(
          {st->loss_scale, st->loss_scale_good_steps, st->loss_scale_hysteresis, st->loss_scale_skipped});
  }
  m.store.sync_weights();
  return p;
}

// ---- one training run: set-up, a step, logging, and the loop ---------------------------
class Trainer {
 public:
  Trainer(const Recipe& r, const parallel::ProcessGroups& g, const TrainOptions& opts);
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;
  TrainSummary run();  // the loop

 private:
  bool install_layer_observer();
  IterationStats train_step(const data::Batch& batch, double lr, std::chrono::steady_clock::time_point t0);
  // The step's memory (device or RSS peak, tensor bytes by role) and traffic (bytes per
  // group, host reads and uploads since the counts given) into `s`.
  void record_memory_and_traffic(IterationStats& s, int64_t reads_before, int64_t uploads_before) const;
  void training_log(IterationStats& s, const data::Batch& batch);
  bool stop_after_step();  // checkpoints, stop signals and exit conditions after a step
  struct StopCause;
  std::optional<StopCause> failure_stop() const;
  std::optional<StopCause> signal_stop() const;
  std::optional<StopCause> scheduled_stop() const;
  void save_now();
  void forward_backward(const data::Batch& batch, double loss_scale);
  StepRead read_step();
  StepRead replay_step(const data::Batch& batch, double loss_scale);  // spike forensics

  // Set-up is the member initializer list: members are declared in the order they are
  // built, each from the ones above it (so they are destroyed in the reverse order).
  // That order is the set-up's: its side effects (files, log lines) and its collectives
  // (the same order on every rank) follow it.
  const Recipe& r_;
  const TrainOptions& opts_;
  const std::chrono::steady_clock::time_point t_start_;
  const FaultInjector fault_;  // MTNLG_FAULT_INJECT, read after the layout check
  const int64_t T_;
  const bool rank0_;
  // Outputs writable, checkpoint root locked and not overwritten (app/process/preflight.hpp).
  const TrainPreflight preflight_;
  const int threads_;  // set before the model is built
  TrainModel model_;
  const parallel::ProcessGroups& g_;  // model_.groups: placed on the training device
  DeviceWatchdogRun watchdog_;        // NCCL groups: their watchdog and flight recorder
  TrainOptimizer optim_;
  TrainData data_;
  TrainOutputs out_;
  TrainStep step_;
  TrainSummary summary_;
  CheckpointManager ckpt_;
  const StartPoint start_;  // resumed from ckpt_ (weights, optimizer, scaler too), or zeros
  // progress (saved in checkpoints)
  int64_t consumed_, iteration_, skipped_total_, nan_total_, nonfinite_in_a_row_ = 0;
  std::vector<int64_t> per_source_;
  int64_t last_saved_;
  Validation validation_;  // training.eval_interval, from the resumed iteration
  // spike and NaN forensics (app/train/forensics.hpp); the message of a stop it asked for
  Forensics forensics_;
  std::string forensics_stop_;
};

Trainer::Trainer(const Recipe& r, const parallel::ProcessGroups& g, const TrainOptions& opts)
    : r_(r),
      opts_(opts),
      t_start_(std::chrono::steady_clock::now()),
      fault_(checked_fault_injection(r, g), g.rank),
      T_(r.model.seq_length),
      rank0_(g.rank == 0),
      preflight_(preflight_train(r, g)),
      threads_(set_cpu_threads(r)),
      model_(r, g),
      g_(model_.groups),
      watchdog_(r.logging.dir, g_, r.parallel.heartbeat_timeout_minutes * 60),
      optim_(r, model_),
      data_(r, g_),
      out_(r, model_, optim_, data_, opts),
      step_(r, model_, optim_),
      ckpt_(checkpoints_with_stop_handlers(r, g_, checkpoint_layout(g_, model_.v(), optim_.adamw.zero1()))),
      start_(resume_or_start(ckpt_, model_, optim_, data_.source->source_names().size())),
      consumed_(start_.consumed),
      iteration_(start_.iteration),
      skipped_total_(start_.skipped_total),
      nan_total_(start_.nan_total),
      per_source_(start_.per_source),
      last_saved_(iteration_),
      validation_(r, g_, model_.store, model_.cfg, model_.specs, data_.cache_dir, iteration_),
      forensics_(r, g_, data_.source, step_.exec) {
  const bool observer = install_layer_observer();  // it calls back into this Trainer: installed once it is whole
  if (r.training.enable_cuda_graph) {
    const std::string why = cuda_graph_refusal(r, model_.device, observer);
    if (!why.empty()) throw_input("training.enable_cuda_graph: {}", why);
    // With an overlapped data-parallel reduction the last micro batch's backward starts it.
    step_.exec.enable_cuda_graphs(/*eager_last_micro_batch=*/step_.ddp.overlapped_buckets() > 0);
  }
}

// Spike and NaN forensics, and the layer observer it shares with the poison fault: the
// chunks get one only when either is on, so a run without them pays nothing. Whether it
// installed one.
bool Trainer::install_layer_observer() {
  const bool poison = fault_.poisons();
  if (!forensics_.watches_steps() && !poison) return false;
  for (auto& c : model_.chunks)
    c->set_layer_observer([this, poison](int64_t layer, const model::TrainMicroBatch& mb, Tensor& out) {
      if (poison && fault_.poisons(layer, iteration_ + 1) &&
          mb.sample_offset == consumed_ + g_.coord.dp * r_.training.micro_batch_size)
        ops::fill(out, std::nan(""));
      forensics_.observe(layer, mb, out);
    });
  return true;
}

namespace {
// The step's routing record of every MoE layer of the model, summed over the job's ranks
// (each routes its own tokens: its micro batches, its rows of them under sequence
// parallelism, its pipeline stage's layers), written back into the chunks' records so that
// the expert-bias update reads the whole batch's counts. A host sum over world.
std::vector<model::MoeLayerStats> gather_moe_stats(std::vector<std::unique_ptr<model::GptChunk>>& chunks,
                                                   const model::MoeLayerConfig& cfg, const parallel::ProcessGroups& g) {
  const int64_t E = cfg.num_experts, W = E + 4;  // tokens, dropped, aux, z, forwards
  std::vector<int64_t> slot(cfg.layers.size(), -1);
  int64_t n = 0;
  for (size_t l = 0; l < cfg.layers.size(); ++l)
    if (cfg.layers[l]) slot[l] = n++;
  std::vector<double> v(static_cast<size_t>(n * W), 0.0);
  for (const auto& c : chunks)
    for (model::MoeLayerStats& st : c->moe_stats()) {
      st.take_record();  // a layer with fixed-size groups recorded on its device
      double* row = v.data() + slot[static_cast<size_t>(st.layer)] * W;
      for (size_t e = 0; e < st.tokens.size(); ++e) row[e] = st.tokens[e];
      row[E] = static_cast<double>(st.dropped);
      row[E + 1] = st.aux;
      row[E + 2] = st.z;
      row[E + 3] = static_cast<double>(st.forwards);
    }
  if (g.world && g.world->size() > 1) g.world->all_reduce(v.data(), n * W, parallel::ReduceOp::sum);
  std::vector<model::MoeLayerStats> all;
  for (size_t l = 0; l < cfg.layers.size(); ++l) {
    if (slot[l] < 0) continue;
    const double* row = v.data() + slot[l] * W;
    model::MoeLayerStats st{static_cast<int64_t>(l),         {}, static_cast<int64_t>(row[E]), row[E + 1], row[E + 2],
                            static_cast<int64_t>(row[E + 3])};
    if (st.forwards > 0) st.tokens.assign(row, row + E);
    all.push_back(st);
  }
  for (auto& c : chunks)
    for (model::MoeLayerStats& st : c->moe_stats()) {
      Tensor record = st.record;
      st = all[static_cast<size_t>(slot[static_cast<size_t>(st.layer)])];
      st.record = record;
    }
  return all;
}

// The step's MoE record from every layer's routing (gather_moe_stats). `seq_parts`: the
// ranks one micro batch's tokens are split over (each holds a part of its losses).
void record_moe(IterationStats& s, const std::vector<model::MoeLayerStats>& all, const model::MoeLayerConfig& cfg,
                int64_t seq_parts) {
  s.moe = true;
  double aux = 0, z = 0;
  int64_t layers = 0;
  for (const model::MoeLayerStats& st : all) {
    if (st.tokens.empty()) continue;
    IterationStats::MoeLayerLoad l;
    l.layer = st.layer;
    l.tokens = st.tokens;
    l.dropped = st.dropped;
    double sum = 0;
    for (double t : st.tokens) sum += t;
    const double mean = sum / static_cast<double>(st.tokens.size());
    const auto [lo, hi] = std::minmax_element(st.tokens.begin(), st.tokens.end());
    l.min_over_mean = mean > 0 ? *lo / mean : 0;
    l.max_over_mean = mean > 0 ? *hi / mean : 0;
    s.moe_layers.push_back(std::move(l));
    const double n = static_cast<double>(std::max<int64_t>(st.forwards, 1)) / static_cast<double>(seq_parts);
    aux += st.aux / n;
    z += st.z / n;
    ++layers;
  }
  if (layers == 0) return;
  if (cfg.aux_coeff > 0 && cfg.balancing != model::MoeBalancing::none) s.moe_aux_loss = aux / layers;
  if (cfg.z_coeff > 0) s.moe_z_loss = z / layers;
}
}  // namespace

// The step's forward and backward with every gradient reduction: what train_step runs
// first, and what a forensics replay runs again from the same weights (the update has
// not run) with the same keys.
void Trainer::forward_backward(const data::Batch& batch, double loss_scale) {
  model_.store.zero_grads();
  for (auto& c : model_.chunks) c->reset_moe_stats();  // a replay records the step again
  ops::fill(step_.stats, 0.0);
  step_.ddp.begin(model_.store.grads());
  Tensor loss_acc = step_.stats.flat(0, 2);
  step_.exec.run_batch(batch, consumed_,
                       mix_key(static_cast<uint64_t>(r_.training.seed), static_cast<uint64_t>(iteration_), 0xD0),
                       loss_scale, loss_acc);
  fault_.dp_reduction(iteration_ + 1);
  // The shared gradients (tied embedding, sequence-parallel partials), then every dp
  // bucket summed, or under ZeRO-1 this rank's shard reduce-scattered.
  parallel::device_watchdog().set_phase(-1, -1, "gradient reduction");
  step_.ddp.finish();
  parallel::device_watchdog().set_phase(-1, -1, "optimizer");
}

// The step's one host round trip: loss, tokens and the squared gradient norm together.
// Every rank learns the batch loss (the last stage's tp-rank-0 ranks contribute) and
// whether the norm was non-finite anywhere: skipping must be unanimous, replicas that
// updated while another skipped would silently diverge.
StepRead Trainer::read_step() {
  Tensor norm_sq = step_.stats.flat(2, 1);
  optim_.adamw.grad_norm_sq(model_.store.grads(), norm_sq);
  const timing::StepPartScope part(timing::StepPart::host_sync);
  const Tensor stats = step_.stats.to(Device::cpu);
  const double* st = stats.data<double>();
  const bool contributes = g_.is_last_stage() && g_.coord.tp == 0;
  double agreed[3] = {contributes ? st[0] : 0.0, contributes ? st[1] : 0.0, std::isfinite(st[2]) ? 0.0 : 1.0};
  if (g_.world && g_.world->size() > 1) g_.world->all_reduce(agreed, 3, parallel::ReduceOp::sum);
  return {agreed[1] > 0 ? agreed[0] / agreed[1] : 0.0, st[2], agreed[2] > 0};
}

// A forensics replay: the nan fault fires again (a persistent fault); bitflip_grad does
// not (a transient one).
StepRead Trainer::replay_step(const data::Batch& batch, double loss_scale) {
  forward_backward(batch, loss_scale);
  fault_.gradients(iteration_ + 1, model_.store.grads(), /*replay=*/true);
  const timing::StepPartScope part(timing::StepPart::optimizer);
  return read_step();
}

void Trainer::save_now() {
  const timing::StepPartScope part(timing::StepPart::checkpoint);
  model::ckpt::TrainState st;
  st.iteration = iteration_;
  st.consumed_samples = consumed_;
  st.consumed_tokens = consumed_ * T_;
  st.optimizer_steps = optim_.adamw.steps_taken();
  st.per_source_samples = per_source_;
  st.skipped_total = skipped_total_;
  st.nan_total = nan_total_;
  st.seed = static_cast<uint64_t>(r_.training.seed);
  if (optim_.scaler) {
    const auto ss = optim_.scaler->state();
    st.loss_scaler = true;
    st.loss_scale = ss.scale;
    st.loss_scale_good_steps = ss.growth_tracker;
    st.loss_scale_hysteresis = ss.hysteresis_tracker;
    st.loss_scale_skipped = ss.skipped_steps;
  }
  st.layout = checkpoint_layout(g_, model_.v(), optim_.adamw.zero1());
  st.recipe_yaml = to_yaml(r_);
  ckpt_.save(st, model_.store, optim_.adamw);
  last_saved_ = iteration_;
}

// One step: batch -> executor (the dp buckets start as the backward finishes them) ->
// the rest of the gradient reductions -> optimizer -> loss-scaler update. Advances the
// counters; returns the step's stats (step time measured from t0, the start of the
// iteration).
IterationStats Trainer::train_step(const data::Batch& batch, double lr, std::chrono::steady_clock::time_point t0) {
  const DeviceStepScope step_memory;  // no cache release (a device-wide wait) with collectives in flight
  const int64_t gbs = batch.global_batch_size;
  fault_.step_start(iteration_ + 1, model_.store.params());
  const double loss_scale = optim_.scaler ? optim_.scaler->scale() : 1.0;
  const int64_t reads_before = device_to_host_copies(), uploads_before = host_to_device_copies();
  mem::reset_peaks();  // per-iteration peaks in the stats (a forensics replay stays inside them)
  forward_backward(batch, loss_scale);
  fault_.gradients(iteration_ + 1, model_.store.grads(), /*replay=*/false);
  std::optional<timing::StepPartScope> part(timing::StepPart::optimizer);  // the step's parts
  const StepRead first = read_step();
  // Spike and NaN forensics may replay the step, and drop or redo its update.
  const ForensicsAction fa =
      forensics_.after_read(iteration_ + 1, batch, first, optim_.scaler && loss_scale > r_.optimizer.min_loss_scale,
                            model_.store.grads(), [&] { return replay_step(batch, loss_scale); });
  const bool dropped = fa.kind == ForensicsAction::skip || fa.kind == ForensicsAction::stop;
  if (fa.kind == ForensicsAction::stop) forensics_stop_ = fa.message;
  const double loss = fa.read.loss;
  optimizer::StepResult update =
      optim_.adamw.apply(model_.store.params(), model_.store.grads(), lr, &model_.store.weights(), loss_scale,
                         std::sqrt(fa.read.norm_sq), fa.read.nonfinite || dropped);
  // Aux-loss-free balancing: once per global batch, as Megatron-Core's gradient finalisation
  // (whether or not the update was skipped), from the whole batch's routed counts.
  std::vector<model::MoeLayerStats> moe_all;
  if (model_.cfg.moe.enabled()) moe_all = gather_moe_stats(model_.chunks, model_.cfg.moe, g_);
  for (auto& c : model_.chunks) c->update_expert_bias();
  const bool nonfinite = (update.skipped && !dropped) || fa.read.nonfinite || !std::isfinite(loss);
  const bool overflow_handled = optim_.scaler && nonfinite && loss_scale > r_.optimizer.min_loss_scale;
  if (optim_.scaler) optim_.scaler->update(nonfinite);  // not a dropped spike: that is no overflow
  if (nonfinite) {
    ++skipped_total_;
    if (!overflow_handled) {
      ++nan_total_;
      ++nonfinite_in_a_row_;
    }
  } else {
    nonfinite_in_a_row_ = 0;
  }
  if (dropped && !nonfinite) ++skipped_total_;  // a loss spike whose batch was dropped
  part.reset();
  consumed_ += gbs;
  ++iteration_;
  forensics_.after_update(iteration_, model_.store.weights());
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  IterationStats s;
  s.iteration = iteration_;
  s.consumed_samples = consumed_;
  s.consumed_tokens = consumed_ * T_;
  s.global_batch_size = gbs;
  s.loss = loss;
  s.lr = lr;
  s.grad_norm = update.grad_norm;
  s.skipped = nonfinite || dropped;
  s.anomaly = fa.verdict;
  s.anomalies_total = forensics_.events();
  s.skipped_total = skipped_total_;
  s.nan_total = nan_total_;
  s.loss_scale = loss_scale;
  s.step_time_s = dt;
  s.tokens_per_s = static_cast<double>(gbs * T_) / dt;
  const double flops = model::model_flops(r_.model, model_.cfg.padded_vocab_size, gbs);
  s.tflops_per_gpu = flops / dt / static_cast<double>(g_.topo.world()) / 1e12;
  s.mfu = out_.peak.tflops > 0 ? s.tflops_per_gpu / out_.peak.tflops : 0.0;
  record_memory_and_traffic(s, reads_before, uploads_before);
  s.world_size = g_.topo.world();
  if (model_.cfg.moe.enabled())
    record_moe(s, moe_all, model_.cfg.moe, (r_.parallel.sequence_parallel ? g_.topo.tp() : 1) * g_.topo.cp());
  return s;
}

void Trainer::record_memory_and_traffic(IterationStats& s, int64_t reads_before, int64_t uploads_before) const {
  if (model_.device == Device::cuda) {  // the caching allocator's peak and what it holds
    const DeviceMemory m = device_memory(model_.device);
    s.peak_memory_bytes = m.peak_bytes;
    s.reserved_memory_bytes = m.reserved_bytes;
    s.gemm_fallbacks = gemm_fallbacks(model_.device);
    if (const MicroBatchGraphs* graphs = step_.exec.cuda_graphs()) s.cuda_graph_replays = graphs->replays();
  } else {
    s.peak_memory_bytes = peak_rss_bytes();
  }
  s.bytes_tp = g_.tp ? g_.tp->bytes_sent() : 0;
  s.bytes_pp = g_.pp ? g_.pp->bytes_sent() : 0;
  s.bytes_dp = g_.grad_group() ? g_.grad_group()->bytes_sent() : 0;  // over dp x cp under context parallelism
  s.bytes_cp = g_.cp ? g_.cp->bytes_sent() : 0;
  s.bytes_ep = (g_.ep ? g_.ep->bytes_sent() : 0) + (g_.etp ? g_.etp->bytes_sent() : 0);  // the experts' exchanges
  if (g_.edp) s.bytes_dp += g_.edp->bytes_sent();                                        // the experts' replicas
  s.host_reads = device_to_host_copies() - reads_before;
  s.host_uploads = host_to_device_copies() - uploads_before;
  log::debug("iteration {}: {} host read(s) of device memory, {} upload(s) in the step", s.iteration, s.host_reads,
             s.host_uploads);
  const mem::Snapshot ms = mem::snapshot();
  s.mem_weights = ms[mem::Role::weights].live;
  s.mem_grads = ms[mem::Role::grads].live;
  s.mem_optimizer = ms[mem::Role::optimizer].live;
  s.mem_activations_peak = ms[mem::Role::activations].peak;
  s.mem_workspace_peak = ms[mem::Role::workspace].peak;
  s.mem_saved_activations_peak = step_.exec.peak_activation_bytes();
  s.mem_send_buffers_peak = step_.exec.peak_send_buffer_bytes();
}

// Logging of one step: the comm report (every rank), the caller's hook, and every
// logging.log_interval iterations metrics.jsonl, TensorBoard and the log line.
void Trainer::training_log(IterationStats& s, const data::Batch& batch) {
  out_.comm_report.write(s.iteration, s.global_batch_size, batch.micro_batches, step_.ddp.overlapped_buckets(),
                         step_.ddp.started_early());
  out_.memory_report.write(s);
  const int64_t total_iters = data_.run.iterations;
  const bool log_now = s.iteration % r_.logging.log_interval == 0 || s.iteration == total_iters;
  out_.straggler.add(s.compute_time_s);
  if (log_now) out_.straggler.at_log(s);  // every rank: one small all-reduce over the world
  if (log_now) {                          // every rank: an all-reduce over the world (two on a GPU)
    StepTiming::Parts parts = out_.step_timing.at_log();
    s.step_parts = std::move(parts.host);
    s.step_parts_gpu = std::move(parts.gpu);
    s.gpu_profile = std::move(parts.ops);
  }
  if (opts_.on_iteration) opts_.on_iteration(s);
  summary_.iterations.push_back(s);
  if (!log_now) return;
  out_.metrics.write(s, r_, s.loss_scale);
  if (out_.tensorboard)
    out_.tensorboard->log_iteration({{"loss", s.loss},
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
  const bool moe_capacity = model_.cfg.moe.capacity_factor > 0;  // drops are possible
  if (out_.tensorboard && s.moe)  // "moe/load_balancing_loss", "moe/layer03/max_over_mean", ...
    out_.tensorboard->log_iteration(moe_tensorboard_scalars(s, moe_capacity), s.iteration, s.consumed_tokens, "moe");
  if (!opts_.quiet)
    log::info(
        " iteration {:>7}/{:<7} | consumed tokens: {:>10} | elapsed time per iteration (ms): {:8.1f} | tokens/s: "
        "{:9.1f} | "
        "TFLOP/s/GPU: {:6.3f} | MFU: {:5.1f}% | learning rate: {:.3E} | global batch size: {:5} | lm loss: {:.6E}{} | "
        "grad norm: {:.3f}{} | skipped: {} | nan: {} | mem: {} MiB{}{}{} | comm MB tp/pp/dp: {:.3f}/{:.3f}/{:.3f}{}{}",
        s.iteration, total_iters, s.consumed_tokens, s.step_time_s * 1e3, s.tokens_per_s, s.tflops_per_gpu, 100 * s.mfu,
        s.lr, s.global_batch_size, s.loss, moe_log_part(s, moe_capacity), s.grad_norm,
        optim_.scaler ? fmt::format(" | loss scale: {:.1f}", s.loss_scale) : "", s.skipped_total, s.nan_total,
        s.peak_memory_bytes >> 20,
        s.reserved_memory_bytes ? fmt::format(" (reserved {} MiB)", s.reserved_memory_bytes >> 20) : std::string(),
        s.gemm_fallbacks >= 0 ? fmt::format(" | gemm fallbacks: {}", s.gemm_fallbacks) : std::string(),
        s.cuda_graph_replays >= 0 ? fmt::format(" | graph replays: {}", s.cuda_graph_replays) : std::string(),
        s.bytes_tp / 1e6, s.bytes_pp / 1e6,
        s.bytes_dp / 1e6,  // rank 0's bytes sent this iteration (ring model, parallel/communicator.hpp)
        g_.ep || g_.etp ? fmt::format(" | ep MB: {:.3f}", s.bytes_ep / 1e6) : std::string(),
        eta_text(summary_.iterations, total_iters - s.iteration));
}

// Why the run ends after a step: a failure (the spike policy's stop, too many non-finite
// steps in a row), or a stop asked for (a signal, training.exit_interval,
// training.exit_duration_mins).
struct Trainer::StopCause {
  bool failure = false;
  std::string asked_by;  // a stop's setting, for throw_stopped_without_checkpoint
  std::string message;   // the error, or the log line
};

std::optional<Trainer::StopCause> Trainer::failure_stop() const {
  if (!forensics_stop_.empty())  // training.spike_policy: the update was dropped, the weights are the last good ones
    return StopCause{true, "", forensics_stop_};
  if (nonfinite_in_a_row_ >= r_.training.max_nonfinite_in_a_row)  // updates were skipped: the weights are good
    return StopCause{
        true, "",
        fmt::format("iteration {}: {} non-finite losses/gradients in a row (training.max_nonfinite_in_a_row); "
                    "lower the lr or check the data",
                    iteration_, nonfinite_in_a_row_)};
  return std::nullopt;
}

// Slurm's preemption (SIGTERM) and time-limit warning (--signal=USR1@...): every rank
// learns whether any rank got one, so they all stop after the same iteration.
std::optional<Trainer::StopCause> Trainer::signal_stop() const {
  int64_t stop = stop_signal_received() ? 1 : 0;
  if (g_.world && g_.world->size() > 1) g_.world->all_reduce(&stop, 1, parallel::ReduceOp::max);
  if (!stop) return std::nullopt;
  return StopCause{false, "a stop signal",
                   fmt::format("stop signal received: saving and exiting after iteration {}", iteration_)};
}

// training.exit_interval, then training.exit_duration_mins (the longest-running rank's minutes).
std::optional<Trainer::StopCause> Trainer::scheduled_stop() const {
  if (r_.training.exit_interval > 0 && iteration_ % r_.training.exit_interval == 0 && iteration_ < data_.run.iterations)
    return StopCause{
        false, "training.exit_interval",
        fmt::format("exiting after iteration {} (training.exit_interval = {})", iteration_, r_.training.exit_interval)};
  if (r_.training.exit_duration_mins <= 0) return std::nullopt;
  double mins = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start_).count() / 60.0;
  if (g_.world && g_.world->size() > 1) g_.world->all_reduce(&mins, 1, parallel::ReduceOp::max);
  if (mins < r_.training.exit_duration_mins) return std::nullopt;
  return StopCause{false, "training.exit_duration_mins",
                   fmt::format("exiting after {:.1f} minutes (training.exit_duration_mins = {})", mins,
                               r_.training.exit_duration_mins)};
}

// After a step: a failure (save the last good weights, then fail), a stop signal, the save
// interval, an exit interval or duration (save, then stop: returns true). Every stop and
// every failure leaves through the one exit path at the end.
bool Trainer::stop_after_step() {
  std::optional<StopCause> cause = failure_stop();
  if (!cause) cause = signal_stop();
  if (!cause) {
    if (r_.checkpoint.save_interval > 0 && iteration_ % r_.checkpoint.save_interval == 0 && ckpt_.enabled()) save_now();
    cause = scheduled_stop();
  }
  if (!cause) return false;
  if (cause->failure) {
    if (ckpt_.enabled()) {
      save_now();
      ckpt_.finish();
    }
    throw_runtime("{}", cause->message);
  }
  if (!ckpt_.enabled()) throw_stopped_without_checkpoint(cause->asked_by, iteration_);
  log::info("{}", cause->message);
  if (last_saved_ != iteration_) save_now();
  return true;
}

// The loop: fetch the batch (prefetching the next), step, log, validate, then
// checkpoints and exit conditions; at the end the final save and validation.
TrainSummary Trainer::run() {
  const int64_t total_iters = data_.run.iterations;
  data_.loader.prefetch(consumed_, schedules::global_batch_size(r_.training, T_, consumed_));
  out_.step_timing.start();
  while (iteration_ < total_iters) {
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t gbs = schedules::global_batch_size(r_.training, T_, consumed_);
    std::optional<timing::StepPartScope> data_part(timing::StepPart::data);
    data::Batch batch = data_.loader.get(consumed_, gbs);
    const int64_t after = consumed_ + gbs;
    if (iteration_ + 1 < total_iters)
      data_.loader.prefetch(after, schedules::global_batch_size(r_.training, T_, after));
    data_part.reset();
    const double lr = schedules::learning_rate(r_.optimizer, after * T_, data_.run.tokens);
    out_.comm_report.reset();  // every group's byte counter, this iteration only
    parallel::device_watchdog().set_iteration(iteration_ + 1);
    fault_.iteration_start(iteration_ + 1);

    const double blocked0 = parallel::comm_blocked_seconds();
    IterationStats s = train_step(batch, lr, t0);
    s.compute_time_s = s.step_time_s - (parallel::comm_blocked_seconds() - blocked0);
    out_.step_timing.after_step();
    training_log(s, batch);
    for (size_t k = 0; k < per_source_.size() && k < batch.per_source_samples.size(); ++k)
      per_source_[k] += batch.per_source_samples[k];
    {
      const timing::StepPartScope part(timing::StepPart::validation);
      validation_.after_iteration(iteration_, consumed_ * T_, out_.tensorboard.get(), opts_.quiet);
    }
    {
      const timing::StepPartScope part(timing::StepPart::checkpoint);
      ckpt_.poll();
    }
    if (stop_after_step()) {
      summary_.interrupted = true;
      break;
    }
  }
  if (ckpt_.enabled() && last_saved_ != iteration_) save_now();
  ckpt_.finish();
  if (!summary_.interrupted) validation_.at_end(iteration_, consumed_ * T_, out_.tensorboard.get(), opts_.quiet);
  summary_.consumed_samples = consumed_;
  summary_.consumed_tokens = consumed_ * T_;
  if (!opts_.quiet && !summary_.iterations.empty()) {
    const auto& f = summary_.iterations.front();
    const auto& l = summary_.iterations.back();
    log::info("done: {} iterations, {} tokens in {} | loss {:.4f} -> {:.4f}", iteration_,
              human_count(static_cast<double>(summary_.consumed_tokens)),
              human_duration(std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start_).count()),
              f.loss, l.loss);
  }
  return summary_;
}

}  // namespace

TrainSummary train(const Recipe& r, const parallel::ProcessGroups& g, const TrainOptions& opts) {
  Trainer trainer(r, g, opts);
  return trainer.run();
}

}  // namespace mtnlg::app
