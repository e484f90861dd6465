// Inference forward of a whole (tp=1) GPT with a key/value cache: the path used by
// `mtnlg eval` (teacher-forced scoring of many requests, batched) and by
// `mtnlg generate` (prefill the prompt once, then one token per step).
//
// The math is GptChunk's forward without dropout (pre-LN blocks, per-head [q|k|v]
// QKV, tanh GELU, final LayerNorm, logits = lnf(x) @ wte^T); only the first
// cfg.vocab_size logit columns are real, the padded ones are never looked at.
// Attention runs over the cache (core/ops_inference.hpp), so the [T,T] probability
// matrix of training is never formed.
//
// Invariant: a KvCache holds positions [0, length) of every batch row; forward()
// appends T_new positions to all rows at once. A "scratch" cache (one layer's
// buffers, reused by every layer) is enough when nothing is generated afterwards.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.hpp"
#include "model/gpt.hpp"
#include "model/params.hpp"

namespace mtnlg::model {

// A model ready for inference: full (tp=1) weights under the names of
// declare_chunk_params with ChunkSpec{0, L, true, true, ""}.
struct LoadedModel {
  GptConfig cfg;
  ParamStore store;
};
// Loads a model from a checkpoint directory (the lead's load_for_inference fits here).
using ModelLoader = std::function<LoadedModel(const std::string& ckpt_dir)>;

// Declares the full model and draws random weights (ParamStore::initialize with `seed`).
// A testing aid: `--random-init RECIPE` and the oracle tests use it.
LoadedModel make_random_model(const GptConfig& cfg, uint64_t seed);

struct KvCache {
  int64_t batch = 0, capacity = 0, length = 0;
  bool scratch = false;     // one buffer pair shared by every layer (no later steps possible)
  std::vector<Tensor> k, v;  // per layer (or one when scratch): [B, H, capacity, D]
};

class InferenceModel {
 public:
  // Keeps views into `store`, which must outlive this object.
  InferenceModel(const GptConfig& cfg, const ParamStore& store);

  const GptConfig& config() const { return cfg_; }
  KvCache make_cache(int64_t batch, int64_t capacity, bool scratch = false) const;

  // tokens: [B, T_new] row-major, placed at positions cache.length.. ; returns the
  // final-LayerNorm hidden states [B*T_new, C] (row = b*T_new + i) and advances
  // cache.length. Throws InputError when positions would pass max_positions.
  Tensor forward(KvCache& cache, const int32_t* tokens, int64_t B, int64_t T_new) const;
  // Logits [n, padded_vocab] of hidden rows [n, C]; columns >= vocab_size are padding.
  Tensor logits(const Tensor& hidden) const;

 private:
  struct Layer {
    Tensor ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc1_w, fc1_b, fc2_w, fc2_b;
  };
  GptConfig cfg_;
  std::vector<Layer> layers_;
  Tensor wte_, wpe_, lnf_w_, lnf_b_;
};

// ---- teacher-forced scoring (loglikelihood requests) --------------------------------
struct ScoreRequest {
  std::vector<int32_t> input;    // model input, 1 <= size <= max_positions
  std::vector<int32_t> targets;  // the continuation; target j is predicted at input position
                                 // size - targets.size() + j
};
struct ScoreResult {
  double logprob = 0;  // sum over targets of log_softmax (real vocabulary only), fp64 sum
  bool is_greedy = true;  // every target is the argmax (lowest index wins ties)
};
// Scores the requests as one right-padded batch.
std::vector<ScoreResult> score_batch(const InferenceModel& m, const std::vector<const ScoreRequest*>& reqs);

// log_softmax over the first `vocab` entries of `row` at `target`, and the argmax.
void log_softmax_at(const float* row, int64_t vocab, int32_t target, double& logprob, int32_t& argmax);

// ---- generation -------------------------------------------------------------------
struct SamplingOptions {
  int64_t max_new_tokens = 64;
  double temperature = 1.0;
  int64_t top_k = 0;      // 0 = off
  double top_p = 1.0;     // 1 = off
  bool greedy = false;
  uint64_t seed = 0;
  int32_t stop_token = 50256;  // <|endoftext|>; generation stops after emitting it
};
// Draws the next token from logits[vocab] (real vocabulary) with draw index `step`:
// temperature, then top-k, then top-p (smallest prefix of the sorted distribution
// whose mass reaches p), then a Philox uniform keyed by (seed, step).
int32_t sample_token(const float* logits, int64_t vocab, const SamplingOptions& opt, uint64_t step);
// Prefills `prompt` (left-truncated so that prompt + new tokens fit max_positions) and
// generates up to max_new_tokens with the KV cache. on_token (optional) sees each new
// token as it is produced. Returns the new tokens (including a final stop token).
std::vector<int32_t> generate(const InferenceModel& m, std::vector<int32_t> prompt, const SamplingOptions& opt,
                              const std::function<void(int32_t)>& on_token = {});

}  // namespace mtnlg::model
