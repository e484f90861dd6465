// Every environment variable mtnlg's programs read (mtnlg, the test binaries, the
// benchmarks, the emulated CUDA backend), declared in one table: its name, its kind of
// value, what it does, what unset means, and whether it is a setting, a test hook or an
// outside variable mtnlg acts on. Nothing outside core/switches.cpp calls
// getenv("MTNLG_..."): code reads a switch through the typed accessors below, which parse
// the one spelling of its kind (booleans: 1/0 or the recipe's true/false, yes/no, on/off)
// and throw InputError naming the variable and its value otherwise.
//
// check_environment(), called first by every main, reads every variable of the table
// that is set, so that a malformed value is exit 2 before any work, and checks the outside
// variables this process acts on (OPENBLAS_CORETYPE against this CPU: OpenBLAS would run
// kernels the CPU lacks and the process die of an illegal instruction). A switch is then
// read where its owner needs it, through the accessors (tests may change a variable
// between two reads: the accessors read the environment each time; owners that need one
// value for the whole run keep the first). `mtnlg --version --verbose` lists the
// variables set (describe_environment); docs/OPERATIONS.md ("Environment switches") is
// the table as users read it, checked against this one by test/core/test_switches.cpp.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>

namespace mtnlg {

enum class Switch {
  // settings
  debug,
  collective_timeout,
  cudnn,
  gelu_epilogue,
  cuda_sync_check,
  cuda_exact_alloc,
  nccl_watchdog,
  watchdog_addr,
  watchdog_stats,
  // test hooks
  fault_inject,
  test_save_delay_ms,
  test_dedup_fail_write_rank,
  test_curate_kill,
  test_blas_core,
  test_cpu_features,
  emu_lt_fail,
  emu_capture_fail,
  emu_cudnn_fail,
  emu_nccl_fault,
  // the emulated CUDA backend's device
  emu_threads,
  emu_memory_bytes,
  emu_devices,
  emu_comm_timeout_s,
  emu_verbose,
  // the test programs
  keep_tmp,
  require_gpu,
  // set by mtnlg itself
  blas_reexec,
  // outside variables mtnlg acts on
  openblas_coretype,
};

enum class SwitchKind {
  boolean,  // 1/0, true/false, yes/no, on/off (any case parse_bool takes)
  integer,  // a whole number in [lo, hi]
  number,   // a finite number in [lo, hi]
  choice,   // one of `choices` ('|'-separated)
  text,     // any text (its owner parses it further)
};

enum class SwitchUse {
  setting,    // changes what a run does or reports
  test_hook,  // makes a fault or a condition happen for a test
  internal,   // set by mtnlg for a process it starts
  outside,    // another program's variable that mtnlg acts on
};

struct SwitchSpec {
  Switch id;
  const char* name;
  SwitchKind kind;
  SwitchUse use;
  // The value unset means, in the variable's own spelling (parsed like a set value), or
  // nullptr when its owner decides (`unset` then says what it does).
  const char* dflt;
  const char* unset;         // what unset means, in words (the docs' "default" column)
  const char* meaning;       // what the variable does
  double lo = 0, hi = 0;     // integer, number: the range
  const char* choices = "";  // choice: the values
};

// The table, in the order of `Switch`.
std::span<const SwitchSpec> switch_table();
const SwitchSpec& switch_spec(Switch s);

namespace switches {

// The variable's text when set and not empty.
std::optional<std::string> raw(Switch s);
// The typed value: the variable's when set (not empty), else the table's default
// (nullopt when the table has none: the owner decides). InputError naming the variable
// when its text is not of the switch's kind; asking a switch for another kind is a bug.
std::optional<bool> flag(Switch s);
std::optional<int64_t> integer(Switch s);
std::optional<double> number(Switch s);
std::optional<std::string> text(Switch s);  // text and choice switches
// flag(s), false when neither set nor defaulted.
bool on(Switch s);

}  // namespace switches

// At the start of every main, before anything else: every variable of the table that is
// set is read (InputError on a malformed one) and OPENBLAS_CORETYPE is checked against
// this CPU (InputError naming the core this CPU can run).
void check_environment();

// First in every main (mtnlg, the test programs, the benchmarks): check_environment(),
// then select_blas_core(argv) (core/blas_core.hpp), which may re-execute the binary. An
// error is "<program>: error: <message>" on stderr and the process exits with its code.
void start_process(char** argv);

// For `mtnlg --version --verbose`: one line per variable of the table that is set
// ("NAME=value: meaning"), then the MTNLG_* variables set that no program reads (a typo, or
// a script's), or a line saying none is set.
std::string describe_environment();

}  // namespace mtnlg
