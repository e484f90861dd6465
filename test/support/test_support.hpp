// Helpers shared by the Catch2 tests: temporary directories, running the mtnlg binary,
// and tolerance checks (one documented metric: |a-b| <= atol + rtol*|ref|).
#pragma once
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace mtnlg::test {

// A fresh directory under the build tree, removed on destruction unless MTNLG_KEEP_TMP=1.
class TempDir {
 public:
  explicit TempDir(const std::string& tag);
  ~TempDir();
  const std::filesystem::path& path() const { return path_; }
  std::string str() const { return path_.string(); }
  std::filesystem::path operator/(const std::string& rel) const { return path_ / rel; }

 private:
  std::filesystem::path path_;
};

struct RunResult {
  int exit_code = -1;
  std::string out;  // stdout and stderr together
};

// Runs a shell command line (through /bin/sh), capturing output.
RunResult run_command(const std::string& cmdline);
// Runs the mtnlg binary with the given argument string.
RunResult run_mtnlg(const std::string& args);
// "sh SOURCE/test/support/mpi/mpirun.sh NP " (the container-safe mpirun flags), for command lines.
std::string mpirun(int np);
// `ENV mtnlg train RECIPE --quiet --set logging.dir=LOGDIR SETS`, plainly when np == 1,
// else under mpirun(np). `env` ("VAR=value ...") is prepended to the command line. The
// command line and its output are attached to the test's next assertion (UNSCOPED_INFO
// is the caller's choice: this helper does not depend on Catch).
RunResult run_train(const std::string& recipe, const std::string& logdir, const std::string& sets, int np = 1,
                    const std::string& env = "");
// The command line run_train runs (for messages).
std::string train_command(const std::string& recipe, const std::string& logdir, const std::string& sets, int np = 1,
                          const std::string& env = "");

std::string source_dir();
std::string binary_dir();
std::string python();  // Debian python3 with torch/numpy
bool python_has(const std::string& module);

void write_file(const std::filesystem::path& p, const std::string& text);
// The `loss` of every training row of RUN_DIR/metrics.jsonl, in order (validation and
// test records, which have no `loss`, are skipped).
// The training iterations' records of RUN_DIR/metrics.jsonl (those with a loss; not
// the validation/test records).
std::vector<nlohmann::json> read_iteration_records(const std::filesystem::path& run_dir);
std::vector<double> read_losses(const std::filesystem::path& run_dir);
std::string read_file(const std::filesystem::path& p);

}  // namespace mtnlg::test
