// Synthetic corpora with planted near-duplicates, hard negatives and benchmark
// passages (see synth_corpus.hpp).
#include "data/curation/synth_corpus.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>

#include "core/error.hpp"
#include "core/progress.hpp"
#include "core/rng.hpp"
#include "data/curation/minhash.hpp"
#include "data/curation/text.hpp"

namespace fs = std::filesystem;

namespace mtnlg::curation {

namespace {

// Sequential draws from the counter RNG for one (purpose, item) pair.
struct Rng {
  uint64_t key, stream, i = 0;
  Rng(uint64_t seed, uint64_t purpose, uint64_t item) : key(mix_key(seed, purpose)), stream(item) {}
  uint32_t bits() { return philox_bits(key, stream, i++); }
  double uniform() { return (static_cast<double>(bits()) + 0.5) / 4294967296.0; }  // (0, 1)
  int64_t below(int64_t n) {
    return std::min<int64_t>(n - 1, static_cast<int64_t>(uniform() * static_cast<double>(n)));
  }
  int64_t range(int64_t lo, int64_t hi) { return lo + below(hi - lo + 1); }
  bool chance(double p) { return uniform() < p; }
};

enum Purpose : uint64_t {
  kVocab = 1,
  kOriginal,
  kKind,
  kBase,
  kPartial,
  kVariant,
  kSource,
  kContam,
  kPlant,
  kTask,
  kPositive,
  kNegative
};

// A made-up vocabulary with Zipf(1) frequencies: unrelated documents share almost no
// 5-grams (expected shared 5-grams of two 300-word documents ~1e-4).
class Vocab {
 public:
  Vocab(uint64_t seed, int64_t size) {
    static const char* onset[] = {"b", "c", "d", "f", "g",  "h",  "j",  "k",  "l",  "m",  "n",  "p",  "r",  "s",
                                  "t", "v", "w", "z", "br", "ch", "st", "tr", "pl", "gr", "sh", "th", "kr", "fl"};
    static const char* nucleus[] = {"a", "e", "i", "o", "u", "ai", "ea", "ou", "ie", "oa"};
    static const char* coda[] = {"", "", "", "n", "r", "s", "l", "nd", "st", "m", "t", "k"};
    Rng r(seed, kVocab, 0);
    double acc = 0;
    for (int64_t w = 0; w < size; ++w) {
      std::string s;
      int64_t syl = r.range(1, 3);
      for (int64_t k = 0; k < syl; ++k) {
        s += onset[r.below(std::size(onset))];
        s += nucleus[r.below(std::size(nucleus))];
      }
      s += coda[r.below(std::size(coda))];
      words_.push_back(std::move(s));
      acc += 1.0 / static_cast<double>(w + 1);
      cdf_.push_back(acc);
    }
    for (auto& c : cdf_) c /= acc;
  }
  const std::string& zipf(Rng& r) const {
    auto it = std::lower_bound(cdf_.begin(), cdf_.end(), r.uniform());
    return words_[std::min<size_t>(static_cast<size_t>(it - cdf_.begin()), words_.size() - 1)];
  }

 private:
  std::vector<std::string> words_;
  std::vector<double> cdf_;
};

using Doc = std::vector<std::vector<std::string>>;  // sentences of word tokens ("word," keeps its comma)

int64_t word_count(const Doc& d) {
  int64_t n = 0;
  for (auto& s : d) n += static_cast<int64_t>(s.size());
  return n;
}

std::string render(const Doc& d) {
  std::string t;
  for (size_t i = 0; i < d.size(); ++i) {
    if (i > 0) t += (i % 4 == 0) ? "\n\n" : " ";
    for (size_t j = 0; j < d[i].size(); ++j) {
      if (j > 0) t += ' ';
      std::string w = d[i][j];
      if (j == 0 && !w.empty()) w[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(w[0])));
      t += w;
    }
    if (!t.empty() && t.back() == ',') t.pop_back();
    t += '.';
  }
  return t;
}

std::vector<std::string> sentence(Rng& r, const Vocab& v, int64_t len) {
  std::vector<std::string> s;
  for (int64_t k = 0; k < len; ++k) {
    s.push_back(v.zipf(r));
    if (k + 1 < len && r.chance(0.08)) s.back() += ',';
  }
  return s;
}

const char* kBoilerplate[] = {
    "Subscribe to our newsletter to get the latest stories delivered straight to your inbox every morning",
    "This article was originally published by our partner site and is republished here with permission",
    "Copyright all rights reserved, read our terms of use and privacy policy before sharing this page",
    "Click here to read more stories like this one from our editors and community contributors",
    "We use cookies to improve your experience on our site, by continuing you accept our cookie policy",
};

struct TaskRow {
  std::string task;
  nlohmann::json row;
};

class Generator {
 public:
  explicit Generator(const SynthOptions& o) : o_(o), vocab_(o.seed, 20000) {}

  enum class Kind { Original, Variant, Partial };
  Kind base_kind(int64_t p) const {
    if (p == 0) return Kind::Original;
    double u = Rng(o_.seed, kKind, static_cast<uint64_t>(p)).uniform();
    if (u < o_.near_dup_fraction) return Kind::Variant;
    if (u < o_.near_dup_fraction + o_.partial_fraction) return Kind::Partial;
    return Kind::Original;
  }
  // The earlier document a variant/partial derives from (-1: none, p is an original).
  int64_t base_of(int64_t p, bool allow_partial) const {
    Rng r(o_.seed, kBase, static_cast<uint64_t>(p));
    int64_t q = r.below(p);
    for (; q >= 0; --q) {
      Kind k = base_kind(q);
      if (k == Kind::Original || (allow_partial && k == Kind::Partial && base_of(q, false) >= 0)) break;
    }
    return q;
  }
  Kind kind(int64_t p) const {
    Kind k = base_kind(p);
    if (k == Kind::Variant && base_of(p, true) < 0) return Kind::Original;
    if (k == Kind::Partial && base_of(p, false) < 0) return Kind::Original;
    return k;
  }

  Doc original(int64_t p) const {
    Rng r(o_.seed, kOriginal, static_cast<uint64_t>(p));
    int64_t target = r.range(o_.min_words, o_.max_words);
    Doc d;
    int64_t n = 0;
    while (n < target) {
      int64_t len = std::min<int64_t>(r.range(6, 18), std::max<int64_t>(1, target - n));
      d.push_back(sentence(r, vocab_, len));
      n += len;
    }
    return d;
  }
  Doc partial(int64_t p) const {
    Doc src = original(base_of(p, false));
    int64_t total = word_count(src), keep = total * 2 / 5, n = 0;
    Doc d;
    for (auto& s : src) {
      if (n >= keep) break;
      d.push_back(s);
      n += static_cast<int64_t>(s.size());
    }
    Rng r(o_.seed, kPartial, static_cast<uint64_t>(p));
    while (n < total) {
      int64_t len = r.range(6, 18);
      d.push_back(sentence(r, vocab_, len));
      n += len;
    }
    return d;
  }
  Doc base_doc(int64_t q) const { return kind(q) == Kind::Partial ? partial(q) : original(q); }

  // A near-duplicate of `d`; `op` names the change.
  std::string variant(const Doc& d, Rng& r, int op, double intensity) const {
    Doc v = d;
    switch (op) {
      case 0:  // exact
        return render(v);
      case 1: {  // case / punctuation / whitespace
        std::string t = render(v), out;
        bool word_start = true;
        for (char c : t) {
          if (word_start && std::isalpha(static_cast<unsigned char>(c)) && r.chance(0.15))
            c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
          if (c == ' ' && r.chance(0.05)) out += r.chance(0.5) ? " " : " \t";
          if (c == '.' && r.chance(0.3)) c = '!';
          out += c;
          word_start = c == ' ' || c == '\n';
        }
        return out;
      }
      case 2:
      case 5: {  // word edits (+ boilerplate for op 5)
        int64_t edits = std::max<int64_t>(1, std::llround(0.01 * intensity * static_cast<double>(word_count(v))));
        for (int64_t e = 0; e < edits; ++e) {
          auto& s = v[r.below(static_cast<int64_t>(v.size()))];
          int64_t at = r.below(static_cast<int64_t>(s.size()));
          int64_t what = r.below(3);
          if (what == 0) s[at] = vocab_.zipf(r);
          if (what == 1 && s.size() > 1) s.erase(s.begin() + at);
          if (what == 2) s.insert(s.begin() + at, vocab_.zipf(r));
        }
        if (op == 2) return render(v);
        [[fallthrough]];
      }
      case 4: {  // boilerplate header and/or footer
        std::string t = render(v);
        bool head = r.chance(0.6), tail = !head || r.chance(0.4);
        if (head) t = std::string(kBoilerplate[r.below(std::size(kBoilerplate))]) + ".\n\n" + t;
        if (tail) t += "\n\n" + std::string(kBoilerplate[r.below(std::size(kBoilerplate))]) + ".";
        return t;
      }
      case 3: {  // reorder: swap two sentences
        if (v.size() >= 2) {
          auto a = r.below(static_cast<int64_t>(v.size())), b = r.below(static_cast<int64_t>(v.size()));
          std::swap(v[a], v[b]);
        }
        return render(v);
      }
      default: return render(v);
    }
  }

  // Row i of task t (the order of make_tasks' names), in the harness's JSON form.
  nlohmann::json task_row(uint64_t t, int64_t i, Rng& r) const {
    auto phrase = [&](Rng& g, int64_t lo, int64_t hi) { return render(Doc{sentence(g, vocab_, g.range(lo, hi))}); };
    auto word = [&](Rng& g) { return vocab_.zipf(g); };
    nlohmann::json j;
    switch (t) {
      case 0: j = {{"text", phrase(r, 40, 80)}}; break;
      case 1: j = {{"question", phrase(r, 8, 12)}, {"passage", phrase(r, 60, 100)}, {"answer", r.chance(0.5)}}; break;
      case 2:
        j = {{"example_id", "high" + std::to_string(i) + ".txt"},
             {"article", phrase(r, 120, 200)},
             {"question", phrase(r, 8, 14)},
             {"options", {phrase(r, 3, 8), phrase(r, 3, 8), phrase(r, 3, 8), phrase(r, 3, 8)}},
             {"answer", std::string(1, static_cast<char>('A' + r.below(4)))}};
        break;
      case 3:
        j = {{"goal", phrase(r, 8, 16)},
             {"sol1", phrase(r, 13, 25)},
             {"sol2", phrase(r, 13, 25)},
             {"label", r.below(2)}};
        break;
      case 4: {
        std::string a = phrase(r, 10, 20), b = phrase(r, 3, 6);
        j = {{"ind", i},
             {"activity_label", word(r)},
             {"ctx_a", a},
             {"ctx_b", b},
             {"ctx", a + " " + b},
             {"endings", {phrase(r, 10, 20), phrase(r, 10, 20), phrase(r, 10, 20), phrase(r, 10, 20)}},
             {"source_id", "synthetic~" + std::to_string(i)},
             {"split", "val"},
             {"split_type", "indomain"},
             {"label", std::to_string(r.below(4))}};
        break;
      }
      case 5: {
        auto s = sentence(r, vocab_, r.range(15, 25));
        s[static_cast<size_t>(r.below(static_cast<int64_t>(s.size())))] = "_";
        j = {{"sentence", render(Doc{s})},
             {"option1", word(r)},
             {"option2", word(r)},
             {"answer", r.chance(0.5) ? "1" : "2"}};
        break;
      }
      case 6:
        j = {{"uid", fmt::format("{:08x}", r.bits())},
             {"premise", phrase(r, 30, 60)},
             {"hypothesis", phrase(r, 8, 14)},
             {"label", r.below(3)},
             {"reason", ""}};
        break;
      case 7: {
        std::string p = phrase(r, 13, 18);
        j = {{"premise", p},
             {"hypothesis", phrase(r, 6, 10)},
             {"label", r.below(2)},
             {"parse_premise", "( " + p + " )"},
             {"heuristic", "lexical_overlap"},
             {"subcase", "ln_subject/object_swap"},
             {"template", "temp1"}};
        break;
      }
      case 8:
        j = {{"word", word(r)},
             {"sentence1", phrase(r, 13, 20)},
             {"sentence2", phrase(r, 13, 20)},
             {"start1", 0},
             {"end1", 3},
             {"start2", 0},
             {"end2", 3},
             {"label", r.chance(0.5)}};
        break;
    }
    return j;
  }

  std::vector<TaskRow> make_tasks() const {
    std::vector<TaskRow> rows;
    const char* names[] = {"lambada_openai", "boolq",   "race_high", "piqa", "hellaswag",
                           "winogrande",     "anli_r2", "hans",      "wic"};
    for (uint64_t t = 0; t < std::size(names); ++t) {
      for (int64_t i = 0; i < o_.task_rows; ++i) {
        Rng r(o_.seed, kTask, t * 1000003ull + static_cast<uint64_t>(i));
        rows.push_back(TaskRow{names[t], task_row(t, i, r)});
      }
    }
    return rows;
  }

  const Vocab& vocab() const { return vocab_; }

 private:
  const SynthOptions& o_;
  Vocab vocab_;
};

std::string source_name(int64_t i, int64_t n) {
  static const char* names[] = {"pile_cc", "books3", "wikipedia", "stackexchange",
                                "pubmed",  "arxiv",  "github",    "openwebtext2"};
  if (n <= static_cast<int64_t>(std::size(names))) return names[i];
  return "source" + std::to_string(i);
}

// The quality corpus's words: well-formed sentences are built from these classes, the
// negative documents from all of them at random (with navigation spam in some).
namespace quality_words {
const std::vector<std::string> det = {"the", "a", "this", "that", "every", "one", "our", "their", "my", "some"};
const std::vector<std::string> adj = {"small", "old",   "bright", "quiet",  "heavy",   "early",  "careful",
                                      "local", "green", "strong", "simple", "ancient", "modern", "narrow",
                                      "warm",  "cold",  "busy",   "famous", "gentle",  "rapid"};
const std::vector<std::string> noun = {"river",   "teacher", "village", "engine",  "garden", "student", "market",
                                       "bridge",  "doctor",  "window",  "farmer",  "city",   "letter",  "island",
                                       "machine", "painter", "storm",   "library", "road",   "child"};
const std::vector<std::string> verb = {"built",    "visited",  "crossed",   "painted", "opened",
                                       "followed", "repaired", "described", "watched", "carried",
                                       "found",    "left",     "studied",   "reached", "joined"};
const std::vector<std::string> prep = {"near",    "across", "behind", "beside", "under",
                                       "through", "after",  "before", "during", "inside"};
const std::vector<std::string> adv = {"slowly", "quickly", "carefully", "quietly",
                                      "often",  "finally", "rarely",    "suddenly"};
const std::vector<std::string> conj = {"and", "but", "because", "while", "although"};
const std::vector<std::string> spam = {"home",   "about",     "contact", "login", "cart",     "click",  "here",
                                       "buy",    "now",       "cheap",   "free",  "download", "cookie", "policy",
                                       "accept", "subscribe", "share",   "menu",  "|",        ">>"};
}  // namespace quality_words

nlohmann::json make_quality(const SynthOptions& o) {
  using namespace quality_words;
  auto pick = [](Rng& r, const std::vector<std::string>& v) {
    return v[static_cast<size_t>(r.below(static_cast<int64_t>(v.size())))];
  };
  std::vector<const std::vector<std::string>*> all = {&det, &adj, &noun, &verb, &prep, &adv, &conj};
  auto cap = [](std::string s) {
    s[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
    return s;
  };
  fs::create_directories(o.output_dir);
  AtomicWriter pos((fs::path(o.output_dir) / "positive.jsonl").string());
  AtomicWriter neg((fs::path(o.output_dir) / "negative.jsonl").string());
  for (int64_t i = 0; i < o.docs; ++i) {
    Rng r(o.seed, kPositive, static_cast<uint64_t>(i));
    std::string t;
    int64_t sentences = r.range(4, 10);
    for (int64_t s = 0; s < sentences; ++s) {
      std::string x;
      switch (r.below(4)) {
        case 0:
          x = cap(pick(r, det)) + " " + pick(r, adj) + " " + pick(r, noun) + " " + pick(r, verb) + " " + pick(r, det) +
              " " + pick(r, noun) + " " + pick(r, prep) + " " + pick(r, det) + " " + pick(r, noun) + ".";
          break;
        case 1:
          x = cap(pick(r, det)) + " " + pick(r, noun) + " " + pick(r, adv) + " " + pick(r, verb) + " " + pick(r, det) +
              " " + pick(r, adj) + " " + pick(r, noun) + ".";
          break;
        case 2:
          x = cap(pick(r, det)) + " " + pick(r, noun) + " " + pick(r, verb) + " " + pick(r, det) + " " + pick(r, noun) +
              ", " + pick(r, conj) + " " + pick(r, det) + " " + pick(r, noun) + " " + pick(r, verb) + " " +
              pick(r, det) + " " + pick(r, adj) + " " + pick(r, noun) + ".";
          break;
        default:
          x = cap(pick(r, prep)) + " " + pick(r, det) + " " + pick(r, noun) + ", " + pick(r, det) + " " + pick(r, adj) +
              " " + pick(r, noun) + " " + pick(r, verb) + " " + pick(r, det) + " " + pick(r, noun) + ".";
          break;
      }
      t += (s ? " " : "") + x;
    }
    pos.write_line(nlohmann::json{{"text", t}, {"id", "pos" + std::to_string(i)}}.dump());

    Rng q(o.seed, kNegative, static_cast<uint64_t>(i));
    std::string u;
    int64_t words = q.range(30, 90);
    bool spammy = q.chance(0.3);
    for (int64_t w = 0; w < words; ++w) {
      std::string x = spammy && q.chance(0.5)
                          ? pick(q, spam)
                          : pick(q, *all[static_cast<size_t>(q.below(static_cast<int64_t>(all.size())))]);
      if (q.chance(0.1)) x = cap(x);
      if (q.chance(0.05)) x += ".";
      u += (w ? " " : "") + x;
    }
    neg.write_line(nlohmann::json{{"text", u}, {"id", "neg" + std::to_string(i)}}.dump());
  }
  pos.close();
  neg.close();
  nlohmann::json summary = {
      {"kind", "quality"}, {"docs", o.docs}, {"seed", o.seed}, {"files", {"positive.jsonl", "negative.jsonl"}}};
  write_file_atomic((fs::path(o.output_dir) / "synth.json").string(), summary.dump(2) + "\n");
  return summary;
}

}  // namespace

namespace {

void check_dedup_options(const SynthOptions& o) {
  if (o.sources < 1 || o.sources > 64) throw_input("--sources {} must be in [1, 64]", o.sources);
  if (o.min_words < 10 || o.max_words < o.min_words) throw_input("--min-words/--max-words: need 10 <= min <= max");
  if (o.near_dup_fraction < 0 || o.partial_fraction < 0 || o.near_dup_fraction + o.partial_fraction >= 1)
    throw_input("--near-dup-fraction + --partial-fraction must be in [0, 1)");
  if (o.contaminate < 0 || o.contaminate > o.docs)
    throw_input("--contaminate {} must be in [0, --docs]", o.contaminate);
  if (o.contaminate > 0 && o.task_rows < 1) throw_input("--task-rows must be positive with --contaminate");
}

// A task field long enough to plant (>= 13 words): its row, name and text.
struct Field {
  size_t row;
  std::string field, text;
};

// Writes the eval tasks (tasks/NAME/validation.jsonl); returns each task's plantable fields.
std::map<std::string, std::vector<Field>> write_tasks(Generator& g, const fs::path& out) {
  std::map<std::string, std::vector<Field>> long_fields;
  std::map<std::string, std::unique_ptr<AtomicWriter>> writers;
  std::map<std::string, int64_t> row_no;
  std::vector<Word> words;
  for (const TaskRow& tr : g.make_tasks()) {
    auto& w = writers[tr.task];
    if (!w) {
      fs::create_directories(out / "tasks" / tr.task);
      w = std::make_unique<AtomicWriter>((out / "tasks" / tr.task / "validation.jsonl").string());
    }
    w->write_line(tr.row.dump());
    const int64_t rn = row_no[tr.task]++;
    for (auto& [k, v] : tr.row.items()) {
      if (!v.is_string() || k == "parse_premise" || k == "ctx") continue;
      normalize_words(v.get<std::string>(), words);
      if (words.size() >= 13) long_fields[tr.task].push_back(Field{static_cast<size_t>(rn), k, v.get<std::string>()});
    }
  }
  for (auto& [k, w] : writers) w->close();
  return long_fields;
}

// Contaminated positions: the first `contaminate` distinct draws -> their order (tasks
// are assigned round-robin by it).
std::map<int64_t, int64_t> contaminated_positions(const SynthOptions& o) {
  std::map<int64_t, int64_t> contaminated;
  Rng r(o.seed, kContam, 0);
  while (static_cast<int64_t>(contaminated.size()) < o.contaminate) {
    const int64_t p = r.below(o.docs);
    if (!contaminated.count(p)) contaminated.emplace(p, static_cast<int64_t>(contaminated.size()));
  }
  return contaminated;
}

// Document p as drawn: its text, kind, cluster and (near-duplicates, partials) the
// document it was made from with their word-shingle Jaccard.
struct Drawn {
  std::string text, kind;
  int64_t cluster = 0, of = -1;
  double jaccard = 1.0;
};

struct Scratch {
  std::vector<Word> wa, wb;
  std::vector<uint64_t> sa, sb;
};

double jaccard_of(const std::string& a, const std::string& b, int64_t ngram, Scratch& x) {
  normalize_words(a, x.wa);
  shingle_hashes(x.wa, ngram, x.sa);
  normalize_words(b, x.wb);
  shingle_hashes(x.wb, ngram, x.sb);
  return exact_jaccard(x.sa, x.sb);
}

// A near-duplicate of base document `of`: weaker versions of the change until the
// Jaccard target holds, exact as the last resort.
Drawn draw_variant(Generator& g, const SynthOptions& o, int64_t p, Scratch& x) {
  static const char* op_names[] = {"exact", "case", "edit", "reorder", "boilerplate", "edit+boilerplate"};
  Drawn d;
  d.of = g.base_of(p, true);
  d.cluster = d.of;
  const Doc base = g.base_doc(d.of);
  const std::string src = render(base);
  normalize_words(src, x.wb);
  shingle_hashes(x.wb, o.ngram, x.sb);
  Rng r(o.seed, kVariant, static_cast<uint64_t>(p));
  const double u = r.uniform();
  int op = u < 0.15 ? 0 : u < 0.3 ? 1 : u < 0.55 ? 2 : u < 0.7 ? 3 : u < 0.85 ? 4 : 5;
  for (double intensity = 1.0;; intensity *= 0.5) {
    d.text = g.variant(base, r, op, intensity);
    normalize_words(d.text, x.wa);
    shingle_hashes(x.wa, o.ngram, x.sa);
    d.jaccard = exact_jaccard(x.sa, x.sb);
    if (d.jaccard >= o.min_jaccard) break;
    if (intensity < 0.2) op = 0;
  }
  d.kind = op_names[op];
  return d;
}

Drawn draw_document(Generator& g, const SynthOptions& o, int64_t p, Scratch& x) {
  Drawn d;
  d.cluster = p;
  switch (g.kind(p)) {
    case Generator::Kind::Original:
      d.text = render(g.original(p));
      d.kind = "original";
      break;
    case Generator::Kind::Partial:
      d.of = g.base_of(p, false);
      d.text = render(g.partial(p));
      d.kind = "partial";
      d.jaccard = jaccard_of(d.text, render(g.original(d.of)), o.ngram, x);
      break;
    case Generator::Kind::Variant: d = draw_variant(g, o, p, x); break;
  }
  return d;
}

// Plants a 13-20 word passage of one of `fields` after a sentence end near a random point
// of `text` (or at its end); returns the truth row's task-side fields.
nlohmann::json plant_passage(std::string& text, const std::vector<Field>& fields, const SynthOptions& o, int64_t p,
                             Scratch& x) {
  Rng r(o.seed, kPlant, static_cast<uint64_t>(p));
  const Field& f = fields[static_cast<size_t>(r.below(static_cast<int64_t>(fields.size())))];
  normalize_words(f.text, x.wa);
  const int64_t w = std::min<int64_t>(static_cast<int64_t>(x.wa.size()), r.range(13, 20));
  const int64_t start = r.below(static_cast<int64_t>(x.wa.size()) - w + 1);
  const std::string passage = f.text.substr(x.wa[start].begin, x.wa[start + w - 1].end - x.wa[start].begin);
  const size_t at = text.find(". ", static_cast<size_t>(r.below(static_cast<int64_t>(text.size()))));
  if (at == std::string::npos)
    text += " " + passage + ".";
  else
    text.insert(at + 2, passage + ". ");
  return {{"row", f.row}, {"field", f.field}, {"passage", passage}};
}

nlohmann::json dedup_summary(const SynthOptions& o, const std::vector<std::string>& names,
                             const std::map<std::string, int64_t>& kinds, const std::vector<std::string>& task_names) {
  return {{"kind", "dedup"},
          {"docs", o.docs},
          {"seed", o.seed},
          {"sources", names},
          {"kinds", kinds},
          {"contaminated", o.contaminate},
          {"tasks", task_names},
          {"params",
           {{"near_dup_fraction", o.near_dup_fraction},
            {"partial_fraction", o.partial_fraction},
            {"ngram", o.ngram},
            {"min_jaccard", o.min_jaccard},
            {"min_words", o.min_words},
            {"max_words", o.max_words}}}};
}

}  // namespace

// The dedup corpus: the eval tasks, then each document drawn, given a source, possibly
// contaminated with a task passage, and written with its truth rows.
nlohmann::json make_synthetic_corpus(const SynthOptions& o) {
  if (o.docs < 1) throw_input("--docs {} must be at least 1", o.docs);
  if (o.kind == "quality") return make_quality(o);
  if (o.kind != "dedup") throw_input("--kind {}: expected dedup or quality", o.kind);
  check_dedup_options(o);
  fs::create_directories(o.output_dir);
  Generator g(o);
  const fs::path out(o.output_dir);
  const std::map<std::string, std::vector<Field>> long_fields = write_tasks(g, out);
  std::vector<std::string> task_names;
  for (auto& [k, v] : long_fields) task_names.push_back(k);
  const std::map<int64_t, int64_t> contaminated = contaminated_positions(o);

  std::vector<std::string> names;
  std::vector<std::unique_ptr<AtomicWriter>> writers;
  std::vector<int64_t> lines(static_cast<size_t>(o.sources), 0);
  for (int64_t s = 0; s < o.sources; ++s) {
    names.push_back(source_name(s, o.sources));
    writers.push_back(std::make_unique<AtomicWriter>((out / (names.back() + ".jsonl")).string()));
  }
  AtomicWriter truth((out / "truth_dedup.jsonl").string());
  AtomicWriter ctruth((out / "truth_contamination.jsonl").string());
  std::map<std::string, int64_t> kinds;
  Scratch x;
  Progress prog("synth-corpus", o.docs, "docs", o.progress);
  for (int64_t p = 0; p < o.docs; ++p) {
    Drawn d = draw_document(g, o, p, x);
    const int64_t src = static_cast<int64_t>(Rng(o.seed, kSource, static_cast<uint64_t>(p)).below(o.sources));
    const int64_t line = ++lines[static_cast<size_t>(src)];
    if (auto it = contaminated.find(p); it != contaminated.end()) {
      const std::string& task = task_names[static_cast<size_t>(it->second) % task_names.size()];
      const nlohmann::json planted = plant_passage(d.text, long_fields.at(task), o, p, x);
      ctruth.write_line(nlohmann::json{{"source", names[src]},
                                       {"line", line},
                                       {"doc", p},
                                       {"task", task},
                                       {"row", planted["row"]},
                                       {"field", planted["field"]},
                                       {"passage", planted["passage"]}}
                            .dump());
    }
    writers[static_cast<size_t>(src)]->write_line(
        nlohmann::json{{"text", d.text}, {"id", "doc" + std::to_string(p)}}.dump());
    nlohmann::json t = {{"source", names[src]}, {"line", line}, {"doc", p}, {"cluster", d.cluster}, {"kind", d.kind}};
    if (d.of >= 0) {
      t["of"] = d.of;
      t["jaccard"] = std::round(d.jaccard * 1e4) / 1e4;
    }
    truth.write_line(t.dump());
    ++kinds[d.kind];
    prog.add(1);
  }
  prog.finish();
  for (auto& w : writers) w->close();
  truth.close();
  ctruth.close();
  const nlohmann::json summary = dedup_summary(o, names, kinds, task_names);
  write_file_atomic((out / "synth.json").string(), summary.dump(2) + "\n");
  return summary;
}

}  // namespace mtnlg::curation
