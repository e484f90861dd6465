// Inference forward with a KV cache, batched teacher-forced scoring, and sampling.
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
  m.store.finalize();
  m.store.initialize(seed, cfg.init_std, cfg.num_layers_total);
  return m;
}

InferenceModel::InferenceModel(const GptConfig& cfg, const ParamStore& store) : cfg_(cfg) {
  MTNLG_CHECK(cfg.hidden % cfg.heads == 0, "hidden {} not divisible by heads {}", cfg.hidden, cfg.heads);
  wte_ = store.param("embedding.word_embeddings.weight");
  wpe_ = store.param("embedding.position_embeddings.weight");
  lnf_w_ = store.param("final_layernorm.weight");
  lnf_b_ = store.param("final_layernorm.bias");
  MTNLG_CHECK(wte_.dim(0) == cfg.padded_vocab_size && wte_.dim(1) == cfg.hidden,
              "word embedding {} is not the full table (inference needs tp=1 weights)", shape_str(wte_.shape()));
  for (int64_t l = 0; l < cfg.num_layers_total; ++l) {
    auto p = [&](const char* n) { return store.param(fmt::format("layers.{}.{}", l, n)); };
    layers_.push_back(Layer{p("input_layernorm.weight"), p("input_layernorm.bias"), p("attention.qkv.weight"),
                            p("attention.qkv.bias"), p("attention.proj.weight"), p("attention.proj.bias"),
                            p("post_attention_layernorm.weight"), p("post_attention_layernorm.bias"),
                            p("mlp.fc1.weight"), p("mlp.fc1.bias"), p("mlp.fc2.weight"), p("mlp.fc2.bias")});
  }
}

KvCache InferenceModel::make_cache(int64_t batch, int64_t capacity, bool scratch) const {
  KvCache c;
  c.batch = batch;
  c.capacity = capacity;
  c.scratch = scratch;
  const int64_t H = cfg_.heads, D = cfg_.hidden / cfg_.heads;
  const int64_t n = scratch ? 1 : cfg_.num_layers_total;
  for (int64_t l = 0; l < n; ++l) {
    c.k.push_back(Tensor::empty({batch, H, capacity, D}, wte_.dtype()));
    c.v.push_back(Tensor::empty({batch, H, capacity, D}, wte_.dtype()));
  }
  return c;
}

Tensor InferenceModel::forward(KvCache& cache, const int32_t* tokens, int64_t B, int64_t T) const {
  const int64_t C = cfg_.hidden, N = B * T, past = cache.length;
  const DType dt = wte_.dtype();
  MTNLG_CHECK(B == cache.batch, "batch {} vs cache batch {}", B, cache.batch);
  if (past + T > cfg_.max_positions)
    throw_input("sequence of {} tokens exceeds the model's {} positions", past + T, cfg_.max_positions);
  MTNLG_CHECK(past + T <= cache.capacity, "cache capacity {} < {}", cache.capacity, past + T);
  MTNLG_CHECK(!(cache.scratch && past > 0), "a scratch cache cannot be extended");

  Tensor tok = Tensor::empty({N}, DType::i32);
  for (int64_t i = 0; i < N; ++i) {
    int32_t t = tokens[i];
    if (t < 0 || t >= cfg_.vocab_size) throw_input("token id {} outside the vocabulary [0, {})", t, cfg_.vocab_size);
    tok.data<int32_t>()[i] = t;
  }
  Tensor x = Tensor::empty({N, C}, dt);
  ops::embedding_forward(x, tok, wte_, 0);
  // learned positions: row (b, i) is at absolute position past + i
  // (a plain loop: one op call per row would open a parallel region per row)
  MTNLG_CHECK(dt == DType::f32, "inference runs in fp32, got {}", to_string(dt));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < T; ++i) {
      float* xr = x.data<float>() + (b * T + i) * C;
      const float* pr = wpe_.data<float>() + (past + i) * C;
      for (int64_t c = 0; c < C; ++c) xr[c] += pr[c];
    }

  Tensor h = Tensor::empty({N, C}, dt), mean = Tensor::empty({N}, dt), rstd = Tensor::empty({N}, dt);
  Tensor qkv = Tensor::empty({B, T, 3 * C}, dt), att = Tensor::empty({N, C}, dt), proj = Tensor::empty({N, C}, dt);
  Tensor fc1 = Tensor::empty({N, cfg_.ffn}, dt), gel = Tensor::empty({N, cfg_.ffn}, dt);
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& p = layers_[l];
    Tensor& kc = cache.k[cache.scratch ? 0 : l];
    Tensor& vc = cache.v[cache.scratch ? 0 : l];
    ops::layernorm_forward(h, mean, rstd, x, p.ln1_w, p.ln1_b, cfg_.layernorm_eps);
    ops::matmul_forward(qkv, h, p.qkv_w, &p.qkv_b);
    ops::attention_cached_forward(att, kc, vc, qkv, cfg_.heads, past);
    ops::matmul_forward(proj, att, p.proj_w, &p.proj_b);
    ops::add_inplace(x, proj);
    ops::layernorm_forward(h, mean, rstd, x, p.ln2_w, p.ln2_b, cfg_.layernorm_eps);
    ops::matmul_forward(fc1, h, p.fc1_w, &p.fc1_b);
    ops::gelu_forward(gel, fc1);
    ops::matmul_forward(proj, gel, p.fc2_w, &p.fc2_b);
    ops::add_inplace(x, proj);
  }
  Tensor out = Tensor::empty({N, C}, dt);
  ops::layernorm_forward(out, mean, rstd, x, lnf_w_, lnf_b_, cfg_.layernorm_eps);
  cache.length = past + T;
  return out;
}

Tensor InferenceModel::logits(const Tensor& hidden) const {
  Tensor out = Tensor::empty({hidden.dim(0), cfg_.padded_vocab_size}, hidden.dtype());
  ops::matmul_forward(out, hidden, wte_, nullptr);
  return out;
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

std::vector<ScoreResult> score_batch(const InferenceModel& m, const std::vector<const ScoreRequest*>& reqs) {
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
  KvCache cache = m.make_cache(B, T, /*scratch=*/true);
  Tensor hidden = m.forward(cache, tokens.data(), B, T);

  // Gather only the scored rows, then one logits matmul for all of them.
  std::vector<int64_t> rows;
  for (int64_t b = 0; b < B; ++b) {
    int64_t n = static_cast<int64_t>(reqs[b]->input.size()), k = static_cast<int64_t>(reqs[b]->targets.size());
    for (int64_t j = 0; j < k; ++j) rows.push_back(b * T + n - k + j);
  }
  const int64_t C = m.config().hidden, R = static_cast<int64_t>(rows.size());
  Tensor sel = Tensor::empty({R, C}, hidden.dtype());
  for (int64_t r = 0; r < R; ++r)
    std::copy_n(hidden.data<float>() + rows[r] * C, C, sel.data<float>() + r * C);
  Tensor lg = m.logits(sel);
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

std::vector<int32_t> generate(const InferenceModel& m, std::vector<int32_t> prompt, const SamplingOptions& opt,
                              const std::function<void(int32_t)>& on_token) {
  const auto& cfg = m.config();
  if (prompt.empty()) prompt.push_back(opt.stop_token);  // as the harness: empty context = <|endoftext|>
  const int64_t room = std::max<int64_t>(1, cfg.max_positions - opt.max_new_tokens);
  if (static_cast<int64_t>(prompt.size()) > room) prompt.erase(prompt.begin(), prompt.end() - room);
  const int64_t cap = std::min<int64_t>(cfg.max_positions, static_cast<int64_t>(prompt.size()) + opt.max_new_tokens);
  KvCache cache = m.make_cache(1, cap);
  Tensor h = m.forward(cache, prompt.data(), 1, static_cast<int64_t>(prompt.size()));
  std::vector<int32_t> out;
  const int64_t C = cfg.hidden;
  for (int64_t step = 0; step < opt.max_new_tokens; ++step) {
    Tensor last = h.rows(h.dim(0) - 1, 1).view({1, C});
    Tensor lg = m.logits(last);
    int32_t t = sample_token(lg.data<float>(), cfg.vocab_size, opt, static_cast<uint64_t>(step));
    out.push_back(t);
    if (on_token) on_token(t);
    if (t == opt.stop_token || cache.length >= cap) break;
    h = m.forward(cache, &t, 1, 1);
  }
  return out;
}

}  // namespace mtnlg::model
