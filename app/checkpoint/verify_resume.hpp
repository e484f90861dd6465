// `mtnlg checkpoint verify-resume`: proves on a user's own checkpoint that it resumes
// under another layout with the same losses. Runs K iterations from the checkpoint under
// layout A and under layout B (each a child `mtnlg train` of this binary, through the
// launcher when it has more than one process), each with its own logging and checkpoint
// directories under the work directory, then compares their metrics.jsonl row by row.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mtnlg::app {

// One side of the comparison: "tp=2,pp=2,dp=2,zero1=1,sp=1". tp, pp and dp default to 1;
// zero1 (parallel.use_distributed_optimizer) and sp (parallel.sequence_parallel) are left
// as the recipe and --set have them unless given.
struct VerifyLayout {
  int64_t tp = 1, pp = 1, dp = 1, cp = 1;
  int64_t ep = 0;           // expert_model_parallel_size; 0: as the recipe says
  int zero1 = -1, sp = -1;  // -1: as the recipe says
  int64_t world() const { return tp * cp * pp * dp; }
  // The --set overrides that select this layout.
  std::vector<std::string> sets() const;
};

// InputError naming `option` and the bad entry.
VerifyLayout parse_verify_layout(const std::string& text, const std::string& option);

struct VerifyResumeOptions {
  std::string checkpoint;  // root (its `latest`) or iteration directory
  std::string recipe;
  std::string layout_a = "tp=1,pp=1,dp=1", layout_b;
  int64_t iters = 5;
  std::vector<std::string> sets;            // applied to both runs, before the layout's
  std::string launcher = "mpirun -np {n}";  // {n} = tp x pp x dp; unused for one process
  double tolerance = 1e-6;                  // on |A-B| / max(|A|,|B|), loss and grad norm
  std::string work_dir;                     // empty: a fresh directory under $TMPDIR
};

// Prints the per-iteration table and the largest differences. Returns normally when
// every iteration is within the tolerance; RuntimeError (exit 1) naming the first one
// that is not, or a run that failed; InputError (exit 2) for a missing or incompatible
// checkpoint, a bad layout or option, before any run starts.
void verify_resume(const VerifyResumeOptions& o);

}  // namespace mtnlg::app
