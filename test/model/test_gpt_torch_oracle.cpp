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
// The MoE keys torch_gpt.py reads (meta values are numbers; the MoE layers a bit mask).
void add_moe_meta(const GptConfig& cfg, int64_t micro_batches, std::map<std::string, std::string>& meta) {
  const MoeLayerConfig& m = cfg.moe;
  if (!m.enabled()) return;
  int64_t mask = 0;
  for (size_t l = 0; l < m.layers.size(); ++l)
    if (m.layers[l]) mask |= int64_t{1} << l;
  for (auto& [k, v] :
       std::map<std::string, double>{{"moe", 1},
                                     {"micro_batches", static_cast<double>(micro_batches)},
                                     {"moe_layers", static_cast<double>(mask)},
                                     {"experts", static_cast<double>(m.num_experts)},
                                     {"topk", static_cast<double>(m.router.topk)},
                                     {"sigmoid", m.router.score == ops::RouterScore::sigmoid ? 1 : 0},
                                     {"pre_softmax", m.router.pre_softmax ? 1 : 0},
                                     {"scaling", m.router.scaling_factor},
                                     {"capacity", m.capacity_factor},
                                     {"seq_aux", m.balancing == MoeBalancing::seq_aux_loss ? 1 : 0},
                                     {"global_aux", m.balancing == MoeBalancing::global_aux_loss ? 1 : 0},
                                     {"aux_coeff", m.balancing == MoeBalancing::none ? 0 : m.aux_coeff},
                                     {"z_coeff", m.z_coeff},
                                     {"bias_rate", m.bias_update_rate}})
    meta[k] = fmt::format("{}", v);
}

// The step's MoE losses from the chunk's record (each layer's value over its coefficient,
// summed over the forwards): what they add to the step's loss (x coeff / micro batches),
// and their logged sums over the layers averaged over the micro batches.
struct MoeTerms {
  double loss = 0, aux = 0, z = 0;
};
MoeTerms moe_terms(const GptChunk& chunk, const GptConfig& cfg, int64_t micro_batches) {
  MoeTerms t;
  const double M = static_cast<double>(micro_batches);
  for (const auto& st : chunk.moe_stats()) {
    t.aux += st.aux / M;
    t.z += st.z / M;
  }
  t.loss = t.aux * cfg.moe.aux_coeff + t.z * cfg.moe.z_coeff;
  return t;
}

Tensor scalar(double v) {
  Tensor t = Tensor::empty({1}, DType::f64);
  t.data<double>()[0] = v;
  return t;
}

// Dumps the initial weights, the first step's loss and gradients and the weights after 3
// AdamW steps of `cfg`'s model, and has torch_gpt.py rebuild and compare them.
void check_against_torch(GptConfig cfg, int llama, double lr = 1e-2) {
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
  oc.weight_decay = 0.1;
  oc.beta1 = 0.9;
  oc.beta2 = 0.95;
  oc.eps = 1e-8;
  oc.clip_grad = 1.0;
  std::map<std::string, std::string> meta = {{"layers", "2"},
                                             {"hidden", "32"},
                                             {"heads", "4"},
                                             {"vocab", "50"},
                                             {"seq", "16"},
                                             {"eps", "1e-05"},
                                             {"lr", fmt::format("{}", lr)},
                                             {"wd", "0.1"},
                                             {"clip", "1.0"},
                                             {"beta1", "0.9"},
                                             {"beta2", "0.95"},
                                             {"adam_eps", "1e-08"}};
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
  add_moe_meta(cfg, B / mbs, meta);
  std::vector<safetensors::Entry> init;
  for (auto& p : store.infos()) init.push_back({p.name, store.param(p.name).clone()});
  init.push_back({"tokens", tokens});
  safetensors::write((dir / "init.safetensors").string(), init, meta);

  // One global batch of 2 micro batches (gradient accumulation), loss = batch mean.
  // MoE: each micro batch's balancing and z losses count 1 / micro batches (Megatron-Core).
  auto step = [&]() {
    store.zero_grads();
    chunk.reset_moe_stats();
    double loss = 0;
    for (int64_t k = 0; k < B / mbs; ++k) {
      TrainMicroBatch mb;
      mb.tokens = tokens.data<int32_t>() + k * mbs * (T + 1);
      mb.micro_batch_size = mbs;
      mb.sample_offset = k * mbs;
      mb.loss_weight = 1.0 / static_cast<double>(B * T);
      mb.moe_loss_weight = 1.0 / static_cast<double>(B / mbs);
      auto r = chunk.forward(k, mb, Tensor());
      loss += r.loss_sum / static_cast<double>(B * T);
      chunk.backward(k, Tensor());
    }
    return loss + moe_terms(chunk, cfg, B / mbs).loss;
  };
  double loss0 = step();
  std::vector<safetensors::Entry> s0;
  s0.push_back({"loss", scalar(loss0)});
  const MoeTerms terms = moe_terms(chunk, cfg, B / mbs);
  s0.push_back({"moe_aux", scalar(terms.aux)});
  s0.push_back({"moe_z", scalar(terms.z)});
  for (const auto& st : chunk.moe_stats()) {
    Tensor c = Tensor::empty({static_cast<int64_t>(st.tokens.size())}, DType::f64);
    std::copy(st.tokens.begin(), st.tokens.end(), c.data<double>());
    s0.push_back({fmt::format("counts.layers.{}.", st.layer), c});
  }
  for (auto& p : store.infos()) s0.push_back({"grad." + p.name, store.grad(p.name).clone()});
  safetensors::write((dir / "step0.safetensors").string(), s0);

  std::vector<optimizer::ParamSegment> segs;
  for (auto& p : store.infos()) segs.push_back({{p.offset, p.numel, p.weight_decay}, true});
  optimizer::DistributedAdamW opt(oc, segs, store.numel(), groups, false, 0);
  Tensor losses = Tensor::empty({3}, DType::f64);
  for (int it = 0; it < 3; ++it) {
    losses.data<double>()[it] = step();
    opt.step(store.params(), store.grads(), lr);
    chunk.update_expert_bias();
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

namespace {
// The tiny model with MoE layers (4 experts, top-2, width 48) where `layers` says.
GptConfig tiny_moe(bool llama, std::vector<uint8_t> layers) {
  GptConfig cfg = test::tiny_gpt_config();
  cfg.init_std = 0.05;
  if (llama) test::make_llama(cfg, 0);
  cfg.bias_linear = false;
  cfg.qkv_bias = false;
  cfg.moe.num_experts = 4;
  cfg.moe.ffn = 48;
  cfg.moe.router.topk = 2;
  cfg.moe.aux_coeff = 1e-1;
  cfg.moe.z_coeff = 1e-2;
  cfg.moe.layers = std::move(layers);
  return cfg;
}
}  // namespace

// Softmax top-k (Mixtral's), the micro batch's balancing loss and the z-loss, SwiGLU
// experts in both layers; then the same with a capacity that drops slots, the per-sequence
// loss and a gated shared expert. The MoE cases step at lr 1e-3 (PyTorch in float64): at
// 1e-2 some expert weights with small gradients move chaotically over 3 steps, so that
// PyTorch's own float32 run lands 9e-5 from its float64 run there (and ours 1.5e-5).
constexpr double kMoeLr = 1e-3;
TEST_CASE("moe: softmax top-k model, loss with aux and z terms, gradients and AdamW steps equal PyTorch's",
          "[oracle]") {
  GptConfig cfg = tiny_moe(true, {1, 1});
  check_against_torch(cfg, 0, kMoeLr);
  INFO("capacity 1.0, seq_aux_loss, gated shared expert");
  cfg.moe.capacity_factor = 1.0;
  cfg.moe.balancing = MoeBalancing::seq_aux_loss;
  cfg.moe.shared_ffn = 40;
  cfg.moe.shared_gate = true;
  check_against_torch(cfg, 0, kMoeLr);
  INFO("global_aux_loss: each micro batch's loss over the running average of the step's counts");
  cfg.moe.capacity_factor = 0;
  cfg.moe.balancing = MoeBalancing::global_aux_loss;
  check_against_torch(cfg, 0, kMoeLr);
}

// Sigmoid scores with the expert bias choosing (updated after each step at a rate large
// enough to change the routing), GELU experts in layer 0 and a dense layer 1.
TEST_CASE("moe: sigmoid with expert bias, GELU experts beside a dense layer, equal PyTorch's", "[oracle]") {
  GptConfig cfg = tiny_moe(false, {1, 0});
  cfg.moe.router.score = ops::RouterScore::sigmoid;
  cfg.moe.expert_bias = true;
  cfg.moe.bias_update_rate = 0.05;
  check_against_torch(cfg, -1, kMoeLr);
}
