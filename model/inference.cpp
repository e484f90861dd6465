// Teacher-forced scoring, sampling and KV-cache generation over GptChunk's forward.
// See model/inference.hpp for the contract.
#include "model/inference.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/ops.hpp"
#include "core/rng.hpp"

namespace mtnlg::model {

LoadedModel make_random_model(const GptConfig& cfg, uint64_t seed) {
  LoadedModel m;
  m.cfg = cfg;
  ChunkSpec spec{0, cfg.num_layers_total, true, true, ""};
  declare_chunk_params(m.store, cfg, spec, 0, 1);
  m.store.finalize(DType::f32, cfg.dtype == DType::f64 ? DType::f64 : cfg.dtype, Device::cpu);
  m.store.initialize(seed, cfg.init_std, cfg.num_layers_total);
  m.store.sync_weights();
  return m;
}

std::unique_ptr<GptChunk> whole_model_chunk(const GptConfig& cfg, ParamStore& store,
                                            const parallel::ProcessGroups& groups) {
  GptConfig c = cfg;
  c.hidden_dropout = c.attention_dropout = 0;
  c.recompute = RecomputeGranularity::none;
  c.sequence_parallel = false;
  return std::make_unique<GptChunk>(c, ChunkSpec{0, c.num_layers_total, true, true, ""}, store, groups);
}

namespace {
void check_tokens(const GptConfig& cfg, const int32_t* tokens, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (tokens[i] < 0 || tokens[i] >= cfg.vocab_size)
      throw_input("token id {} outside the vocabulary [0, {})", tokens[i], cfg.vocab_size);
}
}  // namespace

Tensor logits_at(GptChunk& m, const int32_t* tokens, int64_t B, int64_t T, const std::vector<int64_t>& rows,
                 KvCache* kv) {
  MTNLG_CHECK(m.spec().has_embedding && m.spec().has_head, "inference needs the whole model in one chunk");
  check_tokens(m.config(), tokens, B * T);
  InferenceCall call;
  call.tokens = tokens;
  call.batch = B;
  call.seq_len = T;
  call.kv = kv;
  call.logit_rows = &rows;
  const Tensor lg = m.infer(call, Tensor()).logits.on(Device::cpu);
  if (lg.dtype() == DType::f32) return lg;
  Tensor f = Tensor::empty(lg.shape(), DType::f32, Device::cpu);
  ops::convert(f, lg);
  return f;
}

void log_softmax_at(const float* row, int64_t vocab, int32_t target, double& logprob, int32_t& argmax) {
  float mx = -std::numeric_limits<float>::infinity();
  int32_t am = 0;
  for (int64_t v = 0; v < vocab; ++v)
    if (row[v] > mx) {  // strict: the lowest index wins ties, as numpy/torch argmax
      mx = row[v];
      am = static_cast<int32_t>(v);
    }
  double se = 0;
  for (int64_t v = 0; v < vocab; ++v) se += std::exp(static_cast<double>(row[v]) - mx);
  logprob = static_cast<double>(row[target]) - mx - std::log(se);
  argmax = am;
}

std::vector<ScoreResult> score_batch(GptChunk& m, const std::vector<const ScoreRequest*>& reqs) {
  const int64_t B = static_cast<int64_t>(reqs.size());
  std::vector<ScoreResult> res(reqs.size());
  if (B == 0) return res;
  int64_t T = 0;
  for (auto* r : reqs) {
    MTNLG_CHECK(!r->input.empty() && !r->targets.empty() && r->targets.size() <= r->input.size(),
                "score request with {} inputs and {} targets", r->input.size(), r->targets.size());
    T = std::max<int64_t>(T, static_cast<int64_t>(r->input.size()));
  }
  // Right padding with token 0: causal attention keeps it out of the real positions.
  std::vector<int32_t> tokens(static_cast<size_t>(B * T), 0);
  for (int64_t b = 0; b < B; ++b) std::copy(reqs[b]->input.begin(), reqs[b]->input.end(), tokens.begin() + b * T);
  // Logits only of the scored rows.
  std::vector<int64_t> rows;
  for (int64_t b = 0; b < B; ++b) {
    int64_t n = static_cast<int64_t>(reqs[b]->input.size()), k = static_cast<int64_t>(reqs[b]->targets.size());
    for (int64_t j = 0; j < k; ++j) rows.push_back(b * T + n - k + j);
  }
  const int64_t R = static_cast<int64_t>(rows.size());
  Tensor lg = logits_at(m, tokens.data(), B, T, rows);
  const int64_t Vp = lg.dim(1), V = m.config().vocab_size;
  std::vector<double> lp(static_cast<size_t>(R));
  std::vector<int32_t> am(static_cast<size_t>(R)), tgt(static_cast<size_t>(R));
  {
    int64_t r = 0;
    for (auto* q : reqs)
      for (int32_t t : q->targets) tgt[r++] = t;
  }
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < R; ++r) log_softmax_at(lg.data<float>() + r * Vp, V, tgt[r], lp[r], am[r]);
  int64_t r = 0;
  for (int64_t b = 0; b < B; ++b)
    for (size_t j = 0; j < reqs[b]->targets.size(); ++j, ++r) {
      res[b].logprob += lp[r];
      if (am[r] != tgt[r]) res[b].is_greedy = false;
    }
  return res;
}

int32_t sample_token(const float* logits, int64_t vocab, const SamplingOptions& opt, uint64_t step) {
  if (opt.greedy || opt.temperature <= 0) {
    int32_t best = 0;
    for (int64_t v = 1; v < vocab; ++v)
      if (logits[v] > logits[best]) best = static_cast<int32_t>(v);
    return best;
  }
  std::vector<int32_t> idx(static_cast<size_t>(vocab));
  std::iota(idx.begin(), idx.end(), 0);
  // Sorted by logit descending, index ascending on ties: a deterministic order.
  auto by_logit = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  int64_t keep = vocab;
  if (opt.top_k > 0 && opt.top_k < vocab) {
    keep = opt.top_k;
    std::partial_sort(idx.begin(), idx.begin() + keep, idx.end(), by_logit);
  } else {
    std::sort(idx.begin(), idx.end(), by_logit);
  }
  std::vector<double> p(static_cast<size_t>(keep));
  const double mx = logits[idx[0]];
  double sum = 0;
  for (int64_t i = 0; i < keep; ++i) sum += p[i] = std::exp((logits[idx[i]] - mx) / opt.temperature);
  if (opt.top_p < 1.0) {
    double acc = 0;
    int64_t n = 0;
    while (n < keep) {
      acc += p[n++] / sum;
      if (acc >= opt.top_p) break;
    }
    keep = std::max<int64_t>(n, 1);
    sum = 0;
    for (int64_t i = 0; i < keep; ++i) sum += p[i];
  }
  Philox4x32 r = philox4x32(opt.seed, 0x67656eull /* "gen" */, step);
  double u = ((static_cast<uint64_t>(r.c[0]) << 21) ^ (r.c[1] >> 11)) * (1.0 / 9007199254740992.0) * sum;
  double acc = 0;
  for (int64_t i = 0; i < keep; ++i) {
    acc += p[i];
    if (u < acc) return idx[i];
  }
  return idx[keep - 1];
}

std::vector<int32_t> generate(GptChunk& m, std::vector<int32_t> prompt, const SamplingOptions& opt,
                              const std::function<void(int32_t)>& on_token) {
  const auto& cfg = m.config();
  if (prompt.empty()) prompt.push_back(opt.stop_token);  // as the harness: empty context = <|endoftext|>
  const int64_t room = std::max<int64_t>(1, cfg.max_positions - opt.max_new_tokens);
  if (static_cast<int64_t>(prompt.size()) > room) prompt.erase(prompt.begin(), prompt.end() - room);
  const int64_t P = static_cast<int64_t>(prompt.size());
  const int64_t cap = std::min<int64_t>(cfg.max_positions, P + opt.max_new_tokens);
  std::vector<int32_t> out;
  if (opt.max_new_tokens <= 0) return out;
  KvCache cache = m.make_kv_cache(1, std::max(cap, P));
  Tensor lg = logits_at(m, prompt.data(), 1, P, {P - 1}, &cache);  // prefill
  for (int64_t step = 0; step < opt.max_new_tokens; ++step) {
    int32_t t = sample_token(lg.data<float>(), cfg.vocab_size, opt, static_cast<uint64_t>(step));
    out.push_back(t);
    if (on_token) on_token(t);
    if (t == opt.stop_token || cache.length >= cap) break;
    lg = logits_at(m, &t, 1, 1, {0}, &cache);  // one decode step
  }
  return out;
}

}  // namespace mtnlg::model
