// Benchmark decontamination by n-gram overlap (see decontaminate.hpp).
#include "data/curation/decontaminate.hpp"

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "core/error.hpp"
#include "core/progress.hpp"
#include "data/curation/text.hpp"

namespace fs = std::filesystem;

namespace mtnlg::curation {

namespace {

void collect_strings(const nlohmann::json& j, std::vector<const std::string*>& out) {
  if (j.is_string()) {
    out.push_back(j.get_ptr<const std::string*>());
  } else if (j.is_array() || j.is_object()) {
    for (const auto& v : j) collect_strings(v, out);
  }
}

// First byte at or after `i` that starts a UTF-8 character (or text.size()).
size_t utf8_forward(const std::string& s, size_t i) {
  while (i < s.size() && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) ++i;
  return i;
}
// Last character start at or before `i` (end positions must not split a character).
size_t utf8_back(const std::string& s, size_t i) {
  while (i > 0 && i < s.size() && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return i;
}

}  // namespace

TaskIndex load_task_index(const std::string& tasks_dir, int64_t ngram) {
  if (ngram < 1) throw_input("--ngram {} must be at least 1", ngram);
  if (!fs::is_directory(tasks_dir))
    throw_input("--tasks-dir {}: no such directory (expected D/<task>/<split>.jsonl)", tasks_dir);
  TaskIndex idx;
  std::vector<fs::path> dirs;
  for (const auto& e : fs::directory_iterator(tasks_dir))
    if (e.is_directory()) dirs.push_back(e.path());
  std::sort(dirs.begin(), dirs.end());
  for (const auto& d : dirs) {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(d))
      if (e.is_regular_file() && e.path().extension() == ".jsonl") files.push_back(e.path());
    if (files.empty()) continue;
    std::sort(files.begin(), files.end());
    if (idx.tasks.size() == 64) throw_input("--tasks-dir {}: more than 64 task directories", tasks_dir);
    TaskIndex::Task t;
    t.name = d.filename().string();
    const uint64_t bit = 1ull << idx.tasks.size();
    std::vector<Word> words;
    std::vector<const std::string*> strings;
    for (const auto& f : files) {
      t.files.push_back(f.string());
      LineReader r(f.string());
      std::string line;
      int64_t line_no = 0;
      while (r.next(line, line_no)) {
        if (is_blank_line(line)) continue;
        nlohmann::json row;
        try {
          row = nlohmann::json::parse(line);
        } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range for a huge number
          throw_input("{}:{}: malformed JSON line in the task file", f.string(), line_no);
        }
        ++t.rows;
        strings.clear();
        collect_strings(row, strings);
        for (const std::string* s : strings) {
          normalize_words(*s, words);
          const auto m = static_cast<int64_t>(words.size());
          if (m == 0) continue;
          ++t.fields;
          if (m < ngram) {
            ++t.short_fields;
            continue;
          }
          for (int64_t i = 0; i + ngram <= m; ++i) {
            uint64_t& mask = idx.ngrams[ngram_hash(words.data() + i, ngram)];
            if (!(mask & bit)) ++t.ngrams;
            mask |= bit;
          }
        }
      }
    }
    idx.tasks.push_back(std::move(t));
  }
  if (idx.tasks.empty()) throw_input("--tasks-dir {}: no <task>/<split>.jsonl files found", tasks_dir);
  return idx;
}

namespace {

using Clock = std::chrono::steady_clock;

// Documents listed in a report's documents_log (the ranks' logs are combined up to the
// same bound).
constexpr size_t kMaxLogged = 100000;

struct TaskStats {
  int64_t docs_hit = 0;
  int64_t matched = 0;  // distinct task n-grams found in some document and not too common
};

// One run of decontaminate over the input (or one rank's share of it): the state that
// crosses its stages. run_decontaminate calls the stages in order; state that only one
// stage uses stays local to it.
struct DecontamRun {
  explicit DecontamRun(const DecontamOptions& o) : opt(o) {}

  // The stages, in order.
  void check_inputs();
  void scan();
  void find_common();
  void write_output();
  void count_matched();
  void write_report();

  // Parts of the stages.
  void sum_over_ranks();
  bool common(uint64_t h) const;
  void write_hit(AtomicWriter& out, const std::string& line, int64_t line_no, const std::vector<uint64_t>& live);
  std::string cut_document(AtomicWriter& out, const std::string& line, const std::vector<uint64_t>& live,
                           int64_t& pieces_written);
  std::vector<std::pair<size_t, size_t>> fragments(const std::string& text, const std::vector<uint64_t>& live);
  nlohmann::json task_report() const;

  // The run's parameters and the task side.
  Clock::time_point t0 = Clock::now();
  const DecontamOptions& opt;
  TaskIndex idx;
  size_t n_tasks = 0;
  std::vector<Word> words;  // scratch: one document's words

  // Pass 1: matches per document, documents per n-gram.
  std::unordered_map<int64_t, std::vector<uint64_t>> doc_matches;  // doc -> unique matched n-grams
  std::unordered_map<uint64_t, int64_t> docs_per_ngram;
  int64_t n_docs = 0, blank = 0, common_ignored = 0;

  // Pass 2: what was written, removed and cut.
  std::vector<TaskStats> tstats;
  DecontamResult res;
  int64_t fragments_written = 0, dropped_split = 0, dropped_short = 0, docs_hit = 0;
  nlohmann::json doc_log = nlohmann::json::array();
};

// --- options, input and output, the task index: all checked before any work ------
void DecontamRun::check_inputs() {
  if (opt.mode != "remove" && opt.mode != "cut") throw_input("--mode {}: expected remove or cut", opt.mode);
  if (opt.cut_margin < 0 || opt.min_fragment < 0 || opt.max_fragments < 1 || opt.max_hits < 0)
    throw_input("decontaminate: --cut-margin/--min-fragment/--max-hits must be >= 0 and --max-fragments >= 1");
  if (!fs::is_regular_file(opt.input)) throw_input("--input {}: no such file", opt.input);
  if (fs::exists(opt.output) && fs::equivalent(opt.output, opt.input))
    throw_input("--output {}: would overwrite the input", opt.output);
  idx = load_task_index(opt.tasks_dir, opt.ngram);
  n_tasks = idx.tasks.size();
}

// --- pass 1: matches per document, documents per n-gram -----------------------
void DecontamRun::scan() {
  const int64_t total_bytes = static_cast<int64_t>(fs::file_size(opt.input));
  std::vector<uint64_t> found;
  Progress prog("decontaminate: scan", total_bytes, "B", opt.progress);
  LineReader r(opt.input, opt.range_begin, opt.range_end, opt.lines_before);
  std::string line;
  int64_t line_no = 0, last = 0;
  while (r.next(line, line_no)) {
    if (is_blank_line(line)) {
      ++blank;
      continue;
    }
    std::string text = extract_text(line, opt.json_key, opt.input, line_no);
    normalize_words(text, words);
    found.clear();
    const auto m = static_cast<int64_t>(words.size());
    for (int64_t i = 0; i + opt.ngram <= m; ++i) {
      uint64_t h = ngram_hash(words.data() + i, opt.ngram);
      if (idx.ngrams.count(h)) found.push_back(h);
    }
    if (!found.empty()) {
      std::sort(found.begin(), found.end());
      found.erase(std::unique(found.begin(), found.end()), found.end());
      for (uint64_t h : found) ++docs_per_ngram[h];
      doc_matches.emplace(n_docs, found);
    }
    ++n_docs;
    if ((n_docs & 1023) == 0) {
      if (opt.bytes_done) opt.bytes_done->fetch_add(r.bytes_read() - last, std::memory_order_relaxed);
      prog.add(r.bytes_read() - last, 1024);
      last = r.bytes_read();
    }
  }
  if (opt.bytes_done) opt.bytes_done->fetch_add(r.bytes_read() - last, std::memory_order_relaxed);
  prog.finish();
}

// --- between the passes: the n-grams too common to count (over all ranks) --------
void DecontamRun::find_common() {
  if (opt.reduce_counts) sum_over_ranks();
  for (auto& [h, c] : docs_per_ngram) common_ignored += common(h);
}

// Documents per task n-gram summed over the ranks (dense, in ascending hash order).
void DecontamRun::sum_over_ranks() {
  std::vector<uint64_t> keys;
  keys.reserve(idx.ngrams.size());
  for (const auto& kv : idx.ngrams) keys.push_back(kv.first);
  std::sort(keys.begin(), keys.end());
  std::vector<int64_t> counts(keys.size(), 0);
  for (const auto& [h, c] : docs_per_ngram)
    counts[static_cast<size_t>(std::lower_bound(keys.begin(), keys.end(), h) - keys.begin())] = c;
  opt.reduce_counts(counts);
  docs_per_ngram.clear();
  for (size_t i = 0; i < keys.size(); ++i)
    if (counts[i] > 0) docs_per_ngram.emplace(keys[i], counts[i]);
}

// Found in more than --max-hits documents (0: none is too common).
bool DecontamRun::common(uint64_t h) const {
  if (opt.max_hits <= 0) return false;
  auto it = docs_per_ngram.find(h);
  return it != docs_per_ngram.end() && it->second > opt.max_hits;
}

// --- pass 2: write ------------------------------------------------------------------
// Lines without a live (not too common) match are copied; the others go through
// write_hit.
void DecontamRun::write_output() {
  tstats.assign(n_tasks, TaskStats{});
  res.documents = n_docs;
  AtomicWriter out(opt.output);
  LineReader r(opt.input, opt.range_begin, opt.range_end, opt.lines_before);
  std::string line;
  int64_t line_no = 0, doc = 0;
  std::vector<uint64_t> live;
  int64_t counted = 0;  // bytes_done: this pass's bytes, added every 1,024 lines
  while (r.next(line, line_no)) {
    if (opt.bytes_done && (line_no & 1023) == 0) {
      opt.bytes_done->fetch_add(r.bytes_read() - counted, std::memory_order_relaxed);
      counted = r.bytes_read();
    }
    if (is_blank_line(line)) continue;
    auto it = doc_matches.find(doc++);
    live.clear();
    if (it != doc_matches.end())
      for (uint64_t h : it->second)
        if (!common(h)) live.push_back(h);
    if (live.empty()) {
      out.write_line(line);
      ++res.written;
      continue;
    }
    write_hit(out, line, line_no, live);
  }
  if (opt.bytes_done) opt.bytes_done->fetch_add(r.bytes_read() - counted, std::memory_order_relaxed);
  out.close();
}

// A document with live matches: removed, or cut into fragments (--mode cut); counted
// for its tasks and logged.
void DecontamRun::write_hit(AtomicWriter& out, const std::string& line, int64_t line_no,
                            const std::vector<uint64_t>& live) {
  ++docs_hit;
  uint64_t mask = 0;
  for (uint64_t h : live) mask |= idx.ngrams.at(h);
  nlohmann::json task_names = nlohmann::json::array();
  for (size_t t = 0; t < n_tasks; ++t) {
    if (!(mask & (1ull << t))) continue;
    ++tstats[t].docs_hit;
    task_names.push_back(idx.tasks[t].name);
  }
  std::string action = "removed";
  int64_t pieces_written = 0;
  if (opt.mode == "cut") action = cut_document(out, line, live, pieces_written);
  if (action != "cut") ++res.removed;
  res.written += pieces_written;
  if (doc_log.size() < kMaxLogged)
    doc_log.push_back({{"line", line_no},
                       {"tasks", task_names},
                       {"ngrams", live.size()},
                       {"action", action},
                       {"fragments_written", pieces_written}});
}

// Writes the fragments of the document that are long enough (the line's other fields
// kept), or none when it splits into more than --max-fragments; returns the action.
std::string DecontamRun::cut_document(AtomicWriter& out, const std::string& line, const std::vector<uint64_t>& live,
                                      int64_t& pieces_written) {
  nlohmann::json obj = nlohmann::json::parse(line);
  std::string text = obj.at(opt.json_key).get<std::string>();
  const auto pieces = fragments(text, live);
  if (static_cast<int64_t>(pieces.size()) > opt.max_fragments) {
    ++dropped_split;
    return "dropped_split";
  }
  for (auto& [b, e] : pieces) {
    size_t bb = utf8_forward(text, b), ee = utf8_back(text, e);
    if (ee <= bb || static_cast<int64_t>(ee - bb) < opt.min_fragment) {
      ++dropped_short;
      continue;
    }
    obj[opt.json_key] = text.substr(bb, ee - bb);
    out.write_line(obj.dump());
    ++pieces_written;
  }
  fragments_written += pieces_written;
  ++res.cut;
  return "cut";
}

// The byte ranges of `text` left between the removal intervals: --cut-margin
// characters either side of every live match, merged.
std::vector<std::pair<size_t, size_t>> DecontamRun::fragments(const std::string& text,
                                                              const std::vector<uint64_t>& live) {
  normalize_words(text, words);
  std::vector<std::pair<size_t, size_t>> cuts;
  const auto m = static_cast<int64_t>(words.size());
  for (int64_t i = 0; i + opt.ngram <= m; ++i) {
    uint64_t h = ngram_hash(words.data() + i, opt.ngram);
    if (!std::binary_search(live.begin(), live.end(), h)) continue;
    size_t b = words[i].begin, e = words[i + opt.ngram - 1].end;
    b = b > static_cast<size_t>(opt.cut_margin) ? b - static_cast<size_t>(opt.cut_margin) : 0;
    e = std::min(text.size(), e + static_cast<size_t>(opt.cut_margin));
    if (!cuts.empty() && b <= cuts.back().second)
      cuts.back().second = std::max(cuts.back().second, e);
    else
      cuts.emplace_back(b, e);
  }
  std::vector<std::pair<size_t, size_t>> pieces;
  size_t prev = 0;
  for (auto& [b, e] : cuts) {
    if (b > prev) pieces.emplace_back(prev, b);
    prev = e;
  }
  if (prev < text.size()) pieces.emplace_back(prev, text.size());
  return pieces;
}

// A found n-gram that is not too common is live in every document containing it, so
// each of its tasks counts it as matched (the same set as collecting the live n-grams
// of the hit documents, and with the global counts the same on every rank).
void DecontamRun::count_matched() {
  for (const auto& [h, c] : docs_per_ngram) {
    if (c <= 0 || common(h)) continue;
    const uint64_t mask = idx.ngrams.at(h);
    for (size_t t = 0; t < n_tasks; ++t)
      if (mask & (1ull << t)) ++tstats[t].matched;
  }
}

// The "tasks" object of the report.
nlohmann::json DecontamRun::task_report() const {
  nlohmann::json tasks = nlohmann::json::object();
  for (size_t t = 0; t < n_tasks; ++t) {
    const auto& task = idx.tasks[t];
    tasks[task.name] = {
        {"rows", task.rows},     {"fields", task.fields},          {"short_fields", task.short_fields},
        {"ngrams", task.ngrams}, {"docs_hit", tstats[t].docs_hit}, {"ngrams_matched", tstats[t].matched},
        {"files", task.files}};
  }
  return tasks;
}

// --- report ---------------------------------------------------------------------
// res.report, written to --report (default OUTPUT.report.json) unless the caller
// combines the ranks' reports.
void DecontamRun::write_report() {
  nlohmann::json tasks = task_report();
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  res.report = {{"format", "mtnlg-decontaminate-report"},
                {"version", 1},
                {"input", opt.input},
                {"output", opt.output},
                {"tasks_dir", opt.tasks_dir},
                {"params",
                 {{"ngram", opt.ngram},
                  {"json_key", opt.json_key},
                  {"mode", opt.mode},
                  {"cut_margin", opt.cut_margin},
                  {"min_fragment", opt.min_fragment},
                  {"max_fragments", opt.max_fragments},
                  {"max_hits", opt.max_hits}}},
                {"documents", n_docs},
                {"blank_lines", blank},
                {"documents_hit", docs_hit},
                {"removed", res.removed},
                {"cut", res.cut},
                {"dropped_split", dropped_split},
                {"fragments_written", fragments_written},
                {"fragments_dropped_short", dropped_short},
                {"lines_written", res.written},
                {"task_ngrams", static_cast<int64_t>(idx.ngrams.size())},
                {"common_ngrams_ignored", common_ignored},
                {"tasks", tasks},
                {"documents_log", doc_log},
                {"seconds", secs}};
  if (opt.write_report)
    write_file_atomic(opt.report.empty() ? opt.output + ".report.json" : opt.report, res.report.dump(2) + "\n");
}

}  // namespace

DecontamResult run_decontaminate(const DecontamOptions& opt) {
  DecontamRun run(opt);
  run.check_inputs();
  run.scan();
  run.find_common();
  run.write_output();
  run.count_matched();
  run.write_report();
  return std::move(run.res);
}

nlohmann::json combine_decontaminate_reports(const DecontamOptions& opt, const std::vector<nlohmann::json>& parts,
                                             double seconds) {
  nlohmann::json rep = parts.at(0);
  rep["input"] = opt.input;
  rep["output"] = opt.output;
  rep["seconds"] = seconds;
  for (const char* k : {"documents", "blank_lines", "documents_hit", "removed", "cut", "dropped_split",
                        "fragments_written", "fragments_dropped_short", "lines_written"}) {
    int64_t sum = 0;
    for (const auto& p : parts) sum += p.at(k).get<int64_t>();
    rep[k] = sum;
  }
  for (auto& [name, t] : rep["tasks"].items()) {
    int64_t sum = 0;
    for (const auto& p : parts) sum += p.at("tasks").at(name).at("docs_hit").get<int64_t>();
    t["docs_hit"] = sum;
  }
  nlohmann::json log = nlohmann::json::array();
  for (const auto& p : parts)
    for (const auto& e : p.at("documents_log")) {
      if (log.size() >= kMaxLogged) break;
      log.push_back(e);
    }
  rep["documents_log"] = std::move(log);
  return rep;
}

}  // namespace mtnlg::curation
