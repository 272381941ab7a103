// One writer per run folder.
//
// A run holds RUN_DIR/.ptrain.lock with flock(LOCK_EX) for its whole life: the
// launcher of `ptrain run` (node 0's when there are several), or rank 0 itself
// when another launcher (torchrun, srun) started the workers. The kernel drops
// the lock when its holder exits, however it ends (a crash, SIGKILL), so a
// lock is never stale. The file's text says who holds it (host, pid, since
// when), for the refusal a second writer gets. docs/launching.md, "One run per
// folder", says how this behaves on shared file systems.
//
// Not part of the plugin SDK (ptrain_launch library).
#pragma once

#include <string>

#include "ptrain/core/error.h"

namespace ptrain {

// The environment variable a launcher that holds the lock hands to its
// workers: its value is the run folder, so rank 0 knows not to lock again.
inline constexpr const char* kRunLockHeldVariable = "PTRAIN_RUN_LOCK_HELD";

class PTRAIN_API RunFolderLock {
 public:
  // Creates RUN_DIR (and parents) when missing and takes the lock without
  // waiting. Throws ConfigError (exit 2) when another process holds it:
  // "RUN_DIR is in use by another run (host H, pid P, since T): wait for it
  // to end or stop it, or give another --run-dir"; Error when the folder or
  // the lock file cannot be made (naming the path and the system's reason).
  explicit RunFolderLock(const std::string& runDir);
  ~RunFolderLock();
  RunFolderLock(const RunFolderLock&) = delete;
  RunFolderLock& operator=(const RunFolderLock&) = delete;

  // RUN_DIR/.ptrain.lock
  static std::string pathFor(const std::string& runDir);

 private:
  int fd_ = -1;
};

}  // namespace ptrain
