#include "app/train/checkpointing.hpp"

#include <csignal>
#include <chrono>
#include <cstdlib>
#include <filesystem>

#include "core/log.hpp"
#include "parallel/flight_recorder.hpp"
#include "core/switches.hpp"

namespace mtnlg::app {

namespace {
volatile std::sig_atomic_t g_stop = 0;
// SIGUSR1 also asks the device watchdog for a live flight-recorder dump (an atomic store).
extern "C" void on_stop_signal(int sig) {
  g_stop = 1;
  if (sig == SIGUSR1) parallel::device_watchdog().request_dump();
}
}  // namespace

void install_stop_signal_handlers() {
  parallel::device_watchdog();  // made now: the handler must not be the first to touch it
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);
  sigaction(SIGHUP, &sa, nullptr);  // the terminal went away: save and stop like SIGTERM
  // Ctrl-C: the first saves and stops; the handler then resets itself, so a second one
  // ends the process at once (the way out of a save that takes too long).
  sa.sa_flags = SA_RESTART | SA_RESETHAND;
  sigaction(SIGINT, &sa, nullptr);
}

void throw_stopped_without_checkpoint(const std::string& why, int64_t iteration) {
  throw_runtime(
      "{} stopped the run after iteration {}, but checkpoint.save is not set: nothing was saved (set "
      "checkpoint.save and checkpoint.load to the same directory to resume)",
      why, iteration);
}
bool stop_signal_received() { return g_stop != 0; }
void reset_stop_signal() { g_stop = 0; }

void check_same_network(const std::string& dir, const model::ckpt::TrainState& st, const Recipe& r) {
  Recipe saved = parse_recipe(st.recipe_yaml, dir + "/metadata.json");
  auto same = [&](const char* what, int64_t a, int64_t b) {
    if (a != b)
      throw_input("{}: checkpoint has model.{} = {} but the recipe says {}; a checkpoint continues the same network",
                  dir, what, a, b);
  };
  same("num_layers", saved.model.num_layers, r.model.num_layers);
  same("hidden_size", saved.model.hidden_size, r.model.hidden_size);
  same("num_attention_heads", saved.model.num_attention_heads, r.model.num_attention_heads);
  same("ffn_hidden_size", saved.model.ffn_hidden_size, r.model.ffn_hidden_size);
  same("vocab_size", saved.model.vocab_size, r.model.vocab_size);
  // A learned position table has max_position_embeddings rows; rotary positions have no
  // table, and a longer context (context extension) continues the same weights.
  if (!r.model.rope() || !saved.model.rope())
    same("max_position_embeddings", saved.model.max_position_embeddings, r.model.max_position_embeddings);
  // The architecture's parts that decide which parameters exist and what they mean (the
  // rotary settings may change: a longer context continues with a new base or scaling).
  auto same_text = [&](const char* what, const std::string& a, const std::string& b) {
    if (a != b)
      throw_input("{}: checkpoint has model.{} = {} but the recipe says {}; a checkpoint continues the same network",
                  dir, what, a, b);
  };
  auto yes_no = [](bool b) { return std::string(b ? "true" : "false"); };
  const ModelConfig &a = saved.model, &b = r.model;
  same_text("position_embedding_type", to_string(a.position_embedding_type), to_string(b.position_embedding_type));
  same_text("normalization", to_string(a.normalization), to_string(b.normalization));
  same_text("swiglu", yes_no(a.swiglu), yes_no(b.swiglu));
  same("num_query_groups", a.query_groups(), b.query_groups());
  same("kv_channels", a.head_dim(), b.head_dim());
  same_text("untie_embeddings_and_output_weights", yes_no(a.untie_embeddings_and_output_weights),
            yes_no(b.untie_embeddings_and_output_weights));
  same_text("add_bias_linear", yes_no(a.add_bias_linear), yes_no(b.add_bias_linear));
  same_text("add_qkv_bias", yes_no(a.qkv_bias()), yes_no(b.qkv_bias()));
  same_text("qk_layernorm", yes_no(a.qk_layernorm), yes_no(b.qk_layernorm));
}

namespace {
// Each optimizer of the model with where its region starts in the flat buffers.
std::vector<std::pair<optimizer::DistributedAdamW*, int64_t>> regions(optimizer::ModelAdamW& o) {
  std::vector<std::pair<optimizer::DistributedAdamW*, int64_t>> out{{&o.dense(), 0}};
  if (o.experts()) out.emplace_back(o.experts(), o.expert_offset());
  return out;
}
}  // namespace

CheckpointManager::CheckpointManager(const Recipe& r, const parallel::ProcessGroups& g, model::ckpt::Layout layout)
    : r_(r), g_(g), layout_(layout), root_(r.checkpoint.save) {}

CheckpointManager::~CheckpointManager() {
  if (writer_.joinable()) writer_.join();
}

std::optional<model::ckpt::TrainState> CheckpointManager::resume(model::ParamStore& store,
                                                                 optimizer::ModelAdamW& optim) {
  const std::string& path = r_.checkpoint.load;
  if (path.empty()) return std::nullopt;
  namespace fs = std::filesystem;
  if (!fs::exists(path + "/metadata.json") && !model::ckpt::latest_iteration(path)) {
    log::info("checkpoint.load {}: no checkpoint there yet, starting from scratch", path);
    return std::nullopt;
  }
  std::string dir = model::ckpt::resolve(path);
  auto t0 = std::chrono::steady_clock::now();
  model::ckpt::TrainState st = model::ckpt::read_metadata(dir);
  if (auto miss = model::ckpt::missing_files(dir, st); !miss.empty())
    throw_input("{}: {} is missing ({} shard files of layout tp={} pp={} dp={} are absent)", dir, miss.front(),
                miss.size(), st.layout.tp, st.layout.pp, st.layout.dp);
  check_same_network(dir, st, r_);
  if (model::ckpt::has_optimizer_state(dir)) {
    model::ckpt::load_into(dir, store);
    for (const auto& [adamw, base] : regions(optim)) {
      model::ckpt::OptimShard shard{base + adamw->shard_begin(), base + adamw->shard_end(), &adamw->exp_avg(),
                                    &adamw->exp_avg_sq()};
      model::ckpt::load_optimizer_state(dir, store, shard, adamw->exp_avg(), adamw->exp_avg_sq());
    }
  } else {  // weights only (an imported model): the optimizer starts fresh
    model::ckpt::load_into(dir, store);
    log::info("{}: weights only (no optimizer state): AdamW starts from zero moments", dir);
  }
  optim.set_steps_taken(st.optimizer_steps);
  log::info("resumed from {} (iteration {}, {} tokens; saved with tp={} pp={} dp={}{}{}{}) in {:.1f}s", dir,
            st.iteration, st.consumed_tokens, st.layout.tp, st.layout.pp, st.layout.dp,
            st.layout.cp > 1 ? fmt::format(" cp={}", st.layout.cp) : "",
            st.layout.ep > 1 ? fmt::format(" ep={}", st.layout.ep) : "", st.layout.zero1 ? " ZeRO-1" : "",
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return st;
}

double CheckpointManager::save(const model::ckpt::TrainState& st, const model::ParamStore& store,
                               optimizer::ModelAdamW& optim) {
  if (!enabled()) return 0;
  auto t0 = std::chrono::steady_clock::now();
  finish();  // one save in flight at a time
  const bool rank0 = g_.rank == 0;
  const std::string part = model::ckpt::partial_dir(root_, st.iteration);
  if (rank0) {
    std::filesystem::remove_all(part);  // a stale partial save of a crashed run
    std::filesystem::create_directories(part);
  }
  if (g_.world) g_.world->barrier();
  // The replicas are the dp x cp ranks of a (tp, pp) position; the first writes the model,
  // and the optimizer state under ZeRO-1 comes from each by its index among them.
  const int64_t replica = g_.coord.dp * g_.topo.cp() + g_.coord.cp;
  auto& dense = optim.dense();
  model::ckpt::OptimShard shard{dense.shard_begin(), dense.shard_end(), &dense.exp_avg(), &dense.exp_avg_sq()};
  auto snaps = std::make_shared<std::vector<model::ckpt::Snapshot>>();
  snaps->push_back(model::ckpt::take_snapshot(store, &shard, g_.coord.tp, g_.coord.pp, replica, replica == 0,
                                              optim.zero1() || replica == 0));
  // The routed experts: written by the first of their replicas (edp), their optimizer
  // state by each under ZeRO-1.
  if (auto* ex = optim.experts()) {
    const int64_t base = optim.expert_offset(), edp = g_.ecoord.edp;
    model::ckpt::OptimShard es{base + ex->shard_begin(), base + ex->shard_end(), &ex->exp_avg(), &ex->exp_avg_sq()};
    snaps->push_back(model::ckpt::take_expert_snapshot(store, &es, g_.ecoord.etp, g_.ecoord.ep, g_.coord.pp, edp,
                                                       edp == 0, ex->zero1() || edp == 0));
  }
  double blocked = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  writer_done_ = false;
  writer_error_.clear();
  pending_iteration_ = st.iteration;
  const int64_t delay_ms = *switches::integer(Switch::test_save_delay_ms);
  writer_ = std::thread([this, snaps, part, st, rank0, delay_ms] {
    try {
      for (const auto& snap : *snaps) model::ckpt::write_snapshot(part, snap);
      // Test hook: widen the window in which a kill leaves a partial checkpoint.
      if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
      if (rank0) model::ckpt::write_metadata(part, st);
    } catch (const std::exception& e) {
      writer_error_ = e.what();
    }
    writer_done_ = true;
  });
  log::info("saving checkpoint iteration {} to {} (step blocked {:.3f}s; writing in the background)", st.iteration,
            root_, blocked);
  return blocked;
}

void CheckpointManager::commit_if_all_done(bool wait) {
  if (pending_iteration_ < 0) return;
  if (wait && writer_.joinable()) writer_.join();
  int64_t done = writer_done_ ? 1 : 0;
  if (g_.world && g_.world->size() > 1) g_.world->all_reduce(&done, 1, parallel::ReduceOp::sum);
  int64_t world = g_.world ? g_.world->size() : 1;
  if (done < world) return;
  if (writer_.joinable()) writer_.join();
  int64_t failed = writer_error_.empty() ? 0 : 1;
  if (g_.world && g_.world->size() > 1) g_.world->all_reduce(&failed, 1, parallel::ReduceOp::sum);
  if (failed) {
    if (!writer_error_.empty()) throw_runtime("saving checkpoint iteration {}: {}", pending_iteration_, writer_error_);
    throw_runtime("saving checkpoint iteration {} failed on another rank", pending_iteration_);
  }
  if (g_.rank == 0) {
    model::ckpt::commit(root_, pending_iteration_, r_.checkpoint.keep_last);
    log::info("checkpoint iteration {} committed: {}", pending_iteration_,
              model::ckpt::iteration_dir(root_, pending_iteration_));
  }
  if (g_.world) g_.world->barrier();
  pending_iteration_ = -1;
}

void CheckpointManager::poll() { commit_if_all_done(false); }
void CheckpointManager::finish() { commit_if_all_done(true); }

}  // namespace mtnlg::app
