// Inference drivers over GptChunk (model/gpt.hpp), the one forward path of training,
// eval and generation: `mtnlg eval` scores many requests teacher-forced, batched
// (score_batch); `mtnlg generate` prefills the prompt into a KvCache once, then runs one
// token per step (generate). There is no second model here: both call
// GptChunk::infer with InferenceCall::logit_rows (and a KvCache for generation) and read
// the logits they asked for on the host. Only the first cfg.vocab_size logit columns
// are real; the padded ones are never looked at.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.hpp"
#include "model/gpt.hpp"
#include "model/params.hpp"
#include "parallel/communicator.hpp"

namespace mtnlg::model {

// A model ready for inference: full (tp=1) weights under the names of
// declare_chunk_params with ChunkSpec{0, L, true, true, ""}.
struct LoadedModel {
  GptConfig cfg;
  ParamStore store;
};
// Loads a model from a checkpoint directory (app::load_for_inference fits here).
using ModelLoader = std::function<LoadedModel(const std::string& ckpt_dir)>;

// Declares the full model and draws random weights (ParamStore::initialize with `seed`),
// fp32 master weights with a compute copy in cfg.dtype. A testing aid: `--random-init
// RECIPE` and the oracle tests use it.
LoadedModel make_random_model(const GptConfig& cfg, uint64_t seed);

// The whole model (every layer, the embedding and the output layer) as one chunk of this
// process, configured for inference (no dropout, no recompute, no sequence parallelism);
// with `groups.tp` its weights are this tp rank's shards. `store` must outlive it.
std::unique_ptr<GptChunk> whole_model_chunk(const GptConfig& cfg, ParamStore& store,
                                            const parallel::ProcessGroups& groups = {});

// Logits [rows, padded vocab] of `m` for rows b*T + t of `tokens` [B, T] (row-major),
// as f32 on the host: one GptChunk::infer with InferenceCall::logit_rows (and `kv`, when given).
Tensor logits_at(GptChunk& m, const int32_t* tokens, int64_t B, int64_t T, const std::vector<int64_t>& rows,
                 KvCache* kv = nullptr);

// ---- teacher-forced scoring (loglikelihood requests) --------------------------------
struct ScoreRequest {
  std::vector<int32_t> input;    // model input, 1 <= size <= max_positions
  std::vector<int32_t> targets;  // the continuation; target j is predicted at input position
                                 // size - targets.size() + j
};
struct ScoreResult {
  double logprob = 0;     // sum over targets of log_softmax (real vocabulary only), fp64 sum
  bool is_greedy = true;  // every target is the argmax (lowest index wins ties)
};
// Scores the requests as one right-padded batch (causal attention keeps the padding out
// of the real positions); logits only of the scored rows.
std::vector<ScoreResult> score_batch(GptChunk& m, const std::vector<const ScoreRequest*>& reqs);

// log_softmax over the first `vocab` entries of `row` at `target`, and the argmax.
void log_softmax_at(const float* row, int64_t vocab, int32_t target, double& logprob, int32_t& argmax);

// ---- generation -------------------------------------------------------------------
struct SamplingOptions {
  int64_t max_new_tokens = 64;
  double temperature = 1.0;
  int64_t top_k = 0;   // 0 = off
  double top_p = 1.0;  // 1 = off
  bool greedy = false;
  uint64_t seed = 0;
  int32_t stop_token = 50256;  // <|endoftext|>; generation stops after emitting it
};
// Draws the next token from logits[vocab] (real vocabulary) with draw index `step`:
// temperature, then top-k, then top-p (smallest prefix of the sorted distribution
// whose mass reaches p), then a Philox uniform keyed by (seed, step).
int32_t sample_token(const float* logits, int64_t vocab, const SamplingOptions& opt, uint64_t step);
// Prefills `prompt` (left-truncated so that prompt + new tokens fit max_positions) into
// a KvCache of `m` and generates up to max_new_tokens, one forward per token. `m` holds
// the whole model (tp shards allowed: every tp rank draws the same tokens). on_token
// (optional) sees each new token as it is produced. Returns the new tokens (including a
// final stop token).
std::vector<int32_t> generate(GptChunk& m, std::vector<int32_t> prompt, const SamplingOptions& opt,
                              const std::function<void(int32_t)>& on_token = {});

}  // namespace mtnlg::model
