#include "app/train/forensics.hpp"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "app/process/preflight.hpp"
#include "core/half.hpp"
#include "core/log.hpp"
#include "parallel/watchdog.hpp"

namespace mtnlg::app {

namespace {

uint64_t bits_of(double x) {
  uint64_t b = 0;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

bool all_finite(const Tensor& t) {
  const Tensor h = t.device() == Device::cpu ? t : t.to(Device::cpu);
  const int64_t n = h.numel();
  switch (h.dtype()) {
    case DType::f32: {
      const auto* p = static_cast<const float*>(h.raw());
      for (int64_t i = 0; i < n; ++i)
        if (!std::isfinite(p[i])) return false;
      return true;
    }
    case DType::f64: {
      const auto* p = static_cast<const double*>(h.raw());
      for (int64_t i = 0; i < n; ++i)
        if (!std::isfinite(p[i])) return false;
      return true;
    }
    case DType::bf16:
    case DType::f16: {
      const auto* p = static_cast<const uint16_t*>(h.raw());
      const bool bf = h.dtype() == DType::bf16;
      for (int64_t i = 0; i < n; ++i)
        if (!std::isfinite(bf ? half::bf16_to_f32(p[i]) : half::f16_to_f32(p[i]))) return false;
      return true;
    }
    default: return true;
  }
}

std::string layer_text(int64_t layer) {
  if (layer == -1) return "the embedding";
  return fmt::format("layer {}", layer);
}

}  // namespace

uint64_t tensor_hash(const Tensor& t) {
  const Tensor h = t.device() == Device::cpu ? t : t.to(Device::cpu);
  const auto* p = static_cast<const unsigned char*>(h.raw());
  const size_t n = static_cast<size_t>(h.nbytes());
  uint64_t x = 0x9E3779B97F4A7C15ull ^ n;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w = 0;
    std::memcpy(&w, p + i, 8);
    x = (x ^ w) * 0xFF51AFD7ED558CCDull;
    x ^= x >> 32;
  }
  for (; i < n; ++i) x = (x ^ p[i]) * 0x100000001B3ull;
  return x ^ (x >> 29);
}

// What every rank learns from the replay (one all-reduce over the world).
struct Forensics::Gathered {
  std::vector<int64_t> differ;              // ranks whose replayed gradients (their hash) differ from their first run
  bool loss_same = true, norm_same = true;  // on every rank
  int64_t bad_layer = INT64_MAX;            // the first non-finite activation in the job (-1: the embedding)
  int64_t bad_layer_rank = -1, bad_sample = -1;
  std::vector<double> mb_losses;                 // [dp * micro batches]: dp rank d's micro batch k at d * M + k
  std::vector<std::pair<double, double>> norms;  // per rank: its gradient norm in the first run and the replay
};

Forensics::Forensics(const Recipe& r, const parallel::ProcessGroups& g, std::shared_ptr<const data::SampleSource> src,
                     PipelineExecutor& exec)
    : r_(r), g_(g), src_(std::move(src)), exec_(exec) {}

bool Forensics::watches_steps() const {
  return r_.training.check_for_nan_in_loss_and_grad || r_.training.loss_spike_threshold > 0;
}

void Forensics::observe(int64_t layer, const model::TrainMicroBatch& mb, const Tensor& out) {
  if (!observing_ || layer >= first_bad_layer_ || all_finite(out)) return;
  first_bad_layer_ = layer;
  first_bad_sample_ = mb.sample_offset;
}

// Whether (and why) to replay. Every rank reaches the same answer: the loss and the
// non-finite flag are already agreed, the running mean is the same everywhere, and the
// replicas' norm comparison ends in one flag agreed over the world.
Forensics::Trigger Forensics::check(const StepRead& first, bool overflow_handled) {
  const auto& t = r_.training;
  Trigger tr;
  const bool world = g_.world && g_.world->size() > 1;
  if (t.check_for_nan_in_loss_and_grad && !overflow_handled && (first.nonfinite || !std::isfinite(first.loss))) {
    tr.what = "non-finite loss or gradient";
    return tr;
  }
  if (t.check_for_nan_in_loss_and_grad && world && g_.topo.dp() > 1 && !first.nonfinite) {
    // Replicas hold the same reduced gradients, and the norm is reduced over the
    // model-parallel group, so every rank of a healthy job holds the same bits: one
    // all-reduce (max) of (norm, -norm) over the world, on the host (the world group).
    double mm[2] = {first.norm_sq, -first.norm_sq};
    g_.world->all_reduce(mm, 2, parallel::ReduceOp::max);
    if (mm[0] != -mm[1]) {
      tr.what = "the data-parallel replicas' gradient norms disagree";
      return tr;
    }
  }
  if (t.loss_spike_threshold > 0 && static_cast<int64_t>(recent_.size()) == t.loss_spike_window &&
      std::isfinite(first.loss)) {
    tr.mean = std::accumulate(recent_.begin(), recent_.end(), 0.0) / static_cast<double>(recent_.size());
    if (first.loss > t.loss_spike_threshold * tr.mean) tr.what = "loss spike";
  }
  return tr;
}

Forensics::Gathered Forensics::gather(const StepRead& first, const StepRead& again, uint64_t h1, uint64_t h2,
                                      int64_t m) const {
  const int64_t world = g_.topo.world(), dp = g_.topo.dp();
  const auto& mine = mb_losses_;
  // Per rank kSlots slots (gradients differ, first bad layer + 2 or 0, its sample + 1, its
  // gradient norm in the first run and in the replay), then the micro batches' losses,
  // then how many ranks' norms differ.
  constexpr int64_t kSlots = 5;
  std::vector<double> v(static_cast<size_t>(kSlots * world + dp * m + 1), 0.0);
  double* me = v.data() + kSlots * g_.rank;
  me[0] = h1 != h2 ? 1.0 : 0.0;
  if (first_bad_layer_ != INT64_MAX) {
    me[1] = static_cast<double>(first_bad_layer_ + 2);
    me[2] = static_cast<double>(first_bad_sample_ + 1);
  }
  me[3] = std::sqrt(first.norm_sq);
  me[4] = std::sqrt(again.norm_sq);
  v.back() = bits_of(first.norm_sq) != bits_of(again.norm_sq) ? 1.0 : 0.0;
  // (under context parallelism the first cp rank's: its share of each micro batch's tokens)
  if (g_.is_last_stage() && g_.coord.tp == 0 && g_.coord.cp == 0 && static_cast<int64_t>(mine.size()) == m)
    for (int64_t k = 0; k < m; ++k)
      v[static_cast<size_t>(kSlots * world + g_.coord.dp * m + k)] = mine[static_cast<size_t>(k)];
  if (g_.world && world > 1) g_.world->all_reduce(v.data(), static_cast<int64_t>(v.size()), parallel::ReduceOp::sum);
  Gathered out;
  out.loss_same = bits_of(first.loss) == bits_of(again.loss);
  for (int64_t q = 0; q < world; ++q) {
    const double* at = v.data() + kSlots * q;
    if (at[0] != 0) out.differ.push_back(q);
    out.norms.push_back({at[3], at[4]});
    const auto layer = static_cast<int64_t>(at[1]) - 2;
    if (layer >= -1 && layer < out.bad_layer) {
      out.bad_layer = layer;
      out.bad_layer_rank = q;
      out.bad_sample = static_cast<int64_t>(at[2]) - 1;
    }
  }
  out.mb_losses.assign(v.begin() + kSlots * world, v.end() - 1);
  out.norm_same = v.back() == 0;
  return out;
}

// The micro batches to name: those whose loss is non-finite or where the first
// non-finite activation was found; for a spike those above the threshold, else the
// largest. Each sample with its source and documents (the machinery of `data samples`).
nlohmann::json Forensics::name_samples(const data::Batch& batch, const Gathered& g, const Trigger& t) const {
  const int64_t m = batch.micro_batches, mbs = batch.micro_batch_size, dp = g_.topo.dp();
  std::vector<int64_t> picked;  // d * m + k
  int64_t worst = -1;
  for (int64_t i = 0; i < dp * m; ++i) {
    const double l = g.mb_losses[static_cast<size_t>(i)];
    const bool unknown = l == -1.0;  // after a non-finite micro batch on its rank
    const int64_t first_sample = batch.consumed_samples + (i % m) * mbs * dp + (i / m) * mbs;
    const bool has_bad = g.bad_sample >= first_sample && g.bad_sample < first_sample + mbs;
    const bool pick = t.what == "loss spike" ? !unknown && l > r_.training.loss_spike_threshold * t.mean
                                             : has_bad || (!unknown && !std::isfinite(l));
    if (pick) picked.push_back(i);
    if (!unknown && std::isfinite(l) && (worst < 0 || l > g.mb_losses[static_cast<size_t>(worst)])) worst = i;
  }
  if (picked.empty() && t.what == "loss spike" && worst >= 0) picked.push_back(worst);
  const auto names = src_->source_names();
  nlohmann::json out = nlohmann::json::array();
  for (int64_t i : picked)
    for (int64_t s = 0; s < mbs; ++s) {
      const int64_t idx = batch.consumed_samples + (i % m) * mbs * dp + (i / m) * mbs + s;
      const int k = src_->source_of(idx);
      const double l = g.mb_losses[static_cast<size_t>(i)];
      out.push_back({{"sample", idx},
                     {"micro_batch_loss", std::isfinite(l) && l >= 0 ? nlohmann::json(l) : nlohmann::json(nullptr)},
                     {"dp_rank", i / m},
                     {"source", k},
                     {"source_name", k >= 0 && k < static_cast<int>(names.size()) ? names[static_cast<size_t>(k)] : ""},
                     {"documents", src_->documents_of(idx)}});
    }
  return out;
}

std::string Forensics::ranks_text(const std::vector<int64_t>& ranks) const {
  std::string s;
  for (int64_t q : ranks) {
    if (!s.empty()) s += ", ";
    s += parallel::describe_rank(q, "");
  }
  return s;
}

ForensicsAction Forensics::decide(const Trigger& t, const Gathered& g, const StepRead& first,
                                  const StepRead& again) const {
  ForensicsAction a;
  a.read = first;
  a.verdict = g.differ.empty() && g.loss_same && g.norm_same ? "persistent" : "transient";
  const bool replay_clean = !again.nonfinite && std::isfinite(again.loss) &&
                            !(t.what == "loss spike" && again.loss > r_.training.loss_spike_threshold * t.mean);
  switch (r_.training.spike_policy) {
    case SpikePolicy::stop: a.kind = ForensicsAction::stop; break;
    case SpikePolicy::skip: a.kind = ForensicsAction::skip; break;
    case SpikePolicy::rerun:
      a.kind = a.verdict == "transient" && replay_clean ? ForensicsAction::update_with_replay : ForensicsAction::stop;
      if (a.kind == ForensicsAction::update_with_replay) a.read = again;
      break;
  }
  return a;
}

void Forensics::write_event(const nlohmann::json& j) const {
  if (g_.rank != 0) return;
  std::filesystem::create_directories(r_.logging.dir);
  std::ofstream out(std::filesystem::path(r_.logging.dir) / "forensics.jsonl", std::ios::app);
  out << j.dump() << "\n";
  out.flush();
  if (!out) throw_write_failed("forensics.jsonl", "logging.dir");
}

void Forensics::remember(double loss) {
  if (r_.training.loss_spike_threshold <= 0 || !std::isfinite(loss)) return;
  recent_.push_back(loss);
  while (static_cast<int64_t>(recent_.size()) > r_.training.loss_spike_window) recent_.pop_front();
}

ForensicsAction Forensics::after_read(int64_t iteration, const data::Batch& batch, const StepRead& first,
                                      bool overflow_handled, const Tensor& grads,
                                      const std::function<StepRead()>& replay) {
  ForensicsAction none;
  none.read = first;
  if (!watches_steps()) return none;
  const Trigger t = check(first, overflow_handled);
  if (t.what.empty()) {
    if (!first.nonfinite) remember(first.loss);
    return none;
  }
  // The replay: same batch, same weights (the update has not run), same keys.
  const uint64_t h1 = tensor_hash(grads);
  observing_ = true;
  first_bad_layer_ = INT64_MAX;
  first_bad_sample_ = -1;
  exec_.set_micro_batch_losses(&mb_losses_);
  StepRead again;
  try {
    again = replay();
  } catch (...) {
    exec_.set_micro_batch_losses(nullptr);
    observing_ = false;
    throw;
  }
  exec_.set_micro_batch_losses(nullptr);
  observing_ = false;
  const uint64_t h2 = tensor_hash(grads);
  const Gathered g = gather(first, again, h1, h2, batch.micro_batches);
  ForensicsAction a = decide(t, g, first, again);
  ++events_;
  a.message = report(iteration, batch, t, g, first, again, a);
  if (a.kind == ForensicsAction::update_with_replay) remember(again.loss);
  return a;
}

// The event's JSON line (rank 0) and its one log line; returns the line's text.
std::string Forensics::report(int64_t iteration, const data::Batch& batch, const Trigger& t, const Gathered& g,
                              const StepRead& first, const StepRead& again, const ForensicsAction& a) const {
  const auto& tr = r_.training;
  const bool persistent = a.verdict == "persistent";
  const auto num = [](double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr); };
  nlohmann::json ranks = nlohmann::json::array();
  for (int64_t q : g.differ) {
    const auto c = g_.topo.coord(q);
    const auto [n1, n2] = g.norms[static_cast<size_t>(q)];
    ranks.push_back(
        {{"rank", q}, {"tp", c.tp}, {"pp", c.pp}, {"dp", c.dp}, {"grad_norm", num(n1)}, {"replay_grad_norm", num(n2)}});
  }
  const nlohmann::json samples = persistent ? name_samples(batch, g, t) : nlohmann::json::array();
  const std::string action = a.kind == ForensicsAction::stop   ? "stop"
                             : a.kind == ForensicsAction::skip ? "skip"
                                                               : "rerun";
  nlohmann::json j = {
      {"iteration", iteration},
      {"trigger", t.what},
      {"loss", num(first.loss)},
      {"grad_norm", num(std::sqrt(first.norm_sq))},
      {"replay",
       {{"loss", num(again.loss)}, {"grad_norm", num(std::sqrt(again.norm_sq))}, {"loss_bit_identical", g.loss_same}}},
      {"verdict", a.verdict},
      {"ranks", ranks},
      {"samples", samples},
      {"first_nonfinite_layer", g.bad_layer == INT64_MAX ? nlohmann::json(nullptr) : nlohmann::json(g.bad_layer)},
      {"policy", to_string(tr.spike_policy)},
      {"action", action}};
  if (t.what == "loss spike") {
    j["running_mean"] = t.mean;
    j["threshold"] = tr.loss_spike_threshold;
  }
  write_event(j);

  std::string why = t.what;
  if (t.what == "loss spike")
    why = fmt::format("loss spike ({:.6g} > {} x running mean {:.6g})", first.loss, tr.loss_spike_threshold, t.mean);
  std::string found;
  if (persistent) {
    found =
        "persistent (the replay reproduces the loss, the gradient norm and every rank's gradients bit for bit: data "
        "or numerics)";
    std::string names;
    for (const auto& sm : samples) {
      std::string docs;
      for (const auto& d : sm["documents"]) {
        if (!docs.empty()) docs += ',';  // appended, not "," + ...: GCC 12 -Wrestrict false positive
        docs += std::to_string(d.get<int64_t>());
      }
      names += fmt::format("{}{} (source {} {}, documents {})", names.empty() ? "" : "; ", sm["sample"].get<int64_t>(),
                           sm["source"].get<int>(), sm["source_name"].get<std::string>(), docs.empty() ? "-" : docs);
    }
    found += "; samples: " + (names.empty() ? std::string("none singled out") : names);
    found += "; first non-finite activation: " +
             (g.bad_layer == INT64_MAX ? std::string("none")
                                       : layer_text(g.bad_layer) + fmt::format(" output (rank {})", g.bad_layer_rank));
  } else {
    found = g.differ.empty()
                ? std::string("transient (the replay's loss or gradient norm differs; no rank's gradients do)")
                : "transient (recomputed gradients differ from the first run on " + ranks_text(g.differ) +
                      ": suspect hardware)";
  }
  const std::string what = a.kind == ForensicsAction::stop   ? "stopping"
                           : a.kind == ForensicsAction::skip ? "the batch's update is dropped (counted in skipped)"
                                                             : "the step is redone with the replay's gradients";
  const std::string line = fmt::format(
      "forensics: iteration {}: {}: replayed: {}; training.spike_policy {}: {} (report: {}/forensics.jsonl)", iteration,
      why, found, to_string(tr.spike_policy), what, r_.logging.dir);
  if (g_.rank == 0 && a.kind != ForensicsAction::stop) log::warn("{}", line);
  return line;
}

// Every param_hash_interval iterations: each rank's hash of its parameters, summed into
// a [world] vector (one all-reduce); replicas at the same (tp, pp) must agree. A rank
// outvoted by its replicas is named; with no majority (dp = 2) every replica of that
// position is.
void Forensics::after_update(int64_t iteration, const Tensor& weights) {
  const int64_t n = r_.training.param_hash_interval, world = g_.topo.world(), dp = g_.topo.dp();
  if (n <= 0 || iteration % n != 0 || dp < 2) return;
  std::vector<int64_t> h(static_cast<size_t>(world), 0);
  h[static_cast<size_t>(g_.rank)] = static_cast<int64_t>(tensor_hash(weights));
  g_.world->all_reduce(h.data(), world, parallel::ReduceOp::sum);
  std::vector<int64_t> odd;
  nlohmann::json hashes = nlohmann::json::object();
  for (int64_t q = 0; q < world; ++q) {
    const auto c = g_.topo.coord(q);
    int64_t same = 0;
    for (int64_t d = 0; d < dp; ++d)
      same += h[static_cast<size_t>(g_.topo.rank({c.tp, c.pp, d, c.cp}))] == h[static_cast<size_t>(q)] ? 1 : 0;
    if (2 * same <= dp) odd.push_back(q);
    hashes[std::to_string(q)] = fmt::format("{:016x}", static_cast<uint64_t>(h[static_cast<size_t>(q)]));
  }
  if (odd.empty()) return;
  nlohmann::json ranks = nlohmann::json::array();
  bool outvoted = true;
  for (int64_t q : odd) {
    const auto c = g_.topo.coord(q);
    ranks.push_back({{"rank", q}, {"tp", c.tp}, {"pp", c.pp}, {"dp", c.dp}});
    int64_t same = 0;
    for (int64_t d = 0; d < dp; ++d)
      same += h[static_cast<size_t>(g_.topo.rank({c.tp, c.pp, d, c.cp}))] == h[static_cast<size_t>(q)];
    if (2 * same == dp) outvoted = false;
  }
  write_event({{"iteration", iteration},
               {"trigger", "the data-parallel replicas' parameter hashes disagree"},
               {"verdict", "transient"},
               {"ranks", ranks},
               {"outvoted", outvoted},
               {"hashes", hashes},
               {"policy", "stop"},
               {"action", "stop"}});
  throw_runtime(
      "forensics: iteration {}: the data-parallel replicas' parameters differ (training.param_hash_interval "
      "{}): {} {}: suspect hardware; stopping (resume from the last checkpoint; report: {}/forensics.jsonl)",
      iteration, n, outvoted ? "outvoted by its replicas:" : "no majority, one of:", ranks_text(odd), r_.logging.dir);
}

}  // namespace mtnlg::app
