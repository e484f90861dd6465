// Sharded checkpoints (format version 1).
//
//   ROOT/latest                         the iteration of the newest complete checkpoint
//   ROOT/iter_0000100/metadata.json     iteration, consumed samples/tokens (and per blend
//                                       source), optimizer steps, counters, loss-scaler
//                                       state, layout, the resolved recipe, format version
//   ROOT/iter_0000100/model_tp00_pp000.safetensors    one per (tp, pp) model shard
//   ROOT/iter_0000100/optim_tp00_pp000_dp000.safetensors   Adam m and v: one per (tp, pp)
//                                       without ZeRO-1, one per (tp, pp, dp) shard with it
//
// Every tensor is stored under its global parameter name with the slice it holds:
// global shape, the tensor-parallel split (dim, rank, count) and the flat element range
// [begin, end) of that shard (the whole shard for weights, a ZeRO-1 piece for optimizer
// state), plus a CRC32C of its bytes. A loader can therefore rebuild any parameter
// for any layout: every element maps through its global index.
//
// A checkpoint is written into ROOT/iter_X.partial/ by all ranks, then renamed to
// ROOT/iter_X/ and `latest` is replaced (write temp + rename) — a crash at any point
// leaves the previous checkpoint intact and `latest` pointing at it.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/inference.hpp"
#include "model/params.hpp"

namespace mtnlg::model::ckpt {

constexpr int kFormatVersion = 1;

// The layout a checkpoint was saved under. The ranks that hold the same parameters are
// the dp x cp replicas of a (tp, pp) position; under ZeRO-1 each wrote its optimizer shard
// as optim_..._dp<replica>, replica = dp rank x cp + cp rank (dp x cp files).
struct Layout {
  int64_t tp = 1, pp = 1, dp = 1, virtual_chunks = 1;
  bool zero1 = false;
  int64_t cp = 1;  // context_parallel_size: in metadata.json only when > 1
  // An MoE model's routed experts (the expert grid): written per expert-tensor-parallel
  // rank, expert-parallel rank and stage (model_experts_*), their optimizer state per
  // expert-data-parallel replica under ZeRO-1. ep 0: no expert files (a dense model).
  int64_t ep = 0, edp = 1, etp = 1;
  int64_t replicas() const { return dp * cp; }
};

struct TrainState {
  int64_t iteration = 0, consumed_samples = 0, consumed_tokens = 0, optimizer_steps = 0;
  std::vector<int64_t> per_source_samples;
  int64_t skipped_total = 0, nan_total = 0;
  // fp16 dynamic loss scaler (optimizer/loss_scaler.hpp); loss_scaler false for bf16/fp32 runs.
  bool loss_scaler = false;
  double loss_scale = 1.0;
  int64_t loss_scale_good_steps = 0, loss_scale_hysteresis = 0, loss_scale_skipped = 0;
  uint64_t seed = 0;
  Layout layout;
  std::string recipe_yaml;  // the resolved recipe that produced it
};

std::string iteration_dir(const std::string& root, int64_t iteration);
std::string partial_dir(const std::string& root, int64_t iteration);
std::string model_file(int64_t tp_rank, int64_t pp_rank);
std::string optim_file(int64_t tp_rank, int64_t pp_rank, int64_t dp_rank);
std::string expert_model_file(int64_t etp_rank, int64_t ep_rank, int64_t pp_rank);
std::string expert_optim_file(int64_t etp_rank, int64_t ep_rank, int64_t pp_rank, int64_t edp_rank);

// Optimizer state of one rank: fp32 m and v for elements [begin, end) of its flat buffer.
struct OptimShard {
  int64_t begin = 0, end = 0;
  const Tensor* exp_avg = nullptr;
  const Tensor* exp_avg_sq = nullptr;
};

// A host copy of what one rank saves of one region of its flat buffers (the parameters
// of the attention grid, or the routed experts: ParamStore::expert_offset), taken at the
// iteration boundary so the writer thread can run while training goes on. Offsets are
// the region's own.
struct Snapshot {
  std::vector<ParamInfo> infos;
  Tensor params;               // the region's copy
  Tensor exp_avg, exp_avg_sq;  // [opt_end - opt_begin] copies (undefined: no optimizer file)
  int64_t opt_begin = 0, opt_end = 0;
  std::string model_name, optim_name;  // the files
  bool write_model = false, write_optim = false;
};
// The parameters outside the experts' region (all of them for a dense model); `opt` in
// the store's offsets.
Snapshot take_snapshot(const ParamStore& store, const OptimShard* opt, int64_t tp_rank, int64_t pp_rank,
                       int64_t dp_rank, bool write_model, bool write_optim);
// The routed experts' region (ParamStore::expert_offset on), named by the expert grid.
Snapshot take_expert_snapshot(const ParamStore& store, const OptimShard* opt, int64_t etp_rank, int64_t ep_rank,
                              int64_t pp_rank, int64_t edp_rank, bool write_model, bool write_optim);
// Writes this rank's files of `snap` into `dir` (each file atomically).
void write_snapshot(const std::string& dir, const Snapshot& snap);
void write_metadata(const std::string& dir, const TrainState& st);
// Rank 0, after every rank has written: partial -> final, `latest`, prune to keep_last (0 = keep all).
void commit(const std::string& root, int64_t iteration, int64_t keep_last);

// Committed iteration directories under root (iter_X with a metadata.json), ascending.
std::vector<int64_t> committed_iterations(const std::string& root);
// The newest complete checkpoint under root (reads `latest`; when `latest` is missing, the
// newest committed iter_X, with a warning), or nullopt when there is none.
std::optional<int64_t> latest_iteration(const std::string& root);
// ROOT or ROOT/iter_X -> the iteration directory to load (InputError when there is none).
std::string resolve(const std::string& path);
TrainState read_metadata(const std::string& dir);

// Fills `store` (any layout: its ParamInfos say which slice it wants) from the checkpoint
// in `dir`; with m/v, also the optimizer state for flat elements [opt_begin, opt_end).
// InputError naming the file and tensor when something is missing, truncated or corrupt.
void load_into(const std::string& dir, ParamStore& store, const OptimShard* opt = nullptr, Tensor* exp_avg = nullptr,
               Tensor* exp_avg_sq = nullptr);
// The optimizer state of flat elements [opt.begin, opt.end) of `store` into exp_avg and
// exp_avg_sq (each [end - begin]), from whichever files hold it.
void load_optimizer_state(const std::string& dir, const ParamStore& store, const OptimShard& opt, Tensor& exp_avg,
                          Tensor& exp_avg_sq);

// The whole model (tp = 1, pp = 1, fp32) from iteration directory `dir` (resolve()),
// declared by `cfg`: the config of the run that wrote it (its stored recipe,
// TrainState::recipe_yaml) at tp = 1. Dropout and recompute are turned off and the
// weights computed in fp32. app::load_for_inference reads the recipe and calls this.
LoadedModel load_whole_model(const std::string& dir, const GptConfig& cfg);

struct TensorReport {
  std::string file, name, dtype;
  std::vector<int64_t> shape, global_shape;
  int64_t split_dim = -1, split_rank = 0, split_count = 1, flat_begin = 0, flat_end = 0;
  bool checksum_ok = false;
};
// Shard files the layout in `st` calls for that are absent from `dir` (optimizer files
// only when the checkpoint has any).
// Whether the checkpoint holds optimizer state (optim_*.safetensors): a training run's do;
// a weights-only one (`checkpoint import`) does not.
bool has_optimizer_state(const std::string& dir);
std::vector<std::string> missing_files(const std::string& dir, const TrainState& st);
// Every tensor of every file in `dir`, with its checksum verified.
std::vector<TensorReport> inspect(const std::string& dir);

}  // namespace mtnlg::model::ckpt
