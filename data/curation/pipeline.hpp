// `mtnlg data curate PIPELINE.yaml`: the MT-NLG corpus pipeline as one recipe
// (docs/CURATION.md, "One recipe: data curate"). Stages, in order:
//   1 source/<name>      WARC -> text (data/extract) or JSONL inputs joined -> 1-source/<name>.jsonl
//   2 quality/<name>     quality filter (threshold or Pareto)           -> 2-quality/<name>.jsonl
//   3 dedup              MinHash-LSH across all sources, priority order -> 3-dedup/<name>.jsonl
//   4 decontam/<name>    n-gram overlap with the eval tasks removed     -> 4-decontam/<name>.jsonl
//   5 tokens/<name>      GPT-2 BPE into Megatron .bin/.idx              -> 5-tokens/<name>_text_document
//   6 blend              blend.yaml (data.blend), train.yaml (a recipe with it), curate_report.{json,md}
// Every stage writes its outputs through temporary names, then its manifest
// (<stage dir>/<name>.manifest.json: parameters, inputs' and outputs' sizes and CRC-32,
// counts). A re-run skips a stage whose manifest matches the parameters and the files
// on disk and redoes the rest, so a killed run resumes; every stage is deterministic,
// so the resumed run's files are the same bytes as an uninterrupted one's. A run first
// removes the temporary files that an interrupted one left in the work_dir.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>

#include "data/curation/ranks.hpp"

namespace mtnlg::curation {

// Runs the pipeline of PIPELINE.yaml on this rank of `comm`: rank 0 owns the files and
// runs every stage but dedup, which runs across the ranks; every rank walks the same
// stages and agrees on each one's failure. InputError names the file and field of a bad
// pipeline; progress bars on rank 0 when `progress`.
void run_pipeline(RankComm& comm, const std::string& file, bool progress);

// Removes the temporary files that interrupted writes left in a work_dir and its stage
// directories (atomic writes' NAME.tmp.<pid>.<n>, the dedup stage's NAME.tmp.<pid>.dedup
// and spill directories, a source's empty extraction-shard directory) unless their writer
// is still running on this machine. Returns how many went.
int64_t remove_stale_temporaries(const std::filesystem::path& work_dir);

}  // namespace mtnlg::curation
