// core/atomic_file: the one "temporary name, fsync, rename" helper. Contents arrive whole,
// no temporary file outlives a write (success, a throwing writer, or an abandoned
// AtomicFile), and a path that cannot be written is named in the error.
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "core/atomic_file.hpp"
#include "core/error.hpp"
#include "test/support/test_support.hpp"

using namespace mtnlg;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

std::string read_all(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Every name in `dir`, sorted.
std::vector<std::string> names(const fs::path& dir) {
  std::vector<std::string> n;
  for (auto& e : fs::directory_iterator(dir)) n.push_back(e.path().filename().string());
  std::sort(n.begin(), n.end());
  return n;
}

}  // namespace

TEST_CASE("atomic file: contents arrive whole and no temporary file is left", "[atomic_file]") {
  test::TempDir d("atomic");
  const std::string p = d.str() + "/out.txt";
  write_file_atomic(p, "first\n");
  CHECK(read_all(p) == "first\n");
  write_file_atomic(p, std::string("a\0b", 3));  // replaces, binary-safe
  CHECK(read_all(p) == std::string("a\0b", 3));
  write_file_atomic(p, [](AtomicFile& f) {
    f.write("x", 1);
    f.write_line("yz");
    const uint32_t v = 0x01020304;
    f.write(&v, sizeof(v));
  });
  const uint32_t v = 0x01020304;
  CHECK(read_all(p) == std::string("xyz\n") + std::string(reinterpret_cast<const char*>(&v), 4));
  CHECK(names(d.path()) == std::vector<std::string>{"out.txt"});
}

TEST_CASE("atomic file: a throwing writer leaves the old file and no temporary file", "[atomic_file]") {
  test::TempDir d("atomic-throw");
  const std::string p = d.str() + "/out.txt";
  write_file_atomic(p, "old");
  CHECK_THROWS_WITH(write_file_atomic(p,
                                      [](AtomicFile& f) {
                                        f.write("half of the new");
                                        throw std::runtime_error("writer failed");
                                      }),
                    "writer failed");
  CHECK(read_all(p) == "old");
  {
    AtomicFile f(d.str() + "/never.txt");  // abandoned without commit
    f.write("x");
    CHECK(fs::exists(f.temp_path()));
  }
  CHECK(names(d.path()) == std::vector<std::string>{"out.txt"});
}

TEST_CASE("atomic file: temporary names are unique; sync then commit is all or nothing", "[atomic_file]") {
  test::TempDir d("atomic-two");
  const std::string a = d.str() + "/x.bin", b = d.str() + "/x.idx";
  AtomicFile fa(a), fb(b), fa2(a);
  CHECK(fa.temp_path() != fa2.temp_path());
  CHECK(fs::path(fa.temp_path()).parent_path() == fs::path(a).parent_path());
  fa.write("bin");
  fb.write("idx");
  fa.sync();
  fb.sync();
  CHECK_FALSE(fs::exists(a));  // synced, not yet visible
  CHECK_FALSE(fs::exists(b));
  fa.commit();
  fb.commit();
  CHECK(read_all(a) == "bin");
  CHECK(read_all(b) == "idx");
  CHECK(fa.committed());
}

TEST_CASE("atomic file: an unwritable directory is a RuntimeError naming the path and the reason", "[atomic_file]") {
  test::TempDir d("atomic-bad");
  test::write_file(d / "afile", "x");
  const std::string under_file = d.str() + "/afile/out.txt";  // a directory that is a file
  CHECK_THROWS_AS(write_file_atomic(under_file, "x"), RuntimeError);
  CHECK_THROWS_WITH(write_file_atomic(under_file, "x"), Contains(under_file) && Contains("Not a directory"));
  const std::string missing = d.str() + "/no/such/dir/out.txt";
  CHECK_THROWS_WITH(write_file_atomic(missing, "x"), Contains(missing) && Contains("No such file or directory"));
  if (::geteuid() != 0) {  // root writes through permission bits
    fs::create_directories(d / "ro");
    fs::permissions(d / "ro", fs::perms::owner_read | fs::perms::owner_exec);
    const std::string ro = (d / "ro" / "out.txt").string();
    CHECK_THROWS_WITH(write_file_atomic(ro, "x"), Contains(ro) && Contains("Permission denied"));
    fs::permissions(d / "ro", fs::perms::owner_all);
  }
  const auto left = names(d.path());
  CHECK((left == std::vector<std::string>{"afile"} || left == std::vector<std::string>{"afile", "ro"}));
}
