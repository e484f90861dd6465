// The environment switch table and its readers (core/switches.hpp).
#include "core/switches.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "core/blas_core.hpp"
#include "core/error.hpp"
#include "core/parse.hpp"

extern char** environ;

namespace mtnlg {

namespace {

using K = SwitchKind;
using U = SwitchUse;
constexpr double kMaxInt = 9.0e18;

// In the order of `Switch` (checked by switch_spec and a test).
constexpr std::array kTable = {
    SwitchSpec{Switch::debug, "MTNLG_DEBUG", K::boolean, U::setting, "0", "off",
               "debug log lines from every rank (stderr)"},
    SwitchSpec{Switch::collective_timeout, "MTNLG_COLLECTIVE_TIMEOUT", K::number, U::setting, nullptr,
               "the recipe's parallel.distributed_timeout_minutes",
               "seconds a collective may block before the watchdog ends the job (0 = off); overrides the recipe", 0,
               1e9},
    SwitchSpec{Switch::cudnn, "MTNLG_CUDNN", K::boolean, U::setting, "1", "on where cuDNN 9 loads",
               "0: do not load cuDNN (attention_backend auto then takes the unfused form, flash is an error)"},
    SwitchSpec{Switch::gelu_epilogue, "MTNLG_GELU_EPILOGUE", K::boolean, U::setting, "1", "on",
               "0: no cuBLASLt GELU epilogues (the GEMM, then mtnlg's GELU kernels; the A/B of gpu_bench.sh)"},
    SwitchSpec{Switch::cuda_sync_check, "MTNLG_CUDA_SYNC_CHECK", K::boolean, U::setting, "0", "off",
               "synchronise the device after every kernel launch, so a fault names its launch"},
    SwitchSpec{Switch::cuda_exact_alloc, "MTNLG_CUDA_EXACT_ALLOC", K::boolean, U::setting, nullptr,
               "on under the emulated CUDA backend, off on a GPU",
               "the caching allocator keeps every block its requested size (no rounding, no splitting)"},
    SwitchSpec{Switch::nccl_watchdog, "MTNLG_NCCL_WATCHDOG", K::boolean, U::setting, "1", "on",
               "0: no device (NCCL) watchdog and flight recorder in multi-rank GPU runs (the benchmarks' A/B; the MPI "
               "watchdog stays)"},
    SwitchSpec{Switch::watchdog_addr, "MTNLG_WATCHDOG_ADDR", K::text, U::setting, nullptr,
               "127.0.0.1 when every rank is on rank 0's host, else rank 0's first non-loopback IPv4 address",
               "the IPv4 address of rank 0's host where the ranks reach the NCCL watchdog's liveness service "
               "(parallel/liveness.hpp); a bad value is exit 2, an unreachable one a warning (the watchdog goes on "
               "with the timeout alone)"},
    SwitchSpec{Switch::watchdog_stats, "MTNLG_WATCHDOG_STATS", K::boolean, U::setting, "0", "off",
               "1: each rank prints its NCCL watchdog's cost when it stops (seconds, filesystem calls, liveness "
               "messages sent and received; rank 0 also its service's): scripts/bench/watchdog_scale_bench.sh "
               "reads it"},
    SwitchSpec{Switch::fault_inject, "MTNLG_FAULT_INJECT", K::text, U::test_hook, nullptr, "none",
               "rank=R:iteration=I:mode=M (and :ms=N, :bit=N or :layer=L): one rank fails, stalls or computes wrong "
               "numbers (app/train/fault_injection.hpp)"},
    SwitchSpec{
        Switch::test_save_delay_ms, "MTNLG_TEST_SAVE_DELAY_MS", K::integer, U::test_hook, "0", "0",
        "the background checkpoint writer waits this long before its metadata (a kill then leaves a partial save)", 0,
        3.6e6},
    SwitchSpec{Switch::test_dedup_fail_write_rank, "MTNLG_TEST_DEDUP_FAIL_WRITE_RANK", K::integer, U::test_hook,
               nullptr, "none", "`data dedup`: this rank fails to write its output", 0, kMaxInt},
    SwitchSpec{Switch::test_curate_kill, "MTNLG_TEST_CURATE_KILL", K::text, U::test_hook, nullptr, "none",
               "`data curate`: the process kills itself after this stage (a resume test)"},
    SwitchSpec{Switch::test_blas_core, "MTNLG_TEST_BLAS_CORE", K::text, U::test_hook, nullptr,
               "the core OpenBLAS loaded", "pretend OpenBLAS loaded this core (core/blas_core.hpp)"},
    SwitchSpec{Switch::test_cpu_features, "MTNLG_TEST_CPU_FEATURES", K::text, U::test_hook, nullptr, "this CPU's",
               "pretend the CPU has only these vector features (comma-separated: avx, avx2, fma, avx512f, avx512bw, "
               "avx512vl, avx512dq, avx512bf16) when choosing and checking OpenBLAS's core"},
    SwitchSpec{Switch::emu_lt_fail, "MTNLG_EMU_LT_FAIL", K::choice, U::test_hook, "0", "0",
               "emulated cuBLASLt: 1 offers no algorithm (mtnlg falls back to cublasGemmEx), epilogues refuses the "
               "fused epilogues",
               0, 0, "0|1|epilogues"},
    SwitchSpec{Switch::emu_capture_fail, "MTNLG_EMU_CAPTURE_FAIL", K::boolean, U::test_hook, "0", "off",
               "emulated CUDA: every stream capture ends invalidated (as a library that synchronised inside it would "
               "leave it)"},
    SwitchSpec{Switch::emu_cudnn_fail, "MTNLG_EMU_CUDNN_FAIL", K::choice, U::test_hook, nullptr, "none",
               "emulated cuDNN: plans refuses every execution plan", 0, 0, "plans"},
    SwitchSpec{Switch::emu_nccl_fault, "MTNLG_EMU_NCCL_FAULT", K::text, U::test_hook, nullptr, "none",
               "emulated NCCL: rank=R:op=N:error=remote|system (an asynchronous error at its N-th operation) or "
               "rank=R:init=N (its N-th initialisation never joins its group)"},
    SwitchSpec{Switch::emu_threads, "MTNLG_EMU_THREADS", K::integer, U::setting, nullptr, "the CPU's threads",
               "emulated CUDA: threads that run thread blocks (clamped to 1..64)", 0, kMaxInt},
    SwitchSpec{Switch::emu_memory_bytes, "MTNLG_EMU_MEMORY_BYTES", K::integer, U::setting, "17179869184", "16 GiB",
               "emulated CUDA: the device's memory in bytes", 0, kMaxInt},
    SwitchSpec{Switch::emu_devices, "MTNLG_EMU_DEVICES", K::integer, U::setting, "1", "1",
               "emulated CUDA: devices per node (one process per device)", 0, 1024},
    SwitchSpec{Switch::emu_comm_timeout_s, "MTNLG_EMU_COMM_TIMEOUT_S", K::integer, U::setting, "300", "300",
               "emulated NCCL: seconds a collective waits for its peers before it is an error", 0, kMaxInt},
    SwitchSpec{Switch::emu_verbose, "MTNLG_EMU_VERBOSE", K::boolean, U::setting, "0", "off",
               "emulated CUDA: print every error it returns to stderr"},
    SwitchSpec{Switch::keep_tmp, "MTNLG_KEEP_TMP", K::boolean, U::test_hook, "0", "off",
               "test programs: keep their temporary directories (under the build tree)"},
    SwitchSpec{Switch::require_gpu, "MTNLG_REQUIRE_GPU", K::boolean, U::test_hook, "0", "off",
               "test programs: a [gpu] case without a CUDA device fails instead of being skipped"},
    SwitchSpec{Switch::blas_reexec, "MTNLG_BLAS_REEXEC", K::text, U::internal, nullptr, "not re-executed",
               "set for a process mtnlg re-executed with OPENBLAS_CORETYPE: the core the library chose first"},
    SwitchSpec{Switch::openblas_coretype, "OPENBLAS_CORETYPE", K::text, U::outside, nullptr,
               "OpenBLAS's choice, or mtnlg's (core/blas_core.hpp)",
               "OpenBLAS's kernel family; checked at start against this CPU (exit 2 naming the core it can run)"},
};

const SwitchSpec& spec_of(Switch s, SwitchKind k1, SwitchKind k2) {
  const SwitchSpec& sp = switch_spec(s);
  MTNLG_CHECK(sp.kind == k1 || sp.kind == k2, "switch {} read as another kind", sp.name);
  return sp;
}

// The variable's text, else the table's default; nullopt when neither.
std::optional<std::string> value_text(const SwitchSpec& sp) {
  if (auto r = switches::raw(sp.id)) return r;
  if (sp.dflt) return std::string(sp.dflt);
  return std::nullopt;
}

[[noreturn]] void bad_value(const SwitchSpec& sp, const std::string& v, const std::string& expected) {
  throw_input("environment variable {}=\"{}\": expected {}; {} is for: {}", sp.name, v, expected, sp.name, sp.meaning);
}

bool parse_flag(const SwitchSpec& sp, const std::string& v) {
  if (v == "1") return true;
  if (v == "0") return false;
  if (auto b = parse_bool(v)) return *b;
  bad_value(sp, v, "1 or 0 (or true/false, yes/no, on/off)");
}

double parse_number(const SwitchSpec& sp, const std::string& v) {
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (end == v.c_str() || *end != '\0' || !std::isfinite(x) || x < sp.lo || x > sp.hi)
    bad_value(sp, v, fmt::format("a number from {} to {}", sp.lo, sp.hi));
  return x;
}

int64_t parse_integer(const SwitchSpec& sp, const std::string& v) {
  int64_t x = 0;
  const auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (ec != std::errc() || p != v.data() + v.size() || static_cast<double>(x) < sp.lo || static_cast<double>(x) > sp.hi)
    bad_value(sp, v,
              fmt::format("a whole number from {} to {}", static_cast<int64_t>(sp.lo), static_cast<int64_t>(sp.hi)));
  return x;
}

std::string parse_choice(const SwitchSpec& sp, const std::string& v) {
  std::string_view all(sp.choices);
  for (size_t at = 0; at <= all.size();) {
    const size_t bar = std::min(all.find('|', at), all.size());
    if (all.substr(at, bar - at) == v) return v;
    at = bar + 1;
  }
  bad_value(sp, v, fmt::format("one of {}", sp.choices));
}

// Parses a set variable by its kind (InputError when malformed).
void parse_any(const SwitchSpec& sp, const std::string& v) {
  switch (sp.kind) {
    case K::boolean: parse_flag(sp, v); break;
    case K::integer: parse_integer(sp, v); break;
    case K::number: parse_number(sp, v); break;
    case K::choice: parse_choice(sp, v); break;
    case K::text: break;
  }
}

}  // namespace

std::span<const SwitchSpec> switch_table() { return kTable; }

const SwitchSpec& switch_spec(Switch s) {
  const auto i = static_cast<size_t>(s);
  MTNLG_CHECK(i < kTable.size() && kTable[i].id == s, "switch table out of order at {}", i);
  return kTable[i];
}

namespace switches {

std::optional<std::string> raw(Switch s) {
  const char* v = std::getenv(switch_spec(s).name);
  if (!v || !*v) return std::nullopt;
  return std::string(v);
}

std::optional<bool> flag(Switch s) {
  const SwitchSpec& sp = spec_of(s, K::boolean, K::boolean);
  const auto v = value_text(sp);
  if (!v) return std::nullopt;
  return parse_flag(sp, *v);
}

std::optional<int64_t> integer(Switch s) {
  const SwitchSpec& sp = spec_of(s, K::integer, K::integer);
  const auto v = value_text(sp);
  if (!v) return std::nullopt;
  return parse_integer(sp, *v);
}

std::optional<double> number(Switch s) {
  const SwitchSpec& sp = spec_of(s, K::number, K::number);
  const auto v = value_text(sp);
  if (!v) return std::nullopt;
  return parse_number(sp, *v);
}

std::optional<std::string> text(Switch s) {
  const SwitchSpec& sp = spec_of(s, K::text, K::choice);
  const auto v = value_text(sp);
  if (!v || sp.kind == K::text) return v;
  return parse_choice(sp, *v);
}

bool on(Switch s) { return flag(s).value_or(false); }

}  // namespace switches

void check_environment() {
  for (const SwitchSpec& sp : kTable)
    if (auto v = switches::raw(sp.id)) parse_any(sp, *v);
  check_blas_coretype();
}

void start_process(char** argv) {
  try {
    check_environment();
    select_blas_core(argv);
  } catch (const Error& e) {
    const char* slash = std::strrchr(argv[0], '/');
    std::fprintf(stderr, "%s: error: %s\n", slash ? slash + 1 : argv[0], e.what());
    std::exit(e.exit_code());
  }
}

std::string describe_environment() {
  std::string known, unknown;
  for (const SwitchSpec& sp : kTable)
    if (auto v = switches::raw(sp.id)) known += fmt::format("\n  {}={}: {}", sp.name, *v, sp.meaning);
  for (char** e = environ; e && *e; ++e) {
    const std::string_view kv(*e);
    if (!kv.starts_with("MTNLG_")) continue;
    const std::string_view name = kv.substr(0, kv.find('='));
    bool listed = false;
    for (const SwitchSpec& sp : kTable) listed = listed || name == sp.name;
    if (!listed) unknown += fmt::format("\n  {} (read by no mtnlg program: a typo, or a script's variable)", kv);
  }
  if (known.empty() && unknown.empty()) return "environment switches: none set (docs/OPERATIONS.md lists them)";
  return "environment switches set (docs/OPERATIONS.md lists them):" + known + unknown;
}

}  // namespace mtnlg
