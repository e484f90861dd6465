// Validation and test loss during training, as Megatron's evaluate(): every
// training.eval_interval iterations, eval_iters global batches of the split's valid part
// run forward only (dropout off) through this rank's model chunks; the token-weighted
// mean loss reaches every rank. Each evaluation continues where the previous one stopped
// (Megatron's consumed_valid_samples), which is why the valid part is built for
// (iterations / eval_interval + 1) * eval_iters * global_batch_size samples; after the
// last iteration the valid part is evaluated once more and, when the split has a test
// part, the test part (eval_iters batches from its start).
//
// Rank 0 prints Megatron's line
//   validation loss at iteration N | lm loss value: X | lm loss PPL: Y |
// appends {"iteration": N, "validation_loss": X, "validation_ppl": Y} (test_loss /
// test_ppl for the test part) to metrics.jsonl, and writes TensorBoard scalars
// validation/lm loss, validation/lm loss ppl (and -vs-tokens, as training does).
//
// The loss is the same number on every layout (tp, pp, dp, interleaving) up to
// reduction-order rounding: batches, samples and weights do not depend on the layout.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "config/recipe.hpp"
#include "model/gpt.hpp"
#include "parallel/communicator.hpp"

namespace mtnlg::tb {
class TensorBoardWriter;
}

namespace mtnlg::data {
class SampleSource;
}

namespace mtnlg::app {

struct ValidationResult {
  double loss = 0;    // token-weighted mean over the evaluated batches
  double ppl = 0;     // exp(min(20, loss)), as Megatron
  double tokens = 0;  // tokens that counted
};

class Validation {
 public:
  // Inactive unless training.eval_interval > 0. Builds the valid (and test) sources;
  // a part the split leaves empty is skipped with a warning. `chunks_specs`: this
  // rank's virtual chunks in order; `start_iteration`: the iteration training resumes
  // from (the valid position is a pure function of it).
  Validation(const Recipe& r, const parallel::ProcessGroups& g, model::ParamStore& store, const model::GptConfig& cfg,
             const std::vector<model::ChunkSpec>& chunk_specs, const std::string& cache_dir, int64_t start_iteration);
  ~Validation();

  bool active() const { return valid_ != nullptr; }
  // The trainer's hooks. After iteration `iteration` (every rank calls them):
  void after_iteration(int64_t iteration, int64_t consumed_tokens, tb::TensorBoardWriter* tb, bool quiet);
  void at_end(int64_t iteration, int64_t consumed_tokens, tb::TensorBoardWriter* tb, bool quiet);

  // eval_iters global batches of `part` (1 valid, 2 test) from sample `first`.
  ValidationResult evaluate(int part, int64_t first);

 private:
  void log_result(const char* kind, const std::string& where, int64_t iteration, int64_t consumed_tokens,
                  const ValidationResult& res, tb::TensorBoardWriter* tb, bool quiet);

  const Recipe& r_;
  parallel::ProcessGroups g_;
  std::vector<std::unique_ptr<model::GptChunk>> chunks_;
  std::shared_ptr<const data::SampleSource> valid_, test_;
  int64_t evaluations_done_ = 0;  // valid evaluations so far: the next one starts after them
};

}  // namespace mtnlg::app
