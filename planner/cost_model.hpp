// Cost model behind `mtnlg plan`: per-stage memory, time per iteration and per run,
// communication bytes per group kind, a layout search and a pipeline-timeline
// simulation. Pure functions of the recipe, the layout and a GPU description; no
// device is touched. docs/PLANNER.md gives every formula and where each constant
// comes from (docs/PLANNER.md and docs/specs/planner.md list the published ones).
//
// Conventions: times in seconds, sizes in bytes (GiB only in printed output), FLOPs as
// doubles. "Per GPU" always means one rank of the (tp, pp, dp) grid.
#pragma once
#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "config/recipe.hpp"

namespace mtnlg::cost {

// ---- hardware --------------------------------------------------------------------------

struct GpuSpec {
  std::string name;            // a100-80g | h100-80g | h200-141g
  std::string description;     // one line for humans
  double peak_flops = 0;       // dense bf16/fp16 tensor-core FLOP/s
  double gemm_eff_max = 0;     // best achievable fraction of peak for a large GEMM
  int64_t sm_count = 0;        // streaming multiprocessors (wave quantization)
  double memory_bytes = 0;     // usable HBM per GPU
  double hbm_bw = 0;           // achievable HBM bytes/s for streaming element-wise kernels
  double nvlink_bus_bw = 0;    // achievable ring bus bandwidth inside a node (bytes/s)
  double ib_bw = 0;            // achievable inter-node bytes/s per GPU (one HCA per GPU)
  double nvlink_alpha = 0;     // per ring step latency inside a node (s)
  double ib_alpha = 0;         // per ring step latency across nodes (s)
  double kernel_overhead = 0;  // launch + tail cost per kernel (s)
  // Processes of one node that compute at full speed at once; 0 = every process has its
  // own device (GPUs). On a shared CPU host the job's processes share the cores (and, with
  // the kernel's per-session group scheduling, one session's CPU share), so q > 1 processes
  // on a node each compute max(1, q / compute_slots) times slower than one process alone
  // (below 1 when side-by-side processes lose more than their share, e.g. to MPI's
  // busy-waiting). Calibrated.
  double compute_slots = 0;
  // GEMM efficiency curve (gemm_time in cost_model.cpp): a GEMM of reduction length K runs
  // at gemm_eff_max x wave quantization x K / (K + gemm_k_half) of peak, at least its HBM
  // roofline, plus kernel_overhead. `plan --calibrate BENCH.json` (scripts/bench/gpu_gemm_attn.py)
  // fits gemm_eff_max, gemm_k_half and kernel_overhead to measured GEMMs.
  double gemm_k_half = 64;
  // Fused (flash) attention kernels (SoftwareProfile::fused_attention): achieved FLOP/s at
  // long sequences of the forward and backward kernels, the FLOPs counted as the kernel
  // executes them (causal: half the s x s products), head dim 128; the rate at sequence s
  // and head dim d is rate x s / (s + attn_seq_half) x [d / (d + attn_dim_half)] /
  // [128 / (128 + attn_dim_half)], at most peak x gemm_eff_max. 0: no entry (the attention
  // is timed as GEMMs).
  double attn_fwd_flops = 0;
  double attn_bwd_flops = 0;
  double attn_seq_half = 0;
  double attn_dim_half = 0;
  // The data sheet's HBM bandwidth (bytes/s); 0 when there is none (the `cpu` starting
  // point). A GPU with it is a physical description: `plan --calibrate RUN_DIR` keeps its
  // fit inside physical ranges (gemm_eff_max <= 1, hbm_bw <= this, kernel overhead within
  // kKernelOverheadRange) and regularises it toward these constants (docs/PLANNER.md
  // "Calibration").
  double hbm_peak_bw = 0;
};

// Throws InputError listing the valid names when `name` is unknown. Accepts the short
// aliases a100, h100, h200.
const GpuSpec& gpu_spec(const std::string& name);
std::vector<std::string> gpu_names();
// The table entry of the GPU a CUDA device name describes ("NVIDIA H100 80GB HBM3" ->
// h100-80g), or nullptr when the table has no entry of that model (H100 PCIe/NVL, other
// GPUs): the trainer's MFU peak on a GPU.
const GpuSpec* gpu_spec_for_device(const std::string& device_name);

// ---- layout ---------------------------------------------------------------------------

// a2a+p2p's all-to-all group from the recipe (hierarchical_context_parallel_sizes[0]; 1 when unset).
int64_t cp_a2a_of(const Recipe& r);

struct Layout {
  int64_t tp = 1, pp = 1, dp = 1;
  // Context parallelism: cp ranks split every sequence (each holds s / cp of its tokens)
  // and run attention across them by `cp_comm`; gradients and ZeRO-1 over dp x cp.
  int64_t cp = 1;
  CpCommType cp_comm = CpCommType::p2p;
  int64_t cp_a2a = 1;  // a2a+p2p: the all-to-all's groups (hierarchical_context_parallel_sizes[0]), a ring across them
  // Mixture of experts: an MoE layer's experts split over ep expert-parallel ranks (tokens
  // exchanged by all-to-all) and each expert's columns over etp.
  int64_t ep = 1, etp = 1;
  int64_t vp = 1;  // virtual stages (model chunks) per pipeline rank; 1 = plain 1F1B
  int64_t micro_batch = 1;
  RecomputeGranularity recompute = RecomputeGranularity::none;
  bool sequence_parallel = false;
  bool distributed_optimizer = false;  // ZeRO-1: optimizer state and master weights sharded over dp
  std::vector<int64_t> stage_layers;   // layers per pipeline stage (size pp)

  int64_t gpus() const { return tp * cp * pp * dp; }
  int64_t replicas() const { return dp * cp; }  // the ranks that hold the same parameters
  // The ranks that hold the same routed experts (the expert-data-parallel group).
  int64_t expert_replicas() const { return std::max<int64_t>(1, tp * cp * dp / (ep * etp)); }
  std::string describe() const;  // "tp8 pp35 dp8 vp1 mb1 full sp0 zero0" ("tp8 pp1 dp2 cp4 p2p vp1 ...")
};

// The layout the recipe describes on `gpus` GPUs. Throws InputError (one line naming
// the field) when it cannot exist: gpus % (tp*pp), heads % tp, layers vs stages,
// batch % (micro*dp), interleaving rules.
Layout layout_from_recipe(const Recipe& r, int64_t gpus);

// Same checks for an arbitrary layout against the recipe's model and batch; returns ""
// when valid, else a short reason (used to count rejections in the search).
std::string layout_problem(const Recipe& r, const Layout& l);

// "" when every batch of the ramp splits into whole microbatches of micro x dp, else
// why not. `mtnlg train` rejects such a layout; `plan` only warns (published runs such
// as MT-NLG on 350 and 420 nodes changed dp after the ramp) and the search skips it.
std::string ramp_problem(const Recipe& r, const Layout& l);

// The training software's execution of a layout, where published runs differ although
// the hardware and the layout are the same (docs/PLANNER.md "Software profiles").
struct SoftwareProfile {
  std::string name;         // megatron-lm | megatron-deepspeed
  std::string description;  // one line: what it stands for, and its evidence
  // Multiplies GpuSpec::gemm_eff_max: the kernels' (cuBLAS / PyTorch / fusions) share of the
  // GPU's best GEMM efficiency in this software stack.
  double kernel_efficiency = 1.0;
  // Megatron-LM's scatter/gather of pipeline messages (Narayanan et al. 2021, §4.1): each
  // of the t tensor ranks sends 1/t of the activation across nodes and the receiving
  // stage all-gathers it over NVLink (DeepSpeed's engine does the same with its
  // PartitionedTensor, is_pipe_partitioned). Off: every tensor rank sends the whole.
  bool scatter_gather_p2p = true;
  // Point-to-point transfers on a stage's critical path per microbatch per model chunk:
  // 2 when sends and receives are batched into one exchange after the forward and one after
  // the backward (Megatron), 4 when each send and each receive is its own blocking step
  // (DeepSpeed's pipeline engine: SendActivation, RecvGrad, RecvActivation, SendGrad).
  int p2p_steps_per_microbatch = 2;
  // Bytes per gradient element in the data-parallel reduction of a 16-bit run: 4 when the
  // gradients are accumulated and all-reduced in fp32 (Megatron-LM since bf16 support, and
  // this trainer), 2 for Megatron-LM 2021's fp16 default (accumulate_allreduce_grads_in_fp32
  // off). fp32 runs always reduce 4 bytes.
  double grad_reduce_bytes = 4;
  // Whether the engine has Megatron's interleaved 1F1B schedule (virtual stages);
  // DeepSpeed's pipeline engine does not: plan rejects vp > 1 and the search skips it.
  bool interleaved_schedule = true;
  // How activations are counted. false: Korthikanti et al. 2022 Table 2 (Megatron-LM keeps
  // the attention probabilities unless selective) with the in-flight formula of their
  // Section 4.2.3. true: the tensors mtnlg's own trainer keeps per microbatch and chunk
  // (model/gpt.cpp: flash-style attention keeps the log-sum-exp, never the probabilities;
  // under sequence parallelism the all-gathered LayerNorm outputs are kept), summed over the
  // microbatches in flight in the trainer's schedule table (schedules/pipeline_schedule.hpp).
  bool trainer_activations = false;
  // Flash-style attention (this trainer, core/ops attention_*_lse): the probabilities are
  // never written to memory (no s x s element-wise traffic), the backward recomputes them
  // from Q, K and the log-sum-exp in every recompute mode (half the forward attention
  // GEMMs again), so selective recompute adds nothing.
  bool flash_attention = false;
  // The small collectives this trainer runs in every step, each its own call (on a GPU a
  // few microseconds each; on a loaded CPU each waits for the peer processes to be
  // scheduled, docs/PLANNER.md "Shown on this machine's CPU"): the world all-reduce of
  // loss, tokens and the skip flag (app/train/trainer.cpp), the gradient norm over the
  // model-parallel group (and over dp with ZeRO-1, optimizer/distributed_adamw.cpp), and under
  // sequence parallelism one tp all-reduce per replicated parameter's gradient (6 per
  // layer, the position embedding on the first stage, the final LayerNorm's 2 on the last,
  // parallel::DataParallelGrads::finish).
  bool trainer_step_collectives = false;
  // Megatron-Core (2024-25) mechanisms, each a term of the model (docs/PLANNER.md
  // "Software profiles", megatron-core):
  // Attention through Transformer Engine's fused kernel (cuDNN / FlashAttention): the core
  // runs at GpuSpec::attn_*_flops, computes only the causal half of the s x s products,
  // never writes the probabilities, and its backward recomputes them (2.5x the forward's
  // products).
  bool fused_attention = false;
  // `--tp-comm-overlap` (Transformer Engine userbuffers; needs sequence parallelism): each
  // all-gather / reduce-scatter is split into t chunks and pipelined with the GEMM that
  // consumes or produces it; exposed is what the GEMM's other t-1 chunks cannot cover.
  bool tp_comm_overlap = false;
  // `--overlap-grad-reduce` / `--overlap-param-gather` (distributed data parallel with the
  // distributed optimizer): the gradient reduce-scatter (all-reduce without ZeRO-1) runs in
  // buckets during the backward of the last microbatch, the parameter all-gather during the
  // forward of the first; exposed is the last (first) bucket and what the window cannot cover.
  bool dp_overlap = false;
  double dp_bucket_params = 40e6;  // max(40M, 1M x dp) parameters per bucket (Megatron-Core DDP default)
  // `overlap_p2p_comm` (on by default with the interleaved schedule): pipeline sends and
  // receives run beside the next chunk's compute; exposed is the latency and what the
  // chunk's compute cannot cover.
  bool p2p_overlap = false;
  // Bytes through HBM per logit element (T x V/t) of the vocab-parallel cross-entropy,
  // forward and backward. 12 / 12: three fp32 passes each way (Megatron-LM 2022's fused
  // softmax-style kernel budget, the default). Megatron-Core's unfused
  // VocabParallelCrossEntropy (megatron/core/tensor_parallel/cross_entropy.py): forward
  // bf16->fp32 cast 6, max 4, subtract 8, exp 8, sum 4, divide 8 = 38; backward multiply 8,
  // fp32->bf16 cast 6 = 14.
  double ce_bytes_fwd = 12;
  double ce_bytes_bwd = 12;
  // Megatron-LM's asynchronous tensor-parallel gradient communication in the backward of a
  // column-parallel linear (megatron/mpu/layers.py, LinearWithGradAccumulationAndAsyncCommunication
  // at the 2022-05 sequence-parallel merge; added 2021-08-30, on by default in 2022 behind
  // --no-async-tensor-model-parallel-allreduce; Korthikanti et al. 2022 Section 6.2):
  // without SP the input-gradient all-reduce runs beside the weight-gradient GEMM; under SP
  // the re-gather of the saved input shard runs beside the data-gradient GEMM and the
  // input-gradient reduce-scatter beside the weight-gradient GEMM, while the all-gather of
  // the output gradient (backward of the row-parallel reduce-scatter) stays synchronous.
  // Exposed: what outlasts the GEMM it runs beside. Off: every backward collective exposed.
  bool async_tp_grad_comm = false;
  // Where the last stage's head runs its backward: in the forward (this trainer: the loss
  // gradient is known once the logits are, so model::GptChunk's training head runs the
  // backward through each chunk of logit rows as soon as its loss is computed, and the
  // logits are never kept), or in the backward (Megatron: the logits are kept and their
  // gradient is computed when the backward reaches the head). The time is the same; only
  // the split between the step's forward and backward parts moves.
  bool head_backward_in_forward = false;
};

// Throws InputError listing the valid names when `name` is unknown.
const SoftwareProfile& software_profile(const std::string& name);
std::vector<std::string> software_names();

struct Cluster {
  GpuSpec gpu;
  int64_t gpus_per_node = 8;
  SoftwareProfile software = software_profile("megatron-lm");
  // Device bytes one flash attention call takes beside its tensors (cuDNN's plan
  // workspace, the backward's fp32 dQ accumulator), as the installed cuDNN planned them
  // offline for the recipe's layout (`mtnlg plan`); negative: the model's
  // (cudnn_attention_bytes).
  double attention_workspace = -1;
};

// Whether the plan counts mtnlg's unfused attention form (software profile with
// trainer_activations): the recipe's model.attention_backend; auto is flash on the "cpu"
// profile and, on a GPU, flash (cuDNN's fused attention) for bf16/fp16 with head sizes that
// are multiples of 8 up to 256 (what cuDNN 9.19 plans on sm90), unfused otherwise (as
// model/gpt.cpp resolves it).
bool trainer_unfused_attention(const Recipe& r, const Cluster& c);

// Device bytes one of cuDNN's fused attention calls (core/cuda/cudnn_attention.hpp) takes
// beside its tensors for micro batch `b`, `heads` local heads, sequence `s`, head size `d`:
// the larger of the forward's and the backward's (the plan's workspace, and without
// training.deterministic_mode the [b, heads, s, d] fp32 dQ accumulator). The workspace is
// what cuDNN 9.19 reports on sm90 (the plan table of test/core/cuda/test_cudnn_plan_table.cpp):
// forward 256 B; backward 256 B + the rows' fp32 sums (rounded up to 128 B), and
// deterministic dP as [b, heads, s up to 64, s up to 128] in 2-byte elements; grouped-query
// attention (`grouped`: fewer key/value heads) 4 more bytes per [b, heads, s, d] element.
double cudnn_attention_bytes(int64_t b, int64_t heads, int64_t s, int64_t d, bool deterministic, bool grouped = false);

// ---- calibration ----------------------------------------------------------------------

// One measured run: its recipe, its layout and the measured seconds per iteration at the
// recipe's global batch.
struct Observation {
  Recipe recipe;
  Layout layout;
  double step_time_s = 0;
  std::string label;
};
struct CalibrationResult {
  GpuSpec gpu;               // the base GPU with the fitted constants
  double compute_scale = 1;  // fitted multipliers of (peak x gemm_eff_max), hbm_bw, kernel_overhead
  double bandwidth_scale = 1;
  double overhead_scale = 1;
  double latency_scale = 1;       // of nvlink_alpha and ib_alpha (fitted only with a multi-process run)
  double compute_slots = 0;       // fitted GpuSpec::compute_slots (with two multi-process runs), else the base's
  std::vector<double> predicted;  // per observation, seconds
  double rms_relative_error = 0;  // the fit's residual: sqrt(mean((pred/meas - 1)^2))
  int free_parameters = 0;        // how many of the four multipliers were fitted (<= observations)
  // Physical fit (the base has hbm_peak_bw): the multipliers were bounded to physical ranges
  // and pulled toward 1 by the prior below; `at_bound` names each constant the fit left at
  // a physical limit (the data wanted it beyond: a mechanism the model lacks).
  bool physical = false;
  std::vector<std::string> at_bound;
};
// The prior of a physical fit: the widths (natural log of the multiplier, one standard
// deviation) of the base's GEMM efficiency, HBM bandwidth and kernel overhead, against a
// run's relative model-and-measurement error kCalibrationRunSigma. The fit minimises
// sum_runs (log(pred/meas) / run_sigma)^2 + sum_constants (log(multiplier) / width)^2.
constexpr double kCalibrationRunSigma = 0.03;
constexpr double kCalibrationPriorWidth[3] = {0.25, 0.25, 0.7};
// The range a GPU's per-kernel overhead is kept in by a physical fit (seconds): launch and
// tail of a kernel on one stream, back to back (~1 us) to a launch-bound host (tens of us).
constexpr double kKernelOverheadRange[2] = {0.5e-6, 100e-6};
// Fits the GPU constants to measured runs: when at least two runs are given and one of
// them has several processes, the communication latency, and with a second multi-process
// run (and another run left) the compute slots; with the other runs, one: the
// compute rate, two: compute and memory bandwidth, three or more: also the per-kernel
// overhead; the others keep `base`'s values. Least squares on log(pred/meas) by grid and
// coordinate search; for a physical base (hbm_peak_bw > 0) bounded and regularised
// (CalibrationResult::physical).
CalibrationResult calibrate(const GpuSpec& base, const std::vector<Observation>& runs, int64_t gpus_per_node = 8,
                            const SoftwareProfile& software = software_profile("megatron-lm"));

// ---- kernel calibration: the GEMM curve and the fused-attention rates -------------------

// Seconds of one bf16 GEMM C[M,N] = A[M,K] B[K,N] (`batch` independent products) on `g`:
// the planner's GEMM curve (gemm_eff_max x wave quantization x K/(K+gemm_k_half), at
// least the HBM roofline, plus one kernel overhead).
double gemm_seconds(const GpuSpec& g, int64_t M, int64_t N, int64_t K, int64_t batch = 1);
// Seconds of the fused causal attention kernel over `batch_heads` (batch x heads) sequences
// of length `seq` and head dimension `head_dim`, forward or backward (GpuSpec::attn_*; 0 when
// `g` has no fused-attention entry).
double attention_seconds(const GpuSpec& g, int64_t seq, int64_t head_dim, int64_t batch_heads, bool backward);

struct GemmSample {
  int64_t m = 0, n = 0, k = 0, batch = 1;
  double seconds = 0;
};
struct AttentionSample {
  int64_t batch_heads = 0, seq = 0, head_dim = 0;
  double fwd_seconds = 0, bwd_seconds = 0;
};
struct KernelFit {
  GpuSpec gpu;               // the base with the fitted GEMM curve and attention rates
  double gemm_rms = 0;       // rms relative error of the fitted GEMM times
  double attention_rms = 0;  // of the fitted attention times (forward and backward)
  std::vector<double> gemm_predicted, attention_fwd_predicted, attention_bwd_predicted;
};
// Fits gemm_eff_max, gemm_k_half and kernel_overhead to measured GEMMs (when given) and
// attn_fwd_flops, attn_bwd_flops, attn_seq_half, attn_dim_half to measured attention kernels
// (when given): least squares on log(pred/meas) by grid search. Throws InputError when both
// lists are empty or a time is not positive.
KernelFit calibrate_kernels(const GpuSpec& base, const std::vector<GemmSample>& gemms,
                            const std::vector<AttentionSample>& attention);

// ---- communication bytes --------------------------------------------------------------

// Bytes SENT per rank per iteration (one global batch of `global_batch` sequences),
// per group kind, with the ring model: an all-reduce of S bytes over n ranks sends
// 2(n-1)/n*S, a reduce-scatter or all-gather (n-1)/n*S, a point-to-point S.
// Element size: 2 for bf16/fp16, 4 for fp32 (CPU runs are fp32).
//  tp: per layer per microbatch 4 all-reduces of b*s*h elements (2 forward, 2
//      backward; sequence parallel: the same bytes as all-gather + reduce-scatter
//      pairs), plus 2 more when full recompute re-runs the forward. The vocab-parallel
//      embedding all-reduce (first stage) and the three small cross-entropy
//      all-reduces (last stage) are counted on those stages; the figure is the
//      maximum over stages (the busiest rank).
//  pp: b*s*h elements per microbatch per model chunk crossing, each way: a middle
//      stage sends one activation forward and one gradient backward per microbatch
//      per chunk (v chunks when interleaved); first/last stages send only one way, so
//      the figure is the maximum over stages.
//  dp: one all-reduce of the stage's gradients (fp32 when training in bf16/fp16, as
//      Megatron accumulates and reduces in fp32) over dp x cp ranks; with the distributed
//      optimizer a reduce-scatter of those gradients plus an all-gather of the
//      16-bit parameters. Maximum over stages (first/last carry embeddings).
//  cp: attention across the context-parallel group, per layer per microbatch (again in
//      a full recompute): p2p sends its K/V block cp - 1 times forward and K/V with their
//      gradients cp times backward; all_gather gathers K/V forward, gathers them again and
//      reduce-scatters their gradients backward; a2a exchanges q/k/v and the output
//      forward, and q/k/v, output, its gradient, the log-sum-exp and dq/dk/dv backward
//      ((cp - 1) / cp of each). Maximum over stages.
//  ep: each MoE layer's token dispatch and combine all-to-alls, forward and backward (again
//      in a full recompute): (ep - 1) / ep of the b s k h elements routed, four times.
struct CommBytes {
  double tp = 0, pp = 0, dp = 0, cp = 0, ep = 0;
};
CommBytes comm_bytes_per_iteration(const Recipe& r, const Layout& l, int64_t global_batch);

// ---- memory ---------------------------------------------------------------------------

struct StageMemory {
  int64_t stage = 0;
  int64_t layers = 0;
  double params = 0;  // parameters held by one GPU of this stage
  double weights = 0, gradients = 0, optimizer = 0;
  double activations = 0;          // transformer layers' saved activations (in-flight microbatches);
                                   // with SoftwareProfile::trainer_activations also the head's and the
                                   // token ids, i.e. everything the trainer keeps for the backward
  double embedding = 0;            // first stage: embedding output / dropout mask
  double logits = 0;               // last stage: fp32 logits for the cross-entropy
  double comm_buffers = 0;         // p2p send/recv buffers + collective scratch
  double send_buffers = 0;         // of which p2p sends not yet completed (the most at once)
  double workspace = 0;            // CUDA context, cuBLAS workspace, allocator slack, cuDNN's attention workspace
  double attention_workspace = 0;  // of which one flash attention call's (Cluster::attention_workspace)
  double total = 0;
  // Of the total, what a caching allocator holds in use at its peak (what mtnlg reports as
  // peak_memory_bytes on a GPU): every tensor above, the p2p buffers, the layer a full
  // recompute re-materializes and the cuBLAS workspace. Not in it: the CUDA context and
  // libraries, NCCL's own buffers, and the allocator's fragmentation.
  double allocator = 0;
};

// ---- time -----------------------------------------------------------------------------

struct StageTime {
  double forward = 0;   // one microbatch through all this stage's chunks, forward
  double backward = 0;  // backward incl. recompute
  double tp_comm = 0;   // exposed tensor-parallel communication inside the above
  double p2p = 0;       // exposed point-to-point per microbatch (both directions)
};

struct Estimate {
  Layout layout;
  std::vector<StageMemory> stages;
  std::vector<StageTime> stage_times;
  double peak_memory = 0;     // bytes, the most loaded GPU
  double allocator_peak = 0;  // bytes, the most any GPU's caching allocator holds in use (StageMemory::allocator)
  bool fits = false;
  int64_t microbatches = 0;
  double iteration_time = 0;  // at the full global batch
  double pipeline_time = 0, dp_time = 0, optimizer_time = 0;
  double bubble_fraction = 0;  // idle share of the pipeline phase
  double tokens_per_s = 0;
  double tflops_per_gpu = 0;        // hardware FLOPs (Megatron convention; 96-form under full recompute)
  double model_tflops_per_gpu = 0;  // 72-form (no recompute)
  double mfu = 0;                   // model FLOPs / peak
  double hfu = 0;
  CommBytes comm;
  // The whole run (ramp included).
  int64_t run_iterations = 0;
  double run_tokens = 0;
  double run_seconds = 0;
  double run_tokens_per_s = 0;  // run average
  double run_gpu_hours = 0;
};

// Options that only the search or tests change.
struct EstimateOptions {
  bool with_run = true;  // also simulate the batch ramp for the whole run
};

Estimate estimate(const Recipe& r, const Layout& l, const Cluster& c, const EstimateOptions& o = {});
// Only the iteration time at global batch `batch` (ramp steps).
double iteration_time(const Recipe& r, const Layout& l, const Cluster& c, int64_t batch);

// ---- search ---------------------------------------------------------------------------

struct SearchResult {
  std::vector<Estimate> best;  // feasible layouts, fastest first (up to `keep`)
  int64_t considered = 0, feasible = 0;
  std::map<std::string, int64_t> rejected;  // reason -> count
};
// Enumerates tp, cp (powers of two leaving each rank at least 1024 tokens of a sequence,
// the recipe's cp_comm_type), ep (MoE: powers of two dividing the experts), pp (uneven layer splits allowed), dp, virtual stages, micro
// batch, recompute, sequence parallel and distributed optimizer for exactly `gpus` GPUs.
SearchResult search(const Recipe& r, int64_t gpus, const Cluster& c, size_t keep = 10);

// ---- pipeline timeline ----------------------------------------------------------------

struct TimelineOp {
  int64_t stage = 0, microbatch = 0, chunk = 0;
  bool forward = true;
  double start = 0, end = 0;
};
// Simulates 1F1B (vp == 1) or Megatron's interleaved 1F1B (vp > 1, needs m % pp == 0)
// with the given per-stage times for one microbatch through one chunk, and a
// point-to-point delay between dependent ops on neighbouring stages. Ops run in
// each stage's schedule order as soon as their input has arrived.
std::vector<TimelineOp> simulate_pipeline(int64_t pp, int64_t microbatches, int64_t vp,
                                          const std::vector<double>& fwd_per_chunk,
                                          const std::vector<double>& bwd_per_chunk, double p2p);
double makespan(const std::vector<TimelineOp>& ops);

// An SVG drawing of the timeline: one row per stage, forward and backward boxes,
// idle time visible as gaps, a legend and a title line.
std::string timeline_svg(const std::vector<TimelineOp>& ops, int64_t pp, const std::string& title);

}  // namespace mtnlg::cost
