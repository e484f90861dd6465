// Errors. Library code throws typed exceptions; app/main catches them once and maps
// them to the exit codes of the outside contract:
//   InputError   -> exit 2  (command line, recipe, data or checkpoint fails validation)
//   RuntimeError -> exit 1  (a fault while working: I/O, a dead rank, non-finite loss...)
// The message is one line that names the place (file:line:col, field, rank) and,
// where it can, what would be valid.
#pragma once
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace mtnlg {

class Error : public std::runtime_error {
 public:
  Error(int exit_code, std::string msg) : std::runtime_error(std::move(msg)), exit_code_(exit_code) {}
  int exit_code() const { return exit_code_; }

 private:
  int exit_code_;
};

class InputError : public Error {
 public:
  explicit InputError(std::string msg) : Error(2, std::move(msg)) {}
};

class RuntimeError : public Error {
 public:
  explicit RuntimeError(std::string msg) : Error(1, std::move(msg)) {}
};

template <typename... Args>
[[noreturn]] void throw_input(fmt::format_string<Args...> f, Args&&... args) {
  throw InputError(fmt::format(f, std::forward<Args>(args)...));
}

template <typename... Args>
[[noreturn]] void throw_runtime(fmt::format_string<Args...> f, Args&&... args) {
  throw RuntimeError(fmt::format(f, std::forward<Args>(args)...));
}

// Internal invariant: a bug in mtnlg, not the user's input.
#define MTNLG_CHECK(cond, ...)                                                                     \
  do {                                                                                             \
    if (!(cond))                                                                                   \
      ::mtnlg::throw_runtime("internal check failed at {}:{}: {} ({})", __FILE__, __LINE__, #cond, \
                             ::fmt::format(__VA_ARGS__));                                          \
  } while (0)

}  // namespace mtnlg
