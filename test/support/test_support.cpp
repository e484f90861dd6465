#include "test/support/test_support.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/switches.hpp"

namespace mtnlg::test {

TempDir::TempDir(const std::string& tag) {
  static std::atomic<int> counter{0};
  path_ = std::filesystem::path(MTNLG_BINARY_DIR) / "test-tmp" /
          (tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
  std::filesystem::remove_all(path_);
  std::filesystem::create_directories(path_);
}

TempDir::~TempDir() {
  if (!switches::on(Switch::keep_tmp)) {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
}

RunResult run_command(const std::string& cmdline) {
  RunResult r;
  std::string full = cmdline + " 2>&1";
  FILE* p = ::popen(full.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

RunResult run_mtnlg(const std::string& args) { return run_command(std::string(MTNLG_BINARY) + " " + args); }

std::string source_dir() { return MTNLG_SOURCE_DIR; }
std::string binary_dir() { return MTNLG_BINARY_DIR; }
std::string python() { return MTNLG_PYTHON; }

bool python_has(const std::string& module) {
  return run_command(python() + " -c 'import " + module + "'").exit_code == 0;
}

void write_file(const std::filesystem::path& p, const std::string& text) {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream f(p, std::ios::binary);
  f << text;
}

std::string mpirun(int np) { return "sh " + source_dir() + "/test/support/mpi/mpirun.sh " + std::to_string(np) + " "; }

std::string train_command(const std::string& recipe, const std::string& logdir, const std::string& sets, int np,
                          const std::string& env) {
  const std::string launcher = np == 1 ? std::string(MTNLG_BINARY) : mpirun(np) + MTNLG_BINARY;
  return env + " " + launcher + " train " + recipe + " --quiet --set logging.dir=" + logdir + " " + sets;
}

RunResult run_train(const std::string& recipe, const std::string& logdir, const std::string& sets, int np,
                    const std::string& env) {
  return run_command(train_command(recipe, logdir, sets, np, env));
}

std::vector<nlohmann::json> read_iteration_records(const std::filesystem::path& run_dir) {
  std::vector<nlohmann::json> out;
  std::ifstream f(run_dir / "metrics.jsonl");
  for (std::string line; std::getline(f, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) out.push_back(std::move(j));  // not the validation/test records
  }
  return out;
}

std::vector<double> read_losses(const std::filesystem::path& run_dir) {
  std::vector<double> out;
  for (const auto& j : read_iteration_records(run_dir)) out.push_back(j["loss"].get<double>());
  return out;
}

std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace mtnlg::test
