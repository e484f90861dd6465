// The whole model on the GPU against the CPU (issue 15's model proof): one small GPT
// chunk (embedding, two layers, head, vocab-parallel loss with one rank) built twice
// from the same initialisation, one on each device; one forward and backward of the
// same micro batch (with dropout, whose masks are bit-identical on both devices), then
// the loss and every parameter gradient compared with the CUDA tests' metric
// (test/core/cuda_test_util.hpp): fp32 within 1e-5, bf16 within 1e-2, per parameter.
#include <catch2/catch.hpp>

#ifdef MTNLG_HAVE_CUDA
#include <cmath>
#include <memory>

#include "core/ops.hpp"
#include "model/gpt.hpp"
#include "test/core/cuda_test_util.hpp"

using namespace mtnlg;
using namespace mtnlg::model;

namespace {

struct Small {
  GptConfig cfg;
  ParamStore store;
  parallel::ProcessGroups groups;
  std::unique_ptr<GptChunk> chunk;
  std::vector<int32_t> tokens;
  int64_t B = 3;

  Small(DType dt, Device dev, RecomputeGranularity rc) {
    cfg.vocab_size = 1000;
    cfg.padded_vocab_size = 1024;
    cfg.hidden = 256;
    cfg.heads = 4;
    cfg.ffn = 1024;
    cfg.seq_length = 128;
    cfg.max_positions = 128;
    cfg.num_layers_total = 2;
    cfg.init_std = 0.02;
    cfg.hidden_dropout = 0.1;
    cfg.attention_dropout = 0.1;
    cfg.recompute = rc;
    cfg.dtype = dt;
    ChunkSpec spec{0, 2, true, true, ""};
    declare_chunk_params(store, cfg, spec, 0, 1);
    store.finalize(DType::f32, dt, Device::cpu);
    store.initialize(11, cfg.init_std, 2);
    store.sync_weights();
    store.place(dev);  // the GPU copy: the CPU's initial values, uploaded
    groups.tp = std::make_shared<parallel::LocalCommunicator>("tp");
    chunk = std::make_unique<GptChunk>(cfg, spec, store, groups);
    tokens.resize(static_cast<size_t>(B * (cfg.seq_length + 1)));
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 7919 + 13) % 1000);
  }

  double loss_and_grad() {
    MicroBatch m;
    m.tokens = tokens.data();
    m.micro_batch_size = B;
    m.sample_offset = 5;
    m.step_key = 1234;
    m.loss_weight = 1.0 / static_cast<double>(B * cfg.seq_length);
    store.zero_grads();
    auto r = chunk->forward(0, m, Tensor());
    chunk->backward(0, m, Tensor());
    return r.loss_sum / r.loss_tokens;
  }
};

}  // namespace

TEST_CASE("gpt on the GPU: loss and every parameter gradient equal the CPU run (fp32 1e-5, bf16 1e-2)", "[gpu]") {
  if (!test::gpu_ready()) return;
  for (DType dt : {DType::f32, DType::bf16}) {
    for (RecomputeGranularity rc : {RecomputeGranularity::none, RecomputeGranularity::full}) {
      INFO(to_string(dt) << " recompute " << static_cast<int>(rc));
      Small cpu(dt, Device::cpu, rc), gpu(dt, Device::cuda, rc);
      const double lc = cpu.loss_and_grad(), lg = gpu.loss_and_grad();
      const double rtol = test::rtol_for(dt);
      CHECK(std::abs(lg - lc) <= rtol * std::abs(lc));
      const Tensor gg = gpu.store.grads().to(Device::cpu);
      for (const auto& p : cpu.store.infos()) {
        const Tensor ref = cpu.store.grads().flat(p.offset, p.numel);
        test::check_close("grad " + p.name, gg.flat(p.offset, p.numel), ref, rtol);
      }
    }
  }
}
#endif
