// Synthetic corpora with planted ground truth, for testing and benchmarking the
// curation tools (`mtnlg data synth-corpus`).
//
// kind "dedup": OUT/<source>.jsonl ({"text": ..., "id": ...} per line) made of
//   * originals: Zipf-distributed words from a seeded made-up vocabulary, sentences
//     and paragraphs (unrelated documents share essentially no 5-grams);
//   * near-duplicates of an earlier original (--near-dup-fraction): exact copies,
//     case/punctuation/whitespace changes, ~1% word edits, sentence reorders,
//     boilerplate header/footer insertions, or edits + boilerplate; each is checked to
//     have exact shingle Jaccard >= --min-jaccard with its original (weaker edits are
//     retried otherwise);
//   * hard negatives ("partial", --partial-fraction): the first 40% of an earlier
//     original followed by new text (Jaccard ~0.25: must NOT be merged);
//   * optionally (--contaminate N) N documents with a passage (13-20 words) of an eval
//     task's row inserted; the tasks are written to OUT/tasks/<task>/validation.jsonl
//     in the Hugging Face field layout of the nine mtnlg eval tasks.
//   Ground truth: OUT/truth_dedup.jsonl (source, line, cluster, kind, jaccard) and
//   OUT/truth_contamination.jsonl (source, line, task, row, field).
// kind "quality": OUT/positive.jsonl (grammatical English sentences from a small
//   grammar) and OUT/negative.jsonl (word salad over the same words, navigation and
//   spam boilerplate).
// Every document is a pure function of (seed, position) through the counter RNG, so
// generation streams in constant memory and is reproducible.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace mtnlg::curation {

struct SynthOptions {
  std::string output_dir;
  std::string kind = "dedup";  // dedup | quality
  int64_t docs = 2000;
  int64_t sources = 2;
  double near_dup_fraction = 0.15;
  double partial_fraction = 0.03;
  int64_t contaminate = 0;
  int64_t task_rows = 20;
  int64_t ngram = 5;  // shingle size for the near-duplicate Jaccard check
  double min_jaccard = 0.85;
  int64_t min_words = 150, max_words = 400;
  uint64_t seed = 1;
  bool progress = true;
};

// Writes the corpus; returns the summary also written to OUT/synth.json.
nlohmann::json make_synthetic_corpus(const SynthOptions& opt);

}  // namespace mtnlg::curation
