// Metrics and standard errors as lm-evaluation-harness v0.3 computes them
// (eval-harness.md §2): acc / acc_norm from summed log-probabilities, LAMBADA acc and
// per-word perplexity, mean stderr sqrt(sum (x-mu)^2/(n-1))/sqrt(n), and the
// perplexity bootstrap (chunks of 1000 replicates, chunk c drawn with Random(c)).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mtnlg::data::eval {

double mean(const std::vector<double>& xs);
double sample_stddev(const std::vector<double>& xs);  // NaN when n < 2
double mean_stderr(const std::vector<double>& xs);    // NaN when n < 2
double perplexity(const std::vector<double>& lls);    // exp(-mean)
// The harness's bootstrap_stderr(perplexity, lls, iters): iters/min(1000,iters) chunks,
// chunk c uses Random(c).choices(lls, k=n) per replicate; stddev of the replicates.
// Deterministic; chunks run in parallel.
double bootstrap_perplexity_stderr(const std::vector<double>& lls, int64_t iters);

// np.argmax: the first maximum.
int64_t argmax(const std::vector<double>& xs);
// acc_norm's score: ll_i / len(choice_i) in code points.
std::vector<double> length_normalized(const std::vector<double>& lls, const std::vector<std::string>& choices);

}  // namespace mtnlg::data::eval
