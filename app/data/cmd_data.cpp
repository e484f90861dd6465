// `mtnlg data preprocess|inspect` (the curation stages live in cmd_data_stages.cpp, the whole pipeline in cmd_data_curate.cpp).
//   preprocess: JSONL(.gz|.zst) -> Megatron .bin/.idx per json key (data/preprocess.hpp)
//   merge: several .bin/.idx prefixes -> one dataset, in the order given (data/merge.hpp)
//   preprocess under mpirun/srun: rank r tokenizes its share of the inputs (whole files
//   and line-aligned byte ranges of plain ones, data::split_inputs) into a part prefix,
//   rank 0 merges the parts in rank order (= input order) into the requested prefixes
//   and removes them (preprocess_ranks below)
//   inspect PREFIX...: documents, sequences and tokens per prefix
//   inspect --recipe R.yaml: the MT-NLG-style blend table of a run (tokens, weight, epochs
//   implied by the run's token budget)
#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <thread>

#include "app/commands.hpp"
#include "app/process/module_configs.hpp"
#include "app/process/rank_job.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "core/progress.hpp"
#include "config/recipe.hpp"
#include "data/blended_dataset.hpp"
#include "data/indexed_dataset.hpp"
#include "data/merge.hpp"
#include "data/preprocess.hpp"
#include "data/sample_source.hpp"
#include "parallel/communicator.hpp"

namespace mtnlg::app {

namespace {

struct InspectArgs {
  std::vector<std::string> prefixes;
  std::string recipe;
  std::vector<std::string> sets;
  bool build_index = false;
};

// Training tokens the recipe asks for (the ramp is ignored for iteration-based runs:
// the table is an estimate of data reuse, not a schedule).
int64_t token_budget(const Recipe& r) {
  if (r.training.train_tokens > 0) return r.training.train_tokens;
  if (r.training.train_samples > 0) return r.training.train_samples * r.model.seq_length;
  return r.training.train_iters * r.training.global_batch_size * r.model.seq_length;
}

void inspect_recipe(const InspectArgs& a) {
  Recipe r = load_recipe(a.recipe, a.sets);
  if (r.data.mock) {
    std::printf("%s: data.mock is true (random tokens, no blend)\n", a.recipe.c_str());
    return;
  }
  std::vector<double> raw;
  for (const auto& s : r.data.blend) raw.push_back(s.weight);
  const auto w = data::normalize_weights(raw);
  const int64_t budget = token_budget(r);
  std::printf("recipe %s: split \"%s\", seq_length %lld, token budget %s\n", a.recipe.c_str(), r.data.split.c_str(),
              static_cast<long long>(r.model.seq_length), human_count(static_cast<double>(budget)).c_str());
  std::printf("%-48s %12s %12s %9s %9s\n", "source", "documents", "tokens", "weight", "epochs");
  int64_t total_docs = 0, total_tokens = 0;
  for (size_t i = 0; i < r.data.blend.size(); ++i) {
    const auto& src = r.data.blend[i];
    if (!data::indexed_dataset_exists(src.prefix))
      throw_input("{}: data.blend[{}].prefix '{}' not found (needs {} and {})", a.recipe, i, src.prefix,
                  data::idx_path(src.prefix), data::bin_path(src.prefix));
    data::IndexedDataset ds(src.prefix);
    const double epochs =
        ds.num_tokens() > 0 ? w[i] * static_cast<double>(budget) / static_cast<double>(ds.num_tokens()) : 0.0;
    std::printf("%-48s %12s %12s %8.2f%% %9.2f\n", src.prefix.c_str(),
                human_count(static_cast<double>(ds.num_documents())).c_str(),
                human_count(static_cast<double>(ds.num_tokens())).c_str(), 100.0 * w[i], epochs);
    total_docs += ds.num_documents();
    total_tokens += ds.num_tokens();
  }
  std::printf("%-48s %12s %12s %8.2f%% %9s\n", "total", human_count(static_cast<double>(total_docs)).c_str(),
              human_count(static_cast<double>(total_tokens)).c_str(), 100.0, "");
  if (a.build_index) {
    // Build (and cache) the train split's indices exactly as training will, so that a
    // split leaving a part empty or a source shorter than one sample shows up now.
    std::string cache = r.data.cache_dir;
    if (cache.empty()) cache = (r.logging.dir.empty() ? "runs/" + r.name : r.logging.dir) + "/index-cache";
    const int64_t n = data::split_num_samples(r.training, r.model.seq_length)[0];  // what the trainer asks for
    auto src = data::make_blend_source(blend_spec(r), 0, n, cache);
    std::vector<int64_t> per(src->source_names().size(), 0);
    for (int64_t i = 0; i < src->size(); ++i) ++per[static_cast<size_t>(src->source_of(i))];
    std::printf("train split: %lld samples of %lld tokens, index cache %s\n", static_cast<long long>(n),
                static_cast<long long>(r.model.seq_length + 1), cache.c_str());
    for (size_t i = 0; i < per.size(); ++i)
      std::printf("  %-46s %12lld samples\n", src->source_names()[i].c_str(), static_cast<long long>(per[i]));
  }
}

void inspect_prefixes(const InspectArgs& a) {
  std::printf("%-48s %12s %12s %14s %8s %12s\n", "prefix", "documents", "sequences", "tokens", "dtype", "tokens/doc");
  for (const auto& p : a.prefixes) {
    data::IndexedDataset ds(p);
    const double per_doc =
        ds.num_documents() > 0 ? static_cast<double>(ds.num_tokens()) / static_cast<double>(ds.num_documents()) : 0.0;
    std::printf("%-48s %12lld %12lld %14lld %8s %12.1f\n", p.c_str(), static_cast<long long>(ds.num_documents()),
                static_cast<long long>(ds.num_sequences()), static_cast<long long>(ds.num_tokens()),
                data::dtype_name(ds.dtype()), per_doc);
  }
}

void print_preprocess_result(const data::PreprocessResult& res, const std::string& ranks) {
  for (size_t k = 0; k < res.prefixes.size(); ++k)
    std::printf("wrote %s.{bin,idx}: %lld documents, %lld tokens%s\n", res.prefixes[k].c_str(),
                static_cast<long long>(res.documents), static_cast<long long>(res.tokens[k]), ranks.c_str());
  if (res.bad_lines > 0)
    std::printf("skipped %lld bad lines (first: %s)\n", static_cast<long long>(res.bad_lines), res.first_bad.c_str());
  int64_t toks = 0;
  for (auto t : res.tokens) toks += t;
  // Rates over the tokenizing phase; loading the vocab and flushing to disk are apart.
  const double work = std::max(res.seconds - res.load_seconds - res.flush_seconds, 1e-9);
  std::printf("%.2fs total (%.2fs loading the vocab, %.2fs tokenizing, %.2fs flushing): %.0f docs/s, %.0f tokens/s\n",
              res.seconds, res.load_seconds, work, res.flush_seconds, res.documents / work, toks / work);
}

// Several ranks (world > 1). Each rank tokenizes its share of the inputs taken as one
// byte stream (data::split_inputs: the total bytes divided evenly, cuts at line starts of
// plain files; a compressed file is never cut, one rank reads it whole) on a helper
// thread, while the main thread (the only one that talks MPI) all-reduces the counters
// about once a second for rank 0's progress line: input bytes of all ranks out of the
// inputs' total size (so with an ETA), and tokens. Then rank 0 merges the parts per json
// key, in rank order, which is the input order: the files are the same bytes as a 1-rank
// run. A failure on any rank is agreed on by every rank (RankJob): each removes its part,
// the failing rank reports its own message, the others name it, all exit with its code.
void preprocess_ranks(data::PreprocessOptions opt, const parallel::LaunchInfo& info) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string final_prefix = opt.output_prefix;
  RankJob job(info, final_prefix);
  const int64_t W = job.W, r = job.r;
  const std::vector<std::string> keys = opt.json_keys;
  std::vector<std::string> suffixes;  // of a rank's part files: PREFIX.part<r>of<N> + suffix
  for (const auto& k : keys) {
    const std::string p = data::preprocess_output_prefix("", k);
    suffixes.push_back(data::bin_path(p));
    suffixes.push_back(data::idx_path(p));
  }
  for (const auto& s : suffixes) job.own_files.push_back(job.part(r) + s);

  std::atomic<int64_t> bytes{0}, toks{0};
  data::PreprocessResult mine;
  int64_t size = -1;  // unknown when an input is missing: the step below fails naming it
  try {
    size = data::total_input_bytes(opt.inputs);
  } catch (const InputError&) {}
  RankJob::ProgressSpec progress("preprocess " + data::inputs_label(opt.inputs), size, "B", &bytes, opt.progress);
  progress.secondary_unit = "tokens";
  progress.secondary = &toks;
  job.step_with_progress(
      [&] {
        data::PreprocessOptions o = opt;
        data::check_preprocess_inputs(o.inputs, final_prefix, keys);
        o.pieces = data::split_inputs(o.inputs, W, r);
        o.output_prefix = job.part(r);
        o.progress = false;
        o.on_progress = [&](int64_t, int64_t t, int64_t b) {
          bytes += b;
          toks += t;
        };
        mine = data::preprocess_jsonl(o);
      },
      "tokenizing", progress);

  // Global totals: documents, bad lines, tokens per key.
  std::vector<int64_t> tot = {mine.documents, mine.bad_lines};
  tot.insert(tot.end(), mine.tokens.begin(), mine.tokens.end());
  job.world->all_reduce(tot.data(), static_cast<int64_t>(tot.size()), parallel::ReduceOp::sum);
  if (mine.bad_lines > 0 && r != 0)
    std::printf("rank %lld skipped %lld bad lines (first: %s)\n", static_cast<long long>(r),
                static_cast<long long>(mine.bad_lines), mine.first_bad.c_str());

  // Rank 0 merges (and deletes every rank's parts); every rank learns the outcome.
  data::PreprocessResult res;
  job.join_on_rank0(suffixes, [&] {
    const auto t_merge = std::chrono::steady_clock::now();
    for (const auto& k : keys) {
      std::vector<std::string> parts;
      for (int64_t q = 0; q < W; ++q) parts.push_back(data::preprocess_output_prefix(job.part(q), k));
      res.prefixes.push_back(data::preprocess_output_prefix(final_prefix, k));
      data::merge_indexed_datasets(parts, res.prefixes.back(), opt.progress);
    }
    res.documents = tot[0];
    res.bad_lines = tot[1];
    res.first_bad = mine.first_bad.empty() ? "on another rank, see its line" : mine.first_bad;
    res.tokens.assign(tot.begin() + 2, tot.end());
    const auto t_end = std::chrono::steady_clock::now();
    res.seconds = std::chrono::duration<double>(t_end - t0).count();
    res.load_seconds = mine.load_seconds;
    res.flush_seconds = std::chrono::duration<double>(t_end - t_merge).count();  // merging counts as flushing
  });
  parallel::finalize_world();
  if (r == 0) print_preprocess_result(res, fmt::format(" ({} ranks)", W));
}

void register_preprocess(CLI::App* data) {
  auto* pre = data->add_subcommand(
      "preprocess",
      "Tokenize JSONL (.jsonl, .jsonl.gz, .jsonl.zst) into Megatron .bin/.idx files, one pair per json key");
  static data::PreprocessOptions popt;
  pre->add_option(
         "--input", popt.inputs,
         "Input JSONL files, plain, gzip or zstd (detected from their bytes), read in the order given into one "
         "dataset: --input a b c or --input a --input b")
      ->required()
      ->expected(1, -1);
  pre->add_option("--output-prefix", popt.output_prefix,
                  "Output prefix P: writes P_<key>_document.bin/.idx for each json key")
      ->required();
  pre->add_option(
      "--vocab-file", popt.vocab_file,
      "GPT-2 vocab.json (encoder.json); scripts/fetch-gpt2-vocab.sh gets it (with --merge-file, or --tokenizer)");
  pre->add_option("--merge-file", popt.merge_file, "GPT-2 merges.txt (vocab.bpe)");
  pre->add_option("--tokenizer", popt.tokenizer_file,
                  "A Hugging Face tokenizer.json (Llama 3, Qwen, ...; docs/specs/hf-tokenizer.md) instead of GPT-2's "
                  "files: the same ids as Hugging Face's tokenizers library, BOS where the file's template adds one, "
                  "and int32 .bin files when the vocabulary has 65,500 ids or more");
  pre->add_option("--eod-token", popt.eod_token,
                  "With --tokenizer: the end-of-document token --append-eod appends (default: eos_token of the "
                  "tokenizer_config.json beside the tokenizer.json)");
  pre->add_option("--json-keys", popt.json_keys, "JSON fields to tokenize, each into its own output pair")
      ->expected(1, -1)
      ->capture_default_str();
  pre->add_flag("--append-eod", popt.append_eod,
                "Append the end-of-document token to each non-empty document (GPT-2: <|endoftext|> = 50256)");
  pre->add_option("--workers", popt.workers, "Tokenizer threads; the output is identical for any count")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  pre->add_flag("--skip-bad-lines", popt.skip_bad_lines,
                "Skip lines that are not JSON objects with the keys (counted and reported) instead of failing");
  pre->add_flag("--allow-special-tokens", popt.allow_special_tokens,
                "GPT-2: map the text <|endoftext|> to token 50256 (default: tokenize it as text, like Megatron); a "
                "tokenizer.json always matches its added tokens in the text, as Hugging Face's library does");
  static bool no_progress = false;
  pre->add_flag("--no-progress", no_progress, "Do not draw the progress bar");
  pre->footer(
      "Several inputs give the files of preprocessing each one and joining the results in order with `data merge` "
      "(the same as preprocessing their concatenation, when each input ends with a newline). Errors name the input "
      "file and its line. Under mpirun or srun the inputs are taken as one byte stream split evenly across the "
      "ranks: a rank gets whole files and line-aligned byte ranges of plain files; a .gz/.zst input cannot be split "
      "by bytes and is one unit of work read whole by one rank. Each rank writes PREFIX.part<r>of<N>_<key>_document, "
      "then rank 0 merges the parts into the outputs and removes them: the files are the same bytes for any number "
      "of ranks. The output directory must be shared by all ranks.");
  pre->callback([] {
    popt.progress = !no_progress;
    one_or_several_ranks([] { print_preprocess_result(data::preprocess_jsonl(popt), ""); },
                         [](const parallel::LaunchInfo& info) { preprocess_ranks(popt, info); });
  });
}

void register_merge(CLI::App* data) {
  auto* mrg = data->add_subcommand(
      "merge",
      "Concatenate Megatron .bin/.idx datasets into one (the same bytes as preprocessing their inputs in order)");
  static std::vector<std::string> merge_inputs;
  static std::string merge_output;
  static bool merge_no_progress = false;
  mrg->add_option(
         "--input", merge_inputs,
         "Input prefixes in order (PREFIX.bin + PREFIX.idx); a directory stands for its .idx prefixes sorted by "
         "name")
      ->required()
      ->expected(1, -1);
  mrg->add_option("--output-prefix", merge_output, "Output prefix: writes PREFIX.bin and PREFIX.idx")->required();
  mrg->add_flag("--no-progress", merge_no_progress, "Do not draw the progress bar");
  mrg->callback([] {
    const auto res =
        data::merge_indexed_datasets(data::expand_merge_inputs(merge_inputs), merge_output, !merge_no_progress);
    std::printf("wrote %s.{bin,idx}: %lld prefixes, %lld documents, %lld sequences, %lld tokens (%s)\n",
                merge_output.c_str(), static_cast<long long>(res.inputs), static_cast<long long>(res.documents),
                static_cast<long long>(res.sequences), static_cast<long long>(res.tokens), res.dtype.c_str());
  });
}

void register_inspect(CLI::App* data) {
  auto* ins = data->add_subcommand("inspect", "Documents and tokens per data prefix, or a recipe's blend table");
  static InspectArgs iargs;
  ins->add_option("prefixes", iargs.prefixes, "Data prefixes (PREFIX.bin + PREFIX.idx)");
  ins->add_option("--recipe", iargs.recipe,
                  "Recipe YAML: print per source tokens, weight and the epochs implied by the run's token budget");
  ins->add_option("--set", iargs.sets, "Override a recipe key: section.key=value; repeatable");
  ins->add_flag("--build-index", iargs.build_index,
                "With --recipe: build and cache the train split's sample indices as training would");
  ins->callback([] {
    if (iargs.recipe.empty() && iargs.prefixes.empty())
      throw_input("data inspect: give data prefixes or --recipe RECIPE.yaml");
    if (!iargs.prefixes.empty()) inspect_prefixes(iargs);
    if (!iargs.recipe.empty()) inspect_recipe(iargs);
  });
}

}  // namespace

void register_data(CLI::App& app) {
  auto* data = app.add_subcommand("data", "Prepare and curate training data");
  data->require_subcommand(1);
  register_preprocess(data);
  register_merge(data);
  register_inspect(data);
  register_data_stages(*data);
  register_data_samples(*data);
  register_data_extract(*data);
  register_data_curate(*data);
}

}  // namespace mtnlg::app
