// The data commands under mpirun/srun (world > 1): the ranks' communicator as the
// curation::RankComm that data/ uses, and RankJob, the frame of a command that splits
// its input across ranks into part files that rank 0 joins (preprocess, quality
// filter/score, decontaminate). Failures are agreed with curation::agree (one rule for
// every data command, dedup and quality train included): a failing rank never leaves
// the others waiting, every rank deletes its own part files, the failing rank prints
// its error (it names file:line), the others name the rank, and all exit with its code.
#pragma once
#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "core/error.hpp"
#include "core/log.hpp"
#include "core/progress.hpp"
#include "data/curation/ranks.hpp"
#include "parallel/communicator.hpp"

namespace mtnlg::app {

// After every rank agreed that a rank failed: the failing rank (own) prints `msg` before
// a barrier, the others after it (so mpirun cannot kill the failing rank before its
// message is out); then MPI is finalized and every rank exits with `code`.
[[noreturn]] void exit_agreed_failure(parallel::Communicator& world, const std::string& msg, int code, bool own);

// curation::RankComm over the world communicator. all_to_all: the W x W matrix of byte
// counts is all-reduced, then every rank posts a nonblocking send to each peer and
// receives from the peers in rank order (payloads travel as int32 words).
class WorldRankComm final : public curation::RankComm {
 public:
  explicit WorldRankComm(std::shared_ptr<parallel::Communicator> w) : w_(std::move(w)) {}
  int64_t rank() const override { return w_->rank(); }
  int64_t size() const override { return w_->size(); }
  void all_reduce_sum(int64_t* v, int64_t n) override { w_->all_reduce(v, n, parallel::ReduceOp::sum); }
  void all_reduce_max(int64_t* v, int64_t n) override { w_->all_reduce(v, n, parallel::ReduceOp::max); }
  std::vector<char> all_to_all(const std::vector<std::span<const char>>& send) override;
  parallel::Communicator& world() { return *w_; }

 private:
  std::shared_ptr<parallel::Communicator> w_;
};

// Runs fn(comm) on every rank (fn agrees on its failures with curation::agree, as
// run_dedup and train_quality do), then finalizes MPI. An agreed failure ends every rank
// through exit_agreed_failure with its code; any other exception happened inside an
// exchange the peers are waiting in (disk full while spilling, out of memory), so this
// rank prints its error and aborts the whole job (MPI_Abort, exit 1).
template <typename F>
auto run_on_ranks(const parallel::LaunchInfo& info, F&& fn) {
  auto world = parallel::init_world(info);
  log::context().rank = static_cast<int>(world->rank());
  log::context().world = static_cast<int>(world->size());
  WorldRankComm comm(world);
  try {
    auto result = fn(comm);
    parallel::finalize_world();
    return result;
  } catch (const std::exception& e) {
    const auto* err = dynamic_cast<const Error*>(&e);
    if (comm.failure_agreed) exit_agreed_failure(*world, e.what(), err ? err->exit_code() : 1, comm.failed_here);
    std::fprintf(stderr, "mtnlg: error on rank %d: %s (aborting all ranks)\n", static_cast<int>(world->rank()),
                 e.what());
    parallel::abort_world(err ? err->exit_code() : 1);
  }
  std::abort();  // not reached: both branches end the process
}

// The frame of every data command that runs in one process or on every rank of an
// mpirun/srun job: `one()` in a single process, `several(info)` on every rank when the
// launcher started more than one. With `report`, report(result, ranks) then prints the
// command's summary once: in the single process (ranks = 1) or on rank 0 (ranks = the
// world size).
template <typename One, typename Several>
void one_or_several_ranks(One&& one, Several&& several) {
  const parallel::LaunchInfo info = parallel::detect_launch();
  if (info.world_size > 1)
    several(info);
  else
    one();
}
template <typename One, typename Several, typename Report>
void one_or_several_ranks(One&& one, Several&& several, Report&& report) {
  const parallel::LaunchInfo info = parallel::detect_launch();
  if (info.world_size > 1) {
    const auto result = several(info);
    if (info.rank == 0) report(result, info.world_size);
  } else {
    report(one(), int64_t{1});
  }
}

class RankJob {
 public:
  // `output`: the output path (or prefix) whose parts are OUTPUT.part<r>of<N>.
  RankJob(const parallel::LaunchInfo& info, std::string output);
  std::string part(int64_t q) const { return fmt::format("{}.part{}of{}", output_, q, W); }

  // Runs one phase on every rank and agrees on its outcome (curation::agree); on a
  // failure every rank deletes own_files and exits (exit_agreed_failure).
  template <typename F>
  void step(F&& fn, const std::string& what) {
    try {
      curation::agree(comm_, what, std::forward<F>(fn));
    } catch (...) {
      fail(std::current_exception());
    }
  }

  // What rank 0's progress line shows while step_with_progress runs: `done` (and
  // `secondary`, e.g. tokens, when set) summed over the ranks, out of `total` (<= 0:
  // unknown, no ETA). The counters are incremented by the worker thread.
  struct ProgressSpec {
    ProgressSpec(std::string label_, int64_t total_, std::string unit_, std::atomic<int64_t>* done_, bool show_)
        : label(std::move(label_)), total(total_), unit(std::move(unit_)), done(done_), show(show_) {}
    std::string label;
    int64_t total;
    std::string unit;
    std::atomic<int64_t>* done;
    bool show;
    std::string secondary_unit;
    std::atomic<int64_t>* secondary = nullptr;
  };

  // Runs fn (no MPI inside, but see on_main_thread) on a helper thread as one step,
  // while this, the main, thread all-reduces the ranks' counters about once a second for
  // rank 0's progress line (MPI calls stay on the main thread).
  template <typename F>
  void step_with_progress(F&& fn, const std::string& what, const ProgressSpec& spec) {
    step([&] { run_with_progress(std::function<void()>(std::forward<F>(fn)), spec); }, what);
  }

  // From inside step_with_progress's fn (the helper thread): runs `collective` on the
  // main thread once every rank has asked for it (in the same round of the progress
  // loop), e.g. an all-reduce between two passes. Throws curation::PeerFailed when
  // another rank ended its fn (failed) before asking, so the call never hangs.
  void on_main_thread(const std::function<void()>& collective);

  // Lines and documents before this rank's range of `input` (its line-aligned byte
  // range [begin, end)), from the all-reduced counts of every range.
  void count_share(const std::string& input, int64_t& begin, int64_t& end, int64_t& lines_before,
                   int64_t* documents_before, int64_t* documents_total = nullptr);

  // Rank 0: the parts in rank order into OUTPUT (through a temporary name).
  void join_parts() const;

  // The last step: rank 0 runs fn (joins the parts, writes the report); the parts of
  // every rank (OUTPUT.part<q>of<N> + each of `suffixes`) are deleted afterwards on rank
  // 0 whether fn succeeded or not (the ranks' own parts on failure elsewhere: step()).
  template <typename F>
  void join_on_rank0(const std::vector<std::string>& suffixes, F&& fn) {
    step(
        [&] {
          if (r != 0) return;
          struct Cleanup {
            const RankJob& j;
            const std::vector<std::string>& suffixes;
            ~Cleanup() {
              for (int64_t q = 0; q < j.W; ++q)
                for (const auto& s : suffixes) RankJob::remove_file(j.part(q) + s);
            }
          } cleanup{*this, suffixes};
          fn();
        },
        "joining the parts");
  }

  static void remove_file(const std::string& f);

  std::shared_ptr<parallel::Communicator> world;
  int64_t W, r;
  std::vector<std::string> own_files;  // deleted on this rank when any rank fails

 private:
  [[noreturn]] void fail(std::exception_ptr e);
  void run_with_progress(const std::function<void()>& fn, const ProgressSpec& spec);

  WorldRankComm comm_;
  std::string output_;
  // on_main_thread's hand-over between the helper thread and the main thread.
  std::mutex m_;
  std::condition_variable cv_;
  const std::function<void()>* request_ = nullptr;  // set while the helper waits
  bool served_ = false, peer_failed_ = false;
  std::exception_ptr request_error_;
};

}  // namespace mtnlg::app
