// The environment switch table (core/switches.hpp): its order and defaults, the typed
// reads and their one-line errors, the OpenBLAS core check, the docs' table, and the rule
// that no code but the table's reads an MTNLG_* variable.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <fstream>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/blas_core.hpp"
#include "core/error.hpp"
#include "core/switches.hpp"

using namespace mtnlg;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

// Sets a variable for one scope, restoring what was there.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

std::string read(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST_CASE("switches: the table is in the order of Switch and its defaults parse", "[switches]") {
  std::set<std::string> names;
  for (const SwitchSpec& sp : switch_table()) {
    INFO(sp.name);
    CHECK(&switch_spec(sp.id) == &sp);
    CHECK(names.insert(sp.name).second);
    CHECK(std::string(sp.meaning).size() > 10);
    CHECK(std::string(sp.unset).size() > 0);
    CHECK((std::string(sp.name).starts_with("MTNLG_") || sp.use == SwitchUse::outside));
    ScopedEnv unset(sp.name, nullptr);
    if (!sp.dflt) continue;
    switch (sp.kind) {  // a default is spelt as a set value and read like one
      case SwitchKind::boolean: CHECK(switches::flag(sp.id).has_value()); break;
      case SwitchKind::integer: CHECK(switches::integer(sp.id).has_value()); break;
      case SwitchKind::number: CHECK(switches::number(sp.id).has_value()); break;
      case SwitchKind::choice:
      case SwitchKind::text: CHECK(switches::text(sp.id) == std::string(sp.dflt)); break;
    }
  }
  CHECK(switch_table().back().id == Switch::openblas_coretype);
}

TEST_CASE("switches: typed reads, defaults, and one-line errors naming the variable", "[switches]") {
  {
    ScopedEnv e("MTNLG_DEBUG", nullptr);
    CHECK_FALSE(switches::on(Switch::debug));  // the table's default
  }
  for (const char* yes : {"1", "true", "Yes", "ON"}) {
    ScopedEnv e("MTNLG_DEBUG", yes);
    CHECK(switches::on(Switch::debug));
  }
  for (const char* no : {"0", "false", "off"}) {
    ScopedEnv e("MTNLG_DEBUG", no);
    CHECK_FALSE(switches::on(Switch::debug));
  }
  {
    ScopedEnv e("MTNLG_DEBUG", "maybe");
    CHECK_THAT(error_of([] { switches::on(Switch::debug); }),
               Contains("environment variable MTNLG_DEBUG=\"maybe\": expected 1 or 0") && Contains("debug log lines"));
    CHECK_THROWS_AS(check_environment(), InputError);
  }
  {
    ScopedEnv e("MTNLG_CUDA_EXACT_ALLOC", nullptr);
    CHECK_FALSE(switches::flag(Switch::cuda_exact_alloc).has_value());  // no default: its owner decides
  }
  {
    ScopedEnv e("MTNLG_EMU_MEMORY_BYTES", nullptr);
    CHECK(switches::integer(Switch::emu_memory_bytes) == (int64_t{16} << 30));
  }
  {
    ScopedEnv e("MTNLG_EMU_MEMORY_BYTES", "12345");
    CHECK(switches::integer(Switch::emu_memory_bytes) == 12345);
  }
  for (const char* bad : {"-1", "1.5", "1e3", "12 MiB"}) {
    ScopedEnv e("MTNLG_EMU_MEMORY_BYTES", bad);
    CHECK_THAT(error_of([] { switches::integer(Switch::emu_memory_bytes); }),
               Contains("MTNLG_EMU_MEMORY_BYTES=\"" + std::string(bad) + "\": expected a whole number from 0"));
  }
  {
    ScopedEnv e("MTNLG_COLLECTIVE_TIMEOUT", "2.5");
    CHECK(switches::number(Switch::collective_timeout) == 2.5);
  }
  {
    ScopedEnv e("MTNLG_COLLECTIVE_TIMEOUT", "soon");
    CHECK_THAT(error_of([] { switches::number(Switch::collective_timeout); }),
               Contains("MTNLG_COLLECTIVE_TIMEOUT=\"soon\": expected a number from 0"));
  }
  {
    ScopedEnv e("MTNLG_EMU_LT_FAIL", "epilogues");
    CHECK(switches::text(Switch::emu_lt_fail) == "epilogues");
  }
  {
    ScopedEnv e("MTNLG_EMU_LT_FAIL", "sometimes");
    CHECK_THAT(error_of([] { switches::text(Switch::emu_lt_fail); }), Contains("expected one of 0|1|epilogues"));
  }
  {
    ScopedEnv e("MTNLG_FAULT_INJECT", "");  // empty is unset
    CHECK_FALSE(switches::raw(Switch::fault_inject).has_value());
  }
  // Asking a switch for a kind it is not is mtnlg's bug, not the user's input.
  CHECK_THROWS_AS(switches::integer(Switch::debug), RuntimeError);
}

TEST_CASE("switches: --version --verbose's list names the switches set and the MTNLG_ names no program reads",
          "[switches]") {
  ScopedEnv a("MTNLG_DEBUG", "1"), b("MTNLG_NO_SUCH_SWITCH", "x");
  const std::string d = describe_environment();
  CHECK_THAT(d, Contains("MTNLG_DEBUG=1: debug log lines"));
  CHECK_THAT(d, Contains("MTNLG_NO_SUCH_SWITCH=x (read by no mtnlg program"));
}

TEST_CASE("switches: OPENBLAS_CORETYPE naming a core this CPU cannot run is an input error", "[switches]") {
  ScopedEnv cpu("MTNLG_TEST_CPU_FEATURES", "avx,avx2,fma");  // an AVX2 CPU without AVX-512
  CHECK(cpu_has("avx2"));
  CHECK_FALSE(cpu_has("avx512f"));
  CHECK(blas_core_for_cpu() == "Haswell");
  {
    ScopedEnv core("OPENBLAS_CORETYPE", "SkylakeX");
    CHECK_THAT(
        error_of(check_blas_coretype),
        Contains("OPENBLAS_CORETYPE=SkylakeX: OpenBLAS's SkylakeX kernels need AVX-512 (F, BW, VL, DQ), which this "
                 "CPU lacks") &&
            Contains("this CPU can run Haswell: set OPENBLAS_CORETYPE=Haswell, or unset it"));
    CHECK_THROWS_AS(check_environment(), InputError);
  }
  for (const char* fine : {"Haswell", "haswell", "Sandybridge", "Prescott", "SomethingElse"}) {
    ScopedEnv core("OPENBLAS_CORETYPE", fine);
    CHECK_NOTHROW(check_blas_coretype());
  }
  {
    ScopedEnv older("MTNLG_TEST_CPU_FEATURES", "avx");  // a Sandy Bridge: no core of mtnlg's choice
    ScopedEnv core("OPENBLAS_CORETYPE", "Haswell");
    CHECK_THAT(error_of(check_blas_coretype),
               Contains("need AVX2 and FMA") && Contains("this CPU can run Sandybridge"));
  }
  {
    ScopedEnv none("MTNLG_TEST_CPU_FEATURES", "sse4_2");
    ScopedEnv core("OPENBLAS_CORETYPE", "Zen");
    CHECK_THAT(error_of(check_blas_coretype), Contains("unset it: OpenBLAS then picks a core this CPU runs"));
  }
}

// docs/OPERATIONS.md's table is this table as users read it: a row per variable, and no
// row for a variable the table does not have.
TEST_CASE("switches: docs/OPERATIONS.md has one row per switch", "[switches]") {
  const std::string doc = read(fs::path(MTNLG_SOURCE_DIR) / "docs" / "OPERATIONS.md");
  const size_t at = doc.find("## Environment switches");
  REQUIRE(at != std::string::npos);
  const std::string section = doc.substr(at, doc.find("\n## ", at + 1) - at);
  std::set<std::string> rows;
  const std::regex row(R"(\n\| `([A-Z_]+)` \|)");
  for (std::sregex_iterator it(section.begin(), section.end(), row), end; it != end; ++it) rows.insert((*it)[1].str());
  std::set<std::string> table;
  for (const SwitchSpec& sp : switch_table()) table.insert(sp.name);
  CHECK(rows == table);
}

// The rule the table stands for: no source file but core/switches.cpp reads an MTNLG_*
// variable itself.
TEST_CASE("switches: no getenv of an MTNLG_ variable outside the table", "[switches]") {
  const fs::path root(MTNLG_SOURCE_DIR);
  const std::string needle = std::string("getenv(") + "\"MTNLG_";
  std::vector<std::string> offenders;
  for (const char* dir : {"app", "config", "core", "data", "emulator", "model", "optimizer", "parallel", "planner",
                          "schedules", "scripts", "test"}) {
    for (const auto& e : fs::recursive_directory_iterator(root / dir)) {
      const std::string ext = e.path().extension().string();
      if (!e.is_regular_file() || (ext != ".cpp" && ext != ".hpp" && ext != ".cu" && ext != ".cuh" && ext != ".h"))
        continue;
      const std::string rel = fs::relative(e.path(), root).string();
      if (rel.starts_with("core/switches.") || read(e.path()).find(needle) == std::string::npos) continue;
      offenders.push_back(rel);
    }
  }
  for (const auto& f : offenders) UNSCOPED_INFO(f);
  CHECK(offenders.empty());
}
