#include "app/eval/eval_parallel.hpp"

#include "app/process/module_configs.hpp"
#include "app/train/fault_injection.hpp"
#include "app/train/trainer.hpp"
#include "model/checkpoint.hpp"
#include "model/partition.hpp"
#include "parallel/flight_recorder.hpp"

namespace mtnlg::app {

ParallelScorer::ParallelScorer(const Recipe& r, const std::string& dir, const parallel::ProcessGroups& g, Device dev)
    : g_(g), fault_(fault_injection_from_env()) {
  if (fault_.active() && fault_.mode != "hang")
    throw_input("MTNLG_FAULT_INJECT mode={}: eval takes only mode=hang (its iteration counts eval batches)",
                fault_.mode);
  if (g.topo.dp() != 1)
    throw_input("eval: world size {} must equal tensor_model_parallel_size x pipeline_model_parallel_size = {} x {}",
                g.topo.world(), g.topo.tp(), g.topo.pp());
  if (r.parallel.num_layers_per_virtual_pipeline_stage > 0)
    throw_input("eval: interleaved pipelines are not supported; unset parallel.num_layers_per_virtual_pipeline_stage");
  cfg_ = parallel_inference_config(r);
  const auto chunks = model::partition_chunks(pipeline_split(r), g.coord.pp);
  MTNLG_CHECK(chunks.size() == 1, "eval runs without interleaving; the recipe has {} chunks per rank", chunks.size());
  const model::ChunkSpec spec = chunks.front();
  model::declare_chunk_params(store_, cfg_, spec, g.coord.tp, g.topo.tp());
  store_.finalize(DType::f32, DType::f32, dev);
  model::ckpt::load_into(dir, store_);
  chunk_ = std::make_unique<model::GptChunk>(cfg_, spec, store_, g_);
}

ParallelScorer::~ParallelScorer() = default;

std::vector<model::ScoreResult> ParallelScorer::operator()(const std::vector<const model::ScoreRequest*>& reqs) {
  const int64_t B = static_cast<int64_t>(reqs.size()), T = cfg_.seq_length, C = cfg_.hidden;
  std::vector<model::ScoreResult> res(reqs.size());
  if (B == 0) return res;
  // The flight recorder's context: the eval batch stands where training's iteration does.
  parallel::device_watchdog().set_iteration(++batches_);
  parallel::device_watchdog().set_phase(-1, -1, "eval forward");
  // Testing aid: MTNLG_FAULT_INJECT=rank=R:iteration=I:mode=hang, I counting eval batches.
  if (fault_.mode == "hang" && fault_.rank == g_.rank && fault_.iteration == batches_)
    parallel::device_watchdog().inject_hang();
  // tokens[b] = input ++ [last target], right-padded: the label at position p is
  // tokens[p + 1], so the targets sit at positions n-k .. n-1 of the input.
  std::vector<int32_t> tokens(static_cast<size_t>(B * (T + 1)), 0);
  for (int64_t b = 0; b < B; ++b) {
    const auto& q = *reqs[b];
    const int64_t n = static_cast<int64_t>(q.input.size());
    if (n > T) throw_input("eval: a request of {} tokens exceeds the model's seq_length {}", n, T);
    std::copy(q.input.begin(), q.input.end(), tokens.begin() + b * (T + 1));
    tokens[b * (T + 1) + n] = q.targets.back();
  }
  model::ScoreMicroBatch mb;
  mb.tokens = tokens.data();
  mb.micro_batch_size = B;
  mb.token_scores = true;
  Tensor input;
  const int64_t R = chunk_->local_rows(B);
  if (!g_.is_first_stage()) {
    input = Tensor::empty({R, C}, chunk_->activation_dtype(), chunk_->device());
    g_.pp->recv(input.raw(), input.numel(), input.dtype(), g_.coord.pp - 1, 0);
  }
  model::ForwardResult fr = chunk_->score(mb, input);
  if (!g_.is_last_stage()) {
    auto req = g_.pp->isend(fr.output.raw(), fr.output.numel(), fr.output.dtype(), g_.coord.pp + 1, 0);
    req->wait();
  }
  // Per request sums on the last stage (tp rank 0), then to every rank.
  std::vector<double> out(static_cast<size_t>(2 * B), 0.0);
  if (g_.is_last_stage() && g_.coord.tp == 0) {
    for (int64_t b = 0; b < B; ++b) {
      const auto& q = *reqs[b];
      const int64_t n = static_cast<int64_t>(q.input.size()), k = static_cast<int64_t>(q.targets.size());
      double lp = 0;
      bool greedy = true;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t row = b * T + (n - k + j);
        lp += fr.token_logprob[row];
        greedy = greedy && fr.token_greedy[row];
      }
      out[2 * b] = lp;
      out[2 * b + 1] = greedy ? 1.0 : 0.0;
    }
  }
  if (g_.world && g_.world->size() > 1) g_.world->all_reduce(out.data(), 2 * B, parallel::ReduceOp::sum);
  for (int64_t b = 0; b < B; ++b) {
    res[b].logprob = out[2 * b];
    res[b].is_greedy = out[2 * b + 1] > 0.5;
  }
  return res;
}

}  // namespace mtnlg::app
