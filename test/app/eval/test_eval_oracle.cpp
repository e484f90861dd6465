// Outside oracle for `mtnlg eval`: every request's log-likelihood and is_greedy, and
// every task's accuracy, against a PyTorch computation (test/app/eval/torch_eval.py) of
// the same weights. A tiny GPT with GPT-2's vocabulary (hidden 32, 2 layers), all nine
// tasks on the fixtures, 1-shot, with a 48-token window so that many requests are
// left-truncated, and batches of 3 so that right padding is exercised.
#include <catch2/catch.hpp>

#include "app/eval/eval_runner.hpp"
#include "core/safetensors.hpp"
#include "data/eval/requests.hpp"
#include "test/support/data_util.hpp"

using namespace mtnlg;

TEST_CASE("eval: log-likelihoods, is_greedy and accuracies equal PyTorch's", "[oracle]") {
  if (!test::python_has("torch")) FAIL("Debian's python3-torch is missing (scripts/install-deps.sh installs it)");
  auto tok = test::gpt2_tokenizer();
  if (!tok) FAIL("GPT-2 vocabulary unavailable (scripts/fetch-gpt2-vocab.sh)");
  model::GptConfig cfg;
  cfg.vocab_size = 50257;
  cfg.padded_vocab_size = 50304;
  cfg.hidden = 32;
  cfg.heads = 4;
  cfg.ffn = 128;
  cfg.seq_length = 48;
  cfg.max_positions = 64;
  cfg.num_layers_total = 2;
  cfg.init_std = 0.1;
  model::LoadedModel lm = model::make_random_model(cfg, 2024);
  auto chunk = model::whole_model_chunk(cfg, lm.store);

  app::EvalOptions opt;
  opt.tasks = data::eval::task_names();
  opt.data_dir = test::source_dir() + "/test/fixtures/eval";
  opt.num_fewshot = 1;
  opt.batch_size = 3;
  opt.max_length = 48;
  opt.bootstrap_iters = 100;
  opt.progress = false;
  app::EvalReport rep = app::run_eval(*chunk, *tok, opt);

  nlohmann::json spec;
  spec["max_length"] = opt.max_length;
  spec["docs"] = nlohmann::json::array();
  int64_t truncated = 0;
  for (auto& t : rep.tasks) {
    spec["acc"][t.name] = t.metrics["acc"].get<double>();
    for (auto& s : t.samples) {
      nlohmann::json d;
      d["task"] = t.name;
      d["doc_id"] = s["doc_id"];
      d["gold"] = s["gold"];
      d["kind"] = t.name == "lambada_openai" ? "lambada" : "mc";
      for (size_t i = 0; i < s["contexts"].size(); ++i) {
        auto p = data::eval::tokenize_pair(*tok, s["contexts"][i].get<std::string>(),
                                           s["continuations"][i].get<std::string>(), data::eval::HarnessVersion::v0_3);
        d["requests"].push_back({{"context", p.context},
                                 {"continuation", p.continuation},
                                 {"ll", s["loglikelihoods"][i]},
                                 {"is_greedy", s["is_greedy"][i]}});
        truncated += s["truncated_tokens"][i].get<int64_t>() > 0;
      }
      spec["docs"].push_back(d);
    }
  }
  CHECK(truncated > 5);  // the window really cut contexts
  test::TempDir dir("eval-oracle");
  test::write_file(dir / "requests.json", spec.dump());
  std::vector<safetensors::Entry> w;
  for (auto& p : lm.store.infos()) w.push_back({p.name, lm.store.param(p.name).clone()});
  safetensors::write((dir / "model.safetensors").string(), w,
                     {{"layers", "2"}, {"hidden", "32"}, {"heads", "4"}, {"vocab", "50257"}, {"eps", "1e-05"}});
  auto res = test::run_command(test::python() + " " + test::source_dir() + "/test/app/eval/torch_eval.py " + dir.str());
  INFO(res.out);
  CHECK(res.exit_code == 0);
  CHECK(res.out.find("PASS") != std::string::npos);
}
