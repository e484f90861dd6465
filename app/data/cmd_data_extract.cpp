// `mtnlg data extract`: WARC/WET -> JSONL shards of clean text (data/extract/).
// One shard per input file; under mpirun/srun the files are dealt to the ranks by size
// (extract::assign_inputs), each rank writes its files' shards, the counts are summed
// and rank 0 writes DIR/extract_report.json: the shards and the report (but "seconds")
// are the same for any number of ranks.
#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <mutex>
#include <thread>

#include "app/commands.hpp"
#include "app/process/rank_job.hpp"
#include "core/atomic_file.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "core/progress.hpp"
#include "data/extract/extract.hpp"
#include "parallel/communicator.hpp"

namespace mtnlg::app {

namespace {

struct ExtractRun {
  std::vector<extract::Counts> per_file;
  std::map<std::string, int64_t> languages;
  double seconds = 0;
};

int64_t total_bytes(const std::vector<std::string>& inputs) {
  int64_t t = 0;
  for (const auto& f : inputs) {
    std::error_code ec;
    t += static_cast<int64_t>(std::filesystem::file_size(f, ec));
  }
  return t;
}

// This rank's files, in input order; shards already committed are removed on failure.
void extract_files(const extract::ExtractOptions& opt, const std::vector<int64_t>& mine, ExtractRun& run,
                   const extract::FileProgress& fp) {
  const auto shards = extract::shard_paths(opt);
  std::vector<std::string> done;
  try {
    for (int64_t i : mine) {
      run.per_file[static_cast<size_t>(i)] = extract::extract_file(
          opt.inputs[static_cast<size_t>(i)], shards[static_cast<size_t>(i)], opt, run.languages, fp);
      done.push_back(shards[static_cast<size_t>(i)]);
    }
  } catch (...) {
    for (const auto& f : done) RankJob::remove_file(f);
    throw;
  }
}

void print_summary(const nlohmann::ordered_json& rep, const std::string& dir, int64_t ranks) {
  const auto& t = rep["totals"];
  log::info(
      "extract: {} records, {} pages, kept {} documents ({} characters); dropped {} by language, {} without "
      "main text; {} bad records; report {}/extract_report.json{}",
      t["records"].get<int64_t>(), t["pages"].get<int64_t>(), t["documents"].get<int64_t>(),
      t["characters"].get<int64_t>(), t["language_dropped"].get<int64_t>(), t["no_main_text"].get<int64_t>(),
      t["bad_records"].get<int64_t>(), dir, ranks > 1 ? fmt::format(" ({} ranks)", ranks) : std::string());
}

void extract_one_process(const extract::ExtractOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  extract::check_extract_options(opt);
  std::filesystem::create_directories(opt.output_dir);
  ExtractRun run;
  run.per_file.resize(opt.inputs.size());
  std::vector<int64_t> all(opt.inputs.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
  std::atomic<int64_t> bytes{0}, docs{0};
  std::exception_ptr err;
  bool finished = false;
  std::mutex m;
  std::condition_variable done;
  // The work on a helper thread; this thread draws the progress line (bytes with an ETA,
  // documents/s beside them) every 100 ms, and goes on as soon as the work ends.
  std::thread worker([&] {
    try {
      extract_files(opt, all, run, {&bytes, &docs});
    } catch (...) {
      err = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(m);
      finished = true;
    }
    done.notify_one();
  });
  {
    Progress bar("extract " + std::to_string(opt.inputs.size()) + " file(s)", total_bytes(opt.inputs), "B",
                 opt.progress);
    bar.set_secondary_unit("docs");
    int64_t shown_b = 0, shown_d = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(m);
        if (done.wait_for(lock, std::chrono::milliseconds(100), [&] { return finished; })) break;
      }
      const int64_t b = bytes, d = docs;
      bar.add(b - shown_b, d - shown_d);
      shown_b = b;
      shown_d = d;
    }
    worker.join();
    if (!err) {
      bar.add(bytes - shown_b, docs - shown_d);
      bar.finish();
    }
  }
  if (err) std::rethrow_exception(err);
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto rep = extract::extract_report(opt, run.per_file, run.languages, run.seconds);
  write_file_atomic((std::filesystem::path(opt.output_dir) / "extract_report.json").string(), rep.dump(2) + "\n");
  print_summary(rep, opt.output_dir, 1);
}

void extract_ranks(const extract::ExtractOptions& opt, const parallel::LaunchInfo& info) {
  const auto t0 = std::chrono::steady_clock::now();
  RankJob job(info, (std::filesystem::path(opt.output_dir) / "extract_report.json").string());
  ExtractRun run;
  run.per_file.resize(opt.inputs.size());
  std::vector<int64_t> mine;
  job.step(
      [&] {
        extract::check_extract_options(opt);
        std::filesystem::create_directories(opt.output_dir);
        mine = extract::assign_inputs(opt.inputs, job.W, job.r);
      },
      "checking the inputs");
  const auto shards = extract::shard_paths(opt);
  for (int64_t i : mine) job.own_files.push_back(shards[static_cast<size_t>(i)]);
  std::atomic<int64_t> bytes{0}, docs{0};
  RankJob::ProgressSpec spec("extract " + std::to_string(opt.inputs.size()) + " file(s)", total_bytes(opt.inputs), "B",
                             &bytes, opt.progress);
  spec.secondary_unit = "docs";
  spec.secondary = &docs;
  job.step_with_progress([&] { extract_files(opt, mine, run, {&bytes, &docs}); }, "extracting", spec);
  // Counts per file summed over the ranks (each file has one owner); dropped languages
  // sent to rank 0 as text lines.
  std::vector<int64_t> flat(opt.inputs.size() * extract::kCounters, 0);
  for (int64_t i : mine)
    for (int k = 0; k < extract::kCounters; ++k)
      flat[static_cast<size_t>(i) * extract::kCounters + static_cast<size_t>(k)] =
          run.per_file[static_cast<size_t>(i)][static_cast<size_t>(k)];
  job.world->all_reduce(flat.data(), static_cast<int64_t>(flat.size()), parallel::ReduceOp::sum);
  for (size_t i = 0; i < opt.inputs.size(); ++i)
    for (int k = 0; k < extract::kCounters; ++k)
      run.per_file[i][static_cast<size_t>(k)] = flat[i * extract::kCounters + static_cast<size_t>(k)];
  // "code count\n" per dropped language, padded with newlines to whole words.
  std::string langs;
  for (const auto& [k, v] : run.languages) langs += fmt::format("{} {}\n", k, v);
  while (langs.size() % 4) langs += '\n';
  WorldRankComm comm(job.world);
  std::vector<std::span<const char>> send(static_cast<size_t>(job.W));
  send[0] = std::span<const char>(langs.data(), langs.size());
  const std::vector<char> got = comm.all_to_all(send);
  nlohmann::ordered_json rep;
  job.join_on_rank0({}, [&] {
    std::map<std::string, int64_t> all;
    size_t at = 0;
    const std::string s(got.begin(), got.end());
    while (at < s.size()) {
      size_t nl = s.find('\n', at);
      if (nl == std::string::npos) nl = s.size();
      const std::string line = s.substr(at, nl - at);
      at = nl + 1;
      const size_t sp = line.find(' ');
      if (sp == std::string::npos) continue;
      all[line.substr(0, sp)] += std::stoll(line.substr(sp + 1));
    }
    run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rep = extract::extract_report(opt, run.per_file, all, run.seconds);
    write_file_atomic((std::filesystem::path(opt.output_dir) / "extract_report.json").string(), rep.dump(2) + "\n");
  });
  parallel::finalize_world();
  if (job.r == 0) print_summary(rep, opt.output_dir, job.W);
}

// The block classifier's thresholds (docs/specs/justext.md).
void add_classifier_options(CLI::App* c, extract::BlockParams& b) {
  c->add_option("--length-low", b.length_low, "Block classifier: blocks shorter than this (characters) are short")
      ->capture_default_str();
  c->add_option("--length-high", b.length_high, "Block classifier: good blocks are longer than this")
      ->capture_default_str();
  c->add_option("--stopwords-low", b.stopwords_low, "Block classifier: stop-word density of near-good blocks")
      ->capture_default_str();
  c->add_option("--stopwords-high", b.stopwords_high, "Block classifier: stop-word density of good blocks")
      ->capture_default_str();
  c->add_option("--max-link-density", b.max_link_density,
                "Block classifier: blocks with a larger share of link text are boilerplate")
      ->capture_default_str();
  c->add_option("--repeat-min-chars", b.repeat_min_chars,
                "Block classifier: a block of at least this many code points whose text is on another page of the "
                "same site (host) in the same input is boilerplate")
      ->capture_default_str();
}

}  // namespace

void register_data_extract(CLI::App& data) {
  auto o = std::make_shared<extract::ExtractOptions>();
  auto no_progress = std::make_shared<bool>(false);
  auto langs = std::make_shared<std::string>("en");
  auto explain = std::make_shared<std::string>();
  auto* c = data.add_subcommand(
      "extract",
      "Extract clean main text from WARC/WET files (Common Crawl) into JSONL shards: DIR/<input stem>.jsonl "
      "(or .jsonl.zst) and DIR/extract_report.json");
  c->add_option("--input", o->inputs,
                "WARC files: .warc, or .warc.gz with one gzip member per record (WARC/1.0 and 1.1); WET files "
                "(conversion records) pass their text through (required unless --explain)")
      ->expected(1, -1);
  c->add_option("--output", o->output_dir, "Output directory, created if missing (required unless --explain)");
  c->add_option("--explain", *explain,
                "Print how one page's blocks were classified instead of extracting: per block KEEP or drop, its "
                "class alone and in the end, the rule that decided it, the elements around it (tag#id.class) and "
                "its text. SOURCE: an HTML file, or FILE.warc[.gz]#N (the record numbered N in the file), "
                "FILE.warc[.gz]#URL (the response with that target URI) or FILE.warc[.gz] (its first response). "
                "The classifier options apply; the page is classified alone (no other page of its site)")
      ->type_name("SOURCE");
  c->add_option("--languages", *langs,
                "Comma-separated ISO 639 codes of the languages kept, or 'all'. The language is CLD2's on the "
                "page's MAIN text, with the page's Content-Language or <html lang> as the prior")
      ->capture_default_str();
  c->add_option("--min-language-chars", o->min_language_chars,
                "With a language filter: a page whose main text has fewer code points than this, or whose language "
                "CLD2 cannot tell (unreliable, under 50%, not backed by the declaration), is dropped as "
                "unclassifiable (counted as language_unclassifiable)")
      ->capture_default_str();
  c->add_flag("--keep-comments", o->blocks.keep_comments,
              "Keep user comments and product reviews (sections whose class, id, itemprop or itemtype says comment "
              "or review) in the main text; by default they are left out. Answers of a Q&A page are main text "
              "either way, the comments under them are comments");
  c->add_option("--min-language-score", o->min_language_score,
                "Drop pages whose top language covers less than this share of their text (0..1)")
      ->capture_default_str();
  c->add_option("--min-chars", o->min_chars, "Drop documents whose main text has fewer bytes than this")
      ->capture_default_str();
  c->add_option("--compress", o->compress, "Shard compression: none (.jsonl) or zstd (.jsonl.zst)")
      ->capture_default_str();
  c->add_option("--max-record-bytes", o->max_record_bytes,
                "Record size cap: a record whose Content-Length is larger is bad input (memory stays bounded)")
      ->capture_default_str();
  c->add_flag("--skip-bad-records", o->skip_bad_records,
              "Skip bad records (truncated, corrupt gzip, malformed header, over the cap, unknown encoding, bad HTTP) "
              "and count them per cause in the report, instead of failing on the first");
  add_classifier_options(c, o->blocks);
  c->add_flag("--no-progress", *no_progress, "Do not draw the progress line");
  c->footer(
      "Each JSONL line: {\"text\", \"url\", \"warc_record_id\", \"date\", \"language\", \"language_score\"}. Bad input "
      "exits 2 naming the file, the record number and its byte offset (the compressed offset of its gzip member) and "
      "the field at fault; nothing is left under the shard names. Under mpirun or srun the input files are dealt "
      "to the ranks by size; shards and report (but its seconds) are the same for any number of ranks (the output "
      "directory must be shared). See docs/CURATION.md, \"Text extraction\".");
  c->callback([o, no_progress, langs, explain] {
    if (!explain->empty()) {
      std::fputs(extract::explain_page(*explain, *o).c_str(), stdout);
      return;
    }
    if (o->inputs.empty() || o->output_dir.empty())
      throw InputError("data extract: --input and --output are required (or --explain SOURCE)");
    o->progress = !*no_progress;
    o->languages.clear();
    std::string cur;
    for (char ch : *langs + ",") {
      if (ch == ',') {
        if (!cur.empty()) o->languages.push_back(cur);
        cur.clear();
      } else if (ch != ' ') {
        cur += ch;
      }
    }
    one_or_several_ranks([&] { extract_one_process(*o); },
                         [&](const parallel::LaunchInfo& info) { extract_ranks(*o, info); });
  });
}

}  // namespace mtnlg::app
