#include "ptrain/launch/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>

namespace fs = std::filesystem;

namespace ptrain {
namespace {

std::string hostName() {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) return "unknown host";
  return host;
}

std::string utcNow() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

// What the holder wrote, on one line ("host H, pid P, since T"), or why it
// cannot be said.
std::string holderOf(int fd) {
  char buf[512] = {};
  const ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  std::string text = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text.empty() ? "a process that has not said who it is yet" : text;
}

}  // namespace

std::string RunFolderLock::pathFor(const std::string& runDir) { return (fs::path(runDir) / ".ptrain.lock").string(); }

RunFolderLock::RunFolderLock(const std::string& runDir) {
  std::error_code ec;
  fs::create_directories(runDir, ec);
  if (ec) throw Error(detail::concat(runDir, ": cannot create the run folder: ", ec.message()));
  const std::string path = pathFor(runDir);
  fd_ = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error(detail::concat(path, ": cannot open the run folder's lock: ", std::strerror(errno)));
  int rc;
  while ((rc = flock(fd_, LOCK_EX | LOCK_NB)) != 0 && errno == EINTR) {
  }
  if (rc != 0) {
    const int err = errno;
    const std::string holder = err == EWOULDBLOCK ? holderOf(fd_) : "";
    close(fd_);
    fd_ = -1;
    if (err == EWOULDBLOCK) {
      throw ConfigError(detail::concat(runDir, " is in use by another run (", holder,
                                       "): wait for it to end or stop it, or give another --run-dir"));
    }
    throw Error(detail::concat(path, ": cannot lock the run folder: ", std::strerror(err),
                               " (a file system without flock; docs/launching.md, \"One run per folder\")"));
  }
  const std::string text = detail::concat("host ", hostName(), ", pid ", getpid(), ", since ", utcNow(), "\n");
  // Best effort: the lock itself is what protects the folder.
  if (ftruncate(fd_, 0) == 0) {
    [[maybe_unused]] ssize_t n = pwrite(fd_, text.data(), text.size(), 0);
  }
}

RunFolderLock::~RunFolderLock() {
  if (fd_ >= 0) close(fd_);  // closing the last descriptor releases the lock
}

}  // namespace ptrain
