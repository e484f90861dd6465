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

}  // namespace mtnlg::app
