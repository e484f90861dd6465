// Validation and test loss during training (see validation.hpp).
#include "app/train/validation.hpp"

#include "app/process/module_configs.hpp"
#include "app/train/pipeline_executor.hpp"

#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/ops.hpp"
#include "core/log.hpp"
#include "core/tensorboard.hpp"
#include "data/sample_source.hpp"

namespace mtnlg::app {

namespace {

constexpr uint64_t kValidMockSeed = 0x76616C6964ull;  // "valid": mock data has no split
constexpr uint64_t kTestMockSeed = 0x74657374ull;     // "test"
constexpr int kTagValidation = 7;

std::shared_ptr<const data::SampleSource> make_part(const Recipe& r, int part, int64_t n, const std::string& cache) {
  if (!data::split_part_present(r.data.split, part)) return nullptr;
  if (r.data.mock)
    return data::make_mock_source(
        r.model.vocab_size, r.model.seq_length,
        static_cast<uint64_t>(r.training.seed) ^ (part == 1 ? kValidMockSeed : kTestMockSeed));
  try {
    return data::make_blend_source(blend_spec(r), part, n, cache);
  } catch (const InputError& e) {
    // A part the split leaves without documents (small data): no evaluation of it, as
    // Megatron has no dataset for it. Broken data already failed for the train part.
    log::warn("{} loss is not evaluated: {}", part == 1 ? "validation" : "test", e.what());
    return nullptr;
  }
}

}  // namespace

Validation::Validation(const Recipe& r, const parallel::ProcessGroups& g, model::ParamStore& store,
                       const model::GptConfig& cfg, const std::vector<model::ChunkSpec>& chunk_specs,
                       const std::string& cache_dir, int64_t start_iteration)
    : r_(r), g_(g) {
  const auto& t = r.training;
  if (t.eval_interval <= 0 || t.eval_iters <= 0) return;
  const auto n = data::split_num_samples(r.training, r.model.seq_length);
  valid_ = make_part(r, 1, n[1], cache_dir);
  test_ = make_part(r, 2, n[2], cache_dir);
  if (!valid_ && !test_) return;
  // The same parameters, read through chunks without dropout or recompute (Megatron's
  // model.eval()).
  model::GptConfig ecfg = cfg;
  ecfg.hidden_dropout = 0;
  ecfg.attention_dropout = 0;
  ecfg.recompute = RecomputeGranularity::none;
  for (const auto& s : chunk_specs) chunks_.push_back(std::make_unique<model::GptChunk>(ecfg, s, store, g_));
  evaluations_done_ = start_iteration / t.eval_interval;
}

Validation::~Validation() = default;

ValidationResult Validation::evaluate(int part, int64_t first) {
  const auto& src = part == 1 ? valid_ : test_;
  MTNLG_CHECK(src && !chunks_.empty(), "evaluate part {} without data", part);
  const int64_t T = r_.model.seq_length, C = r_.model.hidden_size, mbs = r_.training.micro_batch_size;
  const int64_t gbs = r_.training.global_batch_size, dp = g_.topo.dp(), pp = g_.topo.pp(), rank = g_.coord.pp;
  const int64_t v = static_cast<int64_t>(chunks_.size());
  MTNLG_CHECK(pp > 1 || v == 1, "interleaving needs pp > 1");
  data::Loader loader(src, mbs, g_.coord.dp, dp);
  const int64_t R = chunks_[0]->local_rows(mbs);
  const int32_t eod = r_.data.eod_mask_loss ? eod_token(r_) : -1;  // masked as in training
  const DType act = chunks_[0]->activation_dtype();
  const Device dev = chunks_[0]->device();
  // Loss sum and tokens, kept on the device and read once at the end.
  Tensor acc = Tensor::empty({2}, DType::f64, dev);
  ops::fill(acc, 0.0);
  for (int64_t it = 0; it < r_.training.eval_iters; ++it) {
    const int64_t consumed = first + it * gbs;
    const data::Batch batch = loader.build(consumed, gbs);
    for (int64_t m = 0; m < batch.micro_batches; ++m) {
      model::ScoreMicroBatch mb;
      mb.tokens = batch.tokens.data() + m * mbs * (T + 1);
      mb.micro_batch_size = mbs;
      mb.loss_acc = &acc;
      std::vector<float> mask;
      if (eod >= 0) {
        double unused = 0;
        mask = eod_loss_mask(mb.tokens, mbs, T, eod, unused);
        mb.loss_mask = mask.data();
      }
      // Forward only, stage after stage: virtual stage c*pp + rank receives from the
      // previous one (rank-1, or the last rank's chunk c-1) and sends to the next.
      Tensor x;
      for (int64_t c = 0; c < v; ++c) {
        auto& chunk = *chunks_[static_cast<size_t>(c)];
        if (!chunk.spec().has_embedding) {
          x = Tensor::empty({R, C}, act, dev);
          g_.pp->recv(x.raw(), x.numel(), act, (rank - 1 + pp) % pp, kTagValidation);
        }
        model::ForwardResult fr = chunk.score(mb, x);
        if (!chunk.spec().has_head) {
          auto req = g_.pp->isend(fr.output.raw(), fr.output.numel(), act, (rank + 1) % pp, kTagValidation);
          req->wait();
        }
      }
    }
  }
  const Tensor host = acc.to(Device::cpu);
  double sums[2] = {host.data<double>()[0], host.data<double>()[1]};
  // Every rank learns the loss: the last stage's tp-rank-0 ranks contribute (one per dp).
  if (!(g_.is_last_stage() && g_.coord.tp == 0)) sums[0] = sums[1] = 0;
  if (g_.world && g_.world->size() > 1) g_.world->all_reduce(sums, 2, parallel::ReduceOp::sum);
  ValidationResult res;
  res.tokens = sums[1];
  res.loss = sums[1] > 0 ? sums[0] / sums[1] : 0.0;
  res.ppl = std::exp(std::min(20.0, res.loss));
  return res;
}

void Validation::log_result(const char* kind, const std::string& where, int64_t iteration, int64_t consumed_tokens,
                            const ValidationResult& res, tb::TensorBoardWriter* tb, bool quiet) {
  if (g_.rank != 0) return;
  const std::string line =
      fmt::format(" validation loss at {} | lm loss value: {:.6E} | lm loss PPL: {:.6E} | ", where, res.loss, res.ppl);
  if (!quiet) {
    const std::string dashes(line.size() + 1, '-');
    log::info("{}", dashes);
    log::info("{}", line);
    log::info("{}", dashes);
  }
  std::filesystem::create_directories(r_.logging.dir);
  std::ofstream out(std::filesystem::path(r_.logging.dir) / "metrics.jsonl", std::ios::app);
  const std::string k = kind;
  nlohmann::json j = {{"iteration", iteration}, {k + "_loss", res.loss}, {k + "_ppl", res.ppl}};
  if (!std::isfinite(res.loss)) j[k + "_loss"] = nullptr;
  if (!std::isfinite(res.ppl)) j[k + "_ppl"] = nullptr;
  out << j.dump() << "\n";
  out.flush();
  if (!out) throw_runtime("{}/metrics.jsonl: cannot append the {} loss", r_.logging.dir, kind);
  if (tb) tb->log_iteration({{"lm loss", res.loss}, {"lm loss ppl", res.ppl}}, iteration, consumed_tokens, k);
}

void Validation::after_iteration(int64_t iteration, int64_t consumed_tokens, tb::TensorBoardWriter* tb, bool quiet) {
  if (!valid_ || iteration % r_.training.eval_interval != 0) return;
  const int64_t per_eval = r_.training.eval_iters * r_.training.global_batch_size;
  const auto res = evaluate(1, evaluations_done_++ * per_eval);
  log_result("validation", fmt::format("iteration {}", iteration), iteration, consumed_tokens, res, tb, quiet);
}

void Validation::at_end(int64_t iteration, int64_t consumed_tokens, tb::TensorBoardWriter* tb, bool quiet) {
  const int64_t per_eval = r_.training.eval_iters * r_.training.global_batch_size;
  if (valid_) {
    const auto res = evaluate(1, evaluations_done_++ * per_eval);
    log_result("validation", fmt::format("iteration {} on validation set", iteration), iteration, consumed_tokens, res,
               tb, quiet);
  }
  if (test_) {
    const auto res = evaluate(2, 0);
    log_result("test", fmt::format("iteration {} on test set", iteration), iteration, consumed_tokens, res, tb, quiet);
  }
}

}  // namespace mtnlg::app
