// What the bad-input tests share (docs/RELIABILITY.md: bad input is exit 2 with one line
// naming the file, key or rank): the check of a run that must have refused its input, and
// the small recipe the recipe and command tests start from.
#pragma once
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "test/support/test_support.hpp"

namespace mtnlg::test {

enum class ErrorLines { one, any };

// Exit 2 and every phrase in the output; with ErrorLines::one, no more than the error's
// line (and mtnlg's own name line) is printed: one error, not a stack of them.
inline void expect_exit2(const RunResult& r, std::initializer_list<const char*> phrases,
                         ErrorLines lines = ErrorLines::any) {
  INFO(r.out);
  CHECK(r.exit_code == 2);
  for (const char* p : phrases) CHECK_THAT(r.out, Catch::Matchers::Contains(p));
  if (lines == ErrorLines::one) CHECK(std::count(r.out.begin(), r.out.end(), '\n') <= 2);
}

// A two-layer GPT on mock data, parsed and trained in a blink.
inline std::string tiny_recipe_yaml(int64_t train_iters) {
  return "model:\n  num_layers: 2\n  hidden_size: 32\n  num_attention_heads: 4\n  seq_length: 16\n  vocab_size: 100\n"
         "  make_vocab_size_divisible_by: 8\ntraining:\n  micro_batch_size: 2\n  global_batch_size: 8\n  "
         "train_iters: " +
         std::to_string(train_iters) + "\ndata:\n  mock: true\n";
}

}  // namespace mtnlg::test
