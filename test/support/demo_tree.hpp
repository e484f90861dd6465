// A directory laid out like the repository for commands that take the README's relative
// paths: recipes/, test/ and third_party/ linked to the sources, and demo-data/ made by
// scripts/make-demo-corpus.sh with the binary under test (MTNLG_BINARY, the test
// folders' compile definition). Returns the corpus script's run.
#pragma once
#include <filesystem>
#include <string>

#include "test/support/test_support.hpp"

namespace mtnlg::test {

inline RunResult make_demo_tree(const std::filesystem::path& dir) {
  for (const char* d : {"recipes", "test", "third_party"})
    std::filesystem::create_directory_symlink(source_dir() + "/" + d, dir / d);
  return run_command(source_dir() + "/scripts/make-demo-corpus.sh " + (dir / "demo-data").string() + " " +
                     MTNLG_BINARY + " 2>&1");
}

}  // namespace mtnlg::test
