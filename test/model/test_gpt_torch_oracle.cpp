// Outside oracle: mtnlg's GPT against PyTorch (Debian python3-torch) on the same
// weights: loss, every gradient, and weights after 3 AdamW steps with clipping and
// weight decay. The comparison is done by test/model/torch_gpt.py.
#include <catch2/catch.hpp>

#include "core/safetensors.hpp"
#include "model/gpt.hpp"
#include "optimizer/distributed_adamw.hpp"
#include "test/model/tiny_gpt.hpp"
#include "test/support/test_support.hpp"

using namespace mtnlg;
using namespace mtnlg::model;

namespace {
// Dumps the initial weights, the first step's loss and gradients and the weights after 3
// AdamW steps of `cfg`'s model, and has torch_gpt.py rebuild and compare them.
void check_against_torch(GptConfig cfg, int llama) {
  if (!test::python_has("torch")) FAIL("Debian's python3-torch is missing (scripts/install-deps.sh installs it)");
  test::TempDir dir("torch-oracle");
  ChunkSpec spec{0, 2, true, true, ""};
  ParamStore store;
  declare_chunk_params(store, cfg, spec, 0, 1);
  store.finalize();
  store.initialize(42, cfg.init_std, 2);
  // perturb norms and biases so their gradients are non-trivial
  for (auto& p : store.infos())
    if (p.init == InitKind::zeros || p.init == InitKind::ones)
      for (int64_t i = 0; i < p.numel; ++i)
        store.params().data<float>()[p.offset + i] += 0.01f * static_cast<float>((i * 37 + 11) % 19 - 9);
  parallel::ProcessGroups groups;
  groups.tp = std::make_shared<parallel::LocalCommunicator>("tp");
  GptChunk chunk(cfg, spec, store, groups);

  const int64_t B = 6, mbs = 3, T = cfg.seq_length;
  Tensor tokens = Tensor::empty({B, T + 1}, DType::i32);
  for (int64_t i = 0; i < tokens.numel(); ++i)
    tokens.data<int32_t>()[i] = static_cast<int32_t>((i * 31 + (i / 7) * 3) % 50);

  optimizer::AdamWConfig oc;
  const double lr = 1e-2;
  oc.weight_decay = 0.1;
  oc.beta1 = 0.9;
  oc.beta2 = 0.95;
  oc.eps = 1e-8;
  oc.clip_grad = 1.0;
  std::map<std::string, std::string> meta = {
      {"layers", "2"}, {"hidden", "32"}, {"heads", "4"},  {"vocab", "50"},  {"seq", "16"},     {"eps", "1e-05"},
      {"lr", "0.01"},  {"wd", "0.1"},    {"clip", "1.0"}, {"beta1", "0.9"}, {"beta2", "0.95"}, {"adam_eps", "1e-08"}};
  if (llama >= 0) {
    const auto& r = cfg.rope_params;
    for (auto& [k, v] : std::map<std::string, double>{{"llama", 1},
                                                      {"head_dim", static_cast<double>(cfg.head_dim())},
                                                      {"groups", static_cast<double>(cfg.kv_groups())},
                                                      {"rope_base", r.base},
                                                      {"rope_percent", r.percent},
                                                      {"rope_interleaved", r.interleaved ? 1 : 0},
                                                      {"rope_scaling", r.scaling ? 1 : 0},
                                                      {"rope_factor", r.factor},
                                                      {"rope_low", r.low_freq_factor},
                                                      {"rope_high", r.high_freq_factor},
                                                      {"rope_original", r.original_max_positions}})
      meta[k] = fmt::format("{}", v);
  }
  std::vector<safetensors::Entry> init;
  for (auto& p : store.infos()) init.push_back({p.name, store.param(p.name).clone()});
  init.push_back({"tokens", tokens});
  safetensors::write((dir / "init.safetensors").string(), init, meta);

  // One global batch of 2 micro batches (gradient accumulation), loss = batch mean.
  auto step = [&]() {
    store.zero_grads();
    double loss = 0;
    for (int64_t k = 0; k < B / mbs; ++k) {
      TrainMicroBatch mb;
      mb.tokens = tokens.data<int32_t>() + k * mbs * (T + 1);
      mb.micro_batch_size = mbs;
      mb.sample_offset = k * mbs;
      mb.loss_weight = 1.0 / static_cast<double>(B * T);
      auto r = chunk.forward(k, mb, Tensor());
      loss += r.loss_sum / static_cast<double>(B * T);
      chunk.backward(k, Tensor());
    }
    return loss;
  };
  double loss0 = step();
  std::vector<safetensors::Entry> s0;
  Tensor lt = Tensor::empty({1}, DType::f64);
  lt.data<double>()[0] = loss0;
  s0.push_back({"loss", lt});
  for (auto& p : store.infos()) s0.push_back({"grad." + p.name, store.grad(p.name).clone()});
  safetensors::write((dir / "step0.safetensors").string(), s0);

  std::vector<optimizer::ParamSegment> segs;
  for (auto& p : store.infos()) segs.push_back({{p.offset, p.numel, p.weight_decay}, true});
  optimizer::DistributedAdamW opt(oc, segs, store.numel(), groups, false, 0);
  Tensor losses = Tensor::empty({3}, DType::f64);
  for (int it = 0; it < 3; ++it) {
    losses.data<double>()[it] = step();
    opt.step(store.params(), store.grads(), lr);
  }
  std::vector<safetensors::Entry> a3;
  a3.push_back({"losses", losses});
  for (auto& p : store.infos()) a3.push_back({p.name, store.param(p.name).clone()});
  safetensors::write((dir / "after3.safetensors").string(), a3);

  auto res = test::run_command(test::python() + " " + test::source_dir() + "/test/model/torch_gpt.py " + dir.str());
  INFO(res.out);
  CHECK(res.exit_code == 0);
  CHECK(res.out.find("PASS") != std::string::npos);
}
}  // namespace

TEST_CASE("gpt: loss, gradients and AdamW steps equal PyTorch's", "[oracle]") {
  GptConfig cfg = test::tiny_gpt_config();  // with this test's position table and init
  cfg.max_positions = 20;
  cfg.init_std = 0.05;
  check_against_torch(cfg, -1);
}

// Variant 0: Llama 3's form with 2 key/value groups, untied; variant 1: multi-query, head
// size 16 (attention 64 wide on a hidden of 32), half of each head rotating in interleaved
// pairs with Llama 3.1's scaling, q/k/v biases, tied; variant 2: variant 0 with Qwen3's
// per-head q/k norms (test::make_llama).
TEST_CASE("llama: loss, gradients and AdamW steps equal PyTorch's", "[oracle]") {
  for (int variant : {0, 1, 2}) {
    INFO("llama variant " << variant);
    GptConfig cfg = test::tiny_gpt_config();
    cfg.init_std = 0.05;
    test::make_llama(cfg, variant);
    check_against_torch(cfg, variant);
  }
}
