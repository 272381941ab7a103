// `ptrain run --nproc N`: start the workers, forward their output, stop them
// all when one fails or when the launcher is told to stop.
//
// One thread does everything with poll(): the workers' stdout/stderr pipes
// and a self-pipe that the signal handlers (SIGCHLD, SIGINT, SIGTERM, SIGHUP)
// write to. Exited workers are observed with waitid(WNOWAIT) and left as
// zombies until the end, so a worker's pid, and with it its process group id,
// cannot be reused while we may still signal that group.
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <iterator>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "ptrain/core/error.h"
#include "ptrain/core/logging.h"
#include "ptrain/launch/host_tuning.h"
#include "ptrain/launch/launcher.h"

extern char** environ;

namespace ptrain {
namespace {

using Clock = std::chrono::steady_clock;

// ---- signals -------------------------------------------------------------

// Written by the handlers, read by the loop. The pipe only wakes poll(); the
// counters say what happened, so a full pipe loses nothing.
int gWakeWrite = -1;
volatile sig_atomic_t gStopSignal = 0;   // first SIGINT/SIGTERM/SIGHUP
volatile sig_atomic_t gStopCount = 0;    // how many of them
std::atomic<bool> gLaunchActive{false};  // one launchWorkers at a time

extern "C" void onSignal(int sig) {
  const int savedErrno = errno;
  if (sig != SIGCHLD) {
    if (gStopSignal == 0) gStopSignal = sig;
    gStopCount = gStopCount + 1;
  }
  if (gWakeWrite >= 0) {
    const char byte = 0;
    // Nothing to do on failure: EAGAIN means a wake-up is already pending.
    [[maybe_unused]] ssize_t n = write(gWakeWrite, &byte, 1);
  }
  errno = savedErrno;
}

constexpr int kHandledSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2, SIGCHLD};
constexpr size_t kNumHandled = std::size(kHandledSignals);
// How long the other workers may take to end by themselves after a rank
// exited only because it lost a peer (kExitPeerFailed), before they are
// stopped: time for the peer that failed first to print its own error.
constexpr std::chrono::seconds kPeerFailureWait{3};

// Read by forked children before exec, so plain globals set before fork().
bool gInstalled[kNumHandled] = {};
bool gPipeWasIgnored = false;

// Installs the handlers (and ignores SIGPIPE, so a closed launcher stdout
// cannot kill the launcher and orphan the workers); restores everything on
// destruction.
class SignalScope {
 public:
  SignalScope() {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
      throw Error(detail::concat("ptrain run: cannot create a pipe: ", std::strerror(errno)));
    }
    wakeRead_ = fds[0];
    gWakeWrite = fds[1];
    gStopSignal = 0;
    gStopCount = 0;
    struct sigaction sa {};
    sa.sa_handler = onSignal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (size_t i = 0; i < kNumHandled; ++i) {
      const int sig = kHandledSignals[i];
      sigaction(sig, nullptr, &saved_[i]);
      // A stop signal ignored on entry (nohup, a script's background job)
      // stays ignored, for the launcher and, through exec, the workers.
      // SIGCHLD is always ours: ignoring it would make the kernel reap the
      // workers before we can read their exit status.
      gInstalled[i] = sig == SIGCHLD || saved_[i].sa_handler != SIG_IGN;
      if (gInstalled[i]) sigaction(sig, &sa, nullptr);
    }
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    sigaction(SIGPIPE, &ignore, &savedPipe_);
    gPipeWasIgnored = savedPipe_.sa_handler == SIG_IGN;
    // The caller may have blocked these in this thread; the handlers would
    // then never run here.
    sigset_t unblock;
    sigemptyset(&unblock);
    for (int s : kHandledSignals) sigaddset(&unblock, s);
    pthread_sigmask(SIG_UNBLOCK, &unblock, &savedMask_);
  }
  ~SignalScope() {
    for (size_t i = 0; i < kNumHandled; ++i) {
      if (gInstalled[i]) sigaction(kHandledSignals[i], &saved_[i], nullptr);
    }
    sigaction(SIGPIPE, &savedPipe_, nullptr);
    pthread_sigmask(SIG_SETMASK, &savedMask_, nullptr);
    const int w = gWakeWrite;
    gWakeWrite = -1;
    close(w);
    close(wakeRead_);
  }
  SignalScope(const SignalScope&) = delete;
  SignalScope& operator=(const SignalScope&) = delete;

  int wakeFd() const { return wakeRead_; }
  void drainWake() {
    char buf[256];
    while (read(wakeRead_, buf, sizeof(buf)) > 0) {
    }
  }

 private:
  int wakeRead_ = -1;
  struct sigaction saved_[kNumHandled] {};
  struct sigaction savedPipe_ {};
  sigset_t savedMask_{};
};

std::string signalName(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev != nullptr ? std::string("SIG") + abbrev : std::string("signal");
}

// ---- output --------------------------------------------------------------

// Writes all of `data`, waiting when the descriptor is non-blocking and full.
// Returns false once the reader has gone (EPIPE): output is then dropped,
// but the workers keep running and are still supervised.
bool writeAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = write(fd, data, size);
    if (n > 0) {
      data += n;
      size -= static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      poll(&p, 1, 1000);
    } else {
      return false;
    }
  }
  return true;
}

struct OutputTarget {
  int fd;
  int copyFd = -1;  // LaunchOptions::log_path, or -1
  bool alive = true;
  void write(const std::string& s) {
    if (alive && !s.empty()) alive = writeAll(fd, s.data(), s.size());
    if (copyFd >= 0 && !s.empty()) {
      // A progress bar redraws with '\r'; the log keeps each state as a line.
      std::string line = s;
      std::replace(line.begin(), line.end(), '\r', '\n');
      writeAll(copyFd, line.data(), line.size());
    }
  }
};

class LineStream;

// What the terminal shows right now: a progress line ended by '\r' that the
// next line from someone else must not overwrite.
struct Terminal {
  LineStream* pendingCr = nullptr;
  OutputTarget* pendingTarget = nullptr;
};

// One worker pipe (stdout or stderr): reads bytes, writes whole prefixed lines.
class LineStream {
 public:
  // Bytes without a line end are written out as a line once they exceed this,
  // so a worker that never prints '\n' cannot grow the buffer without bound.
  static constexpr size_t kMaxLine = 64 * 1024;

  LineStream(int fd, OutputTarget* target, Terminal* term, std::string prefix, bool progress)
      : fd_(fd), target_(target), term_(term), prefix_(std::move(prefix)), progress_(progress) {}
  ~LineStream() { closeFd(); }
  LineStream(const LineStream&) = delete;
  LineStream& operator=(const LineStream&) = delete;

  int fd() const { return fd_; }
  bool open() const { return fd_ >= 0; }

  // Reads what is available, at most kMaxReads buffers, so that a worker
  // printing without pause cannot starve exit and signal handling. Returns
  // true when something was read.
  bool readAvailable() {
    constexpr int kMaxReads = 4;
    if (fd_ < 0) return false;
    bool any = false;
    char buf[65536];
    for (int reads = 0; reads < kMaxReads;) {
      ssize_t n = read(fd_, buf, sizeof(buf));
      if (n > 0) {
        any = true;
        ++reads;
        consume(buf, static_cast<size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return any;
      // EOF or a read error: the worker side is gone.
      finish();
      return any;
    }
    return any;
  }

  // Writes a partial last line and closes the pipe.
  void finish() {
    if (!buf_.empty()) emit(buf_, '\n');
    buf_.clear();
    closeFd();
  }

 private:
  void closeFd() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

  void consume(const char* data, size_t size) {
    size_t i = 0;
    // A "\r\n" split across two reads: the '\r' was already shown as a
    // progress line, so the '\n' only has to move the cursor down.
    if (afterCr_ && size > 0 && data[0] == '\n') {
      if (progress_ && term_->pendingCr == this) {
        target_->write("\n");
        term_->pendingCr = nullptr;
      }
      i = 1;
    }
    afterCr_ = false;
    for (; i < size; ++i) {
      const char c = data[i];
      if (c == '\n') {
        emit(buf_, '\n');
        buf_.clear();
      } else if (c == '\r') {
        if (i + 1 < size && data[i + 1] == '\n') {
          emit(buf_, '\n');
          ++i;
        } else {
          if (!buf_.empty()) emit(buf_, progress_ ? '\r' : '\n');
          afterCr_ = (i + 1 == size);
        }
        buf_.clear();
      } else {
        buf_ += c;
        if (buf_.size() >= kMaxLine) {
          emit(buf_, '\n');
          buf_.clear();
        }
      }
    }
  }

  void emit(const std::string& text, char end) {
    if (term_->pendingCr != nullptr && term_->pendingCr != this) {
      // Keep the other rank's progress line and start below it.
      term_->pendingTarget->write("\n");
      term_->pendingCr = nullptr;
    }
    std::string line;
    line.reserve(prefix_.size() + text.size() + 1);
    line += prefix_;
    line += text;
    line += end;
    target_->write(line);
    if (end == '\r') {
      term_->pendingCr = this;
      term_->pendingTarget = target_;
    } else if (term_->pendingCr == this) {
      term_->pendingCr = nullptr;
    }
  }

  int fd_;
  OutputTarget* target_;
  Terminal* term_;
  std::string prefix_;
  bool progress_;
  std::string buf_;
  bool afterCr_ = false;
};

// ---- workers -------------------------------------------------------------

struct Worker {
  int rank = 0;
  int localRank = 0;
  pid_t pid = -1;
  bool exited = false;  // seen by waitid(WNOWAIT), still a zombie
  bool reaped = false;
  int exitOrder = 0;      // 1 for the first worker seen to exit, 2 for the next, ...
  bool stoppedByUs = false;  // it exited after the launcher signalled the workers
  int code = 0;         // exit code, or 128 + signal
  int signal = 0;       // 0 unless killed by a signal
  std::unique_ptr<LineStream> out;
  std::unique_ptr<LineStream> err;
};

void signalGroup(const Worker& w, int sig) {
  // The group id is the worker's pid (setpgid in the child); the worker is
  // not reaped yet, so the id still names that group. The plain kill covers
  // the short window before the child's setpgid.
  if (w.pid <= 0 || w.reaped) return;
  if (kill(-w.pid, sig) != 0) kill(w.pid, sig);
}

// Kills and reaps whatever is still there; used on every exit path,
// exceptions included.
class WorkerSet {
 public:
  std::vector<Worker> workers;

  ~WorkerSet() {
    for (auto& w : workers) signalGroup(w, SIGKILL);
    reapAll();
  }

  void reapAll() {
    for (auto& w : workers) {
      if (w.pid <= 0 || w.reaped) continue;
      int status = 0;
      while (waitpid(w.pid, &status, 0) < 0 && errno == EINTR) {
      }
      w.reaped = true;
    }
  }
};

// Checks without reaping. Returns true when the worker has just exited.
bool pollExit(Worker& w) {
  if (w.exited || w.pid <= 0) return false;
  siginfo_t info{};
  if (waitid(P_PID, static_cast<id_t>(w.pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0) return false;
  if (info.si_pid == 0) return false;
  w.exited = true;
  if (info.si_code == CLD_EXITED) {
    w.code = info.si_status;
  } else {  // CLD_KILLED, CLD_DUMPED
    w.signal = info.si_status;
    w.code = 128 + info.si_status;
  }
  return true;
}

// Everything a child needs, built before fork(): between fork() and exec()
// only async-signal-safe calls are allowed (the launcher may have threads).
struct ChildPlan {
  std::string path;
  std::vector<std::string> argvStore;
  std::vector<std::string> envStore;
  std::vector<char*> argv;
  std::vector<char*> envp;
  void finalize() {
    for (auto& a : argvStore) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (auto& e : envStore) envp.push_back(e.data());
    envp.push_back(nullptr);
  }
};

std::string envKey(const std::string& entry) { return entry.substr(0, entry.find('=')); }

bool isExecutableFile(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(path.c_str(), X_OK) == 0;
}

// command[0] as given when it contains '/', else the first match in PATH.
std::string resolveCommand(const std::string& name) {
  if (name.find('/') != std::string::npos) {
    PTRAIN_CHECK_AS(ConfigError, isExecutableFile(name), "ptrain run: worker command '", name,
                    "' is not an executable file; check the path");
    return name;
  }
  const char* pathEnv = std::getenv("PATH");
  std::string path = pathEnv != nullptr ? pathEnv : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= path.size()) {
    size_t colon = path.find(':', start);
    std::string dir = path.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
    if (dir.empty()) dir = ".";
    std::string candidate = dir + "/" + name;
    if (isExecutableFile(candidate)) return candidate;
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  throw ConfigError(detail::concat("ptrain run: worker command '", name,
                                   "' was not found in PATH; give its full path"));
}

[[noreturn]] void childFail(const char* what, const char* path) {
  // Async-signal-safe reporting: write() only.
  const int err = errno;
  // strerror may translate (and allocate); the untranslated table may not.
  const char* reason = strerrordesc_np(err);
  if (reason == nullptr) reason = "unknown error";
  const char* parts[] = {"ptrain: cannot ", what, " '", path, "': ", reason, "\n"};
  for (const char* p : parts) {
    [[maybe_unused]] ssize_t n = write(STDERR_FILENO, p, strlen(p));
  }
  _exit(127);
}

void validate(const LaunchOptions& o) {
  PTRAIN_CHECK_AS(ConfigError, o.nproc_per_node >= 1, "ptrain run: --nproc=", o.nproc_per_node,
                  " must be at least 1");
  PTRAIN_CHECK_AS(ConfigError, o.nnodes >= 1, "ptrain run: --nnodes=", o.nnodes, " must be at least 1");
  PTRAIN_CHECK_AS(ConfigError, o.node_rank >= 0 && o.node_rank < o.nnodes, "ptrain run: --node-rank=",
                  o.node_rank, " must be in [0, ", o.nnodes, ") for --nnodes=", o.nnodes);
  PTRAIN_CHECK_AS(ConfigError, static_cast<long long>(o.nnodes) * o.nproc_per_node <= INT_MAX,
                  "ptrain run: --nnodes x --nproc is too large");
  PTRAIN_CHECK_AS(ConfigError, !o.command.empty() && !o.command[0].empty(),
                  "ptrain run: no worker command to launch");
  PTRAIN_CHECK_AS(ConfigError, !o.master_addr.empty(),
                  "ptrain run: --master-addr is empty; give the host of rank 0 (127.0.0.1 on one host)");
  PTRAIN_CHECK_AS(ConfigError, o.master_port >= 0 && o.master_port <= 65535, "ptrain run: --master-port=",
                  o.master_port, " is not a TCP port; expected 1..65535 (or 0 for a free one on one host)");
  PTRAIN_CHECK_AS(ConfigError, o.master_port != 0 || o.nnodes == 1, "ptrain run: --nnodes=", o.nnodes,
                  " needs an explicit --master-port (the same on every node); a free port can only be "
                  "picked for a single node");
  PTRAIN_CHECK_AS(ConfigError, o.grace_seconds >= 0, "ptrain run: grace period ", o.grace_seconds,
                  "s must not be negative");
  for (const auto& e : o.extra_env) {
    PTRAIN_CHECK_AS(ConfigError, e.find('=') != std::string::npos && e[0] != '=',
                    "ptrain run: worker environment entry '", e, "' must look like KEY=VALUE");
  }
}

// Forks one worker; `readOut`/`readErr` receive the parent's pipe ends.
pid_t spawn(const ChildPlan& plan, int& readOut, int& readErr, int devNull, pid_t launcherPid) {
  int outPipe[2];
  int errPipe[2];
  if (pipe2(outPipe, O_CLOEXEC) != 0) {
    throw Error(detail::concat("ptrain run: cannot create a pipe: ", std::strerror(errno)));
  }
  if (pipe2(errPipe, O_CLOEXEC) != 0) {
    const int e = errno;
    close(outPipe[0]);
    close(outPipe[1]);
    throw Error(detail::concat("ptrain run: cannot create a pipe: ", std::strerror(e)));
  }
  // Block everything across fork() so no handler of ours runs in the child
  // before it has reset the dispositions.
  sigset_t all;
  sigset_t old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    // Dying with the launcher: covers a launcher killed by SIGKILL, which
    // cannot clean up. The getppid check closes the race with its death.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != launcherPid) _exit(128 + SIGKILL);
    // Back to what the launcher was started with: our handlers go (exec
    // would drop them too, but a signal could arrive before it), the
    // launcher's own SIG_IGN for SIGPIPE goes, an inherited SIG_IGN stays.
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    for (size_t i = 0; i < kNumHandled; ++i) {
      if (gInstalled[i]) sigaction(kHandledSignals[i], &dfl, nullptr);
    }
    if (!gPipeWasIgnored) sigaction(SIGPIPE, &dfl, nullptr);
    sigset_t none;
    sigemptyset(&none);
    pthread_sigmask(SIG_SETMASK, &none, nullptr);
    // Workers are not in the terminal's foreground group: reading the
    // terminal would stop them with SIGTTIN, so stdin is /dev/null.
    if (dup2(devNull, STDIN_FILENO) < 0 || dup2(outPipe[1], STDOUT_FILENO) < 0 ||
        dup2(errPipe[1], STDERR_FILENO) < 0) {
      _exit(127);
    }
    // Nothing of the launcher's leaks into workers (sockets, other pipes).
    if (close_range(3, ~0U, 0) != 0) {
      for (int fd = 3; fd < 65536; ++fd) close(fd);
    }
    execve(plan.path.c_str(), plan.argv.data(), plan.envp.data());
    childFail("run worker command", plan.path.c_str());
  }
  const int forkErrno = errno;
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  close(outPipe[1]);
  close(errPipe[1]);
  if (pid < 0) {
    close(outPipe[0]);
    close(errPipe[0]);
    throw Error(detail::concat("ptrain run: cannot start a worker process: ", std::strerror(forkErrno)));
  }
  // Also set here so that signalGroup works even before the child runs.
  setpgid(pid, pid);
  fcntl(outPipe[0], F_SETFL, O_NONBLOCK);
  fcntl(errPipe[0], F_SETFL, O_NONBLOCK);
  readOut = outPipe[0];
  readErr = errPipe[0];
  return pid;
}

std::string describeExit(const Worker& w) {
  if (w.signal != 0) {
    return detail::concat("rank ", w.rank, " was killed by signal ", signalName(w.signal), " (", w.signal, ")");
  }
  return detail::concat("rank ", w.rank, " exited with code ", w.code);
}

class LaunchGuard {
 public:
  LaunchGuard() {
    bool expected = false;
    PTRAIN_CHECK(gLaunchActive.compare_exchange_strong(expected, true),
                 "launchWorkers: another launch is already running in this process");
  }
  ~LaunchGuard() { gLaunchActive = false; }
};

class FdGuard {
 public:
  explicit FdGuard(int fd) : fd_(fd) {}
  ~FdGuard() {
    if (fd_ >= 0) close(fd_);
  }
  FdGuard(const FdGuard&) = delete;
  FdGuard& operator=(const FdGuard&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

}  // namespace

int findFreePort(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(host.c_str(), "0", &hints, &res);
  PTRAIN_CHECK_AS(ConfigError, rc == 0, "cannot resolve host '", host, "': ", gai_strerror(rc),
                  "; give --master-addr as a reachable name or address");
  std::string lastError = "no address";
  int port = 0;
  for (addrinfo* ai = res; ai != nullptr && port == 0; ai = ai->ai_next) {
    const int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      lastError = std::strerror(errno);
      continue;
    }
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      port = addr.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                                        : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
    } else {
      lastError = std::strerror(errno);
    }
    close(fd);
  }
  freeaddrinfo(res);
  PTRAIN_CHECK_AS(ConfigError, port > 0, "cannot bind a TCP port on host '", host, "': ", lastError,
                  "; give --master-addr as an address of this host, or pass --master-port");
  return port;
}

namespace {

// LaunchOptions::exit_record_path: how every worker ended, as JSON, written
// to a temporary name and renamed, so a reader never sees half of it. The
// temporary file's space is taken when the launch begins (ExitRecordSpace),
// so the record is written even when the workers have filled the disk.
class ExitRecordSpace {
 public:
  ExitRecordSpace(const std::string& path, size_t workers) {
    if (path.empty()) return;
    temporary_ = path + ".tmp";
    fd_ = open(temporary_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) return;
    // About 80 bytes a worker, and room to spare.
    reserved_ = 4096 + 128 * static_cast<off_t>(workers);
    if (posix_fallocate(fd_, 0, reserved_) != 0) reserved_ = 0;
  }
  ~ExitRecordSpace() {
    if (fd_ >= 0) close(fd_);
  }
  ExitRecordSpace(const ExitRecordSpace&) = delete;
  ExitRecordSpace& operator=(const ExitRecordSpace&) = delete;

  // Writes `json` into the reserved file and renames it to `path`.
  bool write(const std::string& path, const std::string& json) {
    if (fd_ < 0) {
      fd_ = open(temporary_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd_ < 0) return false;
    }
    size_t done = 0;
    while (done < json.size()) {
      const ssize_t n = pwrite(fd_, json.data() + done, json.size() - done, static_cast<off_t>(done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      done += static_cast<size_t>(n);
    }
    // Shrinking needs no space.
    if (ftruncate(fd_, static_cast<off_t>(json.size())) != 0 || fsync(fd_) != 0) return false;
    close(fd_);
    fd_ = -1;
    return std::rename(temporary_.c_str(), path.c_str()) == 0;
  }

 private:
  std::string temporary_;
  int fd_ = -1;
  off_t reserved_ = 0;
};

void writeExitRecord(ExitRecordSpace& space, const std::string& path, const std::vector<Worker>& workers, int result,
                     int firstFailure, int stopSignal) {
  std::string json = detail::concat("{\"result\": ", result, ", \"first_failure_rank\": ", firstFailure,
                                    ", \"launcher_signal\": ",
                                    stopSignal != 0 ? "\"" + signalName(stopSignal) + "\"" : std::string("null"),
                                    ", \"ranks\": [");
  for (size_t i = 0; i < workers.size(); ++i) {
    const Worker& w = workers[i];
    json += detail::concat(i ? ", " : "", "{\"rank\": ", w.rank, ", \"code\": ", w.code, ", \"signal\": ",
                           w.signal != 0 ? "\"" + signalName(w.signal) + "\"" : std::string("null"), "}");
  }
  json += "]}\n";
  if (!space.write(path, json)) logger()->warn("cannot write {}: {}", path, std::strerror(errno));
}

}  // namespace

int launchWorkers(const LaunchOptions& options) {
  validate(options);
  LaunchGuard once;

  const std::string path = resolveCommand(options.command[0]);
  const int port = options.master_port != 0 ? options.master_port : findFreePort(options.master_addr);
  const int nproc = options.nproc_per_node;
  const int worldSize = options.nnodes * nproc;
  const bool stdoutIsTty = isatty(STDOUT_FILENO) == 1;

  // The environment each worker sees: the launcher's, minus every variable
  // we set (so a stale value cannot leak through), plus ours, extra_env last.
  std::set<std::string> ownKeys = {"RANK",        "WORLD_SIZE",  "LOCAL_RANK",    "LOCAL_WORLD_SIZE",
                                   "GROUP_RANK",  "NODE_RANK",   "GROUP_WORLD_SIZE", "MASTER_ADDR",
                                   "MASTER_PORT", "PTRAIN_WORKER", "PTRAIN_PROGRESS_TTY"};
  for (const auto& e : options.extra_env) ownKeys.insert(envKey(e));
  std::vector<std::string> baseEnv;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string entry(*e);
    if (ownKeys.count(envKey(entry)) == 0) baseEnv.push_back(std::move(entry));
  }

  const HostTuning tuning = hostTuning(options.one_thread_pool);
  for (const auto& note : tuning.notes) logger()->info("{}", note);
  std::vector<ChildPlan> plans(static_cast<size_t>(nproc));
  for (int local = 0; local < nproc; ++local) {
    const int rank = options.node_rank * nproc + local;
    ChildPlan& plan = plans[static_cast<size_t>(local)];
    plan.path = path;
    plan.argvStore = options.command;
    plan.envStore = baseEnv;
    auto put = [&](const char* key, const std::string& value) { plan.envStore.push_back(key + ("=" + value)); };
    put("RANK", std::to_string(rank));
    put("WORLD_SIZE", std::to_string(worldSize));
    put("LOCAL_RANK", std::to_string(local));
    put("LOCAL_WORLD_SIZE", std::to_string(nproc));
    put("GROUP_RANK", std::to_string(options.node_rank));
    put("NODE_RANK", std::to_string(options.node_rank));
    put("GROUP_WORLD_SIZE", std::to_string(options.nnodes));
    put("MASTER_ADDR", options.master_addr);
    put("MASTER_PORT", std::to_string(port));
    put("PTRAIN_WORKER", "1");
    // Thread and BLAS kernel settings for this host (launch/host_tuning.h).
    // extra_env wins: its keys are in ownKeys.
    for (const auto& e : tuning.env) {
      if (ownKeys.count(envKey(e)) == 0) plan.envStore.push_back(e);
    }
    if (rank == 0 && stdoutIsTty) put("PTRAIN_PROGRESS_TTY", "1");
    for (const auto& e : options.extra_env) plan.envStore.push_back(e);
    plan.finalize();
  }

  // Whatever the caller printed must come before the workers' output.
  std::cout.flush();
  std::cerr.flush();
  std::fflush(stdout);
  std::fflush(stderr);

  OutputTarget outTarget{STDOUT_FILENO};
  OutputTarget errTarget{STDERR_FILENO};
  FdGuard logFile(options.log_path.empty()
                      ? -1
                      : open(options.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
  PTRAIN_CHECK_AS(Error, options.log_path.empty() || logFile.get() >= 0, "ptrain run: cannot write ",
                  options.log_path, ": ", std::strerror(errno));
  outTarget.copyFd = errTarget.copyFd = logFile.get();
  Terminal terminal;

  FdGuard devNull(open("/dev/null", O_RDONLY | O_CLOEXEC));
  PTRAIN_CHECK_AS(Error, devNull.get() >= 0, "ptrain run: cannot open /dev/null: ", std::strerror(errno));

  // Declaration order matters: the workers are killed and reaped (WorkerSet)
  // before the handlers are restored (SignalScope), so a SIGINT during
  // cleanup still reaches our handler rather than killing the launcher.
  ExitRecordSpace exitSpace(options.exit_record_path, static_cast<size_t>(nproc));
  SignalScope signals;
  WorkerSet set;
  set.workers.resize(static_cast<size_t>(nproc));
  const pid_t self = getpid();
  for (int local = 0; local < nproc; ++local) {
    Worker& w = set.workers[static_cast<size_t>(local)];
    w.rank = options.node_rank * nproc + local;
    w.localRank = local;
    int readOut = -1;
    int readErr = -1;
    w.pid = spawn(plans[static_cast<size_t>(local)], readOut, readErr, devNull.get(), self);
    const std::string prefix = options.prefix_output ? detail::concat("[rank ", w.rank, "] ") : "";
    const bool progress = w.rank == 0;
    w.out = std::make_unique<LineStream>(readOut, &outTarget, &terminal, prefix, progress);
    w.err = std::make_unique<LineStream>(readErr, &errTarget, &terminal, prefix, progress);
  }

  int result = 0;               // first failure's code, or 128 + stop signal
  int firstFailure = -1;        // its rank
  bool stopping = false;        // SIGTERM sent to the workers
  bool killed = false;          // SIGKILL sent to the workers
  int handledStops = 0;         // stop signals already acted on
  int exits = 0;                // workers seen to exit so far
  Clock::time_point killAt{};

  auto drainAll = [&] {
    for (auto& w : set.workers) {
      w.out->readAvailable();
      w.err->readAvailable();
    }
  };
  // The launcher's own lines go below a progress bar, not over it.
  auto say = [&](const std::string& line) {
    if (terminal.pendingCr != nullptr) {
      terminal.pendingTarget->write("\n");
      terminal.pendingCr = nullptr;
    }
    errTarget.write(line);
  };
  auto savesOn = [&](int sig) {
    return std::find(options.save_signals.begin(), options.save_signals.end(), sig) != options.save_signals.end();
  };
  // `sig`: what the workers get (SIGTERM, or a signal they save on), and
  // with it how long they have before SIGKILL.
  auto beginStop = [&](int sig) {
    stopping = true;
    // Capped so that an absurd grace period cannot overflow the clock.
    const double grace = std::min(savesOn(sig) ? options.save_grace_seconds : options.grace_seconds, 86400.0);
    killAt = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(grace));
    for (auto& w : set.workers) {
      if (!w.exited) signalGroup(w, sig);
    }
  };
  auto killRemaining = [&] {
    killed = true;
    for (auto& w : set.workers) {
      if (!w.exited) signalGroup(w, SIGKILL);
    }
  };
  auto liveCount = [&] {
    return std::count_if(set.workers.begin(), set.workers.end(), [](const Worker& w) { return !w.exited; });
  };
  // The first failure: show what the failing rank said before the verdict,
  // then stop the others.
  auto reportFailure = [&](const Worker& w) {
    drainAll();
    const bool others = liveCount() > 0;
    say(detail::concat("ptrain: ", describeExit(w),
                       w.code == kExitPeerFailed ? " (it lost another rank, which is the cause)" : "",
                       others ? "; stopping the other workers" : "", "\n"));
    result = w.code;
    firstFailure = w.rank;
    beginStop(SIGTERM);
  };
  // A rank that exited because it lost a peer, while the others were given
  // until peerWaitUntil to end by themselves (kPeerFailureWait).
  const Worker* peerLost = nullptr;
  Clock::time_point peerWaitUntil{};

  std::vector<pollfd> fds;
  std::vector<LineStream*> streams;
  while (liveCount() > 0) {
    fds.clear();
    streams.clear();
    fds.push_back({signals.wakeFd(), POLLIN, 0});
    for (auto& w : set.workers) {
      for (LineStream* s : {w.out.get(), w.err.get()}) {
        if (s->open()) {
          fds.push_back({s->fd(), POLLIN, 0});
          streams.push_back(s);
        }
      }
    }
    // SIGCHLD wakes us when a worker exits; the timeout is the SIGKILL
    // deadline, with a one-second cap as a guard against a lost wake-up.
    int timeoutMs = 1000;
    if (stopping && !killed) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(killAt - Clock::now()).count();
      timeoutMs = static_cast<int>(std::clamp<long long>(left, 0, 1000));
    } else if (!stopping && peerLost != nullptr) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(peerWaitUntil - Clock::now()).count();
      timeoutMs = static_cast<int>(std::clamp<long long>(left, 0, 1000));
    }
    const int ready = poll(fds.data(), fds.size(), timeoutMs);
    if (ready < 0 && errno != EINTR) {
      throw Error(detail::concat("ptrain run: poll failed: ", std::strerror(errno)));
    }
    if (ready > 0) {
      if (fds[0].revents != 0) signals.drainWake();
      for (size_t i = 1; i < fds.size(); ++i) {
        if (fds[i].revents != 0) streams[i - 1]->readAvailable();
      }
    }

    // A signal to the launcher: stop everyone; a second one skips the grace.
    const int stops = gStopCount;
    if (stops > handledStops) {
      handledStops = stops;
      if (!stopping) {
        const int sig = gStopSignal;
        result = 128 + sig;
        if (savesOn(sig)) {
          say(detail::concat("ptrain: received ", signalName(sig),
                             "; the workers save a checkpoint at the next step boundary and stop (within ",
                             options.save_grace_seconds, " s; send it again to stop them without saving)\n"));
          beginStop(sig);
        } else {
          // The same signal: a worker that does not save on it ends by it.
          say(detail::concat("ptrain: received ", signalName(sig), "; stopping the workers\n"));
          beginStop(sig);
        }
      } else if (!killed) {
        killRemaining();
      }
    }

    for (auto& w : set.workers) {
      if (!pollExit(w)) continue;
      w.exitOrder = ++exits;
      w.stoppedByUs = stopping;
      // 75: the ranks agreed to stop after saving (a signal reached them
      // directly); the others follow by themselves.
      if (stopping || w.code == 0 || w.code == kExitStoppedAndSaved) continue;
      // A rank that only lost a peer often ends a moment before the peer
      // whose own error caused it: stopping everyone now could kill that
      // peer before it says why. The others get a short while to end by
      // themselves first.
      if (w.code == kExitPeerFailed && liveCount() > 0) {
        if (peerLost == nullptr) {
          peerLost = &w;
          peerWaitUntil = Clock::now() + kPeerFailureWait;
        }
        continue;
      }
      reportFailure(w);
    }
    if (!stopping && peerLost != nullptr && (liveCount() == 0 || Clock::now() >= peerWaitUntil)) {
      reportFailure(*peerLost);
    }

    if (stopping && !killed && Clock::now() >= killAt) killRemaining();
  }

  // Every worker has exited. Anything they left in their process groups
  // (background jobs) goes too, then the zombies are reaped.
  for (auto& w : set.workers) signalGroup(w, SIGKILL);
  set.reapAll();

  // The killed leftovers close their copies of the pipes, so EOF comes
  // quickly; a process that escaped its group (setsid) could hold a pipe
  // open forever, hence the bound.
  const auto drainUntil = Clock::now() + std::chrono::milliseconds(500);
  for (;;) {
    fds.clear();
    streams.clear();
    for (auto& w : set.workers) {
      for (LineStream* s : {w.out.get(), w.err.get()}) {
        if (s->open()) {
          fds.push_back({s->fd(), POLLIN, 0});
          streams.push_back(s);
        }
      }
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(drainUntil - Clock::now()).count();
    if (fds.empty() || left <= 0) break;
    if (poll(fds.data(), fds.size(), static_cast<int>(left)) <= 0) continue;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents != 0) streams[i]->readAvailable();
    }
  }
  for (auto& w : set.workers) {
    w.out->finish();
    w.err->finish();
  }
  if (terminal.pendingCr != nullptr) terminal.pendingTarget->write("\n");
  // The cause is the rank whose own error came first: a rank that exited 5
  // only lost a peer (the peer failed, maybe more slowly), and a rank the
  // launcher stopped did not fail by itself. Among the rest, the first to
  // exit; when there are none, the first failure stands.
  if (firstFailure >= 0) {
    const Worker* cause = nullptr;
    for (const auto& w : set.workers) {
      const bool own = w.code != 0 && w.code != kExitPeerFailed && w.code != kExitStoppedAndSaved &&
                       !(w.stoppedByUs && w.signal != 0);
      if (own && (cause == nullptr || w.exitOrder < cause->exitOrder)) cause = &w;
    }
    if (cause != nullptr && cause->rank != firstFailure) {
      say(detail::concat("ptrain: the cause: ", describeExit(*cause), " (its own error; rank ", firstFailure,
                         " stopped because of it)\n"));
      firstFailure = cause->rank;
      result = cause->code;
    }
  }
  // Every rank saved and stopped: the run can be resumed, whoever sent the signal.
  if (firstFailure < 0 && !set.workers.empty() &&
      std::all_of(set.workers.begin(), set.workers.end(),
                  [](const Worker& w) { return w.code == kExitStoppedAndSaved; })) {
    result = kExitStoppedAndSaved;
  }
  if (!options.exit_record_path.empty()) {
    writeExitRecord(exitSpace, options.exit_record_path, set.workers, result, firstFailure,
                    handledStops > 0 ? gStopSignal : 0);
  }
  return result;
}

}  // namespace ptrain
