// Loglikelihood requests as lm-evaluation-harness tokenizes and windows them
// (eval-harness.md §1.1): (context, continuation) -> token ids -> the model input
// (left-truncated to the window) and the scored continuation ids.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/eval/tasks.hpp"
#include "data/text_tokenizer.hpp"

namespace mtnlg::data::eval {

struct TokenizedPair {
  std::vector<int32_t> context, continuation;
};

// v0.3: context and continuation encoded separately; an empty context is [EOT].
// v0.4: the context's trailing whitespace moves to the continuation, continuation ids =
// encode(ctx+cont)[len(encode(ctx)):]; an empty context is [EOT].
TokenizedPair tokenize_pair(const TextTokenizer& tok, const std::string& context, const std::string& continuation,
                            HarnessVersion version);
inline TokenizedPair tokenize_pair(const Tokenizer& tok, const std::string& context, const std::string& continuation,
                                   HarnessVersion version) {
  return tokenize_pair(Gpt2TextTokenizer(std::shared_ptr<const Tokenizer>(std::shared_ptr<const Tokenizer>(), &tok)),
                       context, continuation, version);
}

struct Window {
  std::vector<int32_t> input;    // (context+continuation)[-(max_length+1):][:-1]
  std::vector<int32_t> targets;  // the continuation ids, predicted at the last |targets| inputs
  int64_t truncated = 0;         // tokens dropped from the left
};
// Throws InputError naming `what` when the continuation has no tokens or more than
// max_length (the harness asserts 1 <= len(cont) <= max_length).
Window make_window(const TokenizedPair& p, int64_t max_length, const std::string& what);

}  // namespace mtnlg::data::eval
