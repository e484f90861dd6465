// `mtnlg data merge`: several Megatron .bin/.idx prefixes -> one dataset, the same bytes
// as preprocessing the concatenation of their inputs in order (and as Megatron's
// tools/merge_datasets.py): lengths concatenated, byte pointers recomputed from the
// lengths, document indices shifted by the sequences before each input, .bin files
// concatenated. All inputs must share one dtype.
//
// Streaming: inputs are memory-mapped and copied through fixed buffers, so allocated
// memory does not grow with the dataset (mapped input pages are clean page cache). Output goes to PREFIX.{bin,idx}.tmp-<pid> and is renamed
// into place only when both files are complete and synced (.bin first).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mtnlg::data {

struct MergeResult {
  int64_t inputs = 0, documents = 0, sequences = 0, tokens = 0;
  std::string dtype;
};

// A directory argument stands for the prefixes of the .idx files in it, sorted by
// name (Megatron's merge tool takes a directory); other arguments are prefixes.
std::vector<std::string> expand_merge_inputs(const std::vector<std::string>& args);

// InputError (exit 2) for: no inputs, a missing or corrupt prefix, a dtype different
// from the first input's (naming the prefix), a multimodal index (mode bytes), the
// output being one of the inputs, or a missing output directory.
MergeResult merge_indexed_datasets(const std::vector<std::string>& inputs, const std::string& output_prefix,
                                   bool progress = true);

}  // namespace mtnlg::data
