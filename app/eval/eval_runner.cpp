// Eval runner: tasks -> requests -> batched scoring -> harness metrics (eval_runner.hpp).
#include "app/eval/eval_runner.hpp"
#include "app/process/module_configs.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <unistd.h>

#include "core/error.hpp"
#include "core/log.hpp"
#include "core/progress.hpp"
#include "config/recipe.hpp"
#include "data/eval/metrics.hpp"
#include "data/eval/requests.hpp"
#include "model/checkpoint.hpp"
#include "parallel/watchdog.hpp"

namespace mtnlg::app {

namespace ev = data::eval;
using ojson = nlohmann::ordered_json;

namespace {

struct Req {
  size_t task = 0, inst = 0, choice = 0;
  ev::Window win;
  model::ScoreResult res;
};

ojson num(double v) { return std::isfinite(v) ? ojson(v) : ojson(nullptr); }

// One task's documents, few-shot pool and instances (contexts built).
struct TaskData {
  const ev::TaskInfo* info;
  std::vector<ev::Doc> docs, pool;
  bool pool_is_eval = false;
  int64_t k = 0;
  std::vector<ev::Instance> inst;
};

// 1) documents and few-shot contexts, per task
std::vector<TaskData> load_tasks(const EvalOptions& opt) {
  const bool v03 = opt.task_opt.version == ev::HarnessVersion::v0_3;
  std::vector<TaskData> tds(opt.tasks.size());
  for (size_t t = 0; t < opt.tasks.size(); ++t) {
    TaskData& td = tds[t];
    td.info = &ev::task_info(opt.tasks[t]);
    auto it = opt.task_fewshot.find(td.info->name);
    td.k = it != opt.task_fewshot.end() ? it->second : opt.num_fewshot;
    if (td.k < 0) throw_input("--num-fewshot for {} must be >= 0, got {}", td.info->name, td.k);
    td.docs = ev::load_split(opt.data_dir, *td.info, td.info->eval_split, opt.task_opt);
    const std::string& pool_split = v03 ? td.info->fewshot_v03 : td.info->fewshot_v04;
    td.pool_is_eval = pool_split.empty() || pool_split == td.info->eval_split;
    if (td.k > 0 && !td.pool_is_eval) td.pool = ev::load_split(opt.data_dir, *td.info, pool_split, opt.task_opt);
    td.inst = ev::build_instances(*td.info, td.docs, td.pool_is_eval ? &td.docs : &td.pool, td.pool_is_eval, td.k,
                                  opt.task_opt, opt.limit);
  }
  return tds;
}

// 2) one request per (task, instance, choice), tokenized in parallel (the tokenizer is
// thread-safe) into its model window; the first error is an InputError.
std::vector<Req> make_requests(const std::vector<TaskData>& tds, const data::TextTokenizer& tok, const EvalOptions& opt,
                               int64_t max_length) {
  std::vector<Req> reqs;
  for (size_t t = 0; t < tds.size(); ++t)
    for (size_t i = 0; i < tds[t].inst.size(); ++i)
      for (size_t c = 0; c < tds[t].inst[i].doc->choices.size(); ++c) reqs.push_back(Req{t, i, c, {}, {}});
  std::string first_error;
#pragma omp parallel for schedule(dynamic, 16)
  for (size_t r = 0; r < reqs.size(); ++r) {
    const ev::Instance& in = tds[reqs[r].task].inst[reqs[r].inst];
    try {
      auto pair =
          ev::tokenize_pair(tok, in.contexts[reqs[r].choice], in.doc->choices[reqs[r].choice], opt.task_opt.version);
      reqs[r].win = ev::make_window(pair, max_length, in.doc->where);
    } catch (const std::exception& e) {
#pragma omp critical
      if (first_error.empty()) first_error = e.what();
    }
  }
  if (!first_error.empty()) throw InputError(first_error);
  return reqs;
}

// 3) score, longest first (the harness's order; similar lengths share a batch)
void score_requests(std::vector<Req>& reqs, const ScoreFn& score, const EvalOptions& opt) {
  std::vector<size_t> order(reqs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const auto &x = reqs[a].win.input, &y = reqs[b].win.input;
    if (x.size() != y.size()) return x.size() > y.size();
    return x < y;
  });
  Progress prog("eval", static_cast<int64_t>(reqs.size()), "requests", opt.progress);
  const size_t bs = static_cast<size_t>(std::max<int64_t>(1, opt.batch_size));
  std::vector<model::ScoreRequest> batch;
  for (size_t b = 0; b < order.size(); b += bs) {
    const size_t e = std::min(order.size(), b + bs);
    batch.clear();
    for (size_t i = b; i < e; ++i) batch.push_back({reqs[order[i]].win.input, reqs[order[i]].win.targets});
    std::vector<const model::ScoreRequest*> ptrs;
    int64_t toks = 0;
    for (auto& s : batch) {
      ptrs.push_back(&s);
      toks += static_cast<int64_t>(s.input.size());
    }
    auto res = score(ptrs);
    for (size_t i = b; i < e; ++i) reqs[order[i]].res = res[i - b];
    prog.add(static_cast<int64_t>(e - b), toks);
  }
  prog.finish();
}

// Per-document accuracies of one task, gathered for its aggregate metrics.
struct TaskScores {
  std::vector<double> acc, acc_norm, lls;
  std::map<std::string, std::vector<double>> group_acc;
};

// 4a) one document's sample record (the harness's per-sample output) and its scores.
ojson score_document(const TaskData& td, const std::string& task, size_t i, const std::vector<const Req*>& choices,
                     TaskScores& sc) {
  const ev::Instance& in = td.inst[i];
  const ev::Doc& d = *in.doc;
  std::vector<double> ll;
  ojson greedy = ojson::array(), trunc = ojson::array(), ntok = ojson::array();
  for (const Req* r : choices) {
    ll.push_back(r->res.logprob);
    greedy.push_back(r->res.is_greedy);
    trunc.push_back(r->win.truncated);
    ntok.push_back({r->win.input.size(), r->win.targets.size()});
  }
  ojson s;
  s["task"] = task;
  s["doc_id"] = in.doc_id;
  s["doc_index"] = d.index;
  s["source"] = d.where;
  s["contexts"] = in.contexts;
  s["continuations"] = d.choices;
  s["loglikelihoods"] = ll;
  s["is_greedy"] = greedy;
  s["truncated_tokens"] = trunc;
  s["window_tokens"] = ntok;  // per choice: [model input tokens, scored tokens]
  s["gold"] = d.gold;
  s["fewshot_docs"] = in.fewshot_indices;
  if (td.info->kind == ev::TaskKind::lambada) {
    const double a = choices[0]->res.is_greedy ? 1.0 : 0.0;
    sc.acc.push_back(a);
    sc.lls.push_back(ll[0]);
    s["acc"] = a;
    s["ppl"] = ll[0];
    return s;
  }
  const double a = ev::argmax(ll) == d.gold ? 1.0 : 0.0;
  sc.acc.push_back(a);
  s["acc"] = a;
  if (td.info->acc_norm) {
    const double an = ev::argmax(ev::length_normalized(ll, d.norm_choices)) == d.gold ? 1.0 : 0.0;
    sc.acc_norm.push_back(an);
    s["acc_norm"] = an;
  }
  if (td.info->per_group) {
    sc.group_acc[d.group].push_back(a);
    s["heuristic"] = d.group;
  }
  return s;
}

// 4b) the task's aggregate metrics with their standard errors.
ojson task_metrics(const TaskData& td, const TaskScores& sc, const EvalOptions& opt) {
  ojson m;
  if (td.info->kind == ev::TaskKind::lambada) {
    m["ppl"] = num(ev::perplexity(sc.lls));
    m["ppl_stderr"] = num(ev::bootstrap_perplexity_stderr(sc.lls, opt.bootstrap_iters));
  }
  m["acc"] = num(ev::mean(sc.acc));
  m["acc_stderr"] = num(ev::mean_stderr(sc.acc));
  if (td.info->acc_norm) {
    m["acc_norm"] = num(ev::mean(sc.acc_norm));
    m["acc_norm_stderr"] = num(ev::mean_stderr(sc.acc_norm));
  }
  for (auto& [g, xs] : sc.group_acc) {
    m["acc_" + g] = num(ev::mean(xs));
    m["acc_" + g + "_stderr"] = num(ev::mean_stderr(xs));
  }
  return m;
}

}  // namespace

EvalReport run_eval(model::GptChunk& model, const data::TextTokenizer& tok, const EvalOptions& opt) {
  return run_eval(
      model.config(),
      [&](const std::vector<const model::ScoreRequest*>& reqs) { return model::score_batch(model, reqs); }, tok, opt);
}

EvalReport run_eval(const model::GptConfig& cfg, const ScoreFn& score, const data::TextTokenizer& tok,
                    const EvalOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t max_length = opt.max_length > 0 ? opt.max_length : cfg.seq_length;
  if (max_length > cfg.max_positions)
    throw_input("--max-length {} exceeds the model's {} positions", max_length, cfg.max_positions);
  const std::vector<TaskData> tds = load_tasks(opt);
  std::vector<Req> reqs = make_requests(tds, tok, opt, max_length);
  score_requests(reqs, score, opt);

  // 4) per-document records and per-task metrics
  std::vector<std::vector<std::vector<const Req*>>> by_doc(tds.size());
  for (size_t t = 0; t < tds.size(); ++t) {
    by_doc[t].resize(tds[t].inst.size());
    for (size_t i = 0; i < tds[t].inst.size(); ++i) by_doc[t][i].resize(tds[t].inst[i].doc->choices.size());
  }
  for (auto& r : reqs) by_doc[r.task][r.inst][r.choice] = &r;
  EvalReport rep;
  rep.requests = static_cast<int64_t>(reqs.size());
  for (size_t t = 0; t < tds.size(); ++t) {
    const TaskData& td = tds[t];
    TaskResult tr;
    tr.name = td.info->name;
    tr.version =
        opt.task_opt.version == ev::HarnessVersion::v0_3 ? td.info->version : static_cast<int>(td.info->version_v04);
    tr.num_fewshot = td.k;
    tr.n_docs = static_cast<int64_t>(td.inst.size());
    tr.n_original = static_cast<int64_t>(td.docs.size());
    TaskScores sc;
    for (size_t i = 0; i < td.inst.size(); ++i) tr.samples.push_back(score_document(td, tr.name, i, by_doc[t][i], sc));
    tr.metrics = task_metrics(td, sc, opt);
    rep.tasks.push_back(std::move(tr));
  }
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

ojson results_json(const EvalReport& rep, const EvalOptions& opt) {
  ojson j;
  ojson results = ojson::object(), versions = ojson::object(), nshot = ojson::object(), nsamp = ojson::object();
  for (auto& t : rep.tasks) {
    results[t.name] = t.metrics;
    // v0.4 reports each task's metadata version of the reference release (v0.4.9.1).
    if (opt.task_opt.version == ev::HarnessVersion::v0_3)
      versions[t.name] = t.version;
    else
      versions[t.name] = ev::task_info(t.name).version_v04;
    nshot[t.name] = t.num_fewshot;
    nsamp[t.name] = {{"original", t.n_original}, {"effective", t.n_docs}};
  }
  j["results"] = results;
  j["versions"] = versions;
  ojson cfg;
  cfg["model"] = opt.model_desc;
  cfg["model_args"] = opt.model_args;
  cfg["num_fewshot"] = opt.num_fewshot;
  cfg["batch_size"] = opt.batch_size;
  cfg["device"] = "cpu";
  cfg["no_cache"] = true;
  cfg["limit"] = opt.limit < 0 ? ojson(nullptr) : ojson(opt.limit);
  cfg["bootstrap_iters"] = opt.bootstrap_iters;
  cfg["description_dict"] = ojson::object();
  cfg["harness_version"] = opt.task_opt.version == ev::HarnessVersion::v0_3 ? "0.3" : "0.4";
  if (opt.task_opt.version != ev::HarnessVersion::v0_3) cfg["harness_reference"] = "v0.4.9.1";
  cfg["lambada_format"] = opt.task_opt.lambada_format == ev::LambadaFormat::plain ? "plain" : "cloze";
  j["config"] = cfg;
  j["n-shot"] = nshot;
  j["n-samples"] = nsamp;
  return j;
}

std::string results_table(const EvalReport& rep) {
  struct Row {
    std::string task, version, metric, value, pm, stderr_;
  };
  std::vector<Row> rows;
  auto f4 = [](const ojson& v) { return v.is_null() ? std::string("nan") : fmt::format("{:.4f}", v.get<double>()); };
  for (auto& t : rep.tasks) {
    bool first = true;
    for (auto it = t.metrics.begin(); it != t.metrics.end(); ++it) {
      const std::string k = it.key();
      if (k.size() > 7 && k.compare(k.size() - 7, 7, "_stderr") == 0) continue;
      Row r{first ? t.name : "", first ? std::to_string(t.version) : "", k, f4(it.value()), "", ""};
      auto se = t.metrics.find(k + "_stderr");
      if (se != t.metrics.end()) {
        r.pm = "±";
        r.stderr_ = f4(*se);
      }
      rows.push_back(r);
      first = false;
    }
  }
  size_t w[6] = {4, 7, 6, 5, 1, 6};
  for (auto& r : rows) {
    w[0] = std::max(w[0], r.task.size());
    w[2] = std::max(w[2], r.metric.size());
    w[3] = std::max(w[3], r.value.size());
    w[5] = std::max(w[5], r.stderr_.size());
  }
  auto line = [&](const std::string& a, const std::string& b, const std::string& c, const std::string& d,
                  const std::string& e, const std::string& f) {
    return fmt::format("|{:<{}}|{:>{}}|{:<{}}|{:>{}}|{:<{}}|{:>{}}|\n", a, w[0], b, w[1], c, w[2], d, w[3], e, w[4], f,
                       w[5]);
  };
  std::string out = line("Task", "Version", "Metric", "Value", " ", "Stderr");
  out += fmt::format("|{:-<{}}|{:->{}}:|{:-<{}}|{:->{}}:|{:-<{}}|{:->{}}:|\n", "", w[0], "", w[1] - 1, "", w[2], "",
                     w[3] - 1, "", w[4], "", w[5] - 1);
  for (auto& r : rows) out += line(r.task, r.version, r.metric, r.value, r.pm, r.stderr_);
  return out;
}

model::LoadedModel load_eval_model(const std::string& checkpoint, const std::string& random_recipe,
                                   const std::vector<std::string>& overrides) {
  if (!checkpoint.empty() && !random_recipe.empty()) throw_input("give either --checkpoint or --random-init, not both");
  if (!checkpoint.empty()) return load_for_inference(checkpoint);
  if (random_recipe.empty()) throw_input("one of --checkpoint DIR or --random-init RECIPE is required");
  Recipe r = load_recipe(random_recipe, overrides);
  // eval and generation compute in fp32, whatever the recipe trains in
  const model::GptConfig cfg = inference_config(r);
  return model::make_random_model(cfg, cfg.seed);
}

std::shared_ptr<const data::Tokenizer> load_gpt2_tokenizer(const std::string& vocab, const std::string& merges) {
  namespace fs = std::filesystem;
  if (!vocab.empty() || !merges.empty()) {
    if (vocab.empty() || merges.empty()) throw_input("give both --vocab-file and --merge-file");
    return data::Tokenizer::from_files(vocab, merges);
  }
  std::vector<fs::path> dirs = {fs::path("third_party/gpt2")};
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec)
    for (fs::path p = exe.parent_path(); !p.empty() && p != p.root_path(); p = p.parent_path())
      dirs.push_back(p / "third_party/gpt2");
  for (auto& d : dirs)
    if (fs::exists(d / "vocab.json") && fs::exists(d / "merges.txt"))
      return data::Tokenizer::from_files((d / "vocab.json").string(), (d / "merges.txt").string());
  throw_input(
      "GPT-2 vocabulary not found: pass --vocab-file/--merge-file or run scripts/fetch-gpt2-vocab.sh "
      "(third_party/gpt2/vocab.json)");
}

std::string checkpoint_tokenizer(const std::string& checkpoint) {
  namespace fs = std::filesystem;
  if (checkpoint.empty()) return "";
  std::error_code ec;
  for (fs::path p : {fs::path(checkpoint), fs::path(checkpoint).parent_path()})
    if (!p.empty() && fs::is_regular_file(p / "tokenizer.json", ec)) return (p / "tokenizer.json").string();
  return "";
}

std::shared_ptr<const data::TextTokenizer> load_text_tokenizer(const std::string& vocab, const std::string& merges,
                                                               const std::string& tokenizer_json_arg,
                                                               const std::string& eod_token, bool add_special_tokens,
                                                               const std::string& checkpoint) {
  std::string tokenizer_json = tokenizer_json_arg;
  if (tokenizer_json.empty() && vocab.empty() && merges.empty()) tokenizer_json = checkpoint_tokenizer(checkpoint);
  if (tokenizer_json.empty()) {
    if (!eod_token.empty()) throw_input("--eod-token: only with --tokenizer (GPT-2's is <|endoftext|>)");
    return std::make_shared<data::Gpt2TextTokenizer>(load_gpt2_tokenizer(vocab, merges));
  }
  if (!vocab.empty() || !merges.empty())
    throw_input("--tokenizer {}: give either --tokenizer or --vocab-file/--merge-file, not both", tokenizer_json);
  auto t = data::HfTokenizer::from_file(tokenizer_json);
  const int32_t eod = data::hf_eod_id(*t, eod_token);
  return std::make_shared<data::HfTextTokenizer>(t, eod, add_special_tokens);
}

InferenceWorld start_inference_world(const char* command, const std::string& checkpoint,
                                     const std::vector<std::string>& overrides, const parallel::LaunchInfo& launch,
                                     const std::function<void(const Recipe&)>& check) {
  if (checkpoint.empty()) throw_input("{} under mpirun/srun needs --checkpoint", command);
  InferenceWorld w;
  w.dir = model::ckpt::resolve(checkpoint);
  w.recipe = parse_recipe(model::ckpt::read_metadata(w.dir).recipe_yaml, w.dir + "/metadata.json", overrides);
  if (check) check(w.recipe);
  validate_layout(w.recipe, launch.world_size);
  parallel::set_collective_timeout(w.recipe.parallel.distributed_timeout_minutes * 60);
  w.world = parallel::init_world(launch);
  log::context().rank = static_cast<int>(launch.rank);
  log::context().world = static_cast<int>(launch.world_size);
  return w;
}

}  // namespace mtnlg::app
