// The data section of a recipe: the blend of sources, the split, tokenizer files.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mtnlg {

struct BlendSource {
  double weight = 1.0;
  std::string prefix;
  // false: the entry has no weight. One such source alone is Megatron's unweighted
  // `--data-path PREFIX` (its own sample order, no blend surplus); data.path sets it.
  bool weighted = true;
};

struct DataConfig {
  std::vector<BlendSource> blend;
  std::string split = "969,30,1";
  std::string vocab_file;
  std::string merge_file;
  std::string cache_dir;  // "" -> <logging.dir>/index-cache
  bool mock = false;
  bool eod_mask_loss = false;
};

}  // namespace mtnlg
