#include <catch2/catch.hpp>
#include <filesystem>

#include "core/error.hpp"
#include "config/recipe.hpp"
#include "test/support/bad_input.hpp"
#include "test/support/test_support.hpp"

using namespace mtnlg;
using Catch::Matchers::Contains;

namespace {
const std::string kTiny = test::tiny_recipe_yaml(10);

std::string error_of(const std::string& text, std::vector<std::string> sets = {}) {
  try {
    parse_recipe(text, "r.yaml", sets);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("recipe: defaults and derived values", "[recipe]") {
  Recipe r = parse_recipe(kTiny, "dir/tiny.yaml");
  CHECK(r.name == "tiny");
  CHECK(r.model.ffn_hidden_size == 128);
  CHECK(r.model.max_position_embeddings == 16);
  CHECK(r.model.padded_vocab_size(1) == 104);
  CHECK(r.model.padded_vocab_size(2) == 112);
  CHECK(r.training.seed == 1234);
  CHECK(r.logging.dir == "runs/tiny");
  ModelConfig m;
  m.vocab_size = 50257;
  CHECK(m.padded_vocab_size(8) == 51200);
  CHECK(m.padded_vocab_size(1) == 50304);
}

TEST_CASE("recipe: counts accept suffixes and exponents", "[recipe]") {
  CHECK(parse_count("270B", "x") == 270'000'000'000LL);
  CHECK(parse_count("12e9", "x") == 12'000'000'000LL);
  CHECK(parse_count("1.5M", "x") == 1'500'000);
  CHECK(parse_count("2048", "x") == 2048);
  CHECK_THROWS_AS(parse_count("1.5", "x"), InputError);
  CHECK_THROWS_AS(parse_count("abc", "x"), InputError);
  CHECK_THROWS_AS(parse_count("-3", "x"), InputError);
  Recipe r = parse_recipe(kTiny, "t.yaml", {"training.train_iters=0", "training.train_tokens=\"3K\""});
  CHECK(r.training.train_tokens == 3000);
}

TEST_CASE("recipe: --set overrides and round trip through to_yaml", "[recipe]") {
  Recipe r = parse_recipe(kTiny, "t.yaml",
                          {"model.num_layers=4", "optimizer.lr=3e-4",
                           "training.rampup_batch_size={start: 2, increment: 2, ramp_tokens: 1000}"});
  CHECK(r.model.num_layers == 4);
  CHECK(r.optimizer.lr == 3e-4);
  REQUIRE(r.training.rampup_batch_size);
  CHECK(r.training.rampup_batch_size->ramp_tokens == 1000);
  Recipe back = parse_recipe(to_yaml(r), "t.yaml");
  CHECK(to_yaml(back) == to_yaml(r));
  CHECK(back.optimizer.lr == r.optimizer.lr);
}

TEST_CASE("recipe: data.path and blend entries without weight", "[recipe]") {
  Recipe r = parse_recipe(kTiny, "t.yaml", {"data.mock=false", "data.path=data/x_text_document"});
  REQUIRE(r.data.blend.size() == 1);
  CHECK(r.data.blend[0].prefix == "data/x_text_document");
  CHECK_FALSE(r.data.blend[0].weighted);
  // Written back as a blend of one entry without weight, read back the same.
  CHECK(to_yaml(r).find("{weight") == std::string::npos);
  CHECK(to_yaml(r).find("{prefix: data/x_text_document}") != std::string::npos);
  Recipe back = parse_recipe(to_yaml(r), "t.yaml");
  CHECK(to_yaml(back) == to_yaml(r));
  CHECK_FALSE(back.data.blend[0].weighted);
  Recipe w = parse_recipe(kTiny, "t.yaml", {"data.mock=false", "data.blend=[{weight: 1.0, prefix: p}]"});
  CHECK(w.data.blend[0].weighted);
  Recipe u = parse_recipe(kTiny, "t.yaml", {"data.mock=false", "data.blend=[{prefix: p}]"});
  CHECK_FALSE(u.data.blend[0].weighted);
  CHECK_THAT(error_of(kTiny, {"data.blend=[{weight: 1, prefix: p}]", "data.path=q"}), Contains("both set"));
  CHECK_THAT(error_of(kTiny, {"data.mock=false", "data.blend=[{weight: 1, prefix: p}, {prefix: q}]"}),
             Contains("data.blend[1] (q) has no weight"));
}

TEST_CASE("recipe: errors name the place", "[recipe]") {
  CHECK_THROWS_WITH(parse_recipe("model: [1, 2\n", "r.yaml"), Contains("r.yaml:") && Contains("invalid YAML"));
  std::string e = error_of(std::string(kTiny) + "  bogus_key: 3\n");
  CHECK_THAT(e, Contains("r.yaml:14:3") && Contains("unknown key 'data.bogus_key'") && Contains("valid keys are"));
  e = error_of(std::string(kTiny) + "extra_section: {}\n");
  CHECK_THAT(e, Contains("r.yaml:14:1") && Contains("unknown key 'extra_section'"));
  e = error_of(kTiny, {"model.num_layers=abc"});
  CHECK_THAT(e, Contains("--set model.num_layers=abc") && Contains("expected an integer"));
  e = error_of(kTiny, {"model.hidden_dropout=1.5"});
  CHECK_THAT(e, Contains("out of range"));
  e = error_of(kTiny, {"parallel.recompute_granularity=most"});
  CHECK_THAT(e, Contains("none|selective|full"));
  e = error_of(kTiny, {"model.num_attention_heads=5"});
  CHECK_THAT(e, Contains("divisible by model.num_attention_heads"));
  e = error_of(kTiny, {"training.global_batch_size=7"});
  CHECK_THAT(e, Contains("micro_batch_size"));
  e = error_of(kTiny, {"parallel.pipeline_model_parallel_size=3"});
  CHECK_THAT(e, Contains("pipeline_model_parallel_size"));
  e = error_of(kTiny, {"training.rampup_batch_size={start: 2, increment: 4, ramp_tokens: 10}"});
  CHECK_THAT(e, Contains("multiple of increment"));
  // A --set of one run length replaces the recipe's other one; two are ambiguous.
  CHECK(parse_recipe(kTiny, "r.yaml", {"training.train_samples=5"}).training.train_samples == 5);
  e = error_of(kTiny, {"training.train_samples=5", "training.train_tokens=100"});
  CHECK_THAT(e, Contains("exactly one of"));
  e = error_of(kTiny, {"data.mock=false"});
  CHECK_THAT(e, Contains("data.blend is empty"));
  e = error_of(kTiny, {"model.seq_length=true"});
  CHECK_THAT(e, Contains("model.seq_length"));
  CHECK_THROWS_WITH(load_recipe("/nonexistent/x.yaml"), Contains("/nonexistent/x.yaml") && Contains("no such file"));
}

TEST_CASE("recipe: data.tokenizer_type and data.tokenizer_model", "[recipe]") {
  Recipe d = parse_recipe(kTiny, "t.yaml");
  CHECK(d.data.tokenizer_type == TokenizerType::gpt2_bpe);
  CHECK(d.data.tokenizer_model.empty());
  Recipe r =
      parse_recipe(kTiny, "t.yaml", {"data.tokenizer_type=HuggingFaceTokenizer", "data.tokenizer_model=tok/llama3"});
  CHECK(r.data.tokenizer_type == TokenizerType::huggingface);
  CHECK(r.data.tokenizer_model == "tok/llama3");
  // Written back in Megatron's spelling and read back the same.
  CHECK(to_yaml(r).find("tokenizer_type: HuggingFaceTokenizer") != std::string::npos);
  CHECK(parse_recipe(to_yaml(r), "t.yaml").data.tokenizer_model == "tok/llama3");
  CHECK(parse_recipe(kTiny, "t.yaml", {"data.tokenizer_type=GPT2BPETokenizer"}).data.tokenizer_type ==
        TokenizerType::gpt2_bpe);
  // Bad values: one line naming the key (exit 2 as every InputError).
  CHECK_THAT(error_of(kTiny, {"data.tokenizer_type=SentencePieceTokenizer"}),
             Contains("--set data.tokenizer_type=SentencePieceTokenizer") && Contains("data.tokenizer_type") &&
                 Contains("GPT2BPETokenizer|HuggingFaceTokenizer"));
  CHECK_THAT(error_of(kTiny, {"data.tokenizer_type=[a]"}), Contains("data.tokenizer_type"));
  CHECK_THAT(error_of(kTiny, {"data.tokenizer_type=HuggingFaceTokenizer"}),
             Contains("data.tokenizer_type HuggingFaceTokenizer needs data.tokenizer_model"));
  CHECK_THAT(error_of(kTiny, {"data.tokenizer_model=tok.json"}),
             Contains("data.tokenizer_model (tok.json) is read only with data.tokenizer_type: HuggingFaceTokenizer"));
  CHECK_THAT(error_of(kTiny, {"data.tokenizer_type=HuggingFaceTokenizer", "data.tokenizer_model=t.json",
                              "data.vocab_file=v.json"}),
             Contains("data.vocab_file and data.merge_file are GPT-2's files"));
  CHECK_THAT(error_of(kTiny, {"data.tokenizer_model={a: 1}"}),
             Contains("data.tokenizer_model") && Contains("expected a string"));
  for (const auto& e :
       {error_of(kTiny, {"data.tokenizer_type=HuggingFaceTokenizer"}), error_of(kTiny, {"data.tokenizer_model=x"})})
    CHECK(e.find('\n') == std::string::npos);
}

TEST_CASE("recipe: layout checks need the world size", "[recipe]") {
  Recipe r = parse_recipe(kTiny, "t.yaml", {"parallel.tensor_model_parallel_size=2"});
  CHECK_NOTHROW(validate_layout(r, 4));
  CHECK_THROWS_WITH(validate_layout(r, 3), Contains("not divisible"));
  CHECK_THROWS_WITH(validate_layout(r, 16), Contains("data_parallel_size"));
}

TEST_CASE("recipes/: every shipped recipe loads and validates", "[recipe]") {
  int n = 0;
  for (auto& e : std::filesystem::directory_iterator(mtnlg::test::source_dir() + "/recipes")) {
    if (e.path().extension() != ".yaml") continue;
    INFO(e.path());
    CHECK_NOTHROW(load_recipe(e.path().string()));
    ++n;
  }
  CHECK(n >= 1);
}

TEST_CASE("recipe: the Llama family's keys, their defaults and their round trip", "[recipe]") {
  const std::vector<std::string> llama = {"model.position_embedding_type=rope",
                                          "model.rotary_base=500000",
                                          "model.normalization=RMSNorm",
                                          "model.swiglu=true",
                                          "model.num_query_groups=2",
                                          "model.untie_embeddings_and_output_weights=true",
                                          "model.add_bias_linear=false",
                                          "model.ffn_hidden_size=0",
                                          "model.norm_epsilon=1e-6",
                                          "model.use_rope_scaling=true"};
  Recipe r = parse_recipe(kTiny, "r.yaml", llama);
  CHECK(r.model.rope());
  CHECK(r.model.rmsnorm());
  CHECK(r.model.query_groups() == 2);
  CHECK(r.model.head_dim() == 8);
  CHECK(!r.model.qkv_bias());
  CHECK(r.model.layernorm_epsilon == 1e-6);
  // Megatron's SwiGLU default: 4h x 2/3 (each of gate and up), down to a multiple of 64
  CHECK(r.model.ffn_hidden_size == 64);
  CHECK(parse_recipe(kTiny, "r.yaml").model.query_groups() == 4);  // GPT: one group per head
  CHECK(parse_recipe(kTiny, "r.yaml", {"model.add_bias_linear=false", "model.add_qkv_bias=true"}).model.qkv_bias());
  CHECK(parse_recipe(kTiny, "r.yaml", {"model.layernorm_epsilon=1e-3"}).model.layernorm_epsilon == 1e-3);
  CHECK(parse_recipe(kTiny, "r.yaml", {"model.kv_channels=16"}).model.head_dim() == 16);
  // The resolved recipe reads back the same (the old epsilon name is read, not written).
  const std::string y = to_yaml(r);
  CHECK(y.find("layernorm_epsilon") == std::string::npos);
  Recipe back = parse_recipe(y, "resolved.yaml");
  CHECK(to_yaml(back) == y);
  CHECK(back.model.swiglu);
  CHECK(back.model.rotary_base == 500000);
}

TEST_CASE("recipe: every bad combination of the Llama family's keys is an error naming the key", "[recipe]") {
  CHECK_THAT(error_of(kTiny, {"model.num_query_groups=3"}),
             Contains("model.num_attention_heads (4) must be divisible by model.num_query_groups (3)"));
  CHECK_THAT(error_of(kTiny, {"model.num_query_groups=1", "parallel.tensor_model_parallel_size=2"}),
             Contains("model.num_query_groups (1) must be divisible by parallel.tensor_model_parallel_size (2)"));
  CHECK_THAT(error_of(kTiny, {"model.position_embedding_type=rope", "model.rotary_percent=0"}),
             Contains("model.rotary_percent (0)"));
  CHECK_THAT(error_of(kTiny, {"model.position_embedding_type=rope", "model.rotary_percent=0.3"}),
             Contains("model.rotary_percent (0.3)") && Contains("even whole number"));
  CHECK_THAT(error_of(kTiny, {"model.position_embedding_type=rope", "model.rotary_percent=1.5"}),
             Contains("model.rotary_percent") && Contains("out of range"));
  CHECK_THAT(error_of(kTiny, {"model.use_rope_scaling=true"}),
             Contains("model.use_rope_scaling") && Contains("position_embedding_type: rope"));
  CHECK_THAT(error_of(kTiny, {"model.qk_layernorm=true"}), Contains("model.qk_layernorm") && Contains("RMSNorm"));
  CHECK_THAT(error_of(kTiny, {"model.position_embedding_type=alibi"}),
             Contains("model.position_embedding_type") && Contains("learned_absolute|rope"));
  CHECK_THAT(error_of(kTiny, {"model.normalization=rmsnorm"}), Contains("LayerNorm|RMSNorm"));
  CHECK_THAT(error_of(kTiny, {"model.num_attention_heads=5"}), Contains("or set model.kv_channels"));
  CHECK(error_of(kTiny, {"model.num_attention_heads=5", "model.kv_channels=8"}).empty());
  CHECK_THAT(error_of(kTiny, {"model.swiglu=yes please"}), Contains("model.swiglu"));
}

TEST_CASE("recipe: context parallelism's keys, their defaults and their round trip", "[recipe][cp]") {
  Recipe d = parse_recipe(kTiny, "r.yaml");
  CHECK(d.parallel.context_parallel_size == 1);
  CHECK(d.parallel.cp_comm_type == CpCommType::p2p);
  CHECK(d.parallel.hierarchical_context_parallel_sizes.empty());
  // A dense recipe resolves as it did, plus the three keys at their defaults.
  const std::string y = to_yaml(d);
  CHECK_THAT(y, Contains("context_parallel_size: 1") && Contains("cp_comm_type: p2p") &&
                    Contains("hierarchical_context_parallel_sizes: ~"));
  const std::vector<std::string> cp2 = {"parallel.context_parallel_size=2"};
  auto with = [&](std::vector<std::string> sets, const std::string& more) {
    sets.push_back(more);
    return parse_recipe(kTiny, "r.yaml", sets);
  };
  // Megatron's help spells it "allgather", TransformerEngine "all_gather": both read, one written.
  Recipe ag = with(cp2, "parallel.cp_comm_type=allgather");
  CHECK(ag.parallel.cp_comm_type == CpCommType::all_gather);
  CHECK_THAT(to_yaml(ag), Contains("cp_comm_type: all_gather"));
  CHECK(with(cp2, "parallel.cp_comm_type=all_gather").parallel.cp_comm_type == CpCommType::all_gather);
  CHECK(with(cp2, "parallel.cp_comm_type=a2a").parallel.cp_comm_type == CpCommType::a2a);
  Recipe h = with({"parallel.context_parallel_size=4", "parallel.hierarchical_context_parallel_sizes=[2, 2]"},
                  "parallel.cp_comm_type=a2a+p2p");
  CHECK(h.parallel.cp_comm_type == CpCommType::a2a_p2p);
  CHECK(h.cp() == 4);
  for (const Recipe* r : {&ag, &h}) {
    Recipe back = parse_recipe(to_yaml(*r), "resolved.yaml");
    CHECK(to_yaml(back) == to_yaml(*r));
  }
  CHECK(parse_recipe(to_yaml(h), "resolved.yaml").parallel.hierarchical_context_parallel_sizes ==
        std::vector<int64_t>{2, 2});
  // tp x cp x pp x dp: tp 2 x cp 2 on 8 processes leaves dp 2.
  Recipe l = with(cp2, "parallel.tensor_model_parallel_size=2");
  CHECK_NOTHROW(validate_layout(l, 8));
  CHECK_NOTHROW(validate_layout(l, 4));
}

TEST_CASE("recipe: every bad context-parallel combination is an error naming the key", "[recipe][cp]") {
  // seq_length 16: 2 x cp must divide it
  CHECK(error_of(kTiny, {"parallel.context_parallel_size=8"}).empty());
  CHECK_THAT(error_of(kTiny, {"parallel.context_parallel_size=3"}), Contains("parallel.context_parallel_size (3)") &&
                                                                        Contains("model.seq_length (16)") &&
                                                                        Contains("2 x context_parallel_size = 6"));
  CHECK_THAT(error_of(kTiny, {"parallel.context_parallel_size=0"}), Contains("parallel.context_parallel_size"));
  // a2a exchanges heads: heads and query groups per tensor-parallel rank divisible by cp
  CHECK(error_of(kTiny, {"parallel.context_parallel_size=4", "parallel.cp_comm_type=a2a"}).empty());
  CHECK_THAT(error_of(kTiny, {"parallel.context_parallel_size=8", "parallel.cp_comm_type=a2a"}),
             Contains("parallel.cp_comm_type a2a") && Contains("attention heads (4)"));
  CHECK_THAT(
      error_of(kTiny, {"parallel.context_parallel_size=4", "parallel.cp_comm_type=a2a", "model.num_query_groups=2"}),
      Contains("query groups (2)") && Contains("all-to-all size (4)"));
  CHECK_THAT(error_of(kTiny, {"parallel.context_parallel_size=4", "parallel.cp_comm_type=a2a",
                              "parallel.tensor_model_parallel_size=2"}),
             Contains("attention heads (2)") && Contains("per tensor-parallel rank"));
  // p2p and all_gather send the groups' K/V whatever their number (multi-query too)
  CHECK(error_of(kTiny, {"parallel.context_parallel_size=4", "model.num_query_groups=1"}).empty());
  CHECK(error_of(kTiny,
                 {"parallel.context_parallel_size=4", "parallel.cp_comm_type=all_gather", "model.num_query_groups=1"})
            .empty());
  // a2a+p2p needs [a2a size, p2p size] with cp as their product; the sizes need a2a+p2p
  CHECK_THAT(error_of(kTiny, {"parallel.context_parallel_size=4", "parallel.cp_comm_type=a2a+p2p"}),
             Contains("parallel.hierarchical_context_parallel_sizes") && Contains("product"));
  CHECK_THAT(error_of(kTiny, {"parallel.context_parallel_size=4", "parallel.cp_comm_type=a2a+p2p",
                              "parallel.hierarchical_context_parallel_sizes=[2, 3]"}),
             Contains("parallel.hierarchical_context_parallel_sizes"));
  CHECK_THAT(error_of(kTiny, {"parallel.context_parallel_size=8", "parallel.cp_comm_type=a2a+p2p",
                              "parallel.hierarchical_context_parallel_sizes=[8, 1]"}),
             Contains("all-to-all size (8)"));
  CHECK_THAT(
      error_of(kTiny, {"parallel.context_parallel_size=4", "parallel.hierarchical_context_parallel_sizes=[2, 2]"}),
      Contains("parallel.hierarchical_context_parallel_sizes") && Contains("a2a+p2p"));
  // spellings
  CHECK_THAT(error_of(kTiny, {"parallel.cp_comm_type=ring"}),
             Contains("parallel.cp_comm_type") && Contains("p2p|a2a|all_gather|a2a+p2p"));
  CHECK_THAT(error_of(kTiny, {"parallel.cp_comm_type=[p2p, a2a]"}), Contains("one value for every layer"));
  // sequence parallelism splits each cp rank's rows over tp
  CHECK(error_of(kTiny, {"parallel.context_parallel_size=4", "parallel.tensor_model_parallel_size=4",
                         "parallel.sequence_parallel=true"})
            .empty());
  CHECK_THAT(error_of(kTiny, {"parallel.context_parallel_size=8", "parallel.tensor_model_parallel_size=4",
                              "parallel.sequence_parallel=true"}),
             Contains("parallel.sequence_parallel") && Contains("divisible by tensor_model_parallel_size (4)"));
  // attention dropout is drawn at the global positions: allowed
  CHECK(error_of(kTiny, {"parallel.context_parallel_size=2", "model.attention_dropout=0.1"}).empty());
  // the world: tp x cp x pp must divide it
  Recipe r =
      parse_recipe(kTiny, "t.yaml", {"parallel.context_parallel_size=2", "parallel.tensor_model_parallel_size=2"});
  CHECK_THROWS_WITH(validate_layout(r, 6),
                    Contains("world size 6") && Contains("context_parallel_size") && Contains("2 x 2 x 1"));
  CHECK_THROWS_WITH(validate_layout(r, 32), Contains("data_parallel_size = 2 x 8"));
  for (const std::string& e : {error_of(kTiny, {"parallel.context_parallel_size=3"}),
                               error_of(kTiny, {"parallel.context_parallel_size=8", "parallel.cp_comm_type=a2a"})})
    CHECK(e.find('\n') == std::string::npos);
}
