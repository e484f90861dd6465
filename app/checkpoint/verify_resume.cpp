#include "app/checkpoint/verify_resume.hpp"

#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "app/train/checkpointing.hpp"
#include "config/recipe.hpp"
#include "core/error.hpp"
#include "core/parse.hpp"
#include "model/checkpoint.hpp"
#include "schedules/batch_schedule.hpp"

namespace mtnlg::app {

namespace fs = std::filesystem;

namespace {

// Written into each run directory verify-resume makes, so a later run may replace it
// (and nothing else) in the same --work-dir.
constexpr const char* kMarker = ".mtnlg-verify-resume";

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

// A word for /bin/sh: single-quoted, with ' as '\''.
std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string describe(const Recipe& r, int64_t world) {
  std::string d = fmt::format("tp={} pp={} dp={}", r.tp(), r.pp(), world / (r.tp() * r.cp() * r.pp()));
  if (r.cp() > 1) d += fmt::format(" cp={}", r.cp());
  if (r.model.moe.enabled() && r.ep() > 1) d += fmt::format(" ep={}", r.ep());
  if (r.parallel.use_distributed_optimizer) d += " ZeRO-1";
  if (r.parallel.sequence_parallel) d += " sp";
  return d;
}

struct Row {
  int64_t iteration = 0, batch = 0;
  double loss = 0, grad_norm = 0;
};

std::vector<Row> read_rows(const fs::path& run_dir) {
  std::vector<Row> rows;
  std::ifstream in(run_dir / "metrics.jsonl");
  int line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw_runtime("{}/metrics.jsonl:{}: not valid JSON: {}", run_dir.string(), line_no, e.what());
    }
    if (!j.contains("loss") || !j.contains("grad_norm")) continue;  // validation records
    rows.push_back({j.value("iteration", int64_t{0}), j.value("global_batch_size", int64_t{0}), j["loss"].get<double>(),
                    j["grad_norm"].get<double>()});
  }
  return rows;
}

// |a - b| / max(|a|, |b|); 0 when equal (also both zero), NaN when either is NaN.
double relative(double a, double b) {
  if (a == b) return 0;
  return std::fabs(a - b) / std::max(std::fabs(a), std::fabs(b));
}

// The first error mtnlg reported in the run's log ("mtnlg: error: ...", "mtnlg: error on
// rank R: ..."; the launcher's own lines come after it), else the log's last line.
std::string error_line(const fs::path& log) {
  std::ifstream in(log);
  std::string last;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("mtnlg: error", 0) == 0) return trim(line.substr(7));
    if (!trim(line).empty()) last = line;
  }
  return trim(last);
}

// A run directory of ours: absent, or made by an earlier verify-resume (then replaced).
void fresh_run_dir(const fs::path& dir) {
  if (fs::exists(dir)) {
    if (!fs::exists(dir / kMarker))
      throw_input("{}: exists and was not made by checkpoint verify-resume; choose another --work-dir", dir.string());
    fs::remove_all(dir);
  }
  fs::create_directories(dir);
  std::ofstream(dir / kMarker) << "made by mtnlg checkpoint verify-resume; replaced by the next one\n";
}

struct Side {
  const char* name;  // "A", "B"
  const char* option;
  std::string text;
  VerifyLayout layout;
  Recipe recipe;
  fs::path dir;
  std::vector<std::string> sets;  // everything passed to the child's --set
};

}  // namespace

std::vector<std::string> VerifyLayout::sets() const {
  std::vector<std::string> s = {fmt::format("parallel.tensor_model_parallel_size={}", tp),
                                fmt::format("parallel.pipeline_model_parallel_size={}", pp),
                                fmt::format("parallel.context_parallel_size={}", cp)};
  if (ep > 0) s.push_back(fmt::format("parallel.expert_model_parallel_size={}", ep));
  if (zero1 >= 0) s.push_back(fmt::format("parallel.use_distributed_optimizer={}", zero1 ? "true" : "false"));
  if (sp >= 0) s.push_back(fmt::format("parallel.sequence_parallel={}", sp ? "true" : "false"));
  return s;
}

VerifyLayout parse_verify_layout(const std::string& text, const std::string& option) {
  VerifyLayout l;
  size_t pos = 0;
  if (trim(text).empty()) throw_input("{} is empty: expected e.g. \"tp=2,pp=2,dp=2\"", option);
  while (pos <= text.size()) {
    const size_t end = std::min(text.find(',', pos), text.size());
    const std::string item = trim(text.substr(pos, end - pos));
    pos = end + 1;
    const size_t eq = item.find('=');
    if (eq == std::string::npos)
      throw_input("{} \"{}\": \"{}\" is not key=value (keys: tp, pp, dp, cp, ep, zero1, sp)", option, text, item);
    const std::string key = trim(item.substr(0, eq)), value = trim(item.substr(eq + 1));
    if (key == "tp" || key == "pp" || key == "dp" || key == "cp" || key == "ep") {
      char* stop = nullptr;
      const long long v = std::strtoll(value.c_str(), &stop, 10);
      if (value.empty() || *stop != '\0' || v < 1 || v > (1 << 24))
        throw_input("{} \"{}\": {}={} is not a positive process count", option, text, key, value);
      (key == "tp" ? l.tp : key == "pp" ? l.pp : key == "cp" ? l.cp : key == "ep" ? l.ep : l.dp) = v;
    } else if (key == "zero1" || key == "sp") {
      std::optional<bool> b = value == "1"   ? std::optional<bool>(true)
                              : value == "0" ? std::optional<bool>(false)
                                             : parse_bool(value);
      if (!b) throw_input("{} \"{}\": {}={} is not 0/1 or true/false", option, text, key, value);
      (key == "zero1" ? l.zero1 : l.sp) = *b ? 1 : 0;
    } else {
      throw_input("{} \"{}\": unknown key \"{}\" (tp, pp, dp, cp, ep, zero1, sp; other settings go in --set)", option,
                  text, key);
    }
  }
  if (l.world() > (1 << 24))
    throw_input("{} \"{}\": tp x cp x pp x dp = {} processes is too many", option, text, l.world());
  return l;
}

namespace {

// A layout's recipe: the user's recipe and --set, the layout's keys, then what every
// verification run needs (its own output dir, load the checkpoint, stop at stop_at). An
// impossible layout is exit 2 before any run (the work dir made for it removed).
void prepare_side(Side& s, const VerifyResumeOptions& o, const std::string& ckpt_dir, int64_t stop_at,
                  const fs::path& work, bool made_work) {
  try {
    s.layout = parse_verify_layout(s.text, s.option);
  } catch (const InputError&) {
    std::error_code ec;
    if (made_work) fs::remove_all(work, ec);
    throw;
  }
  s.sets = o.sets;
  for (auto& x : s.layout.sets()) s.sets.push_back(x);
  for (auto& x :
       std::vector<std::string>{"logging.dir=" + s.dir.string(), "logging.log_interval=1", "logging.tensorboard=false",
                                "checkpoint.load=" + ckpt_dir, "checkpoint.save=" + (s.dir / "checkpoints").string(),
                                "checkpoint.save_interval=0", "checkpoint.keep_last=1",
                                fmt::format("training.exit_interval={}", stop_at), "training.eval_interval=0"})
    s.sets.push_back(x);
  try {
    s.recipe = load_recipe(o.recipe, s.sets);
    validate_layout(s.recipe, s.layout.world());
  } catch (const InputError& e) {
    std::error_code ec;
    if (made_work) fs::remove_all(work, ec);
    throw InputError(fmt::format("{} \"{}\": {}", s.option, s.text, e.what()));
  }
}

// One layout's run: a child `mtnlg train` of this binary (through the launcher when it
// has more than one process), its output in s.dir/train.log.
void run_side(const Side& s, const VerifyResumeOptions& o, int64_t first_iteration, int64_t stop_at) {
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  fresh_run_dir(s.dir);
  const int64_t n = s.layout.world();
  std::string prefix;
  if (n > 1) {
    prefix = o.launcher;
    for (size_t p; (p = prefix.find("{n}")) != std::string::npos;) prefix.replace(p, 3, std::to_string(n));
    prefix += " ";
  }
  std::string cmd = prefix + shell_quote(self) + " train " + shell_quote(o.recipe);
  for (auto& x : s.sets) cmd += " --set " + shell_quote(x);
  const fs::path log = s.dir / "train.log";
  std::printf("layout %s: %s, %lld process%s, iterations %lld..%lld (log %s)\n", s.name, describe(s.recipe, n).c_str(),
              static_cast<long long>(n), n > 1 ? "es" : "", static_cast<long long>(first_iteration),
              static_cast<long long>(stop_at), log.c_str());
  std::fflush(stdout);
  std::ofstream(log) << "$ " << cmd << "\n";
  const int status = std::system((cmd + " >> " + shell_quote(log.string()) + " 2>&1 < /dev/null").c_str());
  std::error_code ec;
  fs::remove_all(s.dir / "checkpoints", ec);  // written only because exit_interval saves; not needed
  if (status == -1 || !WIFEXITED(status))
    throw_runtime("layout {} ({}): the run did not finish ({}); see {}", s.name, s.text,
                  status == -1 ? "could not start /bin/sh" : "killed by a signal", log.string());
  if (const int code = WEXITSTATUS(status); code != 0) {
    const std::string msg = fmt::format("layout {} ({}): the run exited {}: {} (see {})", s.name, s.text, code,
                                        error_line(log), log.string());
    if (code == 2) throw InputError(msg);
    throw RuntimeError(msg);
  }
}

// The two runs' iterations side by side; RuntimeError naming the first iteration whose
// loss or grad norm differs by more than the tolerance (relative).
void compare_runs(const std::vector<Row>& a, const std::vector<Row>& b, double tolerance, const fs::path& work) {
  std::printf("\n%9s %6s %16s %16s %9s %14s %14s %9s\n", "iteration", "batch", "loss A", "loss B", "|diff|",
              "grad norm A", "grad norm B", "|diff|");
  double worst_loss = 0, worst_norm = 0;
  int64_t worst_loss_it = 0, worst_norm_it = 0, first_bad = -1;
  std::string first_bad_what;
  for (size_t i = 0; i < a.size(); ++i) {
    const Row &x = a[i], &y = b[i];
    std::printf("%9lld %6lld %16.9f %16.9f %9.2e %14.7e %14.7e %9.2e\n", static_cast<long long>(x.iteration),
                static_cast<long long>(x.batch), x.loss, y.loss, std::fabs(x.loss - y.loss), x.grad_norm, y.grad_norm,
                std::fabs(x.grad_norm - y.grad_norm));
    const double rl = relative(x.loss, y.loss), rg = relative(x.grad_norm, y.grad_norm);
    if (!(rl <= worst_loss)) worst_loss = rl, worst_loss_it = x.iteration;
    if (!(rg <= worst_norm)) worst_norm = rg, worst_norm_it = x.iteration;
    if (first_bad >= 0) continue;
    if (x.iteration != y.iteration || x.batch != y.batch)
      first_bad_what = fmt::format("layout B logged iteration {} with batch {}, layout A iteration {} with batch {}",
                                   y.iteration, y.batch, x.iteration, x.batch);
    else if (!(rl <= tolerance))
      first_bad_what = fmt::format("loss {:.9f} vs {:.9f}, relative difference {:.2e}", x.loss, y.loss, rl);
    else if (!(rg <= tolerance))
      first_bad_what =
          fmt::format("grad norm {:.7e} vs {:.7e}, relative difference {:.2e}", x.grad_norm, y.grad_norm, rg);
    if (!first_bad_what.empty()) first_bad = x.iteration;
  }
  std::printf(
      "\nlargest relative difference: loss %.2e (iteration %lld), grad norm %.2e (iteration %lld); tolerance %.1e\n",
      worst_loss, static_cast<long long>(worst_loss_it), worst_norm, static_cast<long long>(worst_norm_it), tolerance);
  std::fflush(stdout);
  if (first_bad >= 0)
    throw_runtime("layouts differ from iteration {}: {} (tolerance {:.1e}; runs in {})", first_bad, first_bad_what,
                  tolerance, work.string());
}

}  // namespace

void verify_resume(const VerifyResumeOptions& o) {
  if (o.iters < 1) throw_input("--iters {}: must be at least 1", o.iters);
  if (!(o.tolerance >= 0) || !std::isfinite(o.tolerance))
    throw_input("--tolerance {}: must be a finite number >= 0", o.tolerance);
  if (o.launcher.find("{n}") == std::string::npos)
    throw_input("--launcher \"{}\": must contain {{n}}, the number of processes (e.g. \"mpirun -np {{n}}\")",
                o.launcher);

  // The checkpoint: resolved once, so both runs load the same iteration even if `latest` moves.
  const std::string ckpt_dir = model::ckpt::resolve(o.checkpoint);
  const model::ckpt::TrainState st = model::ckpt::read_metadata(ckpt_dir);
  if (auto miss = model::ckpt::missing_files(ckpt_dir, st); !miss.empty())
    throw_input("{}: {} is missing ({} shard files of layout tp={} pp={} dp={} are absent)", ckpt_dir, miss.front(),
                miss.size(), st.layout.tp, st.layout.pp, st.layout.dp);

  // The recipe as the user gives it (errors name the file or --set, not a layout) ...
  const Recipe base = load_recipe(o.recipe, o.sets);
  check_same_network(ckpt_dir, st, base);
  const int64_t run_iters = schedules::run_length(base.training, base.model.seq_length).iterations;
  if (st.iteration >= run_iters)
    throw_input(
        "{} is at iteration {}, the end of the recipe's run ({} iterations): nothing left to train; raise "
        "training.train_iters with --set",
        ckpt_dir, st.iteration, run_iters);
  const int64_t iters = std::min(o.iters, run_iters - st.iteration);
  // Stop after K iterations with training.exit_interval, not a shorter run length: the run
  // length sets the LR schedule, which must stay the one the checkpoint was trained with.
  const int64_t stop_at = st.iteration + iters;

  // Without --work-dir, a fresh directory, removed again if a layout is refused below.
  fs::path work = o.work_dir;
  bool made_work = false;
  if (work.empty()) {
    std::string tmpl = (fs::temp_directory_path() / "mtnlg-verify-resume-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) throw_runtime("{}: cannot create a work directory", tmpl);
    work = tmpl;
    made_work = true;
  }

  // ... then each layout on top of it: an impossible layout is exit 2 before any run.
  Side sides[2] = {{"A", "--layout-a", o.layout_a, {}, {}, work / "layout-a", {}},
                   {"B", "--layout-b", o.layout_b, {}, {}, work / "layout-b", {}}};
  for (Side& s : sides) prepare_side(s, o, ckpt_dir, stop_at, work, made_work);

  std::printf("checkpoint %s: iteration %lld, saved with tp=%lld pp=%lld dp=%lld%s\n", ckpt_dir.c_str(),
              static_cast<long long>(st.iteration), static_cast<long long>(st.layout.tp),
              static_cast<long long>(st.layout.pp), static_cast<long long>(st.layout.dp),
              st.layout.zero1 ? " ZeRO-1" : "");
  if (iters < o.iters)
    std::printf("the recipe's run ends at iteration %lld: verifying %lld iterations, not %lld\n",
                static_cast<long long>(run_iters), static_cast<long long>(iters), static_cast<long long>(o.iters));
  std::fflush(stdout);

  for (const Side& s : sides) run_side(s, o, st.iteration + 1, stop_at);

  const std::vector<Row> a = read_rows(sides[0].dir), b = read_rows(sides[1].dir);
  if (a.size() != static_cast<size_t>(iters) || b.size() != static_cast<size_t>(iters))
    throw_runtime("expected {} iterations from each run, layout A logged {} and layout B {} (see {}/*/metrics.jsonl)",
                  iters, a.size(), b.size(), work.string());

  compare_runs(a, b, o.tolerance, work);
  std::printf("ok: %lld iterations from iteration %lld agree within %.1e under %s and %s (runs in %s)\n",
              static_cast<long long>(iters), static_cast<long long>(st.iteration), o.tolerance,
              describe(sides[0].recipe, sides[0].layout.world()).c_str(),
              describe(sides[1].recipe, sides[1].layout.world()).c_str(), work.c_str());
}

}  // namespace mtnlg::app
