#include "data/curation/pipeline.hpp"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>
#include <zlib.h>

#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <set>

#include "core/atomic_file.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "core/progress.hpp"
#include "core/switches.hpp"
#include "data/curation/decontaminate.hpp"
#include "data/curation/dedup.hpp"
#include "data/curation/quality.hpp"
#include "data/curation/ranks.hpp"
#include "data/extract/extract.hpp"
#include "data/indexed_dataset.hpp"
#include "data/preprocess.hpp"

namespace mtnlg::curation {

namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;


struct SourceSpec {
  std::string name;
  std::vector<std::string> warc, jsonl;  // exactly one of them
  ojson extract;                         // extract options given
  extract::ExtractOptions xopt;
  bool quality = false;
  curation::QualityFilterOptions qopt;
  double weight = 1.0;
};

struct Pipeline {
  std::string file, work_dir;
  std::vector<SourceSpec> sources;
  bool dedup = false;
  curation::DedupOptions dopt;
  bool decontam = false;
  curation::DecontamOptions copt;
  std::string vocab_file, merge_file;
  bool append_eod = true;
  int64_t train_tokens = 0;  // for the epochs column; 0 = from the base recipe, else none
  std::string recipe;        // base training recipe (optional)
};

[[noreturn]] void bad(const Pipeline& p, const std::string& field, const std::string& what) {
  throw_input("{}: {}: {}", p.file, field, what);
}

std::string path_field(const Pipeline& p, const YAML::Node& n, const std::string& field) {
  if (!n || !n.IsScalar()) bad(p, field, "expected a path");
  fs::path v = n.as<std::string>();
  if (v.is_relative()) v = fs::path(p.file).parent_path() / v;
  return v.lexically_normal().string();
}

template <typename T>
T scalar(const Pipeline& p, const YAML::Node& n, const std::string& field) {
  try {
    return n.as<T>();
  } catch (const YAML::Exception&) {
    bad(p, field,
        fmt::format("'{}' is not a {}", n.IsScalar() ? n.Scalar() : "(not a scalar)",
                    std::is_same_v<T, bool> ? "boolean" : "number"));
  }
}

void check_keys(const Pipeline& p, const YAML::Node& n, const std::string& where, std::set<std::string> allowed) {
  if (!n.IsMap()) bad(p, where, "expected a mapping");
  for (const auto& kv : n) {
    const auto k = kv.first.as<std::string>();
    if (!allowed.count(k)) {
      std::string list;
      for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
      bad(p, where.empty() ? k : where + "." + k, "unknown key (known: " + list + ")");
    }
  }
}

// One entry of sources: its name (unique), inputs, extraction and quality settings, weight.
SourceSpec load_source(Pipeline& p, const YAML::Node& s, const std::string& f, std::set<std::string>& names) {
  check_keys(p, s, f, {"name", "warc", "jsonl", "extract", "quality", "weight"});
  SourceSpec src;
  if (!s["name"] || !s["name"].IsScalar()) bad(p, f + ".name", "missing");
  src.name = s["name"].as<std::string>();
  for (char c : src.name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_'))
      bad(p, f + ".name", fmt::format("'{}': use letters, digits, - and _", src.name));
  if (!names.insert(src.name).second) bad(p, f + ".name", fmt::format("'{}' is used twice", src.name));
  for (const char* kind : {"warc", "jsonl"}) {
    if (!s[kind]) continue;
    auto& list = std::string(kind) == "warc" ? src.warc : src.jsonl;
    const YAML::Node l = s[kind];
    if (l.IsScalar())
      list.push_back(path_field(p, l, f + "." + kind));
    else
      for (size_t k = 0; k < l.size(); ++k) list.push_back(path_field(p, l[k], fmt::format("{}.{}[{}]", f, kind, k)));
  }
  if (src.warc.empty() == src.jsonl.empty()) bad(p, f, "give exactly one of warc: or jsonl: (a list of files)");
  for (const auto& in : src.warc.empty() ? src.jsonl : src.warc)
    if (!fs::is_regular_file(in)) bad(p, f, fmt::format("input {}: no such file", in));
  if (const YAML::Node x = s["extract"]) {
    if (src.warc.empty()) bad(p, f + ".extract", "only for warc: sources");
    check_keys(p, x, f + ".extract",
               {"languages", "min_chars", "min_language_score", "skip_bad_records", "max_record_bytes"});
    if (x["languages"]) {
      src.xopt.languages.clear();
      for (const auto& l : x["languages"]) src.xopt.languages.push_back(l.as<std::string>());
    }
    if (x["min_chars"]) src.xopt.min_chars = scalar<int64_t>(p, x["min_chars"], f + ".extract.min_chars");
    if (x["min_language_score"])
      src.xopt.min_language_score = scalar<double>(p, x["min_language_score"], f + ".extract.min_language_score");
    if (x["skip_bad_records"])
      src.xopt.skip_bad_records = scalar<bool>(p, x["skip_bad_records"], f + ".extract.skip_bad_records");
    if (x["max_record_bytes"])
      src.xopt.max_record_bytes = scalar<int64_t>(p, x["max_record_bytes"], f + ".extract.max_record_bytes");
  }
  if (const YAML::Node q = s["quality"]) {
    check_keys(p, q, f + ".quality", {"model", "mode", "threshold", "alpha", "seed"});
    src.quality = true;
    src.qopt.model = path_field(p, q["model"], f + ".quality.model");
    if (!fs::is_regular_file(src.qopt.model)) bad(p, f + ".quality.model", src.qopt.model + ": no such file");
    if (q["mode"]) src.qopt.mode = q["mode"].as<std::string>();
    if (src.qopt.mode != "threshold" && src.qopt.mode != "pareto")
      bad(p, f + ".quality.mode", fmt::format("'{}' is not threshold or pareto", src.qopt.mode));
    if (q["threshold"]) src.qopt.threshold = scalar<double>(p, q["threshold"], f + ".quality.threshold");
    if (q["alpha"]) src.qopt.alpha = scalar<double>(p, q["alpha"], f + ".quality.alpha");
    if (q["seed"]) src.qopt.seed = scalar<uint64_t>(p, q["seed"], f + ".quality.seed");
  }
  if (s["weight"]) src.weight = scalar<double>(p, s["weight"], f + ".weight");
  if (!(src.weight > 0)) bad(p, f + ".weight", "must be > 0");
  return src;
}

// The dedup: and decontaminate: sections (each optional).
void load_cleaning(Pipeline& p, const YAML::Node& root, const std::set<std::string>& names) {
  if (const YAML::Node d = root["dedup"]) {
    check_keys(p, d, "dedup", {"threshold", "priority", "ngram", "num_perm", "seed"});
    p.dedup = true;
    if (d["threshold"]) p.dopt.threshold = scalar<double>(p, d["threshold"], "dedup.threshold");
    if (d["ngram"]) p.dopt.ngram = scalar<int64_t>(p, d["ngram"], "dedup.ngram");
    if (d["num_perm"]) p.dopt.num_perm = scalar<int64_t>(p, d["num_perm"], "dedup.num_perm");
    if (d["seed"]) p.dopt.seed = scalar<uint64_t>(p, d["seed"], "dedup.seed");
    if (d["priority"])
      for (const auto& n : d["priority"]) {
        const auto v = n.as<std::string>();
        if (!names.count(v)) bad(p, "dedup.priority", fmt::format("'{}' is not a source name", v));
        p.dopt.priority.push_back(v);
      }
  }
  if (const YAML::Node d = root["decontaminate"]) {
    check_keys(p, d, "decontaminate", {"tasks_dir", "ngram", "mode", "max_hits"});
    p.decontam = true;
    p.copt.tasks_dir = path_field(p, d["tasks_dir"], "decontaminate.tasks_dir");
    if (!fs::is_directory(p.copt.tasks_dir))
      bad(p, "decontaminate.tasks_dir", p.copt.tasks_dir + ": no such directory");
    if (d["ngram"]) p.copt.ngram = scalar<int64_t>(p, d["ngram"], "decontaminate.ngram");
    if (d["mode"]) p.copt.mode = d["mode"].as<std::string>();
    if (p.copt.mode != "remove" && p.copt.mode != "cut")
      bad(p, "decontaminate.mode", fmt::format("'{}' is not remove or cut", p.copt.mode));
    if (d["max_hits"]) p.copt.max_hits = scalar<int64_t>(p, d["max_hits"], "decontaminate.max_hits");
  }
}

Pipeline load_pipeline(const std::string& file) {
  Pipeline p;
  p.file = file;
  YAML::Node root;
  try {
    root = YAML::LoadFile(file);
  } catch (const YAML::BadFile&) {
    throw_input("{}: cannot read the pipeline file", file);
  } catch (const YAML::Exception& e) {
    throw_input("{}:{}:{}: {}", file, e.mark.line + 1, e.mark.column + 1, e.msg);
  }
  check_keys(p, root, "", {"work_dir", "sources", "dedup", "decontaminate", "tokenizer", "blend"});
  p.work_dir = path_field(p, root["work_dir"], "work_dir");
  if (!root["sources"] || !root["sources"].IsSequence() || root["sources"].size() == 0)
    bad(p, "sources", "expected a list of sources");
  std::set<std::string> names;
  for (size_t i = 0; i < root["sources"].size(); ++i)
    p.sources.push_back(load_source(p, root["sources"][i], fmt::format("sources[{}]", i), names));
  load_cleaning(p, root, names);
  const YAML::Node t = root["tokenizer"];
  if (!t) bad(p, "tokenizer", "missing (vocab_file, merge_file)");
  check_keys(p, t, "tokenizer", {"vocab_file", "merge_file", "append_eod"});
  p.vocab_file = path_field(p, t["vocab_file"], "tokenizer.vocab_file");
  p.merge_file = path_field(p, t["merge_file"], "tokenizer.merge_file");
  if (t["append_eod"]) p.append_eod = scalar<bool>(p, t["append_eod"], "tokenizer.append_eod");
  if (const YAML::Node b = root["blend"]) {
    check_keys(p, b, "blend", {"train_tokens", "recipe"});
    if (b["train_tokens"]) p.train_tokens = scalar<int64_t>(p, b["train_tokens"], "blend.train_tokens");
    if (b["recipe"]) p.recipe = path_field(p, b["recipe"], "blend.recipe");
  }
  return p;
}

// --- manifests ------------------------------------------------------------------------

ojson file_entry(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw_runtime("{}: cannot open to hash it", path);
  std::vector<unsigned char> buf(1 << 20);
  uLong crc = crc32(0L, Z_NULL, 0);
  int64_t size = 0;
  for (;;) {
    const size_t n = std::fread(buf.data(), 1, buf.size(), f);
    if (n == 0) break;
    crc = crc32(crc, buf.data(), static_cast<uInt>(n));
    size += static_cast<int64_t>(n);
  }
  std::fclose(f);
  ojson e;
  e["path"] = path;
  e["bytes"] = size;
  e["crc32"] = fmt::format("{:08x}", crc);
  return e;
}

ojson file_entries(const std::vector<std::string>& paths) {
  ojson a = ojson::array();
  for (const auto& p : paths) a.push_back(file_entry(p));
  return a;
}

// Documents and text bytes of a JSONL file (the funnel's columns).
ojson count_jsonl(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string line;
  int64_t docs = 0, bytes = 0;
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    ++docs;
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("text") && j["text"].is_string())
      bytes += static_cast<int64_t>(j["text"].get_ref<const std::string&>().size());
  }
  return {{"documents", docs}, {"text_bytes", bytes}};
}

// The same JSON on every rank: rank 0's (stage counts, which only rank 0 computes).
ojson broadcast_json(curation::RankComm& comm, const ojson& j) {
  if (comm.size() == 1) return j;
  // all_to_all moves whole 4-byte words: the text's length (8 bytes), then the text
  // padded with spaces to a word.
  std::string msg;
  if (comm.rank() == 0) {
    const std::string text = j.dump();
    const uint64_t n = text.size();
    msg.assign(reinterpret_cast<const char*>(&n), sizeof n);
    msg += text;
    msg.resize((msg.size() + 3) / 4 * 4, ' ');
  }
  std::vector<std::span<const char>> send(static_cast<size_t>(comm.size()));
  if (comm.rank() == 0)
    for (auto& s : send) s = std::span<const char>(msg.data(), msg.size());
  const std::vector<char> got = comm.all_to_all(send);  // only rank 0 sent: its bytes
  uint64_t n = 0;
  if (got.size() < sizeof n) throw_runtime("curate: rank 0's stage counts did not arrive");
  std::memcpy(&n, got.data(), sizeof n);
  return ojson::parse(std::string(got.begin() + sizeof n, got.begin() + static_cast<std::ptrdiff_t>(sizeof n + n)));
}

// The stages' bookkeeping. Across ranks, rank 0 owns the files: it checks each stage's
// manifest, runs the stage (all ranks run a collective one: dedup), writes the manifest
// and tells every rank the stage's counts, so every rank walks the same pipeline; each
// step's failure is agreed on, so no rank waits for a peer that has stopped.
struct Curator {
  Pipeline p;
  curation::RankComm* comm = nullptr;
  int64_t ran = 0, skipped = 0;
  std::string kill_after;  // testing aid: MTNLG_TEST_CURATE_KILL

  bool lead() const { return comm->rank() == 0; }

  // Runs `fn` unless the stage's manifest matches; returns the manifest's "counts".
  // `collective`: every rank runs fn (its result on rank 0 is the counts).
  template <typename F>
  ojson stage(const std::string& id, const std::string& manifest, const ojson& params,
              const std::vector<std::string>& inputs, const std::vector<std::string>& outputs, F&& fn,
              bool collective = false) {
    ojson m, counts;
    int64_t run = 0;
    curation::agree(*comm, "checking stage " + id, [&] {
      if (!lead()) return;
      m["stage"] = id;
      m["params"] = params;
      m["inputs"] = file_entries(inputs);
      if (const auto old = matching_manifest(manifest, m, outputs)) {
        counts = old->at("counts");
        log::info("curate: {}: up to date (manifest {} matches), skipped", id, manifest);
      } else {
        run = 1;
      }
    });
    comm->all_reduce_max(&run, 1);
    if (!run) {
      ++skipped;
      return broadcast_json(*comm, counts);
    }
    curation::agree(*comm, "running stage " + id, [&] {
      if (lead()) {
        log::info("curate: {}: running", id);
        fs::create_directories(fs::path(manifest).parent_path());
      }
      if (lead() || collective) counts = fn();
      if (!lead()) return;
      if (kill_after == id) {  // testing aid: die like kill -9 after the outputs, before the manifest
        std::fflush(nullptr);
        std::raise(SIGKILL);
      }
      m["counts"] = counts;
      m["outputs"] = file_entries(outputs);
      write_file_atomic(manifest, m.dump(2) + "\n");
    });
    ++ran;
    return broadcast_json(*comm, counts);
  }

 private:
  // The manifest of an earlier run when it still matches (same stage, parameters, inputs
  // and outputs as they are now); an unreadable manifest is a stage to redo.
  static std::optional<ojson> matching_manifest(const std::string& manifest, const ojson& m,
                                                const std::vector<std::string>& outputs) {
    if (!fs::exists(manifest)) return std::nullopt;
    try {
      std::ifstream f(manifest);
      ojson old = ojson::parse(f);
      bool same = old.at("stage") == m["stage"] && old.at("params") == m["params"] && old.at("inputs") == m["inputs"];
      if (same) {
        const ojson& outs = old.at("outputs");
        same = outs.size() == outputs.size();
        for (size_t i = 0; same && i < outputs.size(); ++i)
          same = fs::exists(outputs[i]) && outs[i] == file_entry(outputs[i]);
      }
      if (same) return old;
    } catch (const std::exception&) {}
    return std::nullopt;
  }
};

ojson extract_params(const extract::ExtractOptions& o) {
  return {{"languages", o.languages},
          {"min_chars", o.min_chars},
          {"min_language_score", o.min_language_score},
          {"skip_bad_records", o.skip_bad_records},
          {"max_record_bytes", o.max_record_bytes}};
}

void concat_files(const std::vector<std::string>& ins, const std::string& out) {
  AtomicFile f(out);
  std::vector<char> buf(1 << 20);
  for (const auto& in : ins) {
    std::FILE* s = std::fopen(in.c_str(), "rb");
    if (!s) throw_input("{}: cannot open", in);
    char last = '\n';
    for (;;) {
      const size_t n = std::fread(buf.data(), 1, buf.size(), s);
      if (n == 0) break;
      f.write(buf.data(), n);
      last = buf[n - 1];
    }
    std::fclose(s);
    if (last != '\n') f.write("\n", 1);  // every input's last line ends
  }
  f.commit();
}

// One run of a pipeline: its stages in order, each a Curator::stage (skipped when its
// manifest still matches), the funnel of documents and bytes per source, then the
// blend and the report.
struct CurateRun {
  Curator c;
  fs::path W;  // the pipeline's work_dir
  std::string file;
  bool progress = true;
  std::map<std::string, ojson> funnel;     // source -> its stages' in/out counts
  std::map<std::string, std::string> cur;  // source -> its latest JSONL
  std::map<std::string, int64_t> tokens;   // after tokenizing
  std::map<std::string, std::string> prefixes;
  int64_t train_tokens = 0;
  ojson table = ojson::array();  // the blend: source, tokens, weight, epochs

  void add(const std::string& src, const std::string& stage, const ojson& in, const ojson& out) {
    ojson e;
    e["stage"] = stage;
    e["documents_in"] = in.at("documents");
    e["documents_out"] = out.at("documents");
    e["text_bytes_in"] = in.at("text_bytes");
    e["text_bytes_out"] = out.at("text_bytes");
    if (!funnel.count(src)) funnel[src] = ojson::array();
    funnel[src].push_back(e);
  }
  // 1. Sources: WARC extracted to text, or JSONL concatenated.
  void sources() {
    Pipeline& p = c.p;
    for (const auto& s : p.sources) {
      const std::string out = (W / "1-source" / (s.name + ".jsonl")).string();
      const bool warc = !s.warc.empty();
      ojson params = {{"kind", warc ? "warc" : "jsonl"}};
      if (warc) params["extract"] = extract_params(s.xopt);
      const auto counts =
          c.stage("source/" + s.name, (W / "1-source" / (s.name + ".manifest.json")).string(), params,
                  warc ? s.warc : s.jsonl, {out}, [&] {
                    ojson k;
                    if (warc) {
                      extract::ExtractOptions o = s.xopt;
                      o.inputs = s.warc;
                      o.output_dir = (W / "1-source" / (s.name + ".shards")).string();
                      fs::create_directories(o.output_dir);
                      const auto shards = extract::shard_paths(o);
                      std::vector<extract::Counts> per;
                      std::map<std::string, int64_t> langs;
                      Progress bar("curate: extract " + s.name, static_cast<int64_t>(s.warc.size()), "files", progress);
                      for (size_t i = 0; i < s.warc.size(); ++i) {
                        per.push_back(extract::extract_file(s.warc[i], shards[i], o, langs, {}));
                        bar.add(1);
                      }
                      bar.finish();
                      concat_files(shards, out);
                      for (const auto& sh : shards) fs::remove(sh);
                      fs::remove(o.output_dir);
                      const auto rep = extract::extract_report(o, per, langs, 0.0);
                      k["records"] = rep["totals"]["records"];
                      k["pages"] = rep["totals"]["pages"];
                      k["language_dropped"] = rep["totals"]["language_dropped"];
                      k["no_main_text"] = rep["totals"]["no_main_text"];
                      k["bad_records"] = rep["totals"]["bad_records"];
                      k["in"] = {{"documents", rep["totals"]["pages"]}, {"text_bytes", nullptr}};
                    } else {
                      concat_files(s.jsonl, out);
                    }
                    k["out"] = count_jsonl(out);
                    if (!warc) k["in"] = k["out"];
                    return k;
                  });
      ojson in = counts.at("in");
      add(s.name, warc ? "extract" : "source", in, counts.at("out"));
      cur[s.name] = out;
    }
  }
  // 2. Quality: each source with a classifier filtered by its score.
  void quality() {
    Pipeline& p = c.p;
    for (const auto& s : p.sources) {
      if (!s.quality) continue;
      const std::string out = (W / "2-quality" / (s.name + ".jsonl")).string();
      ojson params = {
          {"mode", s.qopt.mode}, {"threshold", s.qopt.threshold}, {"alpha", s.qopt.alpha}, {"seed", s.qopt.seed}};
      const auto counts = c.stage("quality/" + s.name, (W / "2-quality" / (s.name + ".manifest.json")).string(), params,
                                  {cur[s.name], s.qopt.model}, {out}, [&] {
                                    curation::QualityFilterOptions o = s.qopt;
                                    o.input = cur[s.name];
                                    o.output = out;
                                    curation::filter_quality(o);
                                    return ojson{{"in", count_jsonl(cur[s.name])}, {"out", count_jsonl(out)}};
                                  });
      add(s.name, "quality", counts.at("in"), counts.at("out"));
      cur[s.name] = out;
    }
  }
  // 3. Dedup across every source at once (priority order decides the survivor).
  void dedup() {
    Pipeline& p = c.p;
    std::vector<std::string> ins, outs;
    for (const auto& s : p.sources) {
      ins.push_back(cur[s.name]);
      outs.push_back((W / "3-dedup" / (s.name + ".jsonl")).string());
    }
    ojson params = {{"threshold", p.dopt.threshold},
                    {"priority", p.dopt.priority},
                    {"ngram", p.dopt.ngram},
                    {"num_perm", p.dopt.num_perm},
                    {"seed", p.dopt.seed}};
    const auto counts = c.stage(
        "dedup", (W / "3-dedup" / "dedup.manifest.json").string(), params, ins, outs,
        [&] {
          curation::DedupOptions o = p.dopt;
          o.inputs = ins;
          o.output_dir = (W / "3-dedup").string();
          o.workers = 1;
          o.progress = progress;
          curation::run_dedup(o, c.comm);  // across every rank
          if (!c.lead()) return ojson();   // rank 0 renamed the outputs into place and counts them
          ojson k;
          for (size_t i = 0; i < ins.size(); ++i)
            k[p.sources[i].name] = {{"in", count_jsonl(ins[i])}, {"out", count_jsonl(outs[i])}};
          return k;
        },
        /*collective=*/true);
    for (size_t i = 0; i < p.sources.size(); ++i) {
      const auto& k = counts.at(p.sources[i].name);
      add(p.sources[i].name, "dedup", k.at("in"), k.at("out"));
      cur[p.sources[i].name] = outs[i];
    }
  }
  // 4. Decontamination against the eval tasks' n-grams.
  void decontaminate() {
    Pipeline& p = c.p;
    for (const auto& s : p.sources) {
      const std::string out = (W / "4-decontam" / (s.name + ".jsonl")).string();
      ojson params = {{"ngram", p.copt.ngram}, {"mode", p.copt.mode}, {"max_hits", p.copt.max_hits}};
      std::vector<std::string> ins = {cur[s.name]};
      for (const auto& e : fs::recursive_directory_iterator(p.copt.tasks_dir))
        if (e.is_regular_file()) ins.push_back(e.path().string());
      std::sort(ins.begin() + 1, ins.end());
      const auto counts = c.stage("decontaminate/" + s.name, (W / "4-decontam" / (s.name + ".manifest.json")).string(),
                                  params, ins, {out}, [&] {
                                    curation::DecontamOptions o = p.copt;
                                    o.input = cur[s.name];
                                    o.output = out;
                                    o.report = out + ".report.json";
                                    o.progress = false;
                                    curation::run_decontaminate(o);
                                    return ojson{{"in", count_jsonl(cur[s.name])}, {"out", count_jsonl(out)}};
                                  });
      add(s.name, "decontaminate", counts.at("in"), counts.at("out"));
      cur[s.name] = out;
    }
  }
  // 5. Tokenize into Megatron's indexed files.
  void tokenize() {
    Pipeline& p = c.p;
    for (const auto& s : p.sources) {
      const std::string prefix = (W / "5-tokens" / s.name).string();
      const std::string full = data::preprocess_output_prefix(prefix, "text");
      ojson params = {{"append_eod", p.append_eod}};
      const auto counts =
          c.stage("tokens/" + s.name, (W / "5-tokens" / (s.name + ".manifest.json")).string(), params,
                  {cur[s.name], p.vocab_file, p.merge_file}, {data::bin_path(full), data::idx_path(full)}, [&] {
                    fs::create_directories(W / "5-tokens");
                    data::PreprocessOptions o;
                    o.inputs = {cur[s.name]};
                    o.output_prefix = prefix;
                    o.vocab_file = p.vocab_file;
                    o.merge_file = p.merge_file;
                    o.append_eod = p.append_eod;
                    o.progress = progress;
                    const auto r = data::preprocess_jsonl(o);
                    ojson in = count_jsonl(cur[s.name]);
                    return ojson{{"in", in}, {"documents", r.documents}, {"tokens", r.tokens.at(0)}};
                  });
      ojson out = {{"documents", counts.at("documents")}, {"text_bytes", counts.at("in").at("text_bytes")}};
      add(s.name, "tokenize", counts.at("in"), out);
      funnel[s.name].back()["tokens_out"] = counts.at("tokens");  // exact: what preprocess wrote
      tokens[s.name] = counts.at("tokens").get<int64_t>();
      prefixes[s.name] = full;
    }
  }
  // 6. Blend: weights normalised, epochs = weight x train tokens / source tokens; the
  // data.blend fragment, and the training recipe with it when the pipeline names one.
  void write_blend() {
    Pipeline& p = c.p;
    double wsum = 0;
    for (const auto& s : p.sources) wsum += s.weight;
    train_tokens = p.train_tokens;
    YAML::Node base;
    if (!p.recipe.empty()) {
      base = YAML::LoadFile(p.recipe);
      if (train_tokens == 0 && base["training"] && base["training"]["train_iters"] &&
          base["training"]["global_batch_size"] && base["model"] && base["model"]["seq_length"])
        train_tokens = base["training"]["train_iters"].as<int64_t>() *
                       base["training"]["global_batch_size"].as<int64_t>() * base["model"]["seq_length"].as<int64_t>();
    }
    YAML::Node blend(YAML::NodeType::Sequence);
    for (const auto& s : p.sources) {
      const double w = s.weight / wsum;
      YAML::Node e;
      e["weight"] = w;
      e["prefix"] = fs::absolute(prefixes[s.name]).lexically_normal().string();
      e.SetStyle(YAML::EmitterStyle::Flow);
      blend.push_back(e);
      ojson row = {{"source", s.name}, {"tokens", tokens[s.name]}, {"weight", w}};
      row["epochs"] = (train_tokens > 0 && tokens[s.name] > 0)
                          ? w * static_cast<double>(train_tokens) / static_cast<double>(tokens[s.name])
                          : 0.0;
      table.push_back(row);
    }
    YAML::Node frag;
    frag["data"]["blend"] = blend;
    frag["data"]["vocab_file"] = p.vocab_file;
    frag["data"]["merge_file"] = p.merge_file;
    YAML::Emitter em;
    em << frag;
    write_file_atomic((W / "blend.yaml").string(),
                      std::string("# written by mtnlg data curate ") + file + "\n" + em.c_str() + "\n");
    if (!p.recipe.empty()) {
      base["data"]["blend"] = blend;
      base["data"]["vocab_file"] = p.vocab_file;
      base["data"]["merge_file"] = p.merge_file;
      if (base["data"]["path"]) base["data"].remove("path");
      if (base["data"]["mock"]) base["data"]["mock"] = false;
      YAML::Emitter e2;
      e2 << base;
      write_file_atomic((W / "train.yaml").string(),
                        std::string("# ") + p.recipe + " with the blend of " + file + "\n" + e2.c_str() + "\n");
    }
  }
  // Report: the funnel per source and the blend table (no timings: the same bytes on a re-run).
  void write_report() {
    Pipeline& p = c.p;
    ojson rep;
    rep["pipeline"] = file;
    rep["train_tokens"] = train_tokens;
    rep["blend"] = table;
    ojson f = ojson::object();
    for (const auto& s : p.sources) f[s.name] = funnel[s.name];
    rep["funnel"] = f;
    write_file_atomic((W / "curate_report.json").string(), rep.dump(2) + "\n");
    auto cell = [](const ojson& v) {
      return v.is_null() ? std::string("-") : v.dump();
    };  // null: not measured (HTML bytes)
    std::string md = fmt::format(
        "# Curation report: {}\n\n## Funnel\n\n| source | stage | documents in | documents out | text bytes in | text "
        "bytes out |\n|---|---|---|---|---|---|\n",
        file);
    for (const auto& s : p.sources)
      for (const auto& e : funnel[s.name])
        md += fmt::format("| {} | {} | {} | {} | {} | {} |\n", s.name, e["stage"].get<std::string>(),
                          cell(e["documents_in"]), cell(e["documents_out"]), cell(e["text_bytes_in"]),
                          cell(e["text_bytes_out"]));
    md += fmt::format("\n## Blend ({} training tokens)\n\n| source | tokens | weight | epochs |\n|---|---|---|---|\n",
                      train_tokens);
    for (const auto& r : table)
      md += fmt::format("| {} | {} | {:.4f} | {:.3f} |\n", r["source"].get<std::string>(), r["tokens"].get<int64_t>(),
                        r["weight"].get<double>(), r["epochs"].get<double>());
    write_file_atomic((W / "curate_report.md").string(), md);
    std::printf("%s", md.c_str());
  }
};

// Whether a process of this id is running on this machine.
bool process_alive(long pid) { return pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH); }

}  // namespace

// Removes what writes that were cut short (kill -9, a lost node) left under the work_dir:
// core's atomic writes' NAME.tmp.<pid>.<n>, the dedup stage's NAME.tmp.<pid>.dedup and its
// .dedup-spill-rank<r>-<pid>/ directories, in the work_dir and its stage directories. The
// files of a writer still running on this machine are left alone. Returns how many went.
int64_t remove_stale_temporaries(const fs::path& W) {
  auto dedup_temp = [](const std::string& n, long* pid) {
    const size_t t = n.rfind(".tmp."), d = n.rfind(".dedup");
    if (t == std::string::npos || t == 0 || d == std::string::npos || d + 6 != n.size() || d <= t + 5) return false;
    const std::string digits = n.substr(t + 5, d - t - 5);
    if (digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) return false;
    *pid = std::stol(digits);
    return true;
  };
  auto spill_dir = [](const std::string& n, long* pid) {
    if (n.rfind(".dedup-spill-rank", 0) != 0) return false;
    const size_t dash = n.rfind('-');
    const std::string digits = n.substr(dash + 1);
    if (dash < 17 || digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos)
      return false;
    *pid = std::stol(digits);
    return true;
  };
  std::vector<fs::path> stale;
  std::vector<fs::path> dirs = {W};
  for (const char* d : {"1-source", "2-quality", "3-dedup", "4-decontam", "5-tokens"})
    if (fs::is_directory(W / d)) dirs.push_back(W / d);
  for (size_t i = 0; i < dirs.size(); ++i) {
    for (const auto& e : fs::directory_iterator(dirs[i])) {
      const std::string n = e.path().filename().string();
      long pid = 0;
      if (e.is_directory()) {
        if (spill_dir(n, &pid)) {
          if (!process_alive(pid)) stale.push_back(e.path());
        } else if (i > 0 && n.size() > 7 && n.compare(n.size() - 7, 7, ".shards") == 0) {
          dirs.push_back(e.path());  // a source's extraction shards
        }
      } else if ((atomic_temp_name(n, &pid) || dedup_temp(n, &pid)) && !process_alive(pid)) {
        stale.push_back(e.path());
      }
    }
  }
  std::sort(stale.begin(), stale.end());
  for (const auto& f : stale) {
    log::info("curate: removing {}, left by an interrupted run", f.string());
    fs::remove_all(f);
  }
  // A source's shard directory exists only while its extraction runs: one left empty goes.
  for (size_t i = 1; i < dirs.size(); ++i) {
    std::error_code ec;
    if (dirs[i].extension() == ".shards" && fs::is_empty(dirs[i], ec) && !ec) fs::remove(dirs[i], ec);
  }
  return static_cast<int64_t>(stale.size());
}

void run_pipeline(RankComm& comm, const std::string& file, bool progress) {
  CurateRun r;
  r.c.comm = &comm;
  curation::agree(comm, "reading the pipeline", [&] { r.c.p = load_pipeline(file); });
  if (const auto k = switches::text(Switch::test_curate_kill)) r.c.kill_after = *k;
  r.W = r.c.p.work_dir;
  r.file = file;
  r.progress = progress && comm.rank() == 0;
  curation::agree(comm, "creating the work_dir", [&] {
    if (comm.rank() != 0) return;
    fs::create_directories(r.W);
    remove_stale_temporaries(r.W);
  });
  r.sources();
  r.quality();
  if (r.c.p.dedup) r.dedup();
  if (r.c.p.decontam) r.decontaminate();
  r.tokenize();
  if (comm.rank() != 0) return;  // rank 0 writes the blend and the report
  r.write_blend();
  r.write_report();
  log::info("curate: {} stages run, {} up to date; blend {}{}", r.c.ran, r.c.skipped, (r.W / "blend.yaml").string(),
            r.c.p.recipe.empty() ? std::string() : fmt::format(", recipe {}", (r.W / "train.yaml").string()));
}


}  // namespace mtnlg::curation
