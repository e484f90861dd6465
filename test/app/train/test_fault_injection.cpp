// The testing aid MTNLG_FAULT_INJECT (app/train/fault_injection.hpp): what it reads, the
// one-line errors naming the variable when it is malformed, and when each mode fires.
// (What the trainer does when it fires: test_reliability.cpp, test_forensics.cpp.)
#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>

#include "app/train/fault_injection.hpp"
#include "core/error.hpp"

using namespace mtnlg;
using Catch::Matchers::Contains;

namespace {
app::FaultInjection parsed(const char* spec) {
  ::setenv("MTNLG_FAULT_INJECT", spec, 1);
  app::FaultInjection f = app::fault_injection_from_env();
  ::unsetenv("MTNLG_FAULT_INJECT");
  return f;
}
std::string error_of(const char* spec) {
  try {
    parsed(spec);
  } catch (const InputError& e) {
    ::unsetenv("MTNLG_FAULT_INJECT");
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("fault injection: the variable read, its errors, when each mode fires", "[fault]") {
  ::unsetenv("MTNLG_FAULT_INJECT");
  CHECK_FALSE(app::fault_injection_from_env().active());
  const app::FaultInjection f = parsed("rank=1:iteration=5:mode=bitflip_grad:bit=7");
  CHECK(f.active());
  CHECK(f.rank == 1);
  CHECK(f.iteration == 5);
  CHECK(f.mode == "bitflip_grad");
  CHECK(f.bit == 7);
  CHECK(app::inject_at(f, "bitflip_grad", 1, 5));
  CHECK_FALSE(app::inject_at(f, "bitflip_grad", 1, 6));  // one iteration only
  CHECK_FALSE(app::inject_at(f, "bitflip_grad", 0, 5));  // one rank only
  CHECK(parsed("rank=0:iteration=2:mode=poison:layer=-1").layer == -1);
  const app::FaultInjection nan = parsed("rank=0:iteration=3:mode=nan");
  CHECK_FALSE(app::inject_nan(nan, 0, 2));
  CHECK(app::inject_nan(nan, 0, 3));
  CHECK(app::inject_nan(nan, 0, 9));  // from that iteration on
  const app::FaultInjection ovf = parsed("rank=0:iteration=3:mode=overflow");
  CHECK(app::inject_overflow(ovf, 0, 3));
  CHECK_FALSE(app::inject_overflow(ovf, 0, 4));  // that one iteration
  CHECK(parsed("rank=2:iteration=1:mode=slow").ms == 300);

  CHECK_THAT(error_of("rank=1:iteration=5"), Contains("MTNLG_FAULT_INJECT=\"rank=1:iteration=5\"") &&
                                                 Contains("rank, iteration (>= 1) and mode are all required"));
  CHECK_THAT(error_of("rank=1:iteration=5:mode=explode"), Contains("unknown mode 'explode'"));
  CHECK_THAT(error_of("rank=x:iteration=5:mode=throw"), Contains("'x' is not a whole number"));
  CHECK_THAT(error_of("rank=1:iteration=5:mode=bitflip_param:bit=40"), Contains("not a bit of a 32-bit float"));
  CHECK_THAT(error_of("rank=1:when=5:mode=throw"), Contains("unknown key 'when'"));
  CHECK_THAT(error_of("rank:1"), Contains("'rank' is not key=value"));
  CHECK_NOTHROW(app::maybe_inject_fault(parsed("rank=3:iteration=2:mode=throw"), 0, 2));  // another rank: nothing
  CHECK_THROWS_AS(app::maybe_inject_fault(parsed("rank=0:iteration=2:mode=throw"), 0, 2), RuntimeError);
}
