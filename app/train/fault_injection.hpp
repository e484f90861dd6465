// A testing aid: MTNLG_FAULT_INJECT="rank=R:iteration=I:mode=..." makes one rank fail,
// stall or compute wrong numbers at a chosen iteration, so that tests can prove what the
// trainer does then (a failing rank ends the job, the watchdog names a silent one,
// forensics tells a transient fault from a persistent one, straggler detection and the
// time explainer see a slow rank).
// mode=slow (with an optional :ms=N, default 300) makes rank R sleep N ms at the start of
// every iteration from I on: a straggler, for the straggler detection's tests.
// mode=slow_dp sleeps N ms inside rank R's data-parallel gradient reduction from I on (a
// throttled link: the sleep counts as time blocked in dp communication, in the step's
// parts and for straggler detection alike): the time explainer's tests.
// Global rank R fails at the start of iteration I (1-based): throw a RuntimeError (the
// normal error path: message, MPI_Abort), std::abort(), or raise(SIGKILL) on itself (a
// dead process with no goodbye), or raise(SIGSTOP) (a rank that stops answering, which
// only the collective watchdog ends). Tests use it to prove a failing rank ends the job.
// mode=hang makes rank R stop entering collectives of its device (NCCL) groups from
// iteration I on: its next one parks the training thread for good, while the process
// stays alive (the device watchdog's case, parallel/flight_recorder.hpp).
// mode=bitflip_grad / bitflip_param (with an optional :bit=N, default 30) flips bit N of
// the middle element of rank R's gradients (after the data-parallel reduction, in the
// step's first run only: a transient fault; under ZeRO-1 only rank R's shard is read
// after it, so a flip outside the shard changes nothing) or of its fp32 master parameters (at the
// start of iteration I); mode=poison (with :layer=L, default 0) makes the output of layer
// L (-1: the embedding) non-finite for the first micro batch of rank R at iteration I,
// in the first run and in a replay alike (a sample whose numerics blow up: persistent).
// The spike forensics' tests use them.
#pragma once
#include <cstdint>
#include <string>
#include <utility>

#include "config/recipe.hpp"
#include "core/tensor.hpp"
#include "parallel/communicator.hpp"

namespace mtnlg::app {

struct FaultInjection {
  int64_t rank = -1, iteration = -1, ms = 300, bit = 30, layer = 0;
  std::string mode;
  bool active() const { return rank >= 0; }
};

// MTNLG_FAULT_INJECT parsed; inactive when unset. InputError naming the variable when malformed.
FaultInjection fault_injection_from_env();
// The layout checked against the world (validate_layout), then MTNLG_FAULT_INJECT read:
// the trainer's set-up's first two checks.
FaultInjection checked_fault_injection(const Recipe& r, const parallel::ProcessGroups& g);

// mode=nan: from that iteration on, this rank's gradients are non-finite.
bool inject_nan(const FaultInjection& f, int64_t rank, int64_t iteration);
// mode=overflow: at that one iteration this rank's gradients are +inf (an fp16 overflow).
bool inject_overflow(const FaultInjection& f, int64_t rank, int64_t iteration);
// The modes that fire at one iteration on one rank inside the step (bitflip_*, poison).
bool inject_at(const FaultInjection& f, const char* mode, int64_t rank, int64_t iteration);
// Flips bit `bit` of the middle element of an fp32 buffer (on any device).
void flip_bit(Tensor& t, int64_t bit);
// mode=slow_dp: from that iteration on, this rank's dp reduction takes ms longer.
void inject_slow_dp(const FaultInjection& f, int64_t rank, int64_t iteration);
// At the start of an iteration: slow, sigterm/sigusr1, throw, abort, kill, stop, hang.
void maybe_inject_fault(const FaultInjection& f, int64_t rank, int64_t iteration);

// The trainer's side of MTNLG_FAULT_INJECT: one object for this rank, called at the named
// points of an iteration (1-based), each firing the modes that belong to it. A rank the
// fault is not for, or no fault, makes every point a no-op.
class FaultInjector {
 public:
  FaultInjector(FaultInjection f, int64_t rank) : f_(std::move(f)), rank_(rank) {}
  // Before the iteration's step: slow, sigterm/sigusr1, throw, abort, kill, stop.
  void iteration_start(int64_t iteration) const { maybe_inject_fault(f_, rank_, iteration); }
  // The step's start: bitflip_param flips a bit of the fp32 master parameters.
  void step_start(int64_t iteration, Tensor& params) const;
  // Inside the gradient reduction, after the backward: slow_dp.
  void dp_reduction(int64_t iteration) const { inject_slow_dp(f_, rank_, iteration); }
  // The step's reduced gradients: nan, overflow, bitflip_grad; in a forensics replay only
  // nan fires again (a persistent fault; a flipped bit is a transient one).
  void gradients(int64_t iteration, Tensor& grads, bool replay) const;
  // poison: whether this rank's layer observer must be installed, and whether layer
  // `layer`'s output at `iteration` is the one to poison (the caller picks the micro batch).
  bool poisons() const { return f_.active() && f_.mode == "poison" && f_.rank == rank_; }
  bool poisons(int64_t layer, int64_t iteration) const {
    return poisons() && layer == f_.layer && iteration == f_.iteration;
  }

 private:
  FaultInjection f_;
  int64_t rank_;
};

}  // namespace mtnlg::app
