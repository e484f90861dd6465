// recipes/tiny-llama.yaml end to end on the CPU, on the demo corpus (two real English
// texts, GPT-2's BPE, scripts/make-demo-corpus.sh): a short run whose loss falls, then
// `mtnlg generate` (the KV cache of the key/value groups) and `mtnlg eval` from its
// checkpoint, each exit 0 with its output; a resume with model.qk_layernorm is refused; the
// weights continue at twice the context under context parallelism.
#include <catch2/catch.hpp>

#include <filesystem>

#include "test/support/demo_tree.hpp"
#include "test/support/test_support.hpp"

using namespace mtnlg::test;
namespace fs = std::filesystem;

TEST_CASE("tiny Llama on the demo corpus: the loss falls, and generate and eval read its checkpoint", "[e2e]") {
  TempDir tmp("llama-e2e");
  auto corpus = make_demo_tree(fs::path(tmp.str()));
  INFO(corpus.out);
  REQUIRE(corpus.exit_code == 0);

  // 24 iterations of 4 samples of 64 tokens, warmup over the first 4: a second or two a step.
  // `mtnlg ARGS` run in the demo tree: its output (stderr with stdout), then the command line.
  const auto mtnlg = [&](const std::string& args) {
    const std::string cmd = "cd " + tmp.str() + " && " + std::string(MTNLG_BINARY) + " " + args + " 2>&1";
    auto r = run_command(cmd);
    r.out += "\n(" + cmd + ")";
    return r;
  };
  auto r = mtnlg(
      "train recipes/tiny-llama.yaml --quiet --set training.train_iters=24"
      " --set training.micro_batch_size=4 --set training.global_batch_size=4"
      " --set model.seq_length=64 --set optimizer.lr_warmup_tokens=1024"
      " --set checkpoint.save_interval=0 --set training.num_threads=1 --set logging.log_interval=1");
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  const auto losses = read_losses(tmp / "runs" / "tiny-llama");
  REQUIRE(losses.size() == 24);
  INFO("loss " << losses.front() << " -> " << losses.back());
  CHECK(losses.back() < losses.front() - 2.0);  // from ~10.8 (ln 50257) well into the corpus's statistics
  REQUIRE(fs::exists(tmp / "runs" / "tiny-llama" / "checkpoints" / "iter_0000024"));

  // Its checkpoint does not continue as another network: with Qwen3's q/k norms added, the
  // resume is refused (exit 2) naming the key, before any step.
  auto q = mtnlg(
      "train recipes/tiny-llama.yaml --quiet --set model.qk_layernorm=true --set model.seq_length=64"
      " --set checkpoint.load=runs/tiny-llama/checkpoints --set checkpoint.save=qk-ckpt"
      " --set logging.dir=qk-run --set training.num_threads=1");
  INFO(q.out);
  CHECK(q.exit_code == 2);
  CHECK_THAT(q.out, Catch::Matchers::Contains("checkpoint has model.qk_layernorm = false but the recipe says true"));

  // A longer context continues the same weights (context extension): exported and imported
  // back, the checkpoint is its weights alone (iteration 0: AdamW and the token count start
  // fresh), and a run at twice the sequence, split over 2 context-parallel ranks, starts
  // from what the 64-token model learned rather than from ln(vocab).
  auto x = mtnlg("checkpoint export --input runs/tiny-llama/checkpoints --output hf-64");
  INFO(x.out);
  REQUIRE(x.exit_code == 0);
  auto im = mtnlg("checkpoint import --input hf-64 --output imported-64");
  INFO(im.out);
  REQUIRE(im.exit_code == 0);
  auto longer = mtnlg("--version >/dev/null && sh " + source_dir() + "/test/support/mpi/mpirun.sh 2 " +
                      std::string(MTNLG_BINARY) +
                      " train recipes/tiny-llama.yaml --quiet --set training.train_iters=2"
                      " --set training.micro_batch_size=4 --set training.global_batch_size=4"
                      " --set model.seq_length=128 --set parallel.context_parallel_size=2"
                      " --set checkpoint.load=imported-64 --set checkpoint.save=ckpt-128 --set logging.dir=run-128"
                      " --set training.num_threads=1 --set logging.log_interval=1");
  INFO(longer.out);
  REQUIRE(longer.exit_code == 0);
  const auto long_losses = read_losses(tmp / "run-128");
  REQUIRE(long_losses.size() == 2);
  CHECK(long_losses.front() < losses.front() - 1.5);

  auto g =
      mtnlg("generate --checkpoint runs/tiny-llama/checkpoints --prompt 'And God said' --greedy --max-new-tokens 8");
  INFO(g.out);
  CHECK(g.exit_code == 0);
  CHECK_THAT(g.out, Catch::Matchers::StartsWith("And God said"));
  CHECK(g.out.size() > std::string("And God said").size());

  auto e = mtnlg(
      "eval --checkpoint runs/tiny-llama/checkpoints --tasks piqa --data-dir test/fixtures/eval --num-fewshot 0 "
      "--output eval.json");
  INFO(e.out);
  CHECK(e.exit_code == 0);
  CHECK_THAT(e.out, Catch::Matchers::Contains("|piqa"));
  CHECK(fs::exists(tmp / "eval.json"));
}
