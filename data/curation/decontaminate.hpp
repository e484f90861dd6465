// Benchmark decontamination: drop (or cut around) training documents that share a
// normalised word n-gram (default 13, as in GPT-3 appendix C) with any eval task.
//
// Task side: every row of D/<task>/<split>.jsonl contributes the n-grams of each of
// its string values and of the strings inside its lists/objects (so it works for any
// task's fields); n-grams never span two fields. Fields shorter than n words add
// nothing (lower --ngram for tasks of short sentences, e.g. wic).
// Training side, two passes over the input:
//   1. find the task n-grams each document contains and count, per n-gram, the
//      documents that contain it;
//   2. n-grams found in more than --max-hits documents are ignored as too common
//      (boilerplate, licences; GPT-3 applied the same idea); documents with any other
//      match are removed (--mode remove) or cut (--mode cut: --cut-margin characters
//      either side of every match are removed, the rest split into fragments,
//      fragments under --min-fragment bytes dropped, documents split into more than
//      --max-fragments pieces dropped whole). Untouched lines are copied byte-identical.
#pragma once
#include <nlohmann/json.hpp>

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

namespace mtnlg::curation {

struct TaskIndex {
  struct Task {
    std::string name;
    int64_t rows = 0, fields = 0, short_fields = 0, ngrams = 0;
    std::vector<std::string> files;
  };
  std::vector<Task> tasks;                        // sorted by name; at most 64
  std::unordered_map<uint64_t, uint64_t> ngrams;  // n-gram hash -> bit mask of tasks
};

// Reads D/<task>/*.jsonl. InputError (exit 2) for a missing directory, no task files,
// or a malformed row (file:line).
TaskIndex load_task_index(const std::string& tasks_dir, int64_t ngram);

struct DecontamOptions {
  std::string input, tasks_dir, output;
  std::string report;  // default: output + ".report.json"
  int64_t ngram = 13;
  std::string json_key = "text";
  std::string mode = "remove";  // remove | cut
  int64_t cut_margin = 200;
  int64_t min_fragment = 200;
  int64_t max_fragments = 10;
  int64_t max_hits = 10;  // 0 = no n-gram is too common
  bool progress = true;
  // One rank's share of a multi-rank run: bytes [range_begin, range_end) of the input
  // (line-aligned, -1 = the end) with the lines before it (for line numbers). Between the
  // passes `reduce_counts` receives the documents per task n-gram (one entry per n-gram
  // of the task index, in ascending hash order) and must replace them by the sums over
  // all ranks, so that the too-common rule sees the whole input. write_report false:
  // the report is returned, not written (the caller combines the ranks').
  int64_t range_begin = 0, range_end = -1, lines_before = 0;
  std::function<void(std::vector<int64_t>&)> reduce_counts;
  bool write_report = true;
  // Counts the input bytes read by both passes as they go (a multi-rank run's progress
  // line reads it from another thread); nullptr = not counted.
  std::atomic<int64_t>* bytes_done = nullptr;
};

struct DecontamResult {
  int64_t documents = 0, written = 0, removed = 0, cut = 0;
  nlohmann::json report;
};

DecontamResult run_decontaminate(const DecontamOptions& opt);

// The report of the whole input from the ranks' reports (in rank order): counts summed,
// documents_log concatenated (first 100,000 kept); the n-gram totals (task_ngrams,
// common_ngrams_ignored, per-task ngrams_matched) come from the global counts and are
// taken from the first. `opt` gives the input, output and report names.
nlohmann::json combine_decontaminate_reports(const DecontamOptions& opt, const std::vector<nlohmann::json>& parts,
                                             double seconds);

}  // namespace mtnlg::curation
