// Real Slurm, one machine: scripts/slurm-local/start.sh brings up munged + slurmctld +
// slurmd on loopback, `srun -n 8 --mpi=pmix mtnlg train` runs tp2 x pp2 x dp2 with
// Open MPI wired up by Slurm's PMIx server (no mpirun), and the losses must equal the
// single-process run's. The daemons are stopped by pid (stop.sh) by an RAII guard, so
// a failing REQUIRE still cleans up; every command runs under `timeout`.
// Needs root and Debian's slurm-wlm + munge; without them the case only warns.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "test/support/test_support.hpp"

using namespace mtnlg;

namespace {

class LocalSlurm {
 public:
  LocalSlurm() {
    // A short path: munge's unix socket lives in it (108-byte limit on socket paths).
    state_ = "/tmp/mtnlg-slurm-test-" + std::to_string(::getpid());
    port_ = 20000 + 2 * (::getpid() % 5000);
    auto r = test::run_command("MTNLG_SLURM_PORT=" + std::to_string(port_) + " timeout -k 5 60 " + script("start.sh") +
                               " " + state_);
    started_ = r.exit_code == 0;
    log_ = r.out;
  }
  ~LocalSlurm() { test::run_command("timeout -k 5 60 " + script("stop.sh") + " " + state_ + " --purge"); }
  LocalSlurm(const LocalSlurm&) = delete;
  LocalSlurm& operator=(const LocalSlurm&) = delete;

  bool started() const { return started_; }
  const std::string& log() const { return log_; }
  std::string conf() const { return state_ + "/slurm.conf"; }
  std::string daemon_logs() const {
    return test::run_command("tail -n 30 " + state_ + "/slurmctld.log " + state_ + "/slurmd.log").out;
  }

 private:
  static std::string script(const char* name) { return test::source_dir() + "/scripts/slurm-local/" + name; }
  std::string state_, log_;
  int port_ = 0;
  bool started_ = false;
};

bool have_slurm() {
  return ::geteuid() == 0 &&
         test::run_command("command -v slurmctld && command -v slurmd && command -v munged && command -v srun")
                 .exit_code == 0;
}

}  // namespace

TEST_CASE("srun -n 8 (tp2 x pp2 x dp2) on a local Slurm reproduces the single-process losses", "[mpi][slurm]") {
  if (!have_slurm()) {
    WARN("skipped: needs root and slurm-wlm + munge (scripts/install-deps.sh)");
    return;
  }
  const std::string recipe = test::source_dir() + "/recipes/tiny-ramp.yaml";
  test::TempDir ref_dir("slurm-ref"), run_dir("slurm-run");
  auto ref = test::run_command("timeout -k 5 120 " + std::string(MTNLG_BINARY) + " train " + recipe +
                               " --quiet --set training.num_threads=1 --set logging.dir=" + ref_dir.str());
  INFO(ref.out);
  REQUIRE(ref.exit_code == 0);
  const auto want = test::read_losses(ref_dir.path());
  REQUIRE(want.size() == 10);

  LocalSlurm slurm;
  INFO("start.sh: " << slurm.log());
  REQUIRE(slurm.started());
  // Open MPI inside the tasks: the same transport settings as test/support/mpi/mpirun.sh
  // (shared memory without CMA single-copy, no network probing); srun exports them.
  // yield_when_idle: 8 ranks share 2 cores, and without mpirun --oversubscribe Open MPI
  // busy-polls, which made each iteration ~100x slower (2 s instead of 20 ms).
  const std::string env =
      "SLURM_CONF=" + slurm.conf() +
      " OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_pml=ob1 OMPI_MCA_osc=^ucx"
      " OMPI_MCA_mpi_yield_when_idle=1"
      " OMPI_MCA_oob_tcp_if_include=lo OMPI_MCA_btl_tcp_if_include=lo";
  const std::string cmd = env + " timeout -k 10 240 srun -n 8 --mpi=pmix --kill-on-bad-exit=1 " + MTNLG_BINARY +
                          " train " + recipe +
                          " --quiet --set training.num_threads=1 --set parallel.tensor_model_parallel_size=2"
                          " --set parallel.pipeline_model_parallel_size=2 --set logging.dir=" +
                          run_dir.str();
  auto run = test::run_command(cmd);
  INFO(cmd << "\nexit " << run.exit_code << "\n" << run.out << "\n" << slurm.daemon_logs());
  REQUIRE(run.exit_code == 0);
  const auto got = test::read_losses(run_dir.path());
  REQUIRE(got.size() == want.size());
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::fabs(got[i] - want[i]) / std::fabs(want[i]));
  INFO("worst relative loss difference " << worst);
  CHECK(worst <= 1e-5);
  CHECK(want.back() < want.front());
}
