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
//      OUT/dedup_clusters.jsonl). Each document's line length is kept from step 1,
//      so the bytes each output receives are known before it is written.
//
// Across ranks (mpirun/srun; a RankComm given): rank r reads the r-th line-aligned
// byte range of every input and holds the signatures of those documents only; band
// keys travel to the rank that owns them (hash of the key mod ranks), which sorts
// them (spilling sorted runs to disk over --memory-per-rank) and emits candidate
// pairs; a pair is verified on the rank holding its second document (the first
// document's signature is shipped there); the verified edges, reduced to a spanning
// forest on each rank, are gathered on rank 0, which joins them with one union-find
// and chooses the survivors; it tells each rank which of its documents are removed.
// Every rank then writes its own kept lines into its slice of each output: the ranks'
// kept bytes per input, summed in rank order (an exclusive prefix sum), give each
// rank's offset in each file, which rank 0 has created under a temporary name and
// sized; each rank pwrite()s and fsyncs its slice, the ranks agree on the outcome, and
// rank 0 renames the files into place and writes the clusters file and the report.
// One process is the
// same algorithm with one rank, so outputs and report (but timings and the "run"
// object) are the same bytes for any number of ranks.
// Memory per rank: K*4 + 4 (its line length) bytes per document of its share, plus one band's keys
// (16 bytes per document, spilled when over the budget) and the candidate pairs.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "data/curation/ranks.hpp"

namespace mtnlg::curation {

struct DedupOptions {
  std::vector<std::string> inputs;  // JSONL files; source name = file stem
  std::string output_dir;
  std::vector<std::string> priority;  // source names, most preferred first
  double threshold = 0.8;             // Jaccard similarity of shingle sets
  std::string json_key = "text";
  int64_t workers = 0;          // 0 = hardware threads
  int64_t ngram = 5;            // words per shingle
  int64_t num_perm = 128;       // K
  int64_t bands = 0, rows = 0;  // 0 = choose_bands(threshold, K)
  uint64_t seed = 1;            // hash family seed
  bool write_clusters = false;  // OUT/dedup_clusters.jsonl
  bool progress = true;
  int64_t memory_per_rank = 0;  // bytes; 0 = no limit (band keys never spilled)
  std::string tmp_dir;          // spilled band keys; "" = output_dir
  // Testing aid (MTNLG_TEST_DEDUP_FAIL_WRITE_RANK): this rank fails with a write error
  // after writing the first of its slices (before syncing it); -1 = never.
  int64_t fail_write_rank = -1;
};

// "2G", "512M", "64K", "1.5G" or a plain number of bytes (powers of 1024). InputError
// naming `what` otherwise.
int64_t parse_byte_size(const std::string& text, const std::string& what);

struct DedupResult {
  int64_t documents = 0, kept = 0, removed = 0, empty = 0, components = 0;
  nlohmann::json report;  // what dedup_report.json holds
};

// On every rank of `comm` (nullptr: one process). Every rank writes its share of the
// outputs; rank 0 renames them into place and writes the report, and returns the
// counts and the report; the other ranks return the document count with an empty
// report. A rank that fails makes every rank throw (its own error there, "stopped
// because rank R failed" on the others) before any output is renamed into place; the
// temporary files are removed.
DedupResult run_dedup(const DedupOptions& opt, RankComm* comm = nullptr);

}  // namespace mtnlg::curation
