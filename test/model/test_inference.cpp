// Inference path (model/inference.hpp, core/ops_inference.hpp): cached attention vs
// the training attention, the inference forward vs GptChunk's loss, and KV-cache
// generation vs recomputing the full forward at every step.
#include <catch2/catch.hpp>
#include <cmath>

#include "core/ops.hpp"
#include "model/gpt.hpp"
#include "model/inference.hpp"

using namespace mtnlg;
using namespace mtnlg::model;

namespace {

GptConfig tiny_config() {
  GptConfig cfg;
  cfg.vocab_size = 50;
  cfg.padded_vocab_size = 64;
  cfg.hidden = 32;
  cfg.heads = 4;
  cfg.ffn = 128;
  cfg.seq_length = 16;
  cfg.max_positions = 24;
  cfg.num_layers_total = 2;
  cfg.init_std = 0.2;  // large enough that greedy tokens depend on the context
  return cfg;
}

void fill_pattern(Tensor& t, double scale) {
  for (int64_t i = 0; i < t.numel(); ++i)
    t.data<float>()[i] = static_cast<float>(scale * std::sin(0.37 * static_cast<double>(i) + 0.1));
}

double max_abs_diff(const float* a, const float* b, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::abs(static_cast<double>(a[i]) - b[i]));
  return m;
}

}  // namespace

TEST_CASE("attention_cached_forward: prefill and step-by-step equal attention_forward", "[inference]") {
  const int64_t B = 2, T = 7, H = 3, D = 4;
  Tensor qkv = Tensor::empty({B, T, 3 * H * D});
  fill_pattern(qkv, 1.3);
  Tensor ref = Tensor::empty({B, T, H * D}), probs = Tensor::empty({B, H, T, T});
  ops::attention_forward(ref, probs, qkv, H, ops::AttentionDropout{});

  Tensor k = Tensor::zeros({B, H, T, D}), v = Tensor::zeros({B, H, T, D});
  Tensor out = Tensor::empty({B, T, H * D});
  ops::attention_cached_forward(out, k, v, qkv, H, 0);
  CHECK(max_abs_diff(out.data<float>(), ref.data<float>(), out.numel()) < 1e-6);

  // the same positions in chunks of 3, 1, 3 over a cache
  Tensor k2 = Tensor::zeros({B, H, T, D}), v2 = Tensor::zeros({B, H, T, D});
  int64_t past = 0;
  for (int64_t n : {3, 1, 3}) {
    Tensor q = Tensor::empty({B, n, 3 * H * D});
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < n; ++i)
        for (int64_t c = 0; c < 3 * H * D; ++c)
          q.data<float>()[(b * n + i) * 3 * H * D + c] = qkv.data<float>()[(b * T + past + i) * 3 * H * D + c];
    Tensor o = Tensor::empty({B, n, H * D});
    ops::attention_cached_forward(o, k2, v2, q, H, past);
    for (int64_t b = 0; b < B; ++b)
      CHECK(max_abs_diff(o.data<float>() + b * n * H * D, ref.data<float>() + (b * T + past) * H * D, n * H * D) < 1e-6);
    past += n;
  }
  Tensor small = Tensor::empty({B, 1, 3 * H * D});
  CHECK_THROWS(ops::attention_cached_forward(out, k2, v2, small, H, T));  // past + 1 > capacity
}

TEST_CASE("inference forward: token log-probs sum to GptChunk's training loss", "[inference]") {
  GptConfig cfg = tiny_config();
  cfg.seq_length = 12;
  LoadedModel lm = make_random_model(cfg, 11);
  parallel::ProcessGroups groups;
  groups.tp = std::make_shared<parallel::LocalCommunicator>("tp");
  GptChunk chunk(cfg, ChunkSpec{0, 2, true, true, ""}, lm.store, groups);
  const int64_t B = 2, T = cfg.seq_length;
  std::vector<int32_t> tokens(static_cast<size_t>(B * (T + 1)));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 13 + 5) % cfg.vocab_size);
  MicroBatch mb;
  mb.tokens = tokens.data();
  mb.micro_batch_size = B;
  auto fr = chunk.forward(0, mb, Tensor());
  chunk.drop_saved();

  InferenceModel im(cfg, lm.store);
  std::vector<ScoreRequest> reqs(B);
  for (int64_t b = 0; b < B; ++b) {
    reqs[b].input.assign(tokens.begin() + b * (T + 1), tokens.begin() + b * (T + 1) + T);
    reqs[b].targets.assign(tokens.begin() + b * (T + 1) + 1, tokens.begin() + (b + 1) * (T + 1));
  }
  auto res = score_batch(im, {&reqs[0], &reqs[1]});
  const double ours = -(res[0].logprob + res[1].logprob);
  CHECK(ours == Approx(fr.loss_sum).epsilon(1e-5));
  // a batch of one gives the same numbers as the batch of two (right padding is inert)
  ScoreRequest shorter = reqs[1];
  shorter.input.resize(5);
  shorter.targets.assign(reqs[1].targets.begin(), reqs[1].targets.begin() + 5);
  auto one = score_batch(im, {&shorter});
  auto two = score_batch(im, {&reqs[0], &shorter});
  CHECK(one[0].logprob == Approx(two[1].logprob).margin(1e-5));
  CHECK(one[0].is_greedy == two[1].is_greedy);
}

TEST_CASE("generate: KV-cache greedy decoding equals recomputing the full forward", "[inference]") {
  GptConfig cfg = tiny_config();
  LoadedModel lm = make_random_model(cfg, 3);
  InferenceModel im(cfg, lm.store);
  std::vector<int32_t> prompt = {4, 17, 9, 30, 2};
  SamplingOptions opt;
  opt.greedy = true;
  opt.max_new_tokens = 12;
  opt.stop_token = -1;  // never stop early
  std::vector<int32_t> cached = generate(im, prompt, opt);
  REQUIRE(cached.size() == 12);

  // recompute: full forward over the whole sequence at every step; also compare logits
  // against one cached decode run that keeps its logits
  std::vector<int32_t> seq = prompt, recomputed;
  KvCache kv = im.make_cache(1, cfg.max_positions);
  Tensor h = im.forward(kv, seq.data(), 1, static_cast<int64_t>(seq.size()));
  double worst = 0;
  for (int step = 0; step < 12; ++step) {
    KvCache scratch = im.make_cache(1, static_cast<int64_t>(seq.size()), true);
    Tensor hf = im.forward(scratch, seq.data(), 1, static_cast<int64_t>(seq.size()));
    Tensor lf = im.logits(hf.rows(hf.dim(0) - 1, 1));
    Tensor lc = im.logits(h.rows(h.dim(0) - 1, 1));
    worst = std::max(worst, max_abs_diff(lf.data<float>(), lc.data<float>(), cfg.vocab_size));
    int32_t t = sample_token(lf.data<float>(), cfg.vocab_size, opt, static_cast<uint64_t>(step));
    recomputed.push_back(t);
    seq.push_back(t);
    h = im.forward(kv, &t, 1, 1);
  }
  CHECK(recomputed == cached);
  CHECK(worst < 1e-5);
  // the greedy tokens are not all the same (the test can tell positions apart)
  CHECK(std::count(cached.begin(), cached.end(), cached[0]) < 12);
}

TEST_CASE("generate: sampling is seeded, top-k 1 is greedy, stops at the stop token", "[inference]") {
  GptConfig cfg = tiny_config();
  LoadedModel lm = make_random_model(cfg, 5);
  InferenceModel im(cfg, lm.store);
  SamplingOptions s;
  s.max_new_tokens = 10;
  s.temperature = 1.5;
  s.seed = 99;
  s.stop_token = -1;
  auto a = generate(im, {1, 2, 3}, s);
  auto b = generate(im, {1, 2, 3}, s);
  CHECK(a == b);
  s.seed = 100;
  auto c = generate(im, {1, 2, 3}, s);
  CHECK(a != c);
  SamplingOptions k1 = s;
  k1.top_k = 1;
  SamplingOptions g = s;
  g.greedy = true;
  CHECK(generate(im, {1, 2, 3}, k1) == generate(im, {1, 2, 3}, g));
  SamplingOptions stop = g;
  auto gt = generate(im, {1, 2, 3}, g);
  stop.stop_token = gt[2];
  auto st = generate(im, {1, 2, 3}, stop);
  CHECK(st.back() == gt[2]);
  CHECK(st.size() <= 3);
  // a prompt longer than the window is left-truncated, never an error
  std::vector<int32_t> longp(40, 7);
  g.max_new_tokens = 4;
  CHECK(generate(im, longp, g).size() == 4);
}
