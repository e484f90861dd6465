// What the curation commands need from a group of ranks, and the one rule they all use
// to stop together when a rank fails.
//
// data/ does not link the MPI layer: app/ implements RankComm over the world
// communicator (WorldRankComm in app/process/rank_job.hpp); one process uses
// SoloRankComm, a group of one, so a single process runs the same code as N ranks.
#pragma once
#include <fmt/format.h>

#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <vector>

#include "core/error.hpp"

namespace mtnlg::curation {

// Every rank calls every method in the same order.
class RankComm {
 public:
  virtual ~RankComm() = default;
  virtual int64_t rank() const = 0;
  virtual int64_t size() const = 0;
  virtual void all_reduce_sum(int64_t* v, int64_t n) = 0;
  virtual void all_reduce_max(int64_t* v, int64_t n) = 0;
  // send[q] goes to rank q (byte sizes multiples of 4); returns what every rank sent to
  // this one, concatenated in rank order.
  virtual std::vector<char> all_to_all(const std::vector<std::span<const char>>& send) = 0;
  // Set by agree() before it throws an error every rank agreed on (bad input, a failed
  // read or write). Any other exception out of a collective computation left the peers
  // inside an exchange, and the caller must abort the job rather than finalize.
  bool failure_agreed = false;
  bool failed_here = false;  // ... and this rank is the one that failed
};

// One process: collectives are no-ops, the exchange keeps what was sent to itself.
class SoloRankComm final : public RankComm {
 public:
  int64_t rank() const override { return 0; }
  int64_t size() const override { return 1; }
  void all_reduce_sum(int64_t*, int64_t) override {}
  void all_reduce_max(int64_t*, int64_t) override {}
  std::vector<char> all_to_all(const std::vector<std::span<const char>>& send) override {
    return std::vector<char>(send[0].begin(), send[0].end());
  }
};

// Thrown on a rank that learns in the middle of a phase that another rank failed: the
// phase ends there without an error of this rank's own (agree() then names the other).
struct PeerFailed {};

// Runs one phase (fn) on every rank and agrees on its outcome with one all-reduce. When
// no rank failed it returns. Otherwise every rank throws, so that none is left waiting
// in a later exchange: the failing rank its own error, the others an Error with the
// failing rank's exit code naming the lowest failing rank ("stopped because rank R
// failed <what> ..."); comm.failure_agreed and comm.failed_here are set first.
template <typename F>
void agree(RankComm& comm, const std::string& what, F&& fn) {
  std::exception_ptr err;
  int64_t code = 0;
  try {
    fn();
  } catch (const PeerFailed&) {
  } catch (const Error& e) {
    err = std::current_exception();
    code = e.exit_code();
  } catch (...) {
    err = std::current_exception();
    code = 1;
  }
  const int64_t W = comm.size(), r = comm.rank();
  int64_t v[2] = {err ? W - r : 0, err ? code : 0};  // max: the lowest failing rank; the highest exit code
  comm.all_reduce_max(v, 2);
  if (v[0] == 0) return;
  comm.failure_agreed = true;
  comm.failed_here = err != nullptr;
  if (err) std::rethrow_exception(err);
  throw Error(static_cast<int>(v[1]),
              fmt::format("stopped because rank {} failed {} (its message names the cause); no output written",
                          W - v[0], what));
}

}  // namespace mtnlg::curation
