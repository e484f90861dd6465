// Atomic file writes: the one implementation of "write under a temporary name, fsync,
// rename into place, fsync the directory" (DESIGN invariant 6: a reader never sees
// half a file, and a crash never leaves one under the final name).
//
// The temporary name is PATH.tmp.<pid>.<n> in the same directory as PATH (a rename
// across file systems would not be atomic), unique per process and per write, so two
// processes or threads writing the same path never share a temporary file. Errors throw
// RuntimeError naming the path and the system's reason (strerror).
#pragma once
#include <cstddef>
#include <cstdio>
#include <functional>
#include <string>
#include <string_view>

namespace mtnlg {

class AtomicFile {
 public:
  // Creates the temporary file; throws RuntimeError "PATH: cannot create TMP (reason)".
  explicit AtomicFile(std::string path);
  // Removes the temporary file unless commit() renamed it into place.
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t n);
  void write(std::string_view s) { write(s.data(), s.size()); }
  void write_line(std::string_view s) {
    write(s);
    write("\n", 1);
  }

  // Flushes, fsyncs and closes the temporary file; the final name is untouched. For
  // all-or-nothing commits of several files: sync every file first, then commit each.
  void sync();
  // sync() if still open, renames the temporary file to the final name and fsyncs the
  // directory. Afterwards the object only holds the name.
  void commit();

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return tmp_; }
  bool committed() const { return committed_; }

 private:
  std::string path_, tmp_;
  std::FILE* f_ = nullptr;
  bool committed_ = false;
};

// Writes `content` to `path` atomically.
void write_file_atomic(const std::string& path, std::string_view content);
// Writes `path` atomically from `writer`; if the writer throws, the temporary file is
// removed, the final name is untouched and the exception propagates.
void write_file_atomic(const std::string& path, const std::function<void(AtomicFile&)>& writer);

// Whether `filename` (without its directory) is a temporary name of this class,
// NAME.tmp.<pid>.<n>; `pid` gets the writer's process id. A process killed in a write
// (kill -9, a lost node) leaves such a file behind: its owner removes it on the next run.
bool atomic_temp_name(std::string_view filename, long* pid = nullptr);

// fsyncs a directory so that a rename inside it survives a crash. Best effort: file
// systems that cannot sync a directory (EINVAL) and unreadable directories are skipped.
void fsync_directory(const std::string& dir);

}  // namespace mtnlg
