#include "app/process/preflight.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "app/process/recipe_tokenizer.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "model/checkpoint.hpp"

namespace mtnlg::app {

namespace fs = std::filesystem;

namespace {

// Writes `n` bytes fully, or returns errno.
int write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return 0;
}

// Creates, writes, syncs and removes `probe`; "" or the reason it failed.
std::string probe_write(const std::string& probe) {
  int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return std::strerror(errno);
  // A few KiB, so that a disk with no free blocks fails here rather than later.
  std::string block(4096, 'x');
  int err = write_all(fd, block.data(), block.size());
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  ::close(fd);
  ::unlink(probe.c_str());
  return err ? std::strerror(err) : "";
}

}  // namespace

void check_writable_dir(const std::string& dir, const std::string& key) {
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec)) throw_input("{} {}: exists and is not a directory", key, dir);
  fs::create_directories(dir, ec);
  if (ec) throw_input("{} {}: cannot create the directory: {}", key, dir, ec.message());
  const std::string why = probe_write((fs::path(dir) / (".mtnlg-write-test." + std::to_string(::getpid()))).string());
  if (!why.empty()) throw_input("{} {}: cannot write there: {}", key, dir, why);
}

void check_writable_file(const std::string& path, const std::string& what) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw_input("{} {}: is a directory, expected a file name", what, path);
  fs::path parent = fs::path(path).parent_path();
  if (parent.empty()) parent = ".";
  if (!fs::is_directory(parent, ec)) throw_input("{} {}: directory {} does not exist", what, path, parent.string());
  const std::string why = probe_write(path + ".mtnlg-write-test." + std::to_string(::getpid()));
  if (!why.empty()) throw_input("{} {}: cannot write there: {}", what, path, why);
}

void write_file_checked(const std::string& path, const std::string& text, const std::string& key) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  int err = fd < 0 ? errno : write_all(fd, text.data(), text.size());
  if (fd >= 0 && err == 0 && ::fsync(fd) != 0 && errno != EINVAL) err = errno;  // EINVAL: a device
  if (fd >= 0 && ::close(fd) != 0 && err == 0) err = errno;
  if (err != 0)
    throw_runtime("{}: write failed ({} {}): {}", path, key, fs::path(path).parent_path().string(), std::strerror(err));
}

void throw_write_failed(const std::string& file, const std::string& key) {
  // errno from the failed write is the best account there is of why.
  throw_runtime("{}: write failed ({}): {}", file, key, errno ? std::strerror(errno) : "I/O error");
}

CheckpointRootLock::CheckpointRootLock(const std::string& root, const std::string& key) {
  const std::string path = root + "/.lock";
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw_input("{} {}: cannot create the lock file {}: {}", key, root, path, std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char buf[32] = {};
    ssize_t n = ::pread(fd_, buf, sizeof(buf) - 1, 0);
    std::string holder = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    ::close(fd_);
    fd_ = -1;
    if (err == EWOULDBLOCK)
      throw_input(
          "{} {}: another run is writing to this checkpoint root (it holds {}{}); two runs on one root "
          "would overwrite each other's checkpoints",
          key, root, path, holder.empty() ? "" : ", pid " + holder);
    throw_input("{} {}: cannot lock {}: {}", key, root, path, std::strerror(err));
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) == 0) (void)!::pwrite(fd_, pid.data(), pid.size(), 0);
}

CheckpointRootLock::~CheckpointRootLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

std::unique_ptr<CheckpointRootLock> claim_new_checkpoint_root(const std::string& root, const std::string& key) {
  check_writable_dir(root, key);
  auto lock = std::make_unique<CheckpointRootLock>(root, key);
  std::error_code ec;
  auto its = model::ckpt::committed_iterations(root);
  if (fs::exists(root + "/latest", ec) || !its.empty())
    throw_input(
        "{} {}: already holds checkpoints{}; writing another there would move its `latest`: choose a new or "
        "empty directory",
        key, root, its.empty() ? "" : " (newest " + model::ckpt::iteration_dir(root, its.back()) + ")");
  return lock;
}

namespace {

// Does checkpoint.load continue from the checkpoints in `root`?
bool loads_from(const std::string& load, const std::string& root) {
  if (load.empty()) return false;
  std::error_code ec;
  const fs::path l = fs::weakly_canonical(load, ec), s = fs::weakly_canonical(root, ec);
  if (l == s) return true;
  return l.filename().string().rfind("iter_", 0) == 0 && l.parent_path() == s;
}

void check_rank0(const Recipe& r, TrainPreflight& out) {
  check_recipe_tokenizer(r);  // its vocabulary fits model.vocab_size
  check_writable_dir(r.logging.dir, "logging.dir");
  const std::string& root = r.checkpoint.save;
  if (root.empty()) {
    if (!log::context().quiet)  // --quiet: errors only
      log::warn("checkpoint.save is not set: a stop signal, a time limit or a crash loses this run's training");
    return;
  }
  check_writable_dir(root, "checkpoint.save");
  out.lock = std::make_unique<CheckpointRootLock>(root, "checkpoint.save");
  // Never start over committed checkpoints: a run that does not resume from this root
  // would interleave its iterations with theirs and prune them with keep_last.
  auto its = model::ckpt::committed_iterations(root);
  if (!its.empty() && !loads_from(r.checkpoint.load, root))
    throw_input(
        "checkpoint.save {}: holds committed checkpoints (newest {}) that this run would overwrite; to "
        "continue them set checkpoint.load={}, or save to an empty directory",
        root, model::ckpt::iteration_dir(root, its.back()), root);
}

}  // namespace

TrainPreflight preflight_train(const Recipe& r, const parallel::ProcessGroups& g) {
  TrainPreflight out;
  std::string error;
  if (g.rank == 0) {
    try {
      check_rank0(r, out);
    } catch (const InputError& e) {
      error = e.what();
    }
  }
  // Every rank stops with rank 0's message (one int64 per character: a sum with zeros).
  if (g.world && g.world->size() > 1) {
    constexpr int64_t kLen = 512;
    std::vector<int64_t> msg(kLen + 1, 0);
    if (g.rank == 0) {
      msg[0] = static_cast<int64_t>(std::min<size_t>(error.size(), kLen));
      for (int64_t i = 0; i < msg[0]; ++i)
        msg[static_cast<size_t>(i) + 1] = static_cast<unsigned char>(error[static_cast<size_t>(i)]);
    }
    g.world->all_reduce(msg.data(), kLen + 1, parallel::ReduceOp::sum);
    error.assign(static_cast<size_t>(msg[0]), ' ');
    for (int64_t i = 0; i < msg[0]; ++i)
      error[static_cast<size_t>(i)] = static_cast<char>(msg[static_cast<size_t>(i) + 1]);
  }
  if (!error.empty()) throw InputError(error);
  return out;
}

}  // namespace mtnlg::app
