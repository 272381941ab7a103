// launchWorkers with real processes: /bin/sh scripts stand in for the worker
// command and write what they see into a temporary folder.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "ptrain/launch/launcher.h"
#include "support/test_support.h"

namespace {

using ptrain::ConfigError;
using ptrain::LaunchOptions;
using ptrain::launchWorkers;
using ptrain::test::readFile;
using ptrain::test::TempDir;
using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

struct Captured {
  int code = -1;
  std::string out;
  std::string err;
  double seconds = 0;
};

// Runs launchWorkers with this process's stdout/stderr pointed at files, so
// the forwarded worker output can be compared byte for byte.
// `stdoutPath` lets a worker watch what the launcher has already forwarded.
Captured launchCaptured(const LaunchOptions& options, const std::string& stdoutPath = "") {
  TempDir capture;
  const std::string outPath = stdoutPath.empty() ? capture.path() + "/stdout" : stdoutPath;
  const std::string errPath = capture.path() + "/stderr";
  std::fflush(stdout);
  std::fflush(stderr);
  const int savedOut = dup(STDOUT_FILENO);
  const int savedErr = dup(STDERR_FILENO);
  const int outFd = open(outPath.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  const int errFd = open(errPath.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  dup2(outFd, STDOUT_FILENO);
  dup2(errFd, STDERR_FILENO);
  close(outFd);
  close(errFd);
  Captured c;
  std::exception_ptr error;
  const auto start = Clock::now();
  try {
    c.code = launchWorkers(options);
  } catch (...) {
    error = std::current_exception();
  }
  c.seconds = secondsSince(start);
  std::fflush(stdout);
  std::fflush(stderr);
  dup2(savedOut, STDOUT_FILENO);
  dup2(savedErr, STDERR_FILENO);
  close(savedOut);
  close(savedErr);
  if (error) std::rethrow_exception(error);
  c.out = readFile(outPath);
  c.err = readFile(errPath);
  return c;
}

LaunchOptions shell(int nproc, const std::string& script, const TempDir& dir) {
  LaunchOptions o;
  o.nproc_per_node = nproc;
  o.command = {"/bin/sh", "-c", script};
  o.extra_env = {"DIR=" + dir.path()};
  o.grace_seconds = 5;
  return o;
}

// Writes the shell's pid to $DIR/pid.$RANK atomically (a reader never sees
// a half-written file).
const std::string kWritePid = R"(echo $$ > "$DIR/pid.$RANK.tmp" && mv "$DIR/pid.$RANK.tmp" "$DIR/pid.$RANK"; )";

bool waitForFiles(const std::vector<std::string>& paths, double timeoutSeconds) {
  const auto start = Clock::now();
  while (secondsSince(start) < timeoutSeconds) {
    bool all = true;
    for (const auto& p : paths) all = all && std::filesystem::exists(p);
    if (all) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// True when `pid` no longer runs: gone, or a zombie waiting for a reaper that
// is not us (a container's init may never reap).
bool processGone(pid_t pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return true;
  const std::string stat = readFile("/proc/" + std::to_string(pid) + "/stat");
  if (stat.empty()) return true;
  const size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'Z';
}

bool waitGone(pid_t pid, double timeoutSeconds) {
  const auto start = Clock::now();
  while (secondsSince(start) < timeoutSeconds) {
    if (processGone(pid)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return processGone(pid);
}

pid_t readPid(const std::string& path) { return static_cast<pid_t>(std::atol(readFile(path).c_str())); }

int countOccurrences(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t pos = text.find(needle); pos != std::string::npos; pos = text.find(needle, pos + 1)) ++n;
  return n;
}

int openFdCount() {
  int n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

// Sets an environment variable for one test and restores it afterwards.
class ScopedSetenv {
 public:
  ScopedSetenv(const char* key, const char* value) : key_(key) {
    const char* old = getenv(key);
    had_ = old != nullptr;
    if (had_) old_ = old;
    setenv(key, value, 1);
  }
  ~ScopedSetenv() {
    if (had_) {
      setenv(key_.c_str(), old_.c_str(), 1);
    } else {
      unsetenv(key_.c_str());
    }
  }

 private:
  std::string key_;
  std::string old_;
  bool had_ = false;
};

const std::string kEnvLine =
    R"(printf '%s %s %s %s %s %s %s %s %s %s %s\n' "$RANK" "$WORLD_SIZE" "$LOCAL_RANK" "$LOCAL_WORLD_SIZE" )"
    R"("$GROUP_RANK" "$NODE_RANK" "$MASTER_ADDR" "$MASTER_PORT" "$PTRAIN_WORKER" "${PTRAIN_PROGRESS_TTY-unset}" )"
    R"("${EXTRA-unset}" > "$DIR/env.$RANK")";

TEST(Launcher, EveryRankSeesItsTorchrunVariables) {
  TempDir dir;
  // Stale values in the launcher's environment must not reach the workers.
  ScopedSetenv staleRank("RANK", "99");
  ScopedSetenv staleTty("PTRAIN_PROGRESS_TTY", "1");
  auto o = shell(3, kEnvLine, dir);
  o.extra_env.push_back("EXTRA=hello");
  const Captured c = launchCaptured(o);
  ASSERT_EQ(c.code, 0) << c.err;
  std::string port;
  for (int r = 0; r < 3; ++r) {
    const std::string line = readFile(dir.path() + "/env." + std::to_string(r));
    // rank world local local_world group node addr port worker tty extra
    const std::string head = std::to_string(r) + " 3 " + std::to_string(r) + " 3 0 0 127.0.0.1 ";
    ASSERT_EQ(line.substr(0, head.size()), head) << line;
    const std::string rest = line.substr(head.size());
    const std::string thisPort = rest.substr(0, rest.find(' '));
    EXPECT_EQ(rest.substr(thisPort.size()), " 1 unset hello\n") << line;
    if (r == 0) port = thisPort;
    EXPECT_EQ(thisPort, port) << "all ranks must share one MASTER_PORT";
  }
  const int p = std::atoi(port.c_str());
  EXPECT_GE(p, 1);
  EXPECT_LE(p, 65535);
}

TEST(Launcher, SecondNodeGetsTheUpperRanksAndTheGivenPort) {
  TempDir dir;
  auto o = shell(2, kEnvLine, dir);
  o.nnodes = 2;
  o.node_rank = 1;
  o.master_addr = "127.0.0.1";
  o.master_port = 23456;
  const Captured c = launchCaptured(o);
  ASSERT_EQ(c.code, 0) << c.err;
  EXPECT_EQ(readFile(dir.path() + "/env.2"), "2 4 0 2 1 1 127.0.0.1 23456 1 unset unset\n");
  EXPECT_EQ(readFile(dir.path() + "/env.3"), "3 4 1 2 1 1 127.0.0.1 23456 1 unset unset\n");
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/env.0"));
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/env.1"));
  // Output is prefixed with the global rank.
  auto o2 = shell(2, R"(echo "hi from $LOCAL_RANK")", dir);
  o2.nnodes = 2;
  o2.node_rank = 1;
  o2.master_port = 23456;
  const Captured c2 = launchCaptured(o2);
  EXPECT_NE(c2.out.find("[rank 3] hi from 1\n"), std::string::npos) << c2.out;
}

TEST(Launcher, PrefixesEveryLineWithTheRank) {
  TempDir dir;
  const Captured c = launchCaptured(shell(
      2, R"(echo "out line $RANK"; echo "second $RANK"; echo "err line $RANK" >&2; printf 'partial %s' "$RANK")",
      dir));
  ASSERT_EQ(c.code, 0) << c.err;
  // Lines of different ranks may interleave; each line stays whole and each
  // rank's lines keep their order.
  for (int r = 0; r < 2; ++r) {
    const std::string tag = "[rank " + std::to_string(r) + "] ";
    const size_t first = c.out.find(tag + "out line " + std::to_string(r) + "\n");
    const size_t second = c.out.find(tag + "second " + std::to_string(r) + "\n");
    const size_t partial = c.out.find(tag + "partial " + std::to_string(r) + "\n");
    ASSERT_NE(first, std::string::npos) << c.out;
    ASSERT_NE(second, std::string::npos) << c.out;
    ASSERT_NE(partial, std::string::npos) << c.out;
    EXPECT_LT(first, second);
    EXPECT_LT(second, partial);
  }
  EXPECT_NE(c.err.find("[rank 1] err line 1\n"), std::string::npos) << c.err;
  EXPECT_NE(c.err.find("[rank 0] err line 0\n"), std::string::npos) << c.err;
  // 3 lines per rank on stdout, each whole and prefixed.
  EXPECT_EQ(countOccurrences(c.out, "\n"), 6) << c.out;
  EXPECT_EQ(countOccurrences(c.out, "\n[rank "), 5) << c.out;
  EXPECT_EQ(c.out.rfind("[rank ", 0), 0u) << c.out;

  auto plain = shell(1, R"(echo "plain")", dir);
  plain.prefix_output = false;
  EXPECT_EQ(launchCaptured(plain).out, "plain\n");
}

TEST(Launcher, ForwardsHeavyOutputCompletely) {
  TempDir dir;
  // Far more than a pipe holds, from two ranks at once.
  const int kLines = 40000;
  const Captured c = launchCaptured(shell(2, "seq 1 " + std::to_string(kLines), dir));
  ASSERT_EQ(c.code, 0) << c.err;
  std::vector<int> next(2, 1);
  size_t start = 0;
  int bad = 0;
  while (start < c.out.size()) {
    const size_t end = c.out.find('\n', start);
    ASSERT_NE(end, std::string::npos) << "unterminated last line";
    const std::string line = c.out.substr(start, end - start);
    start = end + 1;
    int rank = -1;
    int value = -1;
    if (std::sscanf(line.c_str(), "[rank %d] %d", &rank, &value) != 2 || rank < 0 || rank > 1 ||
        value != next[static_cast<size_t>(rank)]) {
      if (++bad < 5) ADD_FAILURE() << "unexpected line '" << line << "'";
      continue;
    }
    ++next[static_cast<size_t>(rank)];
  }
  EXPECT_EQ(bad, 0);
  EXPECT_EQ(next[0], kLines + 1);
  EXPECT_EQ(next[1], kLines + 1);
}

TEST(Launcher, RankZeroProgressLinesKeepTheirCarriageReturn) {
  TempDir dir;
  // The same bytes come out however the reads split the writes.
  const Captured bar =
      launchCaptured(shell(1, R"(printf 'step 1\r'; sleep 0.05; printf 'step 2\r'; sleep 0.05; printf 'done\n')", dir));
  ASSERT_EQ(bar.code, 0) << bar.err;
  EXPECT_EQ(bar.out, "[rank 0] step 1\r[rank 0] step 2\r[rank 0] done\n");

  // CRLF is an ordinary line end; a '\r' from another rank ends a line.
  const Captured other =
      launchCaptured(shell(2, R"(if [ "$RANK" = 0 ]; then printf 'x\r\n'; else printf 'a\rb\n'; fi)", dir));
  EXPECT_NE(other.out.find("[rank 0] x\n"), std::string::npos) << other.out;
  EXPECT_NE(other.out.find("[rank 1] a\n[rank 1] b\n"), std::string::npos) << other.out;
  EXPECT_EQ(countOccurrences(other.out, "\r"), 0) << other.out;

  // A line from rank 1 while rank 0's bar is drawn starts on a new line and
  // leaves the bar's text in place.
  // Each step waits until the launcher has written the previous one, since
  // the order of bytes across two pipes is otherwise not defined.
  const std::string outPath = dir.path() + "/launcher.out";
  auto mixedOptions = shell(2, R"(
    seen() { grep -q "$1" "$OUT" 2>/dev/null; }
    if [ "$RANK" = 0 ]; then
      printf 'bar 1\r'
      while ! seen msg; do sleep 0.01; done
      printf 'bar 2\r'; printf 'end\n'
    else
      while ! seen 'bar 1'; do sleep 0.01; done
      echo msg
    fi)",
                            dir);
  mixedOptions.extra_env.push_back("OUT=" + outPath);
  const Captured mixed = launchCaptured(mixedOptions, outPath);
  ASSERT_EQ(mixed.code, 0) << mixed.err;
  EXPECT_EQ(mixed.out, "[rank 0] bar 1\r\n[rank 1] msg\n[rank 0] bar 2\r[rank 0] end\n");
}

TEST(Launcher, FailingRankStopsTheOthers) {
  TempDir dir;
  const std::string script = kWritePid + R"(
    if [ "$RANK" = 1 ]; then
      while [ ! -f "$DIR/pid.0" ] || [ ! -f "$DIR/pid.2" ]; do sleep 0.01; done
      echo "rank 1 gives up" >&2
      exit 3
    fi
    exec sleep 60)";
  const Captured c = launchCaptured(shell(3, script, dir));
  EXPECT_EQ(c.code, 3);
  EXPECT_LT(c.seconds, 10.0);
  EXPECT_NE(c.err.find("ptrain: rank 1 exited with code 3"), std::string::npos) << c.err;
  EXPECT_EQ(countOccurrences(c.err, "ptrain: "), 1) << "one line for the failure:\n" << c.err;
  // The failing rank's last words come before the verdict.
  EXPECT_LT(c.err.find("[rank 1] rank 1 gives up"), c.err.find("ptrain: rank 1")) << c.err;
  for (int r : {0, 2}) {
    const pid_t pid = readPid(dir.path() + "/pid." + std::to_string(r));
    ASSERT_GT(pid, 0);
    EXPECT_TRUE(processGone(pid)) << "rank " << r << " (pid " << pid << ") still runs";
  }
}

TEST(Launcher, RankKilledBySignalIsReported) {
  TempDir dir;
  const std::string script = kWritePid + R"(
    if [ "$RANK" = 1 ]; then
      while [ ! -f "$DIR/pid.0" ]; do sleep 0.01; done
      kill -KILL $$
    fi
    exec sleep 60)";
  const Captured c = launchCaptured(shell(2, script, dir));
  EXPECT_EQ(c.code, 128 + 9);
  EXPECT_LT(c.seconds, 10.0);
  EXPECT_NE(c.err.find("ptrain: rank 1 was killed by signal SIGKILL (9)"), std::string::npos) << c.err;
  EXPECT_TRUE(processGone(readPid(dir.path() + "/pid.0")));
}

TEST(Launcher, WorkerIgnoringSigtermIsKilledAfterTheGracePeriod) {
  TempDir dir;
  const std::string script = R"(
    if [ "$RANK" = 0 ]; then
      trap '' TERM
      )" + kWritePid + R"(
      exec sleep 60
    fi
    while [ ! -f "$DIR/pid.0" ]; do sleep 0.01; done
    exit 5)";
  auto o = shell(2, script, dir);
  o.grace_seconds = 0.5;
  const Captured c = launchCaptured(o);
  EXPECT_EQ(c.code, 5);
  EXPECT_GE(c.seconds, 0.5);
  EXPECT_LT(c.seconds, 5.0);
  EXPECT_TRUE(processGone(readPid(dir.path() + "/pid.0")));
}

TEST(Launcher, BackgroundProcessesOfAWorkerDoNotOutliveTheLaunch) {
  TempDir dir;
  // The background sleep keeps the output pipe open; the launcher must not
  // wait for it, and must not leave it running.
  const Captured c = launchCaptured(shell(1, R"(sleep 60 & echo $! > "$DIR/bg"; echo started)", dir));
  EXPECT_EQ(c.code, 0);
  EXPECT_LT(c.seconds, 5.0);
  EXPECT_EQ(c.out, "[rank 0] started\n");
  const pid_t bg = readPid(dir.path() + "/bg");
  ASSERT_GT(bg, 0);
  EXPECT_TRUE(waitGone(bg, 5.0)) << "background pid " << bg << " survived";
}

// The launcher runs in a forked child so that a signal can be sent to it.
void expectSignalStopsEverything(int sig, int expectedCode, const std::string& name) {
  TempDir dir;
  auto o = shell(2, kWritePid + "exec sleep 60", dir);
  o.grace_seconds = 2;
  const std::string errPath = dir.path() + "/launcher.err";
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t launcher = fork();
  ASSERT_GE(launcher, 0);
  if (launcher == 0) {
    const int errFd = open(errPath.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    const int nullFd = open("/dev/null", O_WRONLY);
    dup2(nullFd, STDOUT_FILENO);
    dup2(errFd, STDERR_FILENO);
    int code = 99;
    try {
      code = launchWorkers(o);
    } catch (...) {
    }
    _exit(code);
  }
  const std::vector<std::string> pidFiles = {dir.path() + "/pid.0", dir.path() + "/pid.1"};
  const bool started = waitForFiles(pidFiles, 20.0);
  kill(launcher, sig);
  const auto start = Clock::now();
  int status = 0;
  pid_t done = 0;
  while (done == 0 && secondsSince(start) < 20.0) {
    done = waitpid(launcher, &status, WNOHANG);
    if (done == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (done == 0) {
    kill(launcher, SIGKILL);
    waitpid(launcher, &status, 0);
  }
  ASSERT_TRUE(started) << "workers did not start";
  ASSERT_EQ(done, launcher) << "launcher did not exit after " << name;
  ASSERT_TRUE(WIFEXITED(status)) << "launcher died of signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), expectedCode);
  EXPECT_LT(secondsSince(start), 5.0) << "sleep dies on SIGTERM; no grace period needed";
  EXPECT_NE(readFile(errPath).find("ptrain: received " + name), std::string::npos) << readFile(errPath);
  for (const auto& f : pidFiles) {
    const pid_t pid = readPid(f);
    ASSERT_GT(pid, 0);
    EXPECT_TRUE(processGone(pid)) << "worker " << pid << " survived " << name;
  }
}

TEST(Launcher, CtrlCStopsAllWorkersWith130) { expectSignalStopsEverything(SIGINT, 130, "SIGINT"); }

TEST(Launcher, SigtermStopsAllWorkersWith143) { expectSignalStopsEverything(SIGTERM, 143, "SIGTERM"); }

TEST(Launcher, WorkersDieWhenTheLauncherIsKilled) {
  TempDir dir;
  auto o = shell(2, kWritePid + "exec sleep 60", dir);
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t launcher = fork();
  ASSERT_GE(launcher, 0);
  if (launcher == 0) {
    const int nullFd = open("/dev/null", O_WRONLY);
    dup2(nullFd, STDOUT_FILENO);
    dup2(nullFd, STDERR_FILENO);
    int code = 99;
    try {
      code = launchWorkers(o);
    } catch (...) {
    }
    _exit(code);
  }
  const bool started = waitForFiles({dir.path() + "/pid.0", dir.path() + "/pid.1"}, 20.0);
  // SIGKILL: no chance to clean up; the workers' parent-death signal must act.
  kill(launcher, SIGKILL);
  waitpid(launcher, nullptr, 0);
  ASSERT_TRUE(started);
  for (int r : {0, 1}) {
    const pid_t pid = readPid(dir.path() + "/pid." + std::to_string(r));
    ASSERT_GT(pid, 0);
    EXPECT_TRUE(waitGone(pid, 5.0)) << "worker " << pid << " outlived its launcher";
  }
}

extern "C" void recordSignal(int) {}

TEST(Launcher, LeavesNoDescriptorsOrSignalHandlersBehind) {
  TempDir dir;
  // A descriptor without close-on-exec must not reach the workers.
  const int stray = open("/dev/null", O_RDONLY);
  ASSERT_GE(stray, 0);
  // Known, distinct dispositions, so that a handler left behind shows even
  // if an earlier launch had left the same one.
  const int sigs[4] = {SIGINT, SIGTERM, SIGCHLD, SIGPIPE};
  const sighandler_t wanted[4] = {SIG_DFL, recordSignal, SIG_DFL, SIG_IGN};
  struct sigaction original[4] {};
  for (int i = 0; i < 4; ++i) {
    struct sigaction sa {};
    sa.sa_handler = wanted[i];
    sigemptyset(&sa.sa_mask);
    sigaction(sigs[i], &sa, &original[i]);
  }
  const int fdsBefore = openFdCount();

  // Rank 0 reports, then rank 1 fails (after the report, so the stop cannot
  // cut it short): one launch through the failure path.
  const std::string script = "if [ -e /proc/$$/fd/" + std::to_string(stray) +
                             R"( ]; then echo leaked; else echo closed; fi > "$DIR/fd.tmp.$RANK"
    mv "$DIR/fd.tmp.$RANK" "$DIR/fd.$RANK"
    [ "$RANK" = 0 ] && exit 0
    while [ ! -f "$DIR/fd.0" ]; do sleep 0.01; done
    exit 4)";
  const Captured c = launchCaptured(shell(2, script, dir));
  EXPECT_EQ(c.code, 4);
  EXPECT_EQ(readFile(dir.path() + "/fd.0"), "closed\n");
  EXPECT_EQ(readFile(dir.path() + "/fd.1"), "closed\n");
  EXPECT_EQ(launchCaptured(shell(1, "echo ok", dir)).code, 0);

  EXPECT_EQ(openFdCount(), fdsBefore);
  for (int i = 0; i < 4; ++i) {
    struct sigaction after {};
    sigaction(sigs[i], &original[i], &after);
    EXPECT_EQ(after.sa_handler, wanted[i]) << "signal " << sigs[i] << " not restored";
  }
  close(stray);
}

// The SigIgn mask of a worker's shell, from /proc (bit n-1 is signal n).
unsigned long long ignoredMask(const std::string& statusLine) {
  return std::strtoull(statusLine.c_str() + statusLine.find(':') + 1, nullptr, 16);
}

TEST(Launcher, SignalsIgnoredAtStartStayIgnored) {
  TempDir dir;
  // As under `nohup ptrain run ... &`: SIGHUP ignored. SIGPIPE is at its
  // default, which the workers must see although the launcher ignores it.
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  struct sigaction oldHup {};
  struct sigaction oldPipe {};
  sigaction(SIGHUP, &ignore, &oldHup);
  sigaction(SIGPIPE, &dfl, &oldPipe);
  const Captured c = launchCaptured(shell(1, R"(grep SigIgn /proc/$$/status > "$DIR/sigign")", dir));
  struct sigaction hupAfter {};
  sigaction(SIGHUP, &oldHup, &hupAfter);
  sigaction(SIGPIPE, &oldPipe, nullptr);
  EXPECT_EQ(c.code, 0) << c.err;
  EXPECT_EQ(hupAfter.sa_handler, SIG_IGN);
  const std::string line = readFile(dir.path() + "/sigign");
  ASSERT_NE(line.find("SigIgn:"), std::string::npos) << line;
  const unsigned long long mask = ignoredMask(line);
  EXPECT_NE(mask & (1ULL << (SIGHUP - 1)), 0u) << line;
  EXPECT_EQ(mask & (1ULL << (SIGPIPE - 1)), 0u) << line;
  EXPECT_EQ(mask & (1ULL << (SIGINT - 1)), 0u) << line;
}

TEST(Launcher, OnlyRankZeroIsToldItMayDrawProgressOnATerminal) {
  TempDir dir;
  const int master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (master < 0 || grantpt(master) != 0 || unlockpt(master) != 0) {
    if (master >= 0) close(master);
    GTEST_SKIP() << "no pseudo-terminal available here";
  }
  const int slave = open(ptsname(master), O_RDWR | O_NOCTTY | O_CLOEXEC);
  ASSERT_GE(slave, 0);
  std::fflush(stdout);
  const int savedOut = dup(STDOUT_FILENO);
  dup2(slave, STDOUT_FILENO);
  int code = -1;
  try {
    code = launchWorkers(shell(2, R"(echo "${PTRAIN_PROGRESS_TTY-unset}" > "$DIR/tty.$RANK")", dir));
  } catch (...) {
  }
  dup2(savedOut, STDOUT_FILENO);
  close(savedOut);
  close(slave);
  close(master);
  EXPECT_EQ(code, 0);
  EXPECT_EQ(readFile(dir.path() + "/tty.0"), "1\n");
  EXPECT_EQ(readFile(dir.path() + "/tty.1"), "unset\n");
}

TEST(Launcher, RejectsOptionsThatCannotWork) {
  TempDir dir;
  auto expectConfigError = [&](const LaunchOptions& o, const std::string& mention) {
    try {
      launchWorkers(o);
      ADD_FAILURE() << "expected ConfigError mentioning " << mention;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(mention), std::string::npos) << e.what();
    }
  };
  auto multiNode = shell(2, "true", dir);
  multiNode.nnodes = 2;
  expectConfigError(multiNode, "--master-port");
  auto badNode = shell(2, "true", dir);
  badNode.nnodes = 2;
  badNode.node_rank = 2;
  badNode.master_port = 23456;
  expectConfigError(badNode, "--node-rank=2");
  expectConfigError(shell(0, "true", dir), "--nproc=0");
  LaunchOptions empty;
  expectConfigError(empty, "no worker command");
  LaunchOptions missing;
  missing.command = {dir.path() + "/no-such-program"};
  expectConfigError(missing, "no-such-program");
  LaunchOptions notInPath;
  notInPath.command = {"ptrain-no-such-program-anywhere"};
  expectConfigError(notInPath, "not found in PATH");
  auto badEnv = shell(1, "true", dir);
  badEnv.extra_env.push_back("NOEQUALS");
  expectConfigError(badEnv, "NOEQUALS");
  auto badPort = shell(1, "true", dir);
  badPort.master_port = 70000;
  expectConfigError(badPort, "70000");
}

TEST(Launcher, CommandIsFoundInPath) {
  TempDir dir;
  LaunchOptions o;
  o.nproc_per_node = 2;
  o.command = {"sh", "-c", R"(echo "$RANK" > "$DIR/path.$RANK")"};
  o.extra_env = {"DIR=" + dir.path()};
  EXPECT_EQ(launchCaptured(o).code, 0);
  EXPECT_EQ(readFile(dir.path() + "/path.1"), "1\n");
}

TEST(Launcher, FindFreePortGivesABindablePort) {
  const int port = ptrain::findFreePort("127.0.0.1");
  EXPECT_GT(port, 0);
  EXPECT_LE(port, 65535);
  // The port really is free: it can be bound right away.
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << std::strerror(errno);
  close(fd);
  // An address of no local interface (TEST-NET-1) cannot be bound; no DNS involved.
  EXPECT_THROW(ptrain::findFreePort("192.0.2.1"), ConfigError);
}

}  // namespace
