// Checkpointing inside a training run: resume from checkpoint.load, save every
// checkpoint.save_interval iterations, on SIGTERM/SIGUSR1 (Slurm preemption and
// time-limit warnings), on exit_duration_mins and at the end.
//
// Saving overlaps training: at the iteration boundary every rank copies what it saves
// (the step is blocked only for that copy), a background thread writes the files, and
// the checkpoint is committed (partial dir renamed, `latest` replaced) once every rank
// reports its files are on disk — checked with a one-integer all-reduce per iteration,
// so all MPI calls stay on the main thread.
#pragma once
#include <atomic>
#include <memory>
#include <optional>
#include <thread>

#include "config/recipe.hpp"
#include "model/checkpoint.hpp"
#include "parallel/communicator.hpp"
#include "optimizer/model_optimizer.hpp"

namespace mtnlg::app {

// SIGTERM, SIGUSR1, SIGHUP and a first SIGINT (Ctrl-C) set this flag; the trainer saves
// and stops at the next iteration boundary. A second SIGINT ends the process at once.
void install_stop_signal_handlers();
// A run told to stop early with no checkpoint.save has nothing to resume from: exit 1
// saying so, never the requeue code (--stopped-exit-code) of a run that saved.
[[noreturn]] void throw_stopped_without_checkpoint(const std::string& why, int64_t iteration);
bool stop_signal_received();
void reset_stop_signal();  // tests

// The checkpoint in `dir` (metadata `st`) holds the network `r` describes (layers, hidden,
// heads, ffn, vocabulary, positions); the layout may differ. InputError naming the first
// model key that differs. Resume calls it on every rank; `checkpoint verify-resume` before
// it starts any run.
void check_same_network(const std::string& dir, const model::ckpt::TrainState& st, const Recipe& r);

class CheckpointManager {
 public:
  CheckpointManager(const Recipe& r, const parallel::ProcessGroups& g, model::ckpt::Layout layout);
  ~CheckpointManager();

  // Loads checkpoint.load (its `latest`, or an iteration dir) into the store and the
  // optimizer. Returns the saved training state, or nullopt when checkpoint.load is
  // unset or holds no checkpoint yet (a fresh start, e.g. the first run of a requeued job).
  std::optional<model::ckpt::TrainState> resume(model::ParamStore& store, optimizer::ModelAdamW& optim);

  bool enabled() const { return !root_.empty(); }
  // Starts saving `st` (collective over the world). Returns seconds the caller was blocked.
  double save(const model::ckpt::TrainState& st, const model::ParamStore& store, optimizer::ModelAdamW& optim);
  // Commits a finished background save (collective; call once per iteration on every rank).
  void poll();
  // Waits for the pending save and commits it (collective).
  void finish();

 private:
  void commit_if_all_done(bool wait);

  const Recipe& r_;
  parallel::ProcessGroups g_;
  model::ckpt::Layout layout_;
  std::string root_;
  std::thread writer_;
  std::atomic<bool> writer_done_{true};
  std::string writer_error_;
  int64_t pending_iteration_ = -1;
};

}  // namespace mtnlg::app
