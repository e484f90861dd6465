// `mtnlg data dedup|quality|decontaminate|synth-corpus`: the curation stages, one command
// each (the whole pipeline in one recipe is `data curate`, cmd_data_curate.cpp).
// The algorithms live in data/curation/ (docs/CURATION.md); this file only maps
// command-line options onto their option structs and prints a one-line summary.
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <cstring>
#include <memory>
#include <thread>
#include <span>

#include "app/commands.hpp"
#include "app/process/rank_job.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "core/progress.hpp"
#include "core/switches.hpp"
#include "data/curation/decontaminate.hpp"
#include "data/curation/dedup.hpp"
#include "data/curation/quality.hpp"
#include "data/curation/synth_corpus.hpp"
#include "data/curation/text.hpp"
#include "data/preprocess.hpp"
#include "parallel/communicator.hpp"

namespace mtnlg::app {

namespace {

// " (N ranks)" after a summary line of a multi-rank run, nothing after one process's.
std::string ranks_note(int64_t ranks) { return ranks > 1 ? fmt::format(" ({} ranks)", ranks) : std::string(); }

nlohmann::json filter_quality_ranks(const curation::QualityFilterOptions& opt, const parallel::LaunchInfo& info,
                                    bool progress) {
  RankJob job(info, opt.output);
  curation::QualityFilterOptions o = opt;
  int64_t documents = 0;
  job.count_share(opt.input, o.range_begin, o.range_end, o.lines_before, &o.documents_before, &documents);
  o.output = job.part(job.r);
  o.write_report = false;
  std::atomic<int64_t> done{0};
  o.documents_done = &done;
  job.own_files = {o.output};
  int64_t totals[2] = {0, 0};
  job.step_with_progress(
      [&] {
        const auto rep = curation::filter_quality(o);
        totals[0] = rep["documents"].get<int64_t>();
        totals[1] = rep["kept"].get<int64_t>();
      },
      "filtering", {"quality filter", documents, "docs", &done, progress});
  job.world->all_reduce(totals, 2, parallel::ReduceOp::sum);
  nlohmann::json report;
  job.join_on_rank0({""}, [&] {
    job.join_parts();
    report = curation::quality_filter_report(opt, totals[0], totals[1]);
    curation::write_file_atomic(opt.output + ".report.json", report.dump(2) + "\n");
  });
  parallel::finalize_world();
  return report;
}

// `quality score` across ranks: each rank scores its range into a part (line numbers
// are the file's), rank 0 joins the parts; the output is the same bytes for any N.
nlohmann::json score_quality_ranks(const std::string& input, const std::string& model, const std::string& output,
                                   const std::string& key, const parallel::LaunchInfo& info, bool progress) {
  RankJob job(info, output);
  int64_t begin = 0, end = -1, lines_before = 0, documents = 0;
  job.count_share(input, begin, end, lines_before, nullptr, &documents);
  const std::string part = job.part(job.r);
  job.own_files = {part};
  std::atomic<int64_t> done{0};
  double sum = 0;
  job.step_with_progress(
      [&] {
        sum = curation::score_quality(input, model, part, key, begin, end, lines_before, &done)["score_sum"]
                  .get<double>();
      },
      "scoring", {"quality score", documents, "docs", &done, progress});
  job.world->all_reduce(&sum, 1, parallel::ReduceOp::sum);
  job.join_on_rank0({""}, [&] { job.join_parts(); });
  parallel::finalize_world();
  return {{"documents", documents}, {"mean_score", documents ? sum / static_cast<double>(documents) : 0.0}};
}

// `decontaminate` across ranks: pass 1 on each range, the per-n-gram document counts
// all-reduced (the too-common rule sees the whole input), pass 2 on each range into a
// part, each rank's report into a part file; rank 0 joins the parts and combines the
// reports. Output and report (but its "seconds") are the same for any number of ranks.
// Both passes run on a helper thread; rank 0's progress line counts the input bytes of
// both passes on all ranks (2 x the file size), and the counts' all-reduce between the
// passes runs on the main thread (RankJob::on_main_thread).
curation::DecontamResult decontaminate_ranks(const curation::DecontamOptions& opt, const parallel::LaunchInfo& info) {
  const auto t0 = std::chrono::steady_clock::now();
  RankJob job(info, opt.output);
  curation::DecontamOptions o = opt;
  job.count_share(opt.input, o.range_begin, o.range_end, o.lines_before, nullptr);
  o.output = job.part(job.r);
  o.write_report = false;
  o.progress = false;  // rank 0 draws the line for all ranks
  std::atomic<int64_t> bytes{0};
  o.bytes_done = &bytes;
  const std::string part_report = o.output + ".report.json";
  job.own_files = {o.output, part_report};
  o.reduce_counts = [&](std::vector<int64_t>& counts) {
    job.on_main_thread(
        [&] { job.world->all_reduce(counts.data(), static_cast<int64_t>(counts.size()), parallel::ReduceOp::sum); });
  };
  curation::DecontamResult res;
  std::error_code ec;
  const auto size = static_cast<int64_t>(std::filesystem::file_size(opt.input, ec));
  job.step_with_progress(
      [&] {
        res = curation::run_decontaminate(o);
        curation::write_file_atomic(part_report, res.report.dump() + "\n");
      },
      "decontaminating", {"decontaminate: 2 passes", ec ? -1 : 2 * size, "B", &bytes, opt.progress});
  curation::DecontamResult out;
  job.join_on_rank0({"", ".report.json"}, [&] {
    std::vector<nlohmann::json> parts;
    for (int64_t q = 0; q < job.W; ++q) {
      std::FILE* f = std::fopen((job.part(q) + ".report.json").c_str(), "rb");
      if (!f) throw_runtime("{}.report.json: cannot open rank {}'s report", job.part(q), q);
      parts.push_back(nlohmann::json::parse(f));
      std::fclose(f);
    }
    job.join_parts();
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    out.report = curation::combine_decontaminate_reports(opt, parts, secs);
    out.documents = out.report["documents"].get<int64_t>();
    out.written = out.report["lines_written"].get<int64_t>();
    out.removed = out.report["removed"].get<int64_t>();
    out.cut = out.report["cut"].get<int64_t>();
    curation::write_file_atomic(opt.report.empty() ? opt.output + ".report.json" : opt.report,
                                out.report.dump(2) + "\n");
  });
  parallel::finalize_world();
  return out;
}

void register_dedup(CLI::App& data) {
  auto o = std::make_shared<curation::DedupOptions>();
  auto no_progress = std::make_shared<bool>(false);
  auto* c = data.add_subcommand(
      "dedup",
      "Fuzzy-deduplicate JSONL sources with MinHash-LSH; writes OUT/<input name> (kept lines, byte-identical, "
      "order kept) and OUT/dedup_report.json");
  c->add_option("--input", o->inputs, "Input JSONL files (one source each; source name = file stem)")
      ->required()
      ->expected(1, -1);
  c->add_option("--output-dir", o->output_dir, "Directory for the filtered files and the report")->required();
  c->add_option("--priority", o->priority,
                "Source names (file stems), most preferred first: the survivor of a duplicate group comes from the "
                "first listed source present, then the earliest input file, then the earliest line")
      ->delimiter(',');
  c->add_option("--threshold", o->threshold,
                "Jaccard similarity of word-shingle sets at or above which two documents are duplicates")
      ->capture_default_str();
  c->add_option("--json-key", o->json_key, "JSON field holding the document text")->capture_default_str();
  c->add_option("--workers", o->workers, "Worker threads (0 = all hardware threads)")->capture_default_str();
  c->add_option("--ngram", o->ngram, "Words per shingle")->capture_default_str();
  c->add_option("--num-perm", o->num_perm, "MinHash signature length K")->capture_default_str();
  c->add_option("--bands", o->bands, "LSH bands b (0 = chosen from --threshold, see docs/CURATION.md)")
      ->capture_default_str();
  c->add_option("--rows", o->rows, "LSH rows per band r (0 = chosen with --bands)")->capture_default_str();
  c->add_option("--seed", o->seed, "Seed of the MinHash hash family")->capture_default_str();
  c->add_flag("--clusters", o->write_clusters,
              "Also write OUT/dedup_clusters.jsonl (every duplicate group, kept and removed lines)");
  auto memory = std::make_shared<std::string>();
  c->add_option("--memory-per-rank", *memory,
                "Memory budget of each rank (e.g. 2G): the MinHash signatures of the rank's share must fit; LSH band "
                "keys over the rest are spilled to sorted runs on disk (default: no limit, nothing spilled)");
  c->add_option("--tmp-dir", o->tmp_dir, "Directory for spilled band keys (default: --output-dir)");
  c->add_flag("--no-progress", *no_progress, "Do not draw progress bars");
  c->footer(
      "Under mpirun or srun each rank reads a line-aligned byte range of every input, band keys are routed to their "
      "owner ranks, rank 0 picks the survivors and every rank writes its kept lines into its slice of each output: "
      "outputs and report (but its timings and \"run\") are the same "
      "bytes for any number of ranks (all ranks must see the inputs and the output directory).");
  c->callback([o, no_progress, memory] {
    o->progress = !*no_progress;
    if (!memory->empty()) o->memory_per_rank = curation::parse_byte_size(*memory, "--memory-per-rank");
    // Testing aid: a write failure on one rank (tests prove it leaves no output).
    if (const auto f = switches::integer(Switch::test_dedup_fail_write_rank)) o->fail_write_rank = *f;
    // "; 36 band-key runs (576.0 MiB) spilled" when the budget made the ranks spill.
    auto spilled = [](const curation::DedupResult& r) -> std::string {
      const auto& run = r.report["run"];
      const int64_t runs = run["key_runs_spilled"].get<int64_t>();
      if (runs == 0) return "";
      return fmt::format("; {} band-key runs ({:.1f} MiB) spilled", runs,
                         run["key_bytes_spilled"].get<double>() / 1048576.0);
    };
    one_or_several_ranks([&] { return curation::run_dedup(*o); },
                         [&](const parallel::LaunchInfo& info) {
                           return run_on_ranks(
                               info, [&](curation::RankComm& comm) { return curation::run_dedup(*o, &comm); });
                         },
                         [&](const curation::DedupResult& r, int64_t ranks) {
                           log::info(
                               "dedup: {} documents, kept {}, removed {} ({} duplicate groups, {} empty kept); report "
                               "{}/dedup_report.json{}",
                               r.documents, r.kept, r.removed, r.components, r.empty, o->output_dir,
                               ranks > 1 ? fmt::format(" ({} ranks{})", ranks, spilled(r)) : spilled(r));
                         });
  });
}

void register_quality_train(CLI::App* q) {
  auto t = std::make_shared<curation::QualityTrainOptions>();
  auto t_np = std::make_shared<bool>(false);
  auto* train =
      q->add_subcommand("train",
                        "Train on curated (positive) vs raw (negative) JSONL; writes the model and MODEL.report.json "
                        "with held-out precision/recall");
  train->add_option("--positive", t->positive, "JSONL of curated (high-quality) documents")->required();
  train->add_option("--negative", t->negative, "JSONL of raw (unfiltered) documents")->required();
  train->add_option("--model", t->model, "Output model file (versioned binary with checksum)")->required();
  train->add_option("--report", t->report, "Report path (default MODEL.report.json)");
  train->add_option("--json-key", t->json_key, "JSON field holding the document text")->capture_default_str();
  train->add_option("--bucket-bits", t->bucket_bits, "log2 of the number of hashed feature buckets")
      ->capture_default_str();
  train->add_option("--epochs", t->epochs, "SGD passes over the training documents")->capture_default_str();
  train->add_option("--lr", t->lr, "SGD learning rate (divided by the epoch number)")->capture_default_str();
  train->add_option("--holdout", t->holdout, "Fraction of documents held out for the reported precision/recall")
      ->capture_default_str();
  train->add_option("--seed", t->seed, "Seed for the hash, the held-out split and the shuffles")->capture_default_str();
  train->add_flag("--no-progress", *t_np, "Do not draw progress bars");
  train->footer(
      "Under mpirun or srun each rank reads a line-aligned byte range of both inputs and computes their features; "
      "SGD runs on rank 0, which receives the other ranks' examples in the one-process order: the model and report "
      "are the same bytes for any number of ranks (all ranks must see the inputs and the model's directory).");
  train->callback([t, t_np] {
    t->progress = !*t_np;
    one_or_several_ranks(
        [&] { return curation::train_quality(*t); },
        [&](const parallel::LaunchInfo& info) {
          return run_on_ranks(info, [&](curation::RankComm& comm) { return curation::train_quality(*t, &comm); });
        },
        [&](const nlohmann::json& rep, int64_t ranks) {
          const auto& m = rep["held_out_metrics"];
          log::info("quality train: held-out {} docs: accuracy {:.4f}, precision {:.4f}, recall {:.4f}; model {}{}",
                    m["documents"].get<int64_t>(), m["accuracy"].get<double>(), m["precision"].get<double>(),
                    m["recall"].get<double>(), t->model, ranks_note(ranks));
        });
  });
}

void register_quality_score(CLI::App* q) {
  struct ScoreArgs {
    std::string input, model, output, key = "text";
  };
  auto s = std::make_shared<ScoreArgs>();
  auto* score = q->add_subcommand("score", "Score documents: writes {\"line\": N, \"score\": P(curated)} per document");
  score->add_option("--input", s->input, "JSONL to score")->required();
  score->add_option("--model", s->model, "Model from `quality train`")->required();
  score->add_option("--output", s->output, "Output JSONL of scores")->required();
  score->add_option("--json-key", s->key, "JSON field holding the document text")->capture_default_str();
  auto s_np = std::make_shared<bool>(false);
  score->add_flag("--no-progress", *s_np, "Do not draw the progress line (multi-rank runs)");
  score->footer(
      "Under mpirun or srun each rank scores a line-aligned byte range of the input and rank 0 joins the parts: "
      "the output is the same bytes for any number of ranks (the output directory must be shared).");
  score->callback([s, s_np] {
    one_or_several_ranks([&] { return curation::score_quality(s->input, s->model, s->output, s->key); },
                         [&](const parallel::LaunchInfo& info) {
                           return score_quality_ranks(s->input, s->model, s->output, s->key, info, !*s_np);
                         },
                         [&](const nlohmann::json& r, int64_t ranks) {
                           log::info("quality score: {} documents, mean score {:.4f} -> {}{}",
                                     r["documents"].get<int64_t>(), r["mean_score"].get<double>(), s->output,
                                     ranks_note(ranks));
                         });
  });
}

void register_quality_filter(CLI::App* q) {
  auto f = std::make_shared<curation::QualityFilterOptions>();
  auto* filter = q->add_subcommand("filter",
                                   "Keep documents by score: a threshold, or GPT-3's Pareto sampling "
                                   "(keep if pareto(alpha) > 1 - score); writes OUTPUT.report.json");
  filter->add_option("--input", f->input, "JSONL to filter")->required();
  filter->add_option("--model", f->model, "Model from `quality train`")->required();
  filter->add_option("--output", f->output, "Output JSONL (kept lines, byte-identical)")->required();
  filter->add_option("--json-key", f->json_key, "JSON field holding the document text")->capture_default_str();
  filter->add_option("--mode", f->mode, "threshold | pareto")->capture_default_str();
  filter->add_option("--threshold", f->threshold, "threshold mode: keep if score >= this")->capture_default_str();
  filter->add_option("--alpha", f->alpha, "pareto mode: shape of the Pareto (Lomax) draw; P(keep) = (2 - score)^-alpha")
      ->capture_default_str();
  filter->add_option("--seed", f->seed, "pareto mode: seed of the per-document draws")->capture_default_str();
  auto f_np = std::make_shared<bool>(false);
  filter->add_flag("--no-progress", *f_np, "Do not draw the progress line (multi-rank runs)");
  filter->footer(
      "Under mpirun or srun each rank filters a line-aligned byte range of the input and rank 0 joins the parts: "
      "output and report are the same bytes for any number of ranks (the output directory must be shared).");
  filter->callback([f, f_np] {
    one_or_several_ranks([&] { return curation::filter_quality(*f); },
                         [&](const parallel::LaunchInfo& info) { return filter_quality_ranks(*f, info, !*f_np); },
                         [&](const nlohmann::json& r, int64_t ranks) {
                           log::info("quality filter: {} documents, kept {}, removed {} -> {}{}",
                                     r["documents"].get<int64_t>(), r["kept"].get<int64_t>(),
                                     r["removed"].get<int64_t>(), f->output, ranks_note(ranks));
                         });
  });
}

void register_quality(CLI::App& data) {
  auto* q = data.add_subcommand(
      "quality", "Train / apply a linear quality classifier (hashed unigrams + bigrams, logistic regression)");
  q->require_subcommand(1);
  register_quality_train(q);
  register_quality_score(q);
  register_quality_filter(q);
}

void register_decontaminate(CLI::App& data) {
  auto o = std::make_shared<curation::DecontamOptions>();
  auto no_progress = std::make_shared<bool>(false);
  auto* c = data.add_subcommand(
      "decontaminate",
      "Remove (or cut around) training documents sharing a normalised word n-gram with eval task data "
      "(D/<task>/<split>.jsonl); writes the cleaned JSONL and OUTPUT.report.json");
  c->add_option("--input", o->input, "Training JSONL")->required();
  c->add_option("--tasks-dir", o->tasks_dir, "Eval data directory: D/<task>/<split>.jsonl, Hugging Face rows")
      ->required();
  c->add_option("--output", o->output, "Cleaned JSONL")->required();
  c->add_option("--report", o->report, "Report path (default OUTPUT.report.json)");
  c->add_option("--ngram", o->ngram, "Words per n-gram (GPT-3 used 13)")->capture_default_str();
  c->add_option("--json-key", o->json_key, "JSON field holding the document text")->capture_default_str();
  c->add_option("--mode", o->mode,
                "remove: drop hit documents; cut: remove --cut-margin characters around each match and split")
      ->capture_default_str();
  c->add_option("--cut-margin", o->cut_margin, "cut mode: bytes removed on each side of a match")
      ->capture_default_str();
  c->add_option("--min-fragment", o->min_fragment, "cut mode: fragments shorter than this (bytes) are dropped")
      ->capture_default_str();
  c->add_option("--max-fragments", o->max_fragments, "cut mode: documents split into more pieces are dropped whole")
      ->capture_default_str();
  c->add_option("--max-hits", o->max_hits,
                "Task n-grams found in more training documents than this are ignored as too common (0 = never)")
      ->capture_default_str();
  c->add_flag("--no-progress", *no_progress, "Do not draw progress bars");
  c->footer(
      "Under mpirun or srun each rank scans a line-aligned byte range of the input, the per-n-gram document counts "
      "are summed over the ranks, and rank 0 joins the parts: output and report (but its seconds) are the same for "
      "any number of ranks (the output directory must be shared).");
  c->callback([o, no_progress] {
    o->progress = !*no_progress;
    one_or_several_ranks([&] { return curation::run_decontaminate(*o); },
                         [&](const parallel::LaunchInfo& info) { return decontaminate_ranks(*o, info); },
                         [&](const curation::DecontamResult& r, int64_t ranks) {
                           log::info("decontaminate: {} documents, removed {}, cut {}, {} lines written -> {}{}",
                                     r.documents, r.removed, r.cut, r.written, o->output, ranks_note(ranks));
                         });
  });
}

void register_synth(CLI::App& data) {
  auto o = std::make_shared<curation::SynthOptions>();
  auto no_progress = std::make_shared<bool>(false);
  auto* c = data.add_subcommand(
      "synth-corpus",
      "Write a synthetic test corpus with planted ground truth (testing/benchmarks): kind dedup = sources with "
      "near-duplicates, hard negatives and planted eval passages (+ tasks/ and truth_*.jsonl); kind quality = "
      "positive.jsonl (English) and negative.jsonl (word salad, boilerplate)");
  c->group("Testing");
  c->add_option("--output-dir", o->output_dir, "Output directory")->required();
  c->add_option("--kind", o->kind, "dedup | quality")->capture_default_str();
  c->add_option("--docs", o->docs, "Documents (per file for kind quality)")->capture_default_str();
  c->add_option("--sources", o->sources, "Number of source files")->capture_default_str();
  c->add_option("--near-dup-fraction", o->near_dup_fraction,
                "Fraction of documents that are near-duplicates of an earlier one")
      ->capture_default_str();
  c->add_option("--partial-fraction", o->partial_fraction,
                "Fraction of hard negatives (40% shared prefix, must not be merged)")
      ->capture_default_str();
  c->add_option("--contaminate", o->contaminate, "Documents with a planted eval-task passage (writes OUT/tasks/)")
      ->capture_default_str();
  c->add_option("--task-rows", o->task_rows, "Rows per synthetic eval task")->capture_default_str();
  c->add_option("--ngram", o->ngram, "Shingle size for the planted near-duplicates' Jaccard check")
      ->capture_default_str();
  c->add_option("--min-jaccard", o->min_jaccard, "Minimum exact Jaccard of a near-duplicate with its original")
      ->capture_default_str();
  c->add_option("--min-words", o->min_words, "Shortest document (words)")->capture_default_str();
  c->add_option("--max-words", o->max_words, "Longest document (words)")->capture_default_str();
  c->add_option("--seed", o->seed, "Seed")->capture_default_str();
  c->add_flag("--no-progress", *no_progress, "Do not draw progress bars");
  c->callback([o, no_progress] {
    o->progress = !*no_progress;
    auto s = curation::make_synthetic_corpus(*o);
    log::info("synth-corpus: {} -> {}", s.dump(), o->output_dir);
  });
}

}  // namespace

void register_data_stages(CLI::App& data_cmd) {
  register_dedup(data_cmd);
  register_quality(data_cmd);
  register_decontaminate(data_cmd);
  register_synth(data_cmd);
}

}  // namespace mtnlg::app
