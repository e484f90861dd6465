// The mixture-of-experts keys: Megatron-Core's names and defaults, their round trip, a
// dense recipe's resolved YAML unchanged, and every bad combination an error (exit 2 in
// the binary) naming the key.
#include <catch2/catch.hpp>

#include <sstream>
#include <string>

#include "config/recipe.hpp"
#include "core/error.hpp"
#include "test/support/bad_input.hpp"

using namespace mtnlg;
using Catch::Matchers::Contains;

namespace {
const std::string kTiny = test::tiny_recipe_yaml(10);
// kTiny with 8 experts, top-2 (num_layers 2, hidden 32, heads 4, ffn 128).
const std::vector<std::string> kMoe = {"model.num_experts=8"};

std::vector<std::string> moe(std::vector<std::string> more) {
  std::vector<std::string> s = kMoe;
  s.insert(s.end(), more.begin(), more.end());
  return s;
}

std::string error_of(std::vector<std::string> sets) {
  try {
    parse_recipe(kTiny, "r.yaml", sets);
  } catch (const InputError& e) {
    const std::string w = e.what();
    CHECK(w.find('\n') == std::string::npos);  // one line
    return w;
  }
  return "";
}
}  // namespace

TEST_CASE("recipe moe: a dense recipe resolves as before, the MoE keys at their defaults", "[recipe]") {
  const Recipe r = parse_recipe(kTiny, "t.yaml");
  const MoeConfig& m = r.model.moe;
  CHECK_FALSE(m.enabled());
  CHECK(m.moe_router_topk == 2);
  CHECK(m.moe_router_load_balancing_type == MoeLoadBalancing::aux_loss);
  CHECK(m.moe_aux_loss_coeff == 0.0);
  CHECK(m.moe_router_score_function == MoeScoreFunction::softmax);
  CHECK(m.moe_router_bias_update_rate == 1e-3);
  CHECK_FALSE(m.moe_expert_capacity_factor);
  CHECK(m.moe_token_drop_policy == MoeDropPolicy::probs);
  CHECK(m.moe_token_dispatcher_type == MoeDispatcher::allgather);
  CHECK(r.ep() == 1);
  CHECK(r.etp() == r.tp());
  CHECK_FALSE(m.is_moe_layer(0));
  // The resolved YAML of a dense model names none of them (so the recipe its checkpoints
  // keep has the bytes it had).
  const std::string y = to_yaml(r);
  CHECK(y.find("moe_") == std::string::npos);
  CHECK(y.find("num_experts") == std::string::npos);
  CHECK(y.find("expert_") == std::string::npos);
  CHECK_NOTHROW(refuse_moe_model(r, "mtnlg train"));
}

TEST_CASE("recipe moe: keys, derived defaults, layer pattern and round trip", "[recipe]") {
  const Recipe r = parse_recipe(kTiny, "t.yaml",
                                moe({"model.moe_router_topk=4",
                                     "model.moe_router_score_function=sigmoid",
                                     "model.moe_router_enable_expert_bias=true",
                                     "model.moe_router_bias_update_rate=1e-2",
                                     "model.moe_router_num_groups=4",
                                     "model.moe_router_group_topk=2",
                                     "model.moe_router_topk_scaling_factor=2.5",
                                     "model.moe_aux_loss_coeff=1e-2",
                                     "model.moe_router_load_balancing_type=seq_aux_loss",
                                     "model.moe_z_loss_coeff=1e-3",
                                     "model.moe_shared_expert_intermediate_size=64",
                                     "model.moe_shared_expert_gate=true",
                                     "model.moe_layer_freq=[0, 1]",
                                     "model.moe_expert_capacity_factor=1.25",
                                     "model.moe_pad_expert_input_to_capacity=true",
                                     "model.moe_token_drop_policy=position",
                                     "model.moe_router_dtype=fp32",
                                     "model.moe_input_jitter_eps=0.01",
                                     "model.moe_token_dispatcher_type=alltoall",
                                     "parallel.expert_model_parallel_size=2"}));
  const MoeConfig& m = r.model.moe;
  CHECK(m.num_experts == 8);
  CHECK(m.moe_ffn_hidden_size == 128);  // absent -> ffn_hidden_size
  CHECK(m.moe_router_topk == 4);
  CHECK(m.moe_router_group_topk == 2);
  CHECK(m.moe_expert_capacity_factor == 1.25);
  CHECK(m.moe_router_dtype == MoeRouterDtype::fp32);
  CHECK_FALSE(m.is_moe_layer(0));
  CHECK(m.is_moe_layer(1));
  CHECK(r.ep() == 2);
  const std::string y = to_yaml(r);
  CHECK(y.find("moe_layer_freq: [0, 1]") != std::string::npos);
  CHECK(y.find("expert_model_parallel_size: 2") != std::string::npos);
  const Recipe back = parse_recipe(y, "resolved.yaml");
  CHECK(to_yaml(back) == y);
  CHECK(back.model.moe.moe_router_bias_update_rate == 1e-2);
  CHECK(back.model.moe.moe_token_drop_policy == MoeDropPolicy::position);
  // An int frequency: layer i is MoE when i % N == 0.
  const Recipe f = parse_recipe(kTiny, "t.yaml", moe({"model.num_layers=4", "model.moe_layer_freq=2"}));
  CHECK(f.model.moe.is_moe_layer(0));
  CHECK_FALSE(f.model.moe.is_moe_layer(1));
  CHECK(f.model.moe.is_moe_layer(2));
  // Dropless by default, written back as null and read back so.
  const Recipe d = parse_recipe(kTiny, "t.yaml", kMoe);
  CHECK_FALSE(d.model.moe.moe_expert_capacity_factor);
  CHECK_FALSE(parse_recipe(to_yaml(d), "d.yaml").model.moe.moe_expert_capacity_factor);
  CHECK_THROWS_WITH(refuse_moe_model(d, "checkpoint convert"), Contains("model.num_experts (8)") &&
                                                                   Contains("checkpoint convert") &&
                                                                   Contains("does not run MoE models"));
}

// What `mtnlg train` does not build with MoE layers yet: exit 2 naming the key; the forms it
// builds pass; a dense recipe is never refused.
TEST_CASE("recipe moe: train refuses the MoE forms it does not build, naming the key", "[recipe]") {
  CHECK_NOTHROW(refuse_unwired_moe(parse_recipe(kTiny, "t.yaml", {})));
  const std::vector<std::string> ok = {"model.add_bias_linear=false", "training.device=cpu"};
  CHECK_NOTHROW(refuse_unwired_moe(parse_recipe(kTiny, "t.yaml", moe(ok))));
  for (const char* dev : {"training.device=cuda", "training.device=test", "training.precision=bf16",
                          "training.precision=fp16"}) {  // the MoE ops run on CUDA, and in bf16/fp16 storage
    std::vector<std::string> on = {"model.add_bias_linear=false", dev};
    CHECK_NOTHROW(refuse_unwired_moe(parse_recipe(kTiny, "t.yaml", moe(on))));
  }
  CHECK_THROWS_WITH(refuse_unwired_moe(parse_recipe(kTiny, "t.yaml", kMoe)),
                    Contains("model.add_bias_linear") && Contains("not built yet"));
  for (const auto& [set, key] : std::vector<std::pair<std::string, std::string>>{
           {"parallel.tensor_model_parallel_size=2", "parallel.sequence_parallel"},
           {"model.moe_router_load_balancing_type=global_aux_loss parallel.recompute_granularity=full",
            "model.moe_router_load_balancing_type"},
           {"model.moe_router_load_balancing_type=sinkhorn parallel.tensor_model_parallel_size=2 "
            "parallel.sequence_parallel=true",
            "model.moe_router_load_balancing_type"},
           {"model.moe_router_load_balancing_type=sinkhorn parallel.context_parallel_size=2",
            "model.moe_router_load_balancing_type"}}) {
    INFO(set);
    std::vector<std::string> sets = ok;
    std::istringstream words(set);  // one or more key=value, space-separated
    for (std::string w; words >> w;) sets.push_back(w);
    CHECK_THROWS_WITH(refuse_unwired_moe(parse_recipe(kTiny, "t.yaml", moe(sets))), Contains(key));
  }
  // CUDA graphs: which MoE forms they capture is the trainer's check (app::moe_graph_refusal).
  std::vector<std::string> graphs = ok;
  graphs.push_back("training.enable_cuda_graph=true");
  CHECK_NOTHROW(refuse_unwired_moe(parse_recipe(kTiny, "t.yaml", moe(graphs))));
  // Expert, expert-tensor, tensor (with sequence parallelism) and pipeline parallelism train.
  std::vector<std::string> par = ok;
  for (const char* set : {"parallel.expert_model_parallel_size=2", "parallel.tensor_model_parallel_size=2",
                          "parallel.expert_tensor_parallel_size=2", "parallel.sequence_parallel=true",
                          "parallel.pipeline_model_parallel_size=2"})
    par.push_back(set);
  CHECK_NOTHROW(refuse_unwired_moe(parse_recipe(kTiny, "t.yaml", moe(par))));
  // Each tp rank routes its own rows: tp without sequence parallelism is refused, and the
  // per-sequence loss whose sequences would be split across them.
  std::vector<std::string> no_sp = ok;
  no_sp.insert(no_sp.end(), {"parallel.tensor_model_parallel_size=2", "parallel.expert_tensor_parallel_size=1"});
  CHECK_THROWS_WITH(refuse_unwired_moe(parse_recipe(kTiny, "t.yaml", moe(no_sp))),
                    Contains("parallel.sequence_parallel"));
  no_sp.insert(no_sp.end(), {"parallel.sequence_parallel=true", "model.moe_router_load_balancing_type=seq_aux_loss"});
  CHECK_THROWS_WITH(refuse_unwired_moe(parse_recipe(kTiny, "t.yaml", moe(no_sp))),
                    Contains("model.moe_router_load_balancing_type") && Contains("seq_aux_loss"));
}

TEST_CASE("recipe moe: every bad combination is an error naming the key", "[recipe]") {
  const std::vector<std::pair<std::vector<std::string>, std::vector<std::string>>> cases = {
      {{"model.moe_router_topk=4"}, {"model.moe_router_topk is set but model.num_experts is 0"}},
      {{"parallel.expert_model_parallel_size=2"}, {"parallel.expert_model_parallel_size is set", "num_experts is 0"}},
      {moe({"model.moe_router_topk=9"}), {"model.moe_router_topk (9) must not exceed model.num_experts (8)"}},
      {moe({"model.moe_router_topk=1"}), {"model.moe_router_topk 1", "moe_router_pre_softmax"}},
      {moe({"model.moe_router_enable_expert_bias=true"}), {"model.moe_router_enable_expert_bias", "sigmoid"}},
      {moe({"model.moe_router_bias_update_rate=0.1"}), {"model.moe_router_bias_update_rate is set"}},
      {moe({"model.moe_router_score_function=sigmoid", "model.moe_router_pre_softmax=true"}),
       {"model.moe_router_pre_softmax", "softmax"}},
      {moe({"model.moe_router_group_topk=2"}), {"model.moe_router_group_topk needs model.moe_router_num_groups"}},
      {moe({"model.moe_router_num_groups=4"}), {"model.moe_router_num_groups is set", "moe_router_group_topk"}},
      {moe({"model.moe_router_num_groups=3", "model.moe_router_group_topk=1"}),
       {"model.num_experts (8) must be divisible by model.moe_router_num_groups (3)"}},
      {moe({"model.moe_router_num_groups=2", "model.moe_router_group_topk=3", "model.moe_router_topk=4"}),
       {"model.moe_router_group_topk (3) must not exceed model.moe_router_num_groups (2)"}},
      {moe({"model.moe_router_num_groups=4", "model.moe_router_group_topk=4"}),
       {"model.moe_router_group_topk (4) must not exceed model.moe_router_topk (2)"}},
      {moe({"model.moe_router_num_groups=8", "model.moe_router_group_topk=1"}),
       {"model.moe_router_topk (2) exceeds the experts"}},
      {moe({"model.moe_router_load_balancing_type=none", "model.moe_aux_loss_coeff=0.01"}),
       {"model.moe_aux_loss_coeff (0.01)", "none"}},
      {moe({"model.moe_router_load_balancing_type=quantile_balancing"}),
       {"model.moe_router_load_balancing_type", "aux_loss|"}},
      {moe({"model.moe_router_load_balancing_type=sinkhorn", "model.moe_aux_loss_coeff=0.01"}),
       {"model.moe_aux_loss_coeff is set with model.moe_router_load_balancing_type: sinkhorn"}},
      {moe({"model.moe_router_load_balancing_type=sinkhorn", "model.moe_expert_capacity_factor=1.5"}),
       {"model.moe_expert_capacity_factor is set", "sinkhorn", "dropless"}},
      {moe({"model.moe_router_load_balancing_type=sinkhorn", "model.moe_router_score_function=sigmoid"}),
       {"model.moe_router_score_function or moe_router_pre_softmax", "sinkhorn"}},
      {moe({"model.moe_router_load_balancing_type=sinkhorn", "model.moe_router_topk_scaling_factor=2"}),
       {"model.moe_router_topk_scaling_factor is set", "sinkhorn"}},
      {moe({"model.moe_router_load_balancing_type=sinkhorn", "model.moe_router_num_groups=4",
            "model.moe_router_group_topk=2"}),
       {"model.moe_router_num_groups is set", "sinkhorn"}},
      {moe({"model.moe_router_score_function=sqrtsoftplus"}), {"softmax|sigmoid"}},
      {moe({"model.moe_pad_expert_input_to_capacity=true"}),
       {"model.moe_pad_expert_input_to_capacity needs model.moe_expert_capacity_factor"}},
      {moe({"model.moe_token_drop_policy=position"}), {"model.moe_token_drop_policy is set"}},
      {moe({"model.moe_expert_capacity_factor=0"}), {"model.moe_expert_capacity_factor", "out of range"}},
      {moe({"model.moe_shared_expert_gate=true"}), {"model.moe_shared_expert_gate needs a shared expert"}},
      {moe({"model.moe_layer_freq=[1, 0, 1]"}), {"model.moe_layer_freq lists 3 layers but model.num_layers is 2"}},
      {moe({"model.moe_layer_freq=[1, 2]"}), {"model.moe_layer_freq[1]", "out of range"}},
      {moe({"model.moe_layer_freq=0"}), {"model.moe_layer_freq", "out of range"}},
      {moe({"model.moe_router_dtype=bf16"}), {"model.moe_router_dtype", "none|fp32|fp64"}},
      {moe({"model.moe_token_dispatcher_type=flex"}), {"model.moe_token_dispatcher_type", "allgather|alltoall"}},
      {moe({"parallel.expert_model_parallel_size=3"}),
       {"model.num_experts (8) must be divisible by parallel.expert_model_parallel_size (3)"}},
      {moe({"model.moe_ffn_hidden_size=30", "model.add_bias_linear=false", "parallel.expert_tensor_parallel_size=4"}),
       {"model.moe_ffn_hidden_size (30) must be divisible by the expert tensor-parallel size (4)"}},
      {moe({"parallel.expert_tensor_parallel_size=2"}), {"model.add_bias_linear", "expert tensor-parallel size"}},
      {moe({"model.moe_shared_expert_intermediate_size=30", "parallel.tensor_model_parallel_size=4"}),
       {"model.moe_shared_expert_intermediate_size (30) must be divisible by parallel.tensor_model_parallel_size"}},
      {moe({"model.moe_input_jitter_eps=1.5"}), {"model.moe_input_jitter_eps", "out of range"}},
  };
  for (const auto& [sets, phrases] : cases) {
    INFO(sets.back());
    const std::string e = error_of(sets);
    CHECK_FALSE(e.empty());
    for (const auto& p : phrases) CHECK_THAT(e, Contains(p));
  }
}

TEST_CASE("recipe moe: the world must hold whole expert grids (etp x ep x pp)", "[recipe]") {
  const Recipe r = parse_recipe(kTiny, "t.yaml",
                                moe({"parallel.expert_model_parallel_size=4", "parallel.pipeline_model_parallel_size=2",
                                     "training.global_batch_size=16"}));
  CHECK_NOTHROW(validate_layout(r, 8));
  CHECK_THROWS_WITH(validate_layout(r, 6), Contains("world size 6") && Contains("expert_model_parallel_size"));
  // Expert and attention grids are independent: ep need not divide dp (world 8, tp 1 pp 2
  // gives dp 4; etp 1 x ep 4 x pp 2 = 8).
  const Recipe t = parse_recipe(kTiny, "t.yaml",
                                moe({"parallel.tensor_model_parallel_size=2", "parallel.expert_tensor_parallel_size=1",
                                     "parallel.expert_model_parallel_size=8", "training.global_batch_size=16"}));
  CHECK_NOTHROW(validate_layout(t, 8));
  CHECK_THROWS_WITH(validate_layout(t, 4), Contains("expert_tensor_parallel_size x expert_model_parallel_size"));
}
