// Spike and NaN forensics (docs/RELIABILITY.md, "Spike and NaN forensics"). After the
// step's one host read and before the update, a step whose loss or gradient norm is
// non-finite (training.check_for_nan_in_loss_and_grad), whose replicas' gradient norms
// disagree (the same switch), or whose loss exceeds training.loss_spike_threshold times
// the mean of the last training.loss_spike_window losses is replayed: the fp32 master
// weights and the optimizer state are untouched until the update, and training is
// bit-deterministic for a layout, so the forward/backward of the same batch from the same
// weights must give the same bits. The replay classifies the step:
//  - persistent: every rank's loss, gradient norm and gradient hash are bit for bit the
//    first run's (data or numerics): names the micro batches' samples with their sources
//    and documents (data::SampleSource, as `mtnlg data samples`) and the first layer
//    whose activations went non-finite;
//  - transient: some rank's recomputed gradients differ (suspect hardware): names it.
// Then training.spike_policy: stop (with the report), skip (drop the batch's update,
// counted) or rerun (a transient step continues with the replay's gradients; a
// persistent one stops). Every training.param_hash_interval iterations a 64-bit hash of
// each data-parallel replica's parameters is compared across replicas; a mismatch names
// the odd rank (the minority, or both of a tie) and stops.
// Rank 0 appends each event as one JSON object to LOGDIR/forensics.jsonl and logs one line.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "app/train/pipeline_executor.hpp"
#include "config/recipe.hpp"
#include "core/tensor.hpp"
#include "data/sample_source.hpp"
#include "model/gpt.hpp"
#include "parallel/communicator.hpp"

namespace mtnlg::app {

// A 64-bit hash of a tensor's bytes (read to the host first when it lives on a device).
uint64_t tensor_hash(const Tensor& t);

// What a forward/backward of the step leaves for the host: the batch's mean token loss
// (the same on every rank), this rank's squared gradient norm (of the whole model, so
// the same on every rank of a healthy job), and whether a norm was non-finite anywhere.
struct StepRead {
  double loss = 0, norm_sq = 0;
  bool nonfinite = false;
};

struct ForensicsAction {
  enum Kind { update, skip, stop, update_with_replay };
  Kind kind = update;
  StepRead read;        // what the update uses (the replay's with update_with_replay)
  std::string verdict;  // "" (nothing found), "persistent" or "transient"
  std::string message;  // the log line's text (stop: the error)
};

class Forensics {
 public:
  Forensics(const Recipe& r, const parallel::ProcessGroups& g, std::shared_ptr<const data::SampleSource> src,
            PipelineExecutor& exec);
  // Whether after_read can act (NaN checks or the spike threshold are on).
  bool watches_steps() const;
  // After the step's host read, before the update; collective when watching. `replay`
  // reruns the step's forward/backward and host read on every rank. Every rank returns
  // the same action.
  ForensicsAction after_read(int64_t iteration, const data::Batch& batch, const StepRead& first, bool overflow_handled,
                             const Tensor& grads, const std::function<StepRead()>& replay);
  // After the update (every rank): at iterations divisible by param_hash_interval the
  // replicas' hashes of `weights` are compared; a mismatch is reported and thrown.
  void after_update(int64_t iteration, const Tensor& weights);
  // The chunks' layer observer: while replaying, notes the first non-finite activation.
  void observe(int64_t layer, const model::TrainMicroBatch& mb, const Tensor& out);
  int64_t events() const { return events_; }

 private:
  struct Trigger {
    std::string what;  // "" = nothing wrong
    double mean = 0;   // running mean (spikes)
  };
  struct Gathered;
  Trigger check(const StepRead& first, bool overflow_handled);
  Gathered gather(const StepRead& first, const StepRead& again, uint64_t h1, uint64_t h2, int64_t micro_batches) const;
  nlohmann::json name_samples(const data::Batch& batch, const Gathered& g, const Trigger& t) const;
  ForensicsAction decide(const Trigger& t, const Gathered& g, const StepRead& first, const StepRead& again) const;
  void write_event(const nlohmann::json& j) const;
  std::string report(int64_t iteration, const data::Batch& batch, const Trigger& t, const Gathered& g,
                     const StepRead& first, const StepRead& again, const ForensicsAction& a) const;
  void remember(double loss);
  std::string ranks_text(const std::vector<int64_t>& ranks) const;

  const Recipe& r_;
  parallel::ProcessGroups g_;
  std::shared_ptr<const data::SampleSource> src_;
  PipelineExecutor& exec_;
  std::deque<double> recent_;      // the last loss_spike_window losses of applied steps
  std::vector<double> mb_losses_;  // this rank's micro batches' losses in the replay (last stage)
  bool observing_ = false;
  int64_t first_bad_layer_ = INT64_MAX, first_bad_sample_ = -1;  // this rank, while replaying
  int64_t events_ = 0;
};

}  // namespace mtnlg::app
