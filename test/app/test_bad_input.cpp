// Bad input through the binary: one case per class, each exits 2 with a one-line
// message that names the place (file:line:col, field) and what would be valid.
#include <catch2/catch.hpp>

#include <filesystem>

#include "test/support/bad_input.hpp"
#include "test/support/test_support.hpp"

using namespace mtnlg;
using Catch::Matchers::Contains;

namespace {
const std::string kGood = test::tiny_recipe_yaml(2);

void expect_exit2(const std::string& args, std::initializer_list<const char*> phrases) {
  INFO(args);
  test::expect_exit2(test::run_mtnlg(args), phrases, test::ErrorLines::one);
}
}  // namespace

TEST_CASE("bad input: every class exits 2 naming the place", "[e2e]") {
  test::TempDir d("badinput");
  auto file = [&](const std::string& name, const std::string& text) {
    test::write_file(d / name, text);
    return (d / name).string();
  };
  const std::string good = file("good.yaml", kGood);
  // broken YAML
  expect_exit2("recipe validate " + file("broken.yaml", "model:\n  num_layers: [1, 2\n"),
               {"broken.yaml:", "invalid YAML"});
  // unknown key, with the valid ones listed
  expect_exit2("recipe validate " + file("unknown.yaml", std::string(kGood) + "  shuffle: true\n"),
               {"unknown.yaml:14:3", "unknown key 'data.shuffle'", "valid keys are"});
  // wrong type
  expect_exit2("recipe validate " + file("type.yaml", std::string(kGood) + "logging:\n  log_interval: often\n"),
               {"type.yaml:15:17", "logging.log_interval", "expected an integer"});
  // impossible values: out of range, and a cross-field rule
  expect_exit2("recipe validate " + good + " --set model.hidden_dropout=2",
               {"--set model.hidden_dropout=2", "out of range"});
  expect_exit2("recipe validate " + good + " --set model.num_attention_heads=3",
               {"divisible by model.num_attention_heads"});
  expect_exit2("train " + good + " --set parallel.tensor_model_parallel_size=3",
               {"divisible by parallel.tensor_model_parallel_size"});
  // context parallelism: a world it does not fit
  expect_exit2("train " + good + " --set parallel.context_parallel_size=2 --set logging.dir=" + d.str() + "/cp",
               {"world size 1", "context_parallel_size"});
  expect_exit2("plan " + good + " --gpus 6 --gpu h100-80g --set parallel.context_parallel_size=4",
               {"6 GPUs", "context_parallel_size", "1 x 4 x 1"});
  expect_exit2("recipe validate " + good + " --set parallel.context_parallel_size=3",
               {"parallel.context_parallel_size (3)", "model.seq_length (16)"});
  // a layout that cannot exist in this world
  expect_exit2("recipe validate " + good + " --world-size 3 --set parallel.tensor_model_parallel_size=2",
               {"world size 3", "tensor_model_parallel_size"});
  // missing file
  expect_exit2("train " + (d / "nope.yaml").string(), {"nope.yaml", "no such file"});
  // missing data prefix
  expect_exit2("train " + good + " --set data.mock=false --set 'data.blend=[{weight: 1, prefix: " + d.str() +
                   "/none}]' --set logging.dir=" + d.str() + "/run",
               {"data.blend[0].prefix", "not found"});
  // an unknown tokenizer type, and a Hugging Face tokenizer without its file
  expect_exit2(
      "train " + good + " --set data.tokenizer_type=SentencePieceTokenizer --set logging.dir=" + d.str() + "/run",
      {"--set data.tokenizer_type=SentencePieceTokenizer", "GPT2BPETokenizer|HuggingFaceTokenizer"});
  expect_exit2("train " + good + " --set data.tokenizer_type=HuggingFaceTokenizer --set data.tokenizer_model=" +
                   d.str() + "/none.json --set logging.dir=" + d.str() + "/run",
               {"data.tokenizer_model", "none.json", "no such file or directory"});
  // an unknown precision (bf16 and fp16 train on the CPU: test_mixed_precision.cpp)
  expect_exit2("train " + good + " --set training.precision=fp8 --set logging.dir=" + d.str() + "/run2",
               {"precision", "fp8"});
  // unknown command line option
  auto r = test::run_mtnlg("train " + good + " --bogus");
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.out, Contains("--bogus"));
}

// An MoE recipe validates; train refuses what its MoE layers do not do yet (here the
// GPT recipe's linear biases), and plan a layout its experts do not split over (exit 2,
// one line): never a dense model in its place.
TEST_CASE("bad input: train and plan refuse the MoE forms they do not build", "[e2e]") {
  test::TempDir d("badinput-moe");
  test::write_file(d / "moe.yaml", kGood);
  const std::string moe = (d / "moe.yaml").string() + " --set model.num_experts=4";
  const auto ok = test::run_mtnlg("recipe validate " + moe);
  INFO(ok.out);
  CHECK(ok.exit_code == 0);
  expect_exit2("train " + moe + " --set logging.dir=" + d.str() + "/run", {"model.add_bias_linear", "not built yet"});
  expect_exit2("plan " + moe + " --gpus 8 --gpu h100-80g --set parallel.expert_model_parallel_size=8",
               {"model.num_experts (4)", "parallel.expert_model_parallel_size (8)"});
  const auto plan = test::run_mtnlg("plan " + moe + " --gpus 4 --gpu h100-80g --set model.add_bias_linear=false");
  INFO(plan.out);
  CHECK(plan.exit_code == 0);
  CHECK_THAT(plan.out, Catch::Matchers::Contains("experts: 4 (top 2) on 1 expert-parallel ranks"));
  expect_exit2("recipe validate " + moe + " --set model.moe_router_topk=5", {"model.moe_router_topk (5)"});
  CHECK(!std::filesystem::exists(d / "run"));
}
