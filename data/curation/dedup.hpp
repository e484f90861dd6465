// Fuzzy deduplication across JSONL sources: MinHash-LSH candidates, Jaccard
// verification, union-find components, one survivor per component.
//
// Pipeline (docs/CURATION.md has the full description and the report format):
//   1. stream every input once; workers parse, normalise, shingle (word n-grams) and
//      MinHash each document into a K x uint32 signature (texts are never kept);
//   2. for each LSH band, sort (band hash, doc) pairs, and verify the pairs inside
//      each bucket with the estimated Jaccard (>= threshold) -> edges;
//   3. union-find over the edges; per component, the survivor is the document of the
//      highest-priority source (--priority), then the earliest input, then the
//      earliest line;
//   4. stream the inputs again and copy the kept lines byte-identical to
//      OUT/<input file name>; write OUT/dedup_report.json (and, if asked,
//      OUT/dedup_clusters.jsonl).
// Memory: K*4 bytes (+ ~14 bytes bookkeeping) per document, plus one band's
// (hash, doc) pairs per worker: ~0.6 GB for 1M documents at K = 128.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace mtnlg::curation {

struct DedupOptions {
  std::vector<std::string> inputs;       // JSONL files; source name = file stem
  std::string output_dir;
  std::vector<std::string> priority;     // source names, most preferred first
  double threshold = 0.8;                // Jaccard similarity of shingle sets
  std::string json_key = "text";
  int64_t workers = 0;                   // 0 = hardware threads
  int64_t ngram = 5;                     // words per shingle
  int64_t num_perm = 128;                // K
  int64_t bands = 0, rows = 0;           // 0 = choose_bands(threshold, K)
  uint64_t seed = 1;                     // hash family seed
  bool write_clusters = false;           // OUT/dedup_clusters.jsonl
  bool progress = true;
};

struct DedupResult {
  int64_t documents = 0, kept = 0, removed = 0, empty = 0, components = 0;
  nlohmann::json report;                 // what dedup_report.json holds
};

DedupResult run_dedup(const DedupOptions& opt);

}  // namespace mtnlg::curation
