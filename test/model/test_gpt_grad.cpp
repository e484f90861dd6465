// Whole-model checks on a tiny GPT in fp64: the analytic gradient of every parameter
// against central finite differences, and activation recompute (selective, full)
// giving the same loss and gradients as keeping everything.
#include <catch2/catch.hpp>
#include <cmath>
#include <random>

#include "core/ops.hpp"
#include "model/gpt.hpp"
#include "test/model/tiny_gpt.hpp"

using namespace mtnlg;
using namespace mtnlg::model;

namespace {

struct Tiny {
  GptConfig cfg;
  ParamStore store;
  parallel::ProcessGroups groups;
  std::unique_ptr<GptChunk> chunk;
  std::vector<int32_t> tokens;
  int64_t B = 2;

  // llama: -1 the GPT; 0, 1 the Llama family's variants (test::make_llama), with 4 heads.
  explicit Tiny(RecomputeGranularity rc, double dropout = 0.0, AttentionBackend att = AttentionBackend::flash,
                int64_t logits_chunk_elements = int64_t{1} << 28, int llama = -1) {
    cfg.vocab_size = 11;
    cfg.padded_vocab_size = 16;
    cfg.hidden = 8;
    cfg.heads = 2;
    cfg.ffn = 12;
    cfg.seq_length = 5;
    cfg.max_positions = 6;
    cfg.num_layers_total = 2;
    cfg.init_std = 0.3;
    cfg.hidden_dropout = dropout;
    cfg.attention_dropout = dropout;
    cfg.recompute = rc;
    cfg.attention = att;
    cfg.dtype = DType::f64;
    cfg.logits_chunk_elements = logits_chunk_elements;
    if (llama >= 0) {
      cfg.heads = 4;
      test::make_llama(cfg, llama);
    }
    ChunkSpec spec{0, 2, true, true, ""};
    declare_chunk_params(store, cfg, spec, 0, 1);
    store.finalize(DType::f64);
    store.initialize(7, cfg.init_std, 2);
    // non-trivial norms and biases so their gradients are exercised
    std::mt19937_64 g(3);
    std::normal_distribution<double> d(0, 0.2);
    for (auto& p : store.infos())
      if (p.init == InitKind::zeros || p.init == InitKind::ones)
        for (int64_t i = 0; i < p.numel; ++i) store.params().data<double>()[p.offset + i] += d(g);
    groups.tp = std::make_shared<parallel::LocalCommunicator>("tp");
    chunk = std::make_unique<GptChunk>(cfg, spec, store, groups);
    tokens.resize(B * (cfg.seq_length + 1));
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 7 + 3) % 11);
  }

  TrainMicroBatch mb() const {
    TrainMicroBatch m;
    m.tokens = tokens.data();
    m.micro_batch_size = B;
    m.sample_offset = 4;
    m.step_key = 99;
    m.loss_weight = 1.0 / (B * cfg.seq_length);
    return m;
  }
  double loss() {  // the training forward's loss (its dropout masks), no backward
    auto r = chunk->forward(0, mb(), Tensor());
    chunk->drop_saved();
    return r.loss_sum / r.loss_tokens;
  }
  double loss_and_grad() {
    store.zero_grads();
    auto r = chunk->forward(0, mb(), Tensor());
    chunk->backward(0, Tensor());
    return r.loss_sum / r.loss_tokens;
  }
};

}  // namespace

namespace {
// The analytic gradient of every parameter of `m` (every element of small tensors, a
// strided sample of big ones) against central finite differences: the worst relative error.
void check_finite_differences(Tiny& m) {
  {
    double L = m.loss_and_grad();
    CHECK(std::isfinite(L));
    CHECK(L > 0);
    Tensor grads = m.store.grads().clone();
    const double h = 1e-6;
    double worst = 0;
    std::string worst_name;
    for (auto& info : m.store.infos()) {
      // every element of small tensors, a strided sample of the big ones
      int64_t step = std::max<int64_t>(1, info.numel / 40);
      for (int64_t i = 0; i < info.numel; i += step) {
        double& w = m.store.params().data<double>()[info.offset + i];
        double old = w;
        w = old + h;
        double lp = m.loss();
        w = old - h;
        double lm = m.loss();
        w = old;
        double num = (lp - lm) / (2 * h);
        double ana = grads.data<double>()[info.offset + i];
        // relative error, except where the true gradient is ~0 (e.g. the key bias, to which
        // softmax is invariant): there the finite difference is rounding noise, ~1e-10.
        double diff = std::fabs(num - ana);
        double err = diff < 1e-9 ? 0.0 : diff / (std::fabs(num) + std::fabs(ana));
        if (err > worst) {
          worst = err;
          worst_name = info.name;
        }
      }
    }
    INFO("worst " << worst << " at " << worst_name);
    CHECK(worst < 1e-5);
  }
}
}  // namespace

TEST_CASE("gpt: every parameter gradient matches finite differences (fp64)", "[model]") {
  for (const auto att : {AttentionBackend::flash, AttentionBackend::unfused})
    for (double p : {0.0, 0.2}) {
      INFO("attention " << to_string(att) << " dropout " << p);
      Tiny m(RecomputeGranularity::none, p, att);
      REQUIRE(m.chunk->attention_backend() == att);
      check_finite_differences(m);
    }
}

// Rotary positions, RMSNorm, SwiGLU, grouped and multi-query attention, a head size of
// its own, q/k/v biases alone, tied and untied output layers, Qwen3's per-head q/k norms
// (variant 2, flash only: the norms sit before the attention core).
TEST_CASE("llama: every parameter gradient matches finite differences (fp64)", "[model]") {
  for (int variant : {0, 1, 2})
    for (const auto att : {AttentionBackend::flash, AttentionBackend::unfused})
      for (double p : {0.2}) {  // the dropout-free path is the same code with p = 0 (the GPT case has both)
        if (variant == 2 && att == AttentionBackend::unfused) continue;
        INFO("llama variant " << variant << " attention " << to_string(att) << " dropout " << p);
        Tiny m(RecomputeGranularity::none, p, att, int64_t{1} << 28, variant);
        REQUIRE(m.chunk->attention_backend() == att);
        REQUIRE(m.store.has("output_layer.weight") == (variant != 1));
        REQUIRE(m.store.has("layers.0.attention.q_layernorm.weight") == (variant == 2));
        REQUIRE(m.store.has("embedding.position_embeddings.weight") == false);
        check_finite_differences(m);
      }
}

// Every recompute mode under either attention form gives the no-recompute flash run's
// loss and gradients: bit for bit within a form, to rounding across the two forms (they
// sum in different orders).
TEST_CASE("gpt: selective and full recompute give the same loss and gradients", "[model]") {
  for (int llama : {-1, 0, 1, 2}) {
    Tiny base(RecomputeGranularity::none, 0.1, AttentionBackend::flash, int64_t{1} << 28, llama);
    double L0 = base.loss_and_grad();
    for (auto att : {AttentionBackend::flash, AttentionBackend::unfused})
      for (auto rc : {RecomputeGranularity::none, RecomputeGranularity::selective, RecomputeGranularity::full}) {
        INFO("llama variant " << llama << " attention " << to_string(att) << " recompute " << to_string(rc));
        Tiny m(rc, 0.1, att, int64_t{1} << 28, llama);
        const double tol = att == AttentionBackend::flash ? 0.0 : 1e-13;
        double L = m.loss_and_grad();
        CHECK(std::fabs(L - L0) <= tol);
        double maxdiff = 0;
        for (int64_t i = 0; i < m.store.numel(); ++i)
          maxdiff =
              std::max(maxdiff, std::fabs(m.store.grads().data<double>()[i] - base.store.grads().data<double>()[i]));
        CHECK(maxdiff <= tol);
      }
  }
}

TEST_CASE("gpt: unfused attention under selective recompute keeps no probabilities, without it keeps them", "[model]") {
  Tiny keep(RecomputeGranularity::none, 0.0, AttentionBackend::unfused),
      redo(RecomputeGranularity::selective, 0.0, AttentionBackend::unfused),
      flash(RecomputeGranularity::none, 0.0, AttentionBackend::flash);
  for (Tiny* m : {&keep, &redo, &flash}) m->chunk->forward(0, m->mb(), Tensor());
  const int64_t B = 2, H = 2, T = 5, layers = 2, lse = B * H * T * 8, probs = B * H * T * T * 8;
  CHECK(keep.chunk->saved_bytes() - redo.chunk->saved_bytes() == layers * probs);
  CHECK(flash.chunk->saved_bytes() - redo.chunk->saved_bytes() == layers * lse);
}

TEST_CASE("gpt: recompute within one attention form is bit-exact", "[model]") {
  Tiny base(RecomputeGranularity::none, 0.1, AttentionBackend::unfused);
  double L0 = base.loss_and_grad();
  for (auto rc : {RecomputeGranularity::selective, RecomputeGranularity::full}) {
    Tiny m(rc, 0.1, AttentionBackend::unfused);
    double L = m.loss_and_grad();
    CHECK(L == L0);
    double maxdiff = 0;
    for (int64_t i = 0; i < m.store.numel(); ++i)
      maxdiff = std::max(maxdiff, std::fabs(m.store.grads().data<double>()[i] - base.store.grads().data<double>()[i]));
    CHECK(maxdiff == 0.0);
  }
}

// The last stage computes its logits a chunk of rows at a time and runs their backward in
// the forward: 10 rows over a 16-column vocabulary in chunks of 3, 3, 3 and 1 rows give the
// one-chunk run's loss and gradients (the tied embedding's gradient sums its chunks in
// another order: rounding only), eval's loss too, and neither keeps logits for the backward.
TEST_CASE("gpt: the head in chunks of logit rows equals the head in one", "[model]") {
  CHECK(logits_chunk_rows(10, 16, 48) == 3);
  CHECK(logits_chunk_rows(10, 16, int64_t{1} << 28) == 10);
  CHECK(logits_chunk_rows(10, 16, 1) == 1);
  for (double p : {0.0, 0.2}) {
    INFO("dropout " << p);
    Tiny one(RecomputeGranularity::none, p), chunked(RecomputeGranularity::none, p, AttentionBackend::flash, 48);
    const double L1 = one.loss_and_grad(), Lc = chunked.loss_and_grad();
    CHECK(std::fabs(Lc - L1) <= 1e-14 * std::fabs(L1));
    double maxdiff = 0, scale = 0;
    for (int64_t i = 0; i < one.store.numel(); ++i) {
      maxdiff =
          std::max(maxdiff, std::fabs(chunked.store.grads().data<double>()[i] - one.store.grads().data<double>()[i]));
      scale = std::max(scale, std::fabs(one.store.grads().data<double>()[i]));
    }
    CHECK(maxdiff <= 1e-13 * scale);
    CHECK(std::fabs(chunked.loss() - one.loss()) <= 1e-14 * std::fabs(L1));  // eval: the loss terms only
  }
  Tiny one(RecomputeGranularity::none), chunked(RecomputeGranularity::none, 0.0, AttentionBackend::flash, 48);
  one.chunk->forward(0, one.mb(), Tensor());
  chunked.chunk->forward(0, chunked.mb(), Tensor());
  // what the backward keeps of the head (the chunk output, the final LayerNorm's statistics
  // and its output's gradient) does not depend on the chunking
  CHECK(one.chunk->saved_bytes() == chunked.chunk->saved_bytes());
}

TEST_CASE("gpt: padded vocabulary never enters the loss", "[model]") {
  Tiny m(RecomputeGranularity::none);
  m.loss_and_grad();
  // rows of the word embedding beyond the real vocabulary get no gradient
  auto g = m.store.grad("embedding.word_embeddings.weight");
  for (int64_t v = 11; v < 16; ++v)
    for (int64_t c = 0; c < 8; ++c) CHECK(g.data<double>()[v * 8 + c] == 0.0);
}
