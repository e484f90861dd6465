// What one training iteration reports (the trainer fills it; the log line, metrics.jsonl,
// the memory report, straggler detection and the caller's on_iteration hook read it).
// A header of its own, so that the trainer's side jobs need not include the trainer.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mtnlg::app {

struct IterationStats {
  int64_t iteration = 0;
  int64_t consumed_samples = 0, consumed_tokens = 0;
  int64_t global_batch_size = 0;
  double loss = 0, lr = 0, grad_norm = 0;
  double step_time_s = 0, tokens_per_s = 0, tflops_per_gpu = 0, mfu = 0;
  bool skipped = false;
  double loss_scale = 1.0;  // fp16: the scale this iteration's loss gradient was multiplied by
  int64_t skipped_total = 0, nan_total = 0;
  // The CPU: the process's peak resident set. CUDA: the caching allocator's peak bytes in
  // use on the GPU, and the bytes it holds from the driver (reserved; 0 on the CPU).
  int64_t peak_memory_bytes = 0, reserved_memory_bytes = 0;
  // Sent by this rank this iteration; dp: the gradient reduction's group (dp x cp), cp:
  // attention across the context-parallel group.
  int64_t bytes_tp = 0, bytes_pp = 0, bytes_dp = 0, bytes_cp = 0;
  int64_t bytes_ep = 0;  // the MoE exchanges over ep and etp (the experts' gradients count in bytes_dp)
  // Copies this step made from device memory to the host (host round trips; the design
  // is one) and from the host to the device (token and mask uploads). 0 on the CPU.
  int64_t host_reads = 0, host_uploads = 0;
  // CUDA: matmuls since the start that cuBLASLt did not run as asked (an epilogue it
  // refused, or cublasGemmEx instead; app/process/placement.hpp). -1 off CUDA.
  int64_t gemm_fallbacks = -1;
  // training.enable_cuda_graph: CUDA graph launches since the start (a micro batch's forward
  // and backward are one each; app/train/micro_batch_graphs.hpp). -1 when off.
  int64_t cuda_graph_replays = -1;
  // Tensor bytes this rank holds by role (core/mem_account.hpp): weights, gradients and
  // optimizer state live after the step; the peaks of activations (everything the forward
  // passes allocate) and of workspace (everything else) during this iteration; and the peak
  // of the activations the chunks keep for their backward (app/train/pipeline_executor.hpp).
  int64_t mem_weights = 0, mem_grads = 0, mem_optimizer = 0;
  int64_t mem_activations_peak = 0, mem_saved_activations_peak = 0, mem_workspace_peak = 0;
  int64_t mem_send_buffers_peak = 0;  // pipeline send buffers not yet waited for (PipelineExecutor)
  int64_t world_size = 1;  // processes in the job (metrics.jsonl: `plan --calibrate` reads the layout from it)
  // This rank's compute time: step_time_s less the time blocked in communication.
  double compute_time_s = 0;
  // Straggler detection, at log iterations only (-1: off or not a log iteration): the rank
  // with the longest mean compute time over the log interval, and that time over the
  // median of the other ranks'.
  int64_t slowest_rank = -1;
  double slowest_ratio = 0;
  // The slowest rank among those named as stragglers (in a flagged episode) at this log
  // iteration; -1 when none is.
  int64_t straggler_rank = -1;
  // Spike and NaN forensics (app/train/forensics.hpp): this step's verdict ("" when it
  // found nothing, else "persistent" or "transient") and the steps it replayed so far.
  std::string anomaly;
  int64_t anomalies_total = 0;
  // logging.step_timing, at log iterations only (else empty): every rank's step parts,
  // seconds per iteration averaged over the log interval, [world x timing::kStepParts]
  // rank-major (app/train/step_timing.hpp).
  std::vector<double> step_parts;
  // On a GPU the same from the device's clock (CUDA events): where the GPU's time went.
  std::vector<double> step_parts_gpu;
  // logging.gpu_profile, at log iterations: this rank's GPU seconds per iteration by op family.
  std::vector<std::pair<std::string, double>> gpu_profile;
  // MoE models: the balancing and z losses apart from the LM loss (each MoE layer's loss
  // over its coefficient, averaged over the MoE layers and the step's micro batches; -1
  // where that loss is off), and per MoE layer the step's tokens per expert (after drops),
  // their min and max over their mean, and the dropped slots (with a capacity).
  struct MoeLayerLoad {
    int64_t layer = 0;
    std::vector<double> tokens;
    double min_over_mean = 0, max_over_mean = 0;
    int64_t dropped = 0;
  };
  bool moe = false;
  double moe_aux_loss = -1, moe_z_loss = -1;
  std::vector<MoeLayerLoad> moe_layers;
};

}  // namespace mtnlg::app
