// model::partition_chunks: the one split of the layers into pipeline chunks, used by
// the trainer, eval and the checkpoint tools. Every layer is owned exactly once, in
// Megatron's virtual-stage order, with the embedding first and the head last.
#include <catch2/catch.hpp>

#include "model/partition.hpp"

using namespace mtnlg;

namespace {
// 8 layers over `pp` stages, `k` layers per virtual stage (0 = no interleaving), or the
// explicit `layers` per stage.
model::PipelineSplit split(int64_t pp, int64_t k = 0, std::vector<int64_t> layers = {}) {
  model::PipelineSplit s;
  s.num_layers = 8;
  s.pipeline_model_parallel_size = pp;
  s.num_layers_per_virtual_pipeline_stage = k;
  s.pipeline_layers = std::move(layers);
  return s;
}
}  // namespace

TEST_CASE("partition: every layer once, virtual stage c*pp + r, embedding first and head last", "[partition]") {
  struct Case {
    int64_t pp, layers_per_virtual_stage, v;
  };
  for (const Case& k : {Case{1, 0, 1}, Case{4, 0, 1}, Case{2, 2, 2}, Case{4, 1, 2}}) {
    INFO("pipeline_model_parallel_size " << k.pp << ", num_layers_per_virtual_pipeline_stage "
                                         << k.layers_per_virtual_stage);
    const model::PipelineSplit r = split(k.pp, k.layers_per_virtual_stage);
    CHECK(model::virtual_chunks(r) == k.v);
    std::vector<int> owner(8, 0);
    int embeddings = 0, heads = 0;
    for (int64_t rank = 0; rank < k.pp; ++rank) {
      const auto chunks = model::partition_chunks(r, rank);
      REQUIRE(static_cast<int64_t>(chunks.size()) == k.v);
      for (int64_t c = 0; c < k.v; ++c) {
        const auto& s = chunks[static_cast<size_t>(c)];
        CHECK(s.first_layer == (c * k.pp + rank) * (8 / (k.pp * k.v)));  // virtual stage c * pp + rank
        for (int64_t l = s.first_layer; l < s.first_layer + s.num_layers; ++l) ++owner[static_cast<size_t>(l)];
        embeddings += s.has_embedding;
        heads += s.has_head;
        CHECK(s.has_embedding == (rank == 0 && c == 0));
        CHECK(s.has_head == (rank == k.pp - 1 && c == k.v - 1));
      }
    }
    for (int o : owner) CHECK(o == 1);
    CHECK(embeddings == 1);
    CHECK(heads == 1);
  }
}

TEST_CASE("partition: an explicit pipeline_layers list is followed", "[partition]") {
  const model::PipelineSplit r = split(3, 0, {2, 4, 2});
  const int64_t first[] = {0, 2, 6}, count[] = {2, 4, 2};
  for (int64_t rank = 0; rank < 3; ++rank) {
    const auto chunks = model::partition_chunks(r, rank);
    REQUIRE(chunks.size() == 1);
    CHECK(chunks[0].first_layer == first[rank]);
    CHECK(chunks[0].num_layers == count[rank]);
  }
  CHECK_THROWS(model::partition_chunks(r, 3));
}
