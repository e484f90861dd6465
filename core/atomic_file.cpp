#include "core/atomic_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.hpp"

namespace mtnlg {

namespace {

std::string unique_temp_name(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  return path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1));
}

std::string parent_dir(const std::string& path) {
  const std::string p = std::filesystem::path(path).parent_path().string();
  return p.empty() ? "." : p;
}

}  // namespace

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)), tmp_(unique_temp_name(path_)) {
  f_ = std::fopen(tmp_.c_str(), "wb");
  if (!f_) throw_runtime("{}: cannot create {} ({})", path_, tmp_, std::strerror(errno));
  std::setvbuf(f_, nullptr, _IOFBF, 1 << 20);
}

AtomicFile::~AtomicFile() {
  if (f_) std::fclose(f_);
  if (!committed_) std::remove(tmp_.c_str());
}

void AtomicFile::write(const void* data, size_t n) {
  MTNLG_CHECK(f_ != nullptr, "{}: write after sync or commit", path_);
  if (n > 0 && std::fwrite(data, 1, n, f_) != n) throw_runtime("{}: write failed ({})", path_, std::strerror(errno));
}

void AtomicFile::sync() {
  if (!f_) return;
  std::FILE* f = f_;
  f_ = nullptr;
  int err = 0;
  if (std::fflush(f) != 0) err = errno;
  if (err == 0 && ::fsync(::fileno(f)) != 0) err = errno;
  if (std::fclose(f) != 0 && err == 0) err = errno;
  if (err != 0) throw_runtime("{}: write failed ({})", path_, std::strerror(err));
}

void AtomicFile::commit() {
  MTNLG_CHECK(!committed_, "{}: committed twice", path_);
  sync();
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0)
    throw_runtime("{}: cannot rename {} into place ({})", path_, tmp_, std::strerror(errno));
  committed_ = true;
  fsync_directory(parent_dir(path_));
}

void write_file_atomic(const std::string& path, std::string_view content) {
  AtomicFile f(path);
  f.write(content);
  f.commit();
}

void write_file_atomic(const std::string& path, const std::function<void(AtomicFile&)>& writer) {
  AtomicFile f(path);
  writer(f);
  f.commit();
}

bool atomic_temp_name(std::string_view name, long* pid) {
  // NAME.tmp.<digits>.<digits>, NAME not empty
  auto digits_before = [&](size_t end, size_t* start) {  // the run of digits ending at `end`
    size_t b = end;
    while (b > 0 && name[b - 1] >= '0' && name[b - 1] <= '9') --b;
    *start = b;
    return b < end;
  };
  size_t n_start = 0, p_start = 0;
  if (!digits_before(name.size(), &n_start) || n_start == 0 || name[n_start - 1] != '.') return false;
  if (!digits_before(n_start - 1, &p_start) || p_start < 6 || name.substr(p_start - 5, 5) != ".tmp.") return false;
  if (n_start - 1 - p_start > 9) return false;  // not a pid
  if (pid) *pid = std::stol(std::string(name.substr(p_start, n_start - 1 - p_start)));
  return true;
}

void fsync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // e.g. a write-only directory: the rename itself succeeded
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0 && err != EINVAL && err != EROFS)
    throw_runtime("{}: cannot sync the directory ({})", dir, std::strerror(err));
}

}  // namespace mtnlg
