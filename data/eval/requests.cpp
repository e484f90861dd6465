// Harness tokenization and windowing of loglikelihood requests (requests.hpp).
#include "data/eval/requests.hpp"

#include "core/error.hpp"

namespace mtnlg::data::eval {

TokenizedPair tokenize_pair(const TextTokenizer& tok, const std::string& context, const std::string& continuation,
                            HarnessVersion version) {
  TokenizedPair p;
  if (version == HarnessVersion::v0_3 || context.empty()) {
    if (context.empty())
      p.context = {tok.eod()};
    else
      p.context = tok.encode(context);
    p.continuation = tok.encode(continuation);
    return p;
  }
  auto ws = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; };
  size_t keep = context.size();
  while (keep > 0 && ws(context[keep - 1])) --keep;
  const std::string ctx = context.substr(0, keep);
  const std::string cont = context.substr(keep) + continuation;
  std::vector<int32_t> whole = tok.encode(ctx + cont);
  if (ctx.empty()) {
    p.context = {tok.eod()};
    p.continuation = whole;
    return p;
  }
  p.context = tok.encode(ctx);
  const size_t n = std::min(p.context.size(), whole.size());
  p.continuation.assign(whole.begin() + static_cast<std::ptrdiff_t>(n), whole.end());
  return p;
}

Window make_window(const TokenizedPair& p, int64_t max_length, const std::string& what) {
  const int64_t cont = static_cast<int64_t>(p.continuation.size());
  if (cont < 1) throw_input("{}: the continuation has no tokens (the harness requires at least one)", what);
  if (cont > max_length)
    throw_input("{}: the continuation has {} tokens, more than the {}-token window", what, cont, max_length);
  std::vector<int32_t> all = p.context;
  all.insert(all.end(), p.continuation.begin(), p.continuation.end());
  Window w;
  const int64_t n = static_cast<int64_t>(all.size());
  const int64_t start = std::max<int64_t>(0, n - (max_length + 1));
  w.truncated = start;
  w.input.assign(all.begin() + start, all.end() - 1);
  w.targets = p.continuation;
  return w;
}

}  // namespace mtnlg::data::eval
