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

#include <cstdint>
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
};

struct DecontamResult {
  int64_t documents = 0, written = 0, removed = 0, cut = 0;
  nlohmann::json report;
};

DecontamResult run_decontaminate(const DecontamOptions& opt);

}  // namespace mtnlg::curation
