#include "support/test_support.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace fs = std::filesystem;

namespace ptrain::test {

std::string sourceDir() { return PTRAIN_SOURCE_DIR; }

std::string testPython() {
  const char* configured = std::getenv("PTRAIN_PYTHON");
  if (configured != nullptr && *configured != '\0') return configured;
  if (fs::exists(PTRAIN_TEST_PYTHON)) return PTRAIN_TEST_PYTHON;
  return "python3";
}

std::string pythonLacks(const std::vector<std::string>& modules) {
  const std::string python = testPython();
  for (const auto& m : modules) {
    const std::string command = "'" + python + "' -W ignore -c 'import " + m + "' >/dev/null 2>&1";
    if (std::system(command.c_str()) != 0) {
      return python + " cannot import " + m +
             ": this check runs in the PyPI suite (make TORCH=pypi test; tools/install-deps.sh --pypi installs " + m +
             " there), or with PTRAIN_PYTHON set to a python that has it";
    }
  }
  return "";
}
std::string pythonImporting(const std::string& module) {
  auto imports = [&](const std::string& python) {
    return std::system(("'" + python + "' -W ignore -c 'import " + module + "' >/dev/null 2>&1").c_str()) == 0;
  };
  const std::string first = testPython();
  if (imports(first)) return first;
  const std::string venv = sourceDir() + "/.venv-torch/bin/python";
  if (fs::exists(venv) && imports(venv)) return venv;
  return "";
}

std::string binaryDir() { return PTRAIN_BINARY_DIR; }
std::string ptrainBinary() { return std::string(PTRAIN_BINARY_DIR) + "/bin/ptrain"; }

ProcessResult runProcess(const std::vector<std::string>& args, const std::vector<std::string>& env,
                         double timeoutSeconds, const std::string& cwd) {
  ProcessResult result;
  int pipefd[2];
  if (pipe(pipefd) != 0) {
    result.output = "pipe failed";
    return result;
  }
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    dup2(pipefd[1], STDOUT_FILENO);
    dup2(pipefd[1], STDERR_FILENO);
    close(pipefd[0]);
    close(pipefd[1]);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, STDIN_FILENO);
    if (!cwd.empty() && chdir(cwd.c_str()) != 0) _exit(127);
    for (const auto& e : env) putenv(strdup(e.c_str()));
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  setpgid(pid, pid);
  close(pipefd[1]);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeoutSeconds);
  char buf[4096];
  bool open_pipe = true;
  while (open_pipe) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      result.timed_out = true;
      kill(-pid, SIGKILL);
      break;
    }
    pollfd p{pipefd[0], POLLIN, 0};
    int r = poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (r > 0) {
      ssize_t n = read(pipefd[0], buf, sizeof(buf));
      if (n <= 0) open_pipe = false;
      else result.output.append(buf, static_cast<size_t>(n));
    }
  }
  close(pipefd[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  // Anything the process group left behind goes too.
  kill(-pid, SIGKILL);
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  else if (WIFSIGNALED(status)) result.exit_code = 128 + WTERMSIG(status);
  return result;
}

ProcessResult runPtrain(const std::vector<std::string>& args, const std::vector<std::string>& env,
                        double timeoutSeconds, const std::string& cwd) {
  std::vector<std::string> full{ptrainBinary()};
  full.insert(full.end(), args.begin(), args.end());
  return runProcess(full, env, timeoutSeconds, cwd);
}

TempDir::TempDir() {
  std::string tmpl = (fs::temp_directory_path() / "ptrain-test-XXXXXX").string();
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  char* dir = mkdtemp(buf.data());
  if (dir == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = dir;
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

std::string TempDir::write(const std::string& name, const std::string& content) const {
  fs::path p = fs::path(path_) / name;
  fs::create_directories(p.parent_path());
  std::ofstream out(p);
  out << content;
  return p.string();
}

namespace {

// Whether `port` on 127.0.0.1 can be bound now.
bool bindable(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

// The lowest port the kernel hands out for outgoing connections.
int ephemeralLow() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 32768;
  in >> low;
  return low;
}

}  // namespace

// A port below the kernel's ephemeral range: every connection another test
// opens takes an ephemeral port, so a free one from that range may be taken
// between this call and the bind (a test that starts its server late would
// then fail). Random, so tests running side by side rarely pick the same one.
int freePort() {
  const int high = ephemeralLow() - 1;
  const int low = std::max(10000, high - 12000);
  std::mt19937 rng(static_cast<uint32_t>(getpid()) * 2654435761u ^
                   static_cast<uint32_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
  std::uniform_int_distribution<int> pick(low, high);
  for (int attempt = 0; attempt < 64 && high > low; ++attempt) {
    const int port = pick(rng);
    if (bindable(port)) return port;
  }
  // No luck below the range: any port the kernel finds free.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(addr.sin_port);
  close(fd);
  return port;
}

std::string runRanks(int worldSize, const std::function<void(int, int, int)>& body, double timeoutSeconds) {
  int port = freePort();
  std::vector<pid_t> pids;
  for (int rank = 0; rank < worldSize; ++rank) {
    pid_t pid = fork();
    if (pid == 0) {
      int code = 0;
      try {
        body(rank, worldSize, port);
        code = ::testing::Test::HasFailure() ? 1 : 0;
      } catch (const std::exception& e) {
        fprintf(stderr, "rank %d: %s\n", rank, e.what());
        code = 3;
      }
      fflush(stdout);
      fflush(stderr);
      _exit(code);
    }
    pids.push_back(pid);
  }
  std::ostringstream failures;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeoutSeconds);
  std::vector<bool> done(worldSize, false);
  int remaining = worldSize;
  while (remaining > 0) {
    bool progressed = false;
    for (int r = 0; r < worldSize; ++r) {
      if (done[r]) continue;
      int status = 0;
      if (waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        done[r] = true;
        --remaining;
        progressed = true;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
          failures << "rank " << r << " failed (status " << status << "); ";
        }
      }
    }
    if (std::chrono::steady_clock::now() > deadline) {
      for (int r = 0; r < worldSize; ++r) {
        if (!done[r]) {
          kill(pids[r], SIGKILL);
          waitpid(pids[r], nullptr, 0);
          failures << "rank " << r << " timed out; ";
        }
      }
      break;
    }
    if (!progressed) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return failures.str();
}

namespace {
// Marks are made by static initialisers of the test sources, in whatever
// order the linker put them: a function-local set exists before the first.
std::set<std::pair<std::string, std::string>>& longTestMarks() {
  static std::set<std::pair<std::string, std::string>> marks;
  return marks;
}
}  // namespace

LongTestMark::LongTestMark(const char* suite, const char* name) { longTestMarks().emplace(suite, name); }

std::vector<std::string> longTestNames() {
  // gtest names a parameterised test "Prefix/Suite" . "Name/param"; a mark
  // names "Suite" . "Name".
  std::vector<std::string> out;
  const auto* unit = ::testing::UnitTest::GetInstance();
  for (int s = 0; s < unit->total_test_suite_count(); ++s) {
    const auto* suite = unit->GetTestSuite(s);
    std::string suiteName = suite->name();
    const std::string bareSuite = suiteName.substr(suiteName.rfind('/') + 1);
    for (int t = 0; t < suite->total_test_count(); ++t) {
      const std::string name = suite->GetTestInfo(t)->name();
      const std::string bareName = name.substr(0, name.find('/'));
      if (longTestMarks().count({bareSuite, bareName}) != 0) out.push_back(suiteName + "." + name);
    }
  }
  return out;
}

double relDiff(double a, double b) { return std::fabs(a - b) / std::max(std::fabs(b), 1e-12); }

std::map<int, std::string> readTrainingSteps(const std::string& runDir) {
  std::map<int, std::string> out;
  std::istringstream in(readFile(runDir + "/metrics.jsonl"));
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) out[j["step"].get<int>()] = line;
  }
  return out;
}

std::string readLastEvaluation(const std::string& runDir) {
  std::string last;
  std::istringstream in(readFile(runDir + "/metrics.jsonl"));
  for (std::string line; std::getline(in, line);) {
    if (nlohmann::json::parse(line).contains("eval_exact_match")) last = line;
  }
  return last;
}

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return "";
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string trimNewlines(std::string text) {
  while (!text.empty() && text.front() == '\n') text.erase(0, 1);
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

std::string markedSection(const std::string& path, const std::string& name) {
  const std::string doc = readFile(path);
  const std::string begin = "<!-- " + name + ":begin -->\n";
  const std::string end = "<!-- " + name + ":end -->";
  const auto b = doc.find(begin);
  const auto e = doc.find(end);
  EXPECT_NE(b, std::string::npos) << path << " lacks " << begin;
  EXPECT_NE(e, std::string::npos) << path << " lacks " << end;
  if (b == std::string::npos || e == std::string::npos || e < b) return "";
  return trimNewlines(doc.substr(b + begin.size(), e - b - begin.size()));
}

}  // namespace ptrain::test
