// Start-up checks of a training run that protect finished work (docs/RELIABILITY.md):
// every output location is created and written to once before any step runs, and the
// checkpoint root is locked so that a second run cannot write into it at the same time.
#pragma once
#include <memory>
#include <string>

#include "config/recipe.hpp"
#include "parallel/communicator.hpp"

namespace mtnlg::app {

// Creates `dir` and writes (then removes) a small file in it. InputError naming `key`
// and the reason when it cannot: found at start-up, not after the first interval.
void check_writable_dir(const std::string& dir, const std::string& key);
// Checks that `path` can be created or replaced (its directory exists and is writable)
// without leaving anything behind. InputError naming `what`.
void check_writable_file(const std::string& path, const std::string& what);

// Writes `text` to `path` and syncs it; RuntimeError naming the file, the
// recipe key that placed it and the reason (e.g. "No space left on device").
void write_file_checked(const std::string& path, const std::string& text, const std::string& key);
// RuntimeError for an append-only log (metrics.jsonl) whose write or flush failed.
[[noreturn]] void throw_write_failed(const std::string& file, const std::string& key);

// An exclusive lock on a checkpoint root (flock on ROOT/.lock, released when the
// process ends, kill -9 included). InputError when another process holds it.
class CheckpointRootLock {
 public:
  CheckpointRootLock(const std::string& root, const std::string& key);
  ~CheckpointRootLock();
  CheckpointRootLock(const CheckpointRootLock&) = delete;
  CheckpointRootLock& operator=(const CheckpointRootLock&) = delete;

 private:
  int fd_ = -1;
};

// For `checkpoint convert/import --output ROOT`: ROOT is writable and holds no
// checkpoint yet (writing one there would move its `latest` away from the run that
// owns it). Returns the lock, held while writing. InputError naming `key`.
std::unique_ptr<CheckpointRootLock> claim_new_checkpoint_root(const std::string& root, const std::string& key);

// What preflight_train holds for the run's lifetime.
struct TrainPreflight {
  std::unique_ptr<CheckpointRootLock> lock;
};

// Collective over the world: rank 0 checks logging.dir and checkpoint.save (writable,
// locked, and not holding committed checkpoints that this run would not resume from);
// every rank throws the same InputError when one fails.
TrainPreflight preflight_train(const Recipe& r, const parallel::ProcessGroups& g);

}  // namespace mtnlg::app
