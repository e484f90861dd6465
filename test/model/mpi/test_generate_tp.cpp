// Generation with the model split over tensor-parallel ranks (tp = 2, for np = 2 and 4;
// np = 1 and 3 have no tp = 2 layout and skip): GptChunk's KV-cache decode on each tp
// shard gives the logits of the whole (tp = 1) model and the same greedy tokens. The
// tp = 1 reference is computed on every rank; initialisation from global element
// indices makes the shards exactly the slices of the whole model's weights.
#include <catch2/catch.hpp>
#include <cmath>

#include "model/inference.hpp"
#include "test/model/tiny_gpt.hpp"
#include "parallel/topology.hpp"
#include "test/support/mpi/mpi_test_world.hpp"

using namespace mtnlg;
using namespace mtnlg::model;

namespace {
// `cfg`'s model split over the tp = 2 ranks of `g` against the whole model.
void check_tp_generation(const GptConfig& cfg, const parallel::ProcessGroups& g) {
  LoadedModel whole = make_random_model(cfg, 3);
  auto m1 = whole_model_chunk(cfg, whole.store);
  ParamStore shard;
  declare_chunk_params(shard, cfg, ChunkSpec{0, cfg.num_layers_total, true, true, ""}, g.coord.tp, 2);
  shard.finalize();
  shard.initialize(3, cfg.init_std, cfg.num_layers_total);
  auto m2 = whole_model_chunk(cfg, shard, g);

  // logits of a prefill and three decode steps
  std::vector<int32_t> seq = {4, 17, 9, 30, 2, 11, 5, 40};
  KvCache k1 = m1->make_kv_cache(1, 8), k2 = m2->make_kv_cache(1, 8);
  CHECK(k2.k[0].dim(1) == cfg.kv_groups() / 2);  // this rank's key/value heads only
  double worst = 0;
  for (int64_t t0 = 0; t0 < 8;) {
    const int64_t n = t0 == 0 ? 5 : 1;
    Tensor a = logits_at(*m1, seq.data() + t0, 1, n, {n - 1}, &k1);
    Tensor b = logits_at(*m2, seq.data() + t0, 1, n, {n - 1}, &k2);
    REQUIRE(b.dim(1) == cfg.padded_vocab_size);
    double d = 0, mx = 0;
    for (int64_t v = 0; v < cfg.vocab_size; ++v) {
      d = std::max(d, std::fabs(static_cast<double>(a.data<float>()[v]) - b.data<float>()[v]));
      mx = std::max(mx, std::fabs(static_cast<double>(a.data<float>()[v])));
    }
    worst = std::max(worst, d / mx);
    t0 += n;
  }
  CHECK(worst < 1e-5);

  SamplingOptions opt;
  opt.greedy = true;
  opt.max_new_tokens = 10;
  opt.stop_token = -1;
  CHECK(generate(*m2, {4, 17, 9}, opt) == generate(*m1, {4, 17, 9}, opt));
  opt.greedy = false;
  opt.temperature = 1.3;
  opt.seed = 5;
  CHECK(generate(*m2, {4, 17, 9}, opt) == generate(*m1, {4, 17, 9}, opt));
}
}  // namespace

TEST_CASE("mpi: tp=2 KV-cache generation equals the tp=1 model", "[mpi]") {
  auto world = mtnlg::test::mpi_test_world();
  if (world->size() % 2 != 0) return;
  parallel::ProcessGroups g = parallel::make_groups(world, parallel::Topology::from_world(world->size(), 2, 1));
  REQUIRE(g.tp->size() == 2);
  GptConfig cfg = test::tiny_gpt_config();  // tp rank 1 holds 18 real and 14 padding rows of the 64
  check_tp_generation(cfg, g);
  // The Llama family with Qwen3's per-head q/k norms (one key/value group per rank): each
  // rank norms its own heads with the replicated weights, and caches the normed keys.
  test::make_llama(cfg, 2);
  check_tp_generation(cfg, g);
}
