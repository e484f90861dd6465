// Refusals apart from bugs. A `Refused` is what a library or the runtime may legitimately
// decline: a stream capture (the runtime's capture errors, work that cannot be captured),
// a cuDNN plan, a cuBLASLt heuristic. Only a caller that has another way to do the work
// catches it — the eager step for a capture (app/train/micro_batch_graphs.cpp), the
// unfused attention for a plan (model/gpt.cpp through ops::attention_lse_supported) — and
// it is a RuntimeError (exit 1) where nobody does. An internal check (MTNLG_CHECK) or any
// other RuntimeError is never a Refused: it always ends the run.
#pragma once
#include "core/error.hpp"

namespace mtnlg {

class Refused : public RuntimeError {
 public:
  explicit Refused(std::string msg) : RuntimeError(std::move(msg)) {}
};

template <typename... Args>
[[noreturn]] void throw_refused(fmt::format_string<Args...> f, Args&&... args) {
  throw Refused(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace mtnlg
