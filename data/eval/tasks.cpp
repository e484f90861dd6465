// Task definitions and few-shot assembly; see tasks.hpp and eval-harness.md §3-4.
#include "data/eval/tasks.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <cctype>
#include <cstring>
#include <map>

#include "core/error.hpp"
#include "data/eval/py_case_tables.hpp"
#include "data/eval/py_random.hpp"

namespace mtnlg::data::eval {

namespace {

using json = nlohmann::json;

const std::vector<TaskInfo>& registry() {
  static const std::vector<TaskInfo> tasks = {
      {"lambada_openai", TaskKind::lambada, "test", "", "test", 0, false, false},
      {"boolq", TaskKind::multiple_choice, "validation", "train", "train", 1, false, false, true, 2.0},
      {"race_high", TaskKind::multiple_choice, "test", "train", "test", 1, false, false, false, 2.0},
      {"piqa", TaskKind::multiple_choice, "validation", "train", "train", 0, true, false, true},
      {"hellaswag", TaskKind::multiple_choice, "validation", "train", "train", 0, true, false, true},
      {"winogrande", TaskKind::multiple_choice, "validation", "train", "train", 0, false, false, true},
      {"anli_r2", TaskKind::multiple_choice, "test_r2", "train_r2", "train_r2", 0, false, false},
      {"hans", TaskKind::multiple_choice, "validation", "train", "train", 0, false, true, true},
      {"wic", TaskKind::multiple_choice, "validation", "train", "train", 0, false, false, true},
  };
  return tasks;
}

const json& field(const json& row, const char* name, const std::string& where) {
  auto it = row.find(name);
  if (it == row.end()) throw_input("{}: field '{}' missing", where, name);
  return *it;
}

std::string get_str(const json& row, const char* name, const std::string& where) {
  const json& v = field(row, name, where);
  if (!v.is_string()) throw_input("{}: field '{}' must be a string, got {}", where, name, v.type_name());
  return v.get<std::string>();
}

// Integers as HF stores labels: a JSON integer, a bool, or a decimal string ("1").
int64_t get_int(const json& row, const char* name, const std::string& where) {
  const json& v = field(row, name, where);
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_boolean()) return v.get<bool>() ? 1 : 0;
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (!s.empty() && s.size() < 19 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return std::stoll(s);
  }
  throw_input("{}: field '{}' must be an integer label, got {}", where, name, v.dump());
}

int64_t check_label(int64_t v, int64_t n, const char* name, const std::string& where) {
  if (v < 0 || v >= n) throw_input("{}: field '{}' is {}, expected 0..{}", where, name, v, n - 1);
  return v;
}

Doc multiple_choice(std::string text, std::vector<std::string> answers, int64_t gold) {
  Doc d;
  d.text = std::move(text);
  for (auto& a : answers) {
    d.choices.push_back(" " + a);
    d.norm_choices.push_back(a);
  }
  d.gold = gold;
  d.target = d.choices.at(static_cast<size_t>(gold));
  return d;
}

Doc make_race(const json& row, const TaskOptions& /*opt: RACE has no per-run options*/, const std::string& where) {
  const std::string article = get_str(row, "article", where);
  const json& problems = field(row, "problems", where);
  if (!problems.is_array() || problems.empty()) throw_input("{}: field 'problems' must be a non-empty list", where);
  auto answer_index = [&](const json& p) {
    std::string a = get_str(p, "answer", where);
    if (a.size() != 1 || a[0] < 'A' || a[0] > 'D')
      throw_input("{}: RACE answer '{}' must be one of A, B, C, D", where, a);
    return static_cast<int64_t>(a[0] - 'A');
  };
  auto options = [&](const json& p) {
    const json& o = field(p, "options", where);
    if (!o.is_array() || o.size() != 4) throw_input("{}: RACE 'options' must be a list of 4 strings", where);
    std::vector<std::string> out;
    for (auto& s : o) {
      if (!s.is_string()) throw_input("{}: RACE 'options' must be a list of 4 strings", where);
      out.push_back(s.get<std::string>());
    }
    return out;
  };
  std::string text = "Article: " + article + "\n\n";
  for (size_t i = 0; i + 1 < problems.size(); ++i) {
    const json& p = problems[i];
    const std::string q = get_str(p, "question", where);
    const std::string ans = options(p)[static_cast<size_t>(answer_index(p))];
    const bool cloze = q.size() >= 6 && q.compare(q.size() - 6, 6, "  _  .") == 0;
    if (cloze) {
      // Only the last 5 characters are kept: a harness bug that v0.3 and v0.4 up to the
      // reference release v0.4.9.1 share (v0.4.12 keeps the question minus them).
      text += q.substr(q.size() - 5) + ans + "\n";
    } else {
      text += "Question: " + q + "\nAnswer: " + ans + "\n";
    }
  }
  const json& last = problems.back();
  text += get_str(last, "question", where);
  return multiple_choice(std::move(text), options(last), answer_index(last));
}

// Splits a code-point index out of a UTF-8 string: byte offset of code point `cp`.
size_t utf8_offset(const std::string& s, int64_t cp) {
  size_t i = 0;
  int64_t n = 0;
  while (i < s.size() && n < cp) {
    ++i;
    while (i < s.size() && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) ++i;
    ++n;
  }
  return i;
}

}  // namespace

const std::vector<std::string>& task_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (auto& t : registry()) n.push_back(t.name);
    return n;
  }();
  return names;
}

const TaskInfo& task_info(const std::string& name) {
  for (auto& t : registry())
    if (t.name == name) return t;
  std::string valid;
  for (auto& n : task_names()) valid += (valid.empty() ? "" : ", ") + n;
  throw_input("unknown task '{}' (valid tasks: {})", name, valid);
}

namespace {

// One code point of UTF-8 at s[i]: {cp, bytes}. A byte that does not start a valid
// sequence is {kRawByte, 1} and is copied through unchanged.
constexpr uint32_t kRawByte = 0xFFFFFFFFu;
std::pair<uint32_t, size_t> utf8_at(const std::string& s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c = b(0);
  if (c < 0x80) return {c, 1};
  size_t n = c >= 0xF5 ? 0 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0;
  if (n == 0 || i + n > s.size()) return {kRawByte, 1};
  uint32_t cp = c & (n == 2 ? 0x1F : n == 3 ? 0x0F : 0x07);
  for (size_t k = 1; k < n; ++k) {
    if ((b(k) & 0xC0) != 0x80) return {kRawByte, 1};
    cp = (cp << 6) | (b(k) & 0x3F);
  }
  if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) || (cp >= 0xD800 && cp <= 0xDFFF))
    return {kRawByte, 1};
  return {cp, n};
}

std::vector<std::pair<uint32_t, std::string>> code_points(const std::string& s) {
  std::vector<std::pair<uint32_t, std::string>> out;
  for (size_t i = 0; i < s.size();) {
    const auto [cp, n] = utf8_at(s, i);
    out.emplace_back(cp, s.substr(i, n));
    i += n;
  }
  return out;
}

bool in(const pycase::Range* r, int64_t n, uint32_t cp) {
  const auto* e = r + n;
  const auto* it = std::upper_bound(r, e, cp, [](uint32_t x, const pycase::Range& g) { return x < g.lo; });
  return it != r && cp <= (it - 1)->hi;
}

const char* mapped(const pycase::CaseMapping* t, int64_t n, uint32_t cp) {
  const auto* e = t + n;
  const auto* it = std::lower_bound(t, e, cp, [](const pycase::CaseMapping& m, uint32_t x) { return m.cp < x; });
  return it != e && it->cp == cp ? it->utf8 : nullptr;
}

bool py_isspace(uint32_t cp) { return cp != kRawByte && in(pycase::kSpace, pycase::kSpace_size, cp); }
bool case_ignorable(uint32_t cp) {
  return cp != kRawByte && in(pycase::kCaseIgnorable, pycase::kCaseIgnorable_size, cp);
}
bool cased(uint32_t cp) { return cp != kRawByte && in(pycase::kCased, pycase::kCased_size, cp); }

}  // namespace

// Python's str.strip(): removes str.isspace() characters (Unicode White_Space, e.g.
// U+00A0, U+3000, U+0085, and U+001C..U+001F) from both ends.
std::string py_strip(const std::string& s) {
  const auto cps = code_points(s);
  size_t b = 0, e = cps.size();
  while (b < e && py_isspace(cps[b].first)) ++b;
  while (e > b && py_isspace(cps[e - 1].first)) --e;
  std::string out;
  for (size_t i = b; i < e; ++i) out += cps[i].second;
  return out;
}

// Python's str.capitalize() (3.8+): the first character's full titlecase mapping, the
// rest lowercased with full mappings and lower()'s final-sigma rule (capital sigma
// becomes final sigma after a cased letter, skipping case-ignorable characters, unless
// a cased letter follows).
std::string py_capitalize(const std::string& s) {
  const auto cps = code_points(s);
  std::string out;
  for (size_t i = 0; i < cps.size(); ++i) {
    const uint32_t cp = cps[i].first;
    if (cp == kRawByte) {
      out += cps[i].second;
      continue;
    }
    if (i == 0) {
      const char* t = mapped(pycase::kTitle, pycase::kTitle_size, cp);
      out += t ? t : cps[i].second;
      continue;
    }
    if (cp == 0x3A3) {
      size_t j = i;
      while (j > 0 && case_ignorable(cps[j - 1].first)) --j;
      bool final_sigma = j > 0 && cased(cps[j - 1].first);
      if (final_sigma) {
        size_t k = i + 1;
        while (k < cps.size() && case_ignorable(cps[k].first)) ++k;
        final_sigma = k == cps.size() || !cased(cps[k].first);
      }
      out += final_sigma ? "\xcf\x82" : "\xcf\x83";  // U+03C2 final sigma, U+03C3 sigma
      continue;
    }
    const char* l = mapped(pycase::kLower, pycase::kLower_size, cp);
    out += l ? l : cps[i].second;
  }
  return out;
}

std::string hellaswag_preprocess(const std::string& in) {
  std::string s = py_strip(in);
  // " [title]" -> ". "
  std::string t;
  for (size_t i = 0; i < s.size();) {
    if (s.compare(i, 8, " [title]") == 0) {
      t += ". ";
      i += 8;
    } else {
      t += s[i++];
    }
  }
  // delete every non-greedy \[.*?\] match ('.' does not match a newline)
  std::string u;
  for (size_t i = 0; i < t.size();) {
    if (t[i] == '[') {
      size_t j = i + 1;
      while (j < t.size() && t[j] != ']' && t[j] != '\n') ++j;
      if (j < t.size() && t[j] == ']') {
        i = j + 1;
        continue;
      }
    }
    u += t[i++];
  }
  // "  " -> " " in one left-to-right pass (so "   " becomes "  ")
  std::string v;
  for (size_t i = 0; i < u.size();) {
    if (u.compare(i, 2, "  ") == 0) {
      v += ' ';
      i += 2;
    } else {
      v += u[i++];
    }
  }
  return v;
}

int64_t utf8_length(const std::string& s) {
  int64_t n = 0;
  for (unsigned char c : s)
    if ((c & 0xC0) != 0x80) ++n;
  return n;
}

std::string utf8_slice(const std::string& s, int64_t start, int64_t end) {
  const int64_t n = utf8_length(s);
  auto clamp = [&](int64_t x) { return std::clamp<int64_t>(x < 0 ? x + n : x, 0, n); };
  start = clamp(start);
  end = clamp(end);
  if (end <= start) return "";
  size_t b = utf8_offset(s, start), e = utf8_offset(s, end);
  return s.substr(b, e - b);
}

Doc make_doc(const TaskInfo& task, const json& row, const TaskOptions& opt, const std::string& where) {
  if (!row.is_object()) throw_input("{}: expected a JSON object", where);
  Doc d;
  const std::string& n = task.name;
  if (n == "lambada_openai") {
    const std::string text = get_str(row, "text", where);
    const size_t sp = text.rfind(' ');
    if (sp == std::string::npos) throw_input("{}: field 'text' has no space before a last word", where);
    std::string ctx = text.substr(0, sp);
    if (opt.lambada_format == LambadaFormat::cloze) ctx += " ____. ->";
    d.text = ctx;
    d.choices = {" " + text.substr(sp + 1)};
    d.norm_choices = {text.substr(sp + 1)};
    d.gold = 0;
    d.target = d.choices[0];
  } else if (n == "boolq") {
    // v0.3 BoolQ is task version 1 (question followed by "?"), as is v0.4.
    const std::string passage = get_str(row, "passage", where), question = get_str(row, "question", where);
    d = multiple_choice(passage + "\nQuestion: " + question + "?\nAnswer:", {"no", "yes"},
                        check_label(get_int(row, "label", where), 2, "label", where));
  } else if (n == "race_high") {
    d = make_race(row, opt, where);
  } else if (n == "piqa") {
    // fields read in order so that the first bad one is the one reported
    const std::string goal = get_str(row, "goal", where), sol1 = get_str(row, "sol1", where),
                      sol2 = get_str(row, "sol2", where);
    d = multiple_choice("Question: " + goal + "\nAnswer:", {sol1, sol2},
                        check_label(get_int(row, "label", where), 2, "label", where));
  } else if (n == "hellaswag") {
    const std::string label = get_str(row, "activity_label", where), ctx_a = get_str(row, "ctx_a", where),
                      ctx_b = get_str(row, "ctx_b", where);
    const std::string query = hellaswag_preprocess(label + ": " + ctx_a + " " + py_capitalize(ctx_b));
    const json& endings = field(row, "endings", where);
    if (!endings.is_array() || endings.empty()) throw_input("{}: field 'endings' must be a list of strings", where);
    std::vector<std::string> ch;
    for (auto& e : endings) {
      if (!e.is_string()) throw_input("{}: field 'endings' must be a list of strings", where);
      ch.push_back(hellaswag_preprocess(e.get<std::string>()));
    }
    int64_t g = check_label(get_int(row, "label", where), static_cast<int64_t>(ch.size()), "label", where);
    d = multiple_choice(query, ch, g);
  } else if (n == "winogrande") {
    const std::string s = get_str(row, "sentence", where);
    const size_t us = s.find('_');
    if (us == std::string::npos) throw_input("{}: field 'sentence' has no '_' blank", where);
    const std::string o1 = get_str(row, "option1", where), o2 = get_str(row, "option2", where);
    const std::string ans = get_str(row, "answer", where);
    if (ans != "1" && ans != "2") throw_input("{}: field 'answer' is '{}', expected \"1\" or \"2\"", where, ans);
    d.gold = ans == "1" ? 0 : 1;
    d.choice_contexts = {s.substr(0, us) + o1, s.substr(0, us) + o2};
    d.target = " ";  // appended, not " " + ...: GCC 12 -Wrestrict false positive (PR105651)
    d.target += py_strip(s.substr(us + 1));
    d.choices = {d.target, d.target};
    d.norm_choices = {o1, o2};
    d.text = d.choice_contexts[static_cast<size_t>(d.gold)];
  } else if (n == "anli_r2") {
    const std::string premise = get_str(row, "premise", where), hyp = get_str(row, "hypothesis", where);
    d = multiple_choice(premise + "\nQuestion: " + hyp + " True, False, or Neither?\nAnswer:",
                        {"True", "Neither", "False"}, check_label(get_int(row, "label", where), 3, "label", where));
  } else if (n == "hans") {
    const std::string premise = get_str(row, "premise", where), hyp = get_str(row, "hypothesis", where);
    d = multiple_choice(premise + "\nQuestion: " + hyp + " True or False?\nAnswer:", {"True", "False"},
                        check_label(get_int(row, "label", where), 2, "label", where));
    d.group = get_str(row, "heuristic", where);
  } else if (n == "wic") {
    const std::string s1 = get_str(row, "sentence1", where);
    const std::string s2 = get_str(row, "sentence2", where);
    const int64_t start1 = get_int(row, "start1", where), end1 = get_int(row, "end1", where);
    const std::string w = utf8_slice(s1, start1, end1);
    d = multiple_choice("Sentence 1: " + s1 + "\nSentence 2: " + s2 + "\nQuestion: Is the word '" + w +
                            "' used in the same way in the two sentences above?\nAnswer:",
                        {"no", "yes"}, check_label(get_int(row, "label", where), 2, "label", where));
  } else {
    throw_input("unknown task '{}'", n);
  }
  d.row = row;
  d.where = where;
  return d;
}

std::string split_path(const std::string& data_dir, const std::string& task, const std::string& split) {
  return (std::filesystem::path(data_dir) / task / (split + ".jsonl")).string();
}

std::vector<Doc> load_split(const std::string& data_dir, const TaskInfo& task, const std::string& split,
                            const TaskOptions& opt) {
  const std::string path = split_path(data_dir, task.name, split);
  std::ifstream f(path);
  if (!f)
    throw_input("{}: split file missing (export the '{}' split of task {}; see docs/EVAL.md)", path, split, task.name);
  std::vector<std::pair<json, std::string>> rows;
  std::string line;
  int64_t lineno = 0;
  while (std::getline(f, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(lineno);
    json row = json::parse(line, nullptr, false);
    if (row.is_discarded()) throw_input("{}: malformed JSON row", where);
    if (!row.is_object()) throw_input("{}: expected a JSON object, got {}", where, row.type_name());
    rows.emplace_back(std::move(row), where);
  }
  if (rows.empty()) throw_input("{}: no rows", path);

  if (task.name == "race_high") {
    // EleutherAI/race rows are articles already ("problems": a Python-literal list);
    // HF `race` rows are questions, grouped here by identical article in order of
    // first appearance, keeping row order inside a group.
    std::vector<std::pair<json, std::string>> grouped;
    std::map<std::string, size_t> by_article;
    for (auto& [row, where] : rows) {
      if (row.contains("problems")) {
        json art = {{"article", get_str(row, "article", where)}};
        const json& p = row["problems"];
        art["problems"] = p.is_string() ? parse_python_literal(p.get<std::string>(), where) : p;
        grouped.emplace_back(std::move(art), where);
        continue;
      }
      const std::string a = get_str(row, "article", where);
      json prob = {{"question", get_str(row, "question", where)},
                   {"answer", get_str(row, "answer", where)},
                   {"options", field(row, "options", where)}};
      auto it = by_article.find(a);
      if (it == by_article.end()) {
        by_article[a] = grouped.size();
        grouped.emplace_back(json{{"article", a}, {"problems", json::array({prob})}}, where);
      } else {
        grouped[it->second].first["problems"].push_back(prob);
      }
    }
    rows = std::move(grouped);
  }
  std::vector<Doc> docs;
  docs.reserve(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    docs.push_back(make_doc(task, rows[i].first, opt, rows[i].second));
    docs.back().index = static_cast<int64_t>(i);
  }
  return docs;
}

std::vector<Instance> build_instances(const TaskInfo& task, const std::vector<Doc>& eval_docs,
                                      const std::vector<Doc>* pool, bool pool_is_eval, int64_t k,
                                      const TaskOptions& opt, int64_t limit) {
  const bool v03 = opt.version == HarnessVersion::v0_3;
  PyRandom rnd(v03 ? 42 : 1234);
  std::vector<int64_t> order(eval_docs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  if (v03) rnd.shuffle(order);
  const int64_t n = limit < 0 ? static_cast<int64_t>(order.size()) : std::min<int64_t>(limit, order.size());
  if (k > 0 && !pool) throw_input("task {}: {}-shot needs a few-shot pool", task.name, k);
  std::vector<Instance> out;
  out.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const Doc& doc = eval_docs[static_cast<size_t>(order[i])];
    Instance inst;
    inst.doc_id = i;
    inst.doc = &doc;
    std::string prefix;
    if (k > 0) {
      // v0.3 draws k+1 only when the pool is the evaluated split. v0.4's sampler draws
      // k+1 when the task's fewshot_split equals its test_split: both unset for the
      // tasks marked v04_extra_draw, so they draw k+1 from their train split (which
      // moves every later document's draw). Both drop the current document by row
      // equality (v0.4 always compares, v0.3 only for a pool that is the eval split)
      // and keep the first k.
      const bool extra = v03 ? pool_is_eval : task.v04_extra_draw;
      const int64_t draw = extra ? k + 1 : k;
      const int64_t pn = static_cast<int64_t>(pool->size());
      if (draw > pn)
        throw_input("task {}: {}-shot needs {} few-shot documents but the pool has only {}", task.name, k, draw, pn);
      for (int64_t j : rnd.sample_indices(pn, draw)) {
        if (static_cast<int64_t>(inst.fewshot_indices.size()) == k) break;
        const Doc& ex = (*pool)[static_cast<size_t>(j)];
        if ((pool_is_eval || !v03) && ex.row == doc.row) continue;
        inst.fewshot_indices.push_back(j);
        // v0.4 joins text and target with target_delimiter " "; lambada's target already
        // starts with a space (" word"), so its examples read "text  word".
        prefix += ex.text + (!v03 && task.kind == TaskKind::lambada ? " " : "") + ex.target + "\n\n";
      }
    }
    if (!doc.choice_contexts.empty()) {
      for (auto& c : doc.choice_contexts) inst.contexts.push_back(prefix + c);
    } else {
      inst.contexts.assign(doc.choices.size(), prefix + doc.text);
    }
    out.push_back(std::move(inst));
  }
  return out;
}

// ---- Python literal parser (RACE `problems`) ------------------------------------------
namespace {

struct PyLit {
  const std::string& s;
  const std::string& where;
  size_t i = 0;

  [[noreturn]] void fail(const char* what) { throw_input("{}: field 'problems': {} at character {}", where, what, i); }
  void ws() {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\n' || s[i] == '\t' || s[i] == '\r')) ++i;
  }
  static void put_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  uint32_t hex(int n) {
    if (i + n > s.size()) fail("truncated escape");
    uint32_t v = static_cast<uint32_t>(std::stoul(s.substr(i, n), nullptr, 16));
    i += n;
    return v;
  }
  std::string str() {
    const char q = s[i++];
    std::string out;
    while (true) {
      if (i >= s.size()) fail("unterminated string");
      char c = s[i++];
      if (c == q) break;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i >= s.size()) fail("unterminated escape");
      char e = s[i++];
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'x': put_utf8(out, hex(2)); break;
        case 'u': put_utf8(out, hex(4)); break;
        case 'U': put_utf8(out, hex(8)); break;
        default: out += '\\'; out += e;
      }
    }
    return out;
  }
  nlohmann::json value() {
    ws();
    if (i >= s.size()) fail("unexpected end");
    char c = s[i];
    if (c == '\'' || c == '"') return str();
    if (c == '[' || c == '{') {
      const bool dict = c == '{';
      const char close = dict ? '}' : ']';
      ++i;
      nlohmann::json out = dict ? nlohmann::json::object() : nlohmann::json::array();
      while (true) {
        ws();
        if (i < s.size() && s[i] == close) {
          ++i;
          break;
        }
        if (dict) {
          nlohmann::json key = value();
          if (!key.is_string()) fail("dict key is not a string");
          ws();
          if (i >= s.size() || s[i] != ':') fail("expected ':'");
          ++i;
          out[key.get<std::string>()] = value();
        } else {
          out.push_back(value());
        }
        ws();
        if (i < s.size() && s[i] == ',') {
          ++i;
        } else if (i >= s.size() || s[i] != close) {
          fail("expected ',' or a closing bracket");
        }
      }
      return out;
    }
    for (auto [word, val] : {std::pair<const char*, nlohmann::json>{"True", true}, {"False", false}, {"None", nullptr}})
      if (s.compare(i, std::strlen(word), word) == 0) {
        i += std::strlen(word);
        return val;
      }
    size_t b = i;
    while (i < s.size() &&
           (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '-' || s[i] == '.' || s[i] == 'e'))
      ++i;
    if (b == i) fail("unexpected character");
    nlohmann::json num = nlohmann::json::parse(s.substr(b, i - b), nullptr, false);
    if (num.is_discarded()) fail("bad number");
    return num;
  }
};

}  // namespace

nlohmann::json parse_python_literal(const std::string& text, const std::string& where) {
  PyLit p{text, where};
  nlohmann::json v = p.value();
  p.ws();
  if (p.i != text.size()) p.fail("trailing characters");
  return v;
}

}  // namespace mtnlg::data::eval
