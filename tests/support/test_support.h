// Helpers shared by the test suites: run the ptrain binary as a real process,
// temporary folders that clean up after themselves, free loopback ports.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace ptrain::test {

struct ProcessResult {
  int exit_code = -1;   // exit status, or 128 + signal
  std::string output;   // stdout and stderr together
  bool timed_out = false;
};

// Runs `args` (args[0] is the program) with extra environment entries
// ("KEY=VALUE"), capturing output. Kills the whole process group after
// `timeoutSeconds`.
ProcessResult runProcess(const std::vector<std::string>& args,
                         const std::vector<std::string>& env = {},
                         double timeoutSeconds = 300, const std::string& cwd = "");

// Runs build/bin/ptrain with `args`.
ProcessResult runPtrain(const std::vector<std::string>& args,
                        const std::vector<std::string>& env = {},
                        double timeoutSeconds = 300, const std::string& cwd = "");

// Path of the ptrain binary, the source tree and the build tree.
std::string ptrainBinary();
std::string sourceDir();
std::string binaryDir();

// The Python that tests of ptrain against other frameworks' code run
// (transformers, megatron-core, pycocotools): $PTRAIN_PYTHON, else the Python
// of this build's libtorch (the PyPI environment of `make TORCH=pypi`, where
// tools/install-deps.sh --pypi installs those packages), else python3.
std::string testPython();
// Why such a test must skip: "" when testPython() imports every module of
// `modules` ("transformers", "megatron.core"), else a sentence naming the
// python and the module it lacks, and where it comes from.
std::string pythonLacks(const std::vector<std::string>& modules);
// A Python that imports `module`, for readers that do not depend on
// libtorch (tensorboard): testPython(), else the tree's PyPI environment
// (.venv-torch, which tools/install-deps.sh --pypi fills whichever libtorch
// this build uses); empty when neither does (pythonLacks says why).
std::string pythonImporting(const std::string& module);

// A fresh temporary directory, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  // Writes `content` to path()/name and returns the full path.
  std::string write(const std::string& name, const std::string& content) const;

 private:
  std::string path_;
};

// A TCP port on 127.0.0.1 that was free a moment ago, below the kernel's
// ephemeral range (which other processes' connections draw from).
int freePort();

// Runs `body(rank, worldSize, port)` in `worldSize` forked processes and waits
// for all of them (killing them after `timeoutSeconds`). Returns an empty
// string when every child exited 0, else a description of the failures.
// Children report gtest failures through their exit code.
std::string runRanks(int worldSize, const std::function<void(int rank, int worldSize, int port)>& body,
                     double timeoutSeconds = 120);

// The training lines of RUN_DIR/metrics.jsonl (those with a "loss"), by step;
// a step written twice (a resumed run appends) keeps its last line. Each
// value is the JSON object as text, so callers can compare numbers bitwise.
std::map<int, std::string> readTrainingSteps(const std::string& runDir);
// The last evaluation line of RUN_DIR/metrics.jsonl (one with
// "eval_exact_match"), as text; empty when there is none.
std::string readLastEvaluation(const std::string& runDir);

// |a - b| / |b|, the relative difference of a loss against its reference.
double relDiff(double a, double b);

// Reads a whole file; "" when it does not exist.
std::string readFile(const std::string& path);

// Text with its leading and trailing newlines removed.
std::string trimNewlines(std::string text);

// What a document holds between "<!-- NAME:begin -->" and "<!-- NAME:end -->",
// newlines trimmed; a gtest failure (and "") when the markers are missing.
std::string markedSection(const std::string& path, const std::string& name);

// Long tests: a recipe trained to its accuracy, an exactness sweep over many
// layouts on up to 8 ranks, a model larger than a rank may hold. `make test`
// leaves them out; `make test-long` runs them, and CI runs both (.ci/run).
// A test is long when it is declared with PTRAIN_LONG_TEST (or its _F / _P
// forms) instead of TEST: the declaration registers its name, each suite's
// binary lists the names it holds (--ptrain_list_long_tests, test_main.cpp),
// and the test discovery (support/discover_tests.cmake) gives those tests the
// ctest label `long`.
struct LongTestMark {
  LongTestMark(const char* suite, const char* name);
};
// "Suite.Name" of every long test of this binary, as gtest names them to run
// (a parameterised test once per instantiation: "Prefix/Suite.Name/param").
std::vector<std::string> longTestNames();

}  // namespace ptrain::test

#define PTRAIN_LONG_TEST_MARK_(suite, name) \
  static const ::ptrain::test::LongTestMark ptrain_long_test_mark_##suite##_##name{#suite, #name}
// TEST(suite, name), labelled long.
#define PTRAIN_LONG_TEST(suite, name) \
  PTRAIN_LONG_TEST_MARK_(suite, name);  \
  TEST(suite, name)
// TEST_F(fixture, name), labelled long.
#define PTRAIN_LONG_TEST_F(fixture, name) \
  PTRAIN_LONG_TEST_MARK_(fixture, name);  \
  TEST_F(fixture, name)
// TEST_P(suite, name), labelled long (every instantiation).
#define PTRAIN_LONG_TEST_P(suite, name) \
  PTRAIN_LONG_TEST_MARK_(suite, name);    \
  TEST_P(suite, name)
