// model::partition_chunks: the one split of the layers into pipeline chunks, used by
// the trainer, eval and the checkpoint tools. Every layer is owned exactly once, in
// Megatron's virtual-stage order, with the embedding first and the head last.
#include <catch2/catch.hpp>

#include "model/partition.hpp"

using namespace mtnlg;

namespace {
Recipe recipe(const std::string& parallel) {
  return parse_recipe("model: {num_layers: 8, hidden_size: 32, num_attention_heads: 4, seq_length: 16, vocab_size: 64}\n"
                      "training: {micro_batch_size: 1, global_batch_size: 8, train_iters: 1}\n"
                      "data: {mock: true}\nparallel: " +
                          parallel + "\n",
                      "test.yaml");
}
}  // namespace

TEST_CASE("partition: every layer once, virtual stage c*pp + r, embedding first and head last", "[partition]") {
  struct Case {
    const char* parallel;
    int64_t pp, v;
  };
  for (const Case& k : {Case{"{pipeline_model_parallel_size: 1}", 1, 1}, Case{"{pipeline_model_parallel_size: 4}", 4, 1},
                        Case{"{pipeline_model_parallel_size: 2, num_layers_per_virtual_pipeline_stage: 2}", 2, 2},
                        Case{"{pipeline_model_parallel_size: 4, num_layers_per_virtual_pipeline_stage: 1}", 4, 2}}) {
    INFO(k.parallel);
    const Recipe r = recipe(k.parallel);
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
  const Recipe r = recipe("{pipeline_model_parallel_size: 3, pipeline_layers: [2, 4, 2]}");
  const int64_t first[] = {0, 2, 6}, count[] = {2, 4, 2};
  for (int64_t rank = 0; rank < 3; ++rank) {
    const auto chunks = model::partition_chunks(r, rank);
    REQUIRE(chunks.size() == 1);
    CHECK(chunks[0].first_layer == first[rank]);
    CHECK(chunks[0].num_layers == count[rank]);
  }
  CHECK_THROWS(model::partition_chunks(r, 3));
}
