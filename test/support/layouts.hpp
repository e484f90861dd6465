// The parallel layouts the tests run, one catalogue: a name, the number of ranks, and the
// `--set` options that make it (fp32 tests and bf16 ones, validation, the planner's memory
// check all pick from here by name, so a layout means the same thing in every file).
#pragma once
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

namespace mtnlg::test {

struct Layout {
  std::string name;
  int np = 1;        // ranks: tp x cp x pp x dp
  std::string sets;  // "--set parallel.... --set ..." ("" for the recipe's own layout)
};

// Every layout of the catalogue, in its order.
const std::vector<Layout>& all_layouts();
// The named layouts, in the order given. An unknown name throws std::invalid_argument.
std::vector<Layout> layouts(std::initializer_list<std::string_view> names);

}  // namespace mtnlg::test
