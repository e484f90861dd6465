// The nine evaluation tasks of MT-NLG (eval-harness.md §4), read from Hugging Face
// rows exported as JSONL (`D/<task>/<split>.jsonl`), turned into the documents the
// harness builds: the prompt text, the scored continuations, the gold index and the
// few-shot target. Few-shot contexts (§3) are assembled by build_instances().
//
// Strings are UTF-8; "length" and slicing follow Python's code points where the
// harness uses len() or str slicing (acc_norm, WiC's start1/end1).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace mtnlg::data::eval {

enum class HarnessVersion { v0_3, v0_4 };
enum class LambadaFormat { plain, cloze };

struct TaskOptions {
  HarnessVersion version = HarnessVersion::v0_3;
  LambadaFormat lambada_format = LambadaFormat::plain;
};

// One document as the harness sees it.
struct Doc {
  int64_t index = 0;   // position in the split (RACE: article group in first-appearance order)
  std::string where;   // "file:line" (for messages and the sample log)
  nlohmann::json row;  // the HF row (RACE: {"article", "problems"}); few-shot exclusion compares it
  std::string text;    // doc_to_text; WinoGrande: partial context with the gold option
  std::vector<std::string> choice_contexts;  // WinoGrande only: partial context per option (no few-shot prefix)
  std::vector<std::string> choices;          // scored continuations, each with its leading " "
  std::vector<std::string> norm_choices;     // the choice text acc_norm divides by (no delimiter space)
  int64_t gold = 0;
  std::string target;  // few-shot target: " " + gold answer (WinoGrande: the shared suffix)
  std::string group;   // HANS: the heuristic, for the per-heuristic breakdown
};

enum class TaskKind { multiple_choice, lambada };

struct TaskInfo {
  std::string name;
  TaskKind kind = TaskKind::multiple_choice;
  std::string eval_split;   // HF split name of the evaluated split
  std::string fewshot_v03;  // few-shot pool split in v0.3 ("" = the eval split minus the current doc)
  std::string fewshot_v04;  // few-shot pool split in v0.4
  int version = 0;          // the task VERSION the v0.3 results file reports
  bool acc_norm = false;    // reports acc_norm as well
  bool per_group = false;   // reports acc per Doc::group (HANS heuristics)
  // v0.4 draws k+1 few-shot examples and drops the current document: its sampler draws
  // one extra when the task's fewshot_split equals its test_split, and both are unset
  // for boolq, piqa, hellaswag, winogrande, wic (and RTE, whose prompt HANS uses).
  bool v04_extra_draw = false;
  // The task's metadata version in the v0.4 reference release (v0.4.9.1), which a v0.4
  // results file reports.
  double version_v04 = 1.0;
};

// Task names in a fixed order (the console table and `--tasks all` use it).
const std::vector<std::string>& task_names();
// Throws InputError (exit 2) naming the valid tasks.
const TaskInfo& task_info(const std::string& name);

// Builds a Doc from one row. `where` is "file:line"; a missing or mistyped field
// throws InputError "<where>: field '<f>' ...".
Doc make_doc(const TaskInfo& task, const nlohmann::json& row, const TaskOptions& opt, const std::string& where);

// Reads D/<task>/<split>.jsonl into documents (RACE rows are grouped by article first).
// Missing file or malformed row -> InputError naming the path / file:line.
std::vector<Doc> load_split(const std::string& data_dir, const TaskInfo& task, const std::string& split,
                            const TaskOptions& opt);
std::string split_path(const std::string& data_dir, const std::string& task, const std::string& split);

// One evaluated document with its few-shot prefix applied: contexts[i] is the context
// of choice i (the same string for every choice except WinoGrande).
struct Instance {
  int64_t doc_id = 0;  // v0.3: position in the shuffled eval list; v0.4: dataset position
  const Doc* doc = nullptr;
  std::vector<std::string> contexts;
  std::vector<int64_t> fewshot_indices;  // positions in the pool of the examples used
};

// Few-shot assembly (§3): v0.3 shuffles the eval docs with Random(42) and samples
// examples with the same generator; v0.4 keeps dataset order and uses Random(1234).
// `pool` may be the eval docs themselves (then the current doc is excluded by row
// equality after drawing k+1 in v0.3). limit < 0 = all docs.
std::vector<Instance> build_instances(const TaskInfo& task, const std::vector<Doc>& eval_docs,
                                      const std::vector<Doc>* pool, bool pool_is_eval, int64_t k,
                                      const TaskOptions& opt, int64_t limit);

// ---- text helpers (exposed for tests) --------------------------------------------
std::string hellaswag_preprocess(const std::string& s);
// Python's str.capitalize() (3.8+: titlecase first) and str.strip() on UTF-8, all of
// Unicode (tables generated from Python: data/eval/py_case_tables.hpp); bytes that are
// not valid UTF-8 are kept as they are.
std::string py_capitalize(const std::string& s);
std::string py_strip(const std::string& s);
int64_t utf8_length(const std::string& s);                                 // Python len(): code points
std::string utf8_slice(const std::string& s, int64_t start, int64_t end);  // s[start:end] by code points
// Parses a Python literal (str, int, float, list, dict, True/False/None) as RACE's
// `problems` field stores it.
nlohmann::json parse_python_literal(const std::string& text, const std::string& where);

}  // namespace mtnlg::data::eval
