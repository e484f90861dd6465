// `mtnlg data extract`: WARC/WET files -> JSONL shards of clean text, one shard per
// input file (DIR/<stem>.jsonl or .jsonl.zst), so the outputs do not depend on how the
// files are spread over ranks. Per input: records are read one at a time (warc.hpp),
// `response` records with an HTML payload become pages (page.hpp), `conversion`
// records (WET) pass through as text; the language filter applies to both.
#pragma once
#include <nlohmann/json.hpp>

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "data/extract/page.hpp"

namespace mtnlg::extract {

struct ExtractOptions {
  std::vector<std::string> inputs;
  std::string output_dir;
  std::vector<std::string> languages = {"en"};  // ISO codes kept; {"all"} keeps every language
  double min_language_score = 0.0;              // share of the text in the top language
  int64_t min_language_chars = 50;              // main texts shorter (code points) are unclassifiable
  int64_t min_chars = 1;                        // shorter main texts are dropped (counted)
  std::string compress = "none";                // none | zstd
  int64_t max_record_bytes = 64 << 20;
  bool skip_bad_records = false;
  BlockParams blocks;
  bool progress = true;
};

// Counters of one input file, summed over files (and ranks) for the report.
enum Counter : int {
  kRecords,
  kResponse,
  kConversion,
  kOtherType,
  kNotOk,
  kNotHtml,
  kPages,
  kNoText,
  kLanguageDropped,
  kLanguageUnclassifiable,
  kKept,
  kCharsOut,
  kReplacedBytes,
  kCsBom,
  kCsHttp,
  kCsMeta,
  kCsUtf8,
  kCsDetected,
  kCsDefault,
  kBadTruncated,
  kBadGzip,
  kBadHeader,
  kBadOversize,
  kBadEncoding,
  kBadHttp,
  kCounters
};
const char* counter_name(int c);
using Counts = std::array<int64_t, kCounters>;

struct FileProgress {
  std::atomic<int64_t>* bytes = nullptr;      // input bytes read (compressed for gzip)
  std::atomic<int64_t>* documents = nullptr;  // documents written
};

// Pages wait in a window of up to kWindowPages pages (or kWindowBytes of block text) so
// that the pages of one site are compared (text repeated across them is boilerplate);
// documents come out in the input's order.
constexpr size_t kWindowPages = 512, kWindowBytes = size_t{64} << 20;

// Extracts one input into `output` (written through a temporary name, renamed at the
// end). `dropped_languages`: documents dropped per language code. Throws WarcError
// (exit 2) for bad input without skip_bad_records.
Counts extract_file(const std::string& input, const std::string& output, const ExtractOptions& opt,
                    std::map<std::string, int64_t>& dropped_languages, const FileProgress& progress);

// DIR/<stem>.jsonl or .jsonl.zst for an input; inputs with one stem are rejected.
std::vector<std::string> shard_paths(const ExtractOptions& opt);
// `data extract --explain SOURCE`: how the page's blocks were classified, one line a
// block: KEEP or drop, its class alone and in the end, the rule that decided it, the
// elements around it (id and classes) and its text. SOURCE: an HTML file, or a WARC file
// with #N (the record numbered N in the file) or #URL (the first response with that
// target URI), or alone (its first response record). The page is classified on its own:
// no other page of its site is there to show repeated text. Throws InputError (exit 2).
std::string explain_page(const std::string& source, const ExtractOptions& opt);
// Checks options and inputs (exit 2 naming the problem).
void check_extract_options(const ExtractOptions& opt);
// Which inputs rank r of W extracts: greedy by size, largest first, to the least
// loaded rank (ties: lowest rank); a function of the sizes only.
std::vector<int64_t> assign_inputs(const std::vector<std::string>& inputs, int64_t W, int64_t r);

// extract_report.json from the summed counts per input.
nlohmann::ordered_json extract_report(const ExtractOptions& opt, const std::vector<Counts>& per_file,
                                      const std::map<std::string, int64_t>& dropped_languages, double seconds);

}  // namespace mtnlg::extract
