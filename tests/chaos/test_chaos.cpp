// What a user or a scheduler does to a run, done for real: two runs in one
// folder, SIGTERM and SIGUSR1 in the middle of training, a run that diverges,
// resuming with another recipe or from an earlier step, recipes `check` must
// refuse as `run` does. Each case asserts the exit code, the one line that
// says why, and that nothing already saved is lost or damaged.
// docs/launching.md ("Exit codes", "One run per folder", "Signals"),
// docs/checkpoints.md ("Resuming").
#include <fcntl.h>
#include <sys/stat.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/test_support.h"

namespace fs = std::filesystem;
using ptrain::test::readFile;
using ptrain::test::runPtrain;
using ptrain::test::TempDir;

namespace {

using Clock = std::chrono::steady_clock;

const std::string kQuickstart = ptrain::test::sourceDir() + "/configs/quickstart.yaml";

// `ptrain ARGS` in the background, its output to `log`; in its own process
// group, so a test can signal it as a scheduler would and clean up after.
class Background {
 public:
  Background(const std::vector<std::string>& args, const std::string& log) {
    pid_ = fork();
    if (pid_ == 0) {
      setpgid(0, 0);
      const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
      const int null = open("/dev/null", O_RDONLY);
      dup2(null, STDIN_FILENO);
      std::vector<std::string> full{ptrain::test::ptrainBinary()};
      full.insert(full.end(), args.begin(), args.end());
      std::vector<char*> argv;
      for (auto& a : full) argv.push_back(a.data());
      argv.push_back(nullptr);
      setenv("OMP_NUM_THREADS", "1", 1);
      execv(argv[0], argv.data());
      _exit(127);
    }
    setpgid(pid_, pid_);
  }
  ~Background() {
    if (pid_ > 0 && !reaped_) {
      kill(-pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  pid_t pid() const { return pid_; }
  // The launcher alone, as a scheduler signals the job's main process.
  void signal(int sig) const { kill(pid_, sig); }
  // Exit code (128 + signal when killed); -1 after `seconds` (then killed).
  int wait(double seconds) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
    int status = 0;
    while (Clock::now() < deadline) {
      const pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        reaped_ = true;
        kill(-pid_, SIGKILL);  // whatever it left in its group
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return -1;
  }

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
};

// Waits until `done()` or `seconds` pass; returns done().
template <typename F>
bool waitFor(F done, double seconds) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return done();
}

std::vector<int64_t> checkpointSteps(const std::string& runDir) {
  std::vector<int64_t> steps;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(runDir + "/checkpoints", ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step_", 0) == 0 && name.find_first_not_of("0123456789", 5) == std::string::npos) {
      steps.push_back(std::stoll(name.substr(5)));
    }
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

// Each training step's loss, by step (the last line of a step that appears twice).
std::map<int, double> losses(const std::string& runDir) {
  std::map<int, double> out;
  for (const auto& [step, line] : ptrain::test::readTrainingSteps(runDir)) {
    const auto j = nlohmann::json::parse(line);
    out[step] = j["loss"].is_number() ? j["loss"].get<double>() : std::nan("");
  }
  return out;
}

int trainingLines(const std::string& runDir) { return static_cast<int>(ptrain::test::readTrainingSteps(runDir).size()); }

// The lines of `text` that start with "ptrain: " or "[rank R] ptrain: " and
// are not log lines: what the command says about how it ended.
std::vector<std::string> verdicts(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    std::string body = line;
    if (body.rfind("[rank ", 0) == 0) body = body.substr(body.find("] ") + 2);
    if (body.rfind("ptrain: ", 0) == 0) out.push_back(body);
  }
  return out;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

// Two runs started into one folder: the second is refused in one line naming
// the first (host, pid), as is a --resume of it; the first is not disturbed,
// and once it is gone (however it ended) the folder resumes.
TEST(Chaos, ASecondWriterOfARunFolderIsRefused) {
  TempDir dir;
  const std::string run = dir.path() + "/run";
  Background first({"run", kQuickstart, "--nproc", "1", "train.steps=100000", "checkpoint.every=5", "--run-dir", run},
                   dir.path() + "/first.log");
  ASSERT_TRUE(waitFor([&] { return checkpointSteps(run).size() >= 1; }, 120)) << readFile(dir.path() + "/first.log");

  ptrain::test::ProcessResult second =
      runPtrain({"run", kQuickstart, "--nproc", "1", "train.seed=2", "--run-dir", run}, {}, 60);
  EXPECT_EQ(second.exit_code, 2) << second.output;
  const auto said = verdicts(second.output);
  ASSERT_EQ(said.size(), 1u) << second.output;
  EXPECT_TRUE(contains(said[0], run + " is in use by another run (host ")) << said[0];
  EXPECT_TRUE(contains(said[0], ", pid " + std::to_string(first.pid()) + ", since ")) << said[0];

  ptrain::test::ProcessResult resume = runPtrain({"run", "--resume", "--run-dir", run}, {}, 60);
  EXPECT_EQ(resume.exit_code, 2) << resume.output;
  EXPECT_TRUE(contains(resume.output, "is in use by another run")) << resume.output;
  // Nothing of the refused runs reached the folder.
  EXPECT_FALSE(contains(readFile(run + "/recipe.yaml"), "seed: 2"));

  // The first run is still training.
  const int before = trainingLines(run);
  ASSERT_TRUE(waitFor([&] { return trainingLines(run) > before + 5; }, 60));
  EXPECT_EQ(first.wait(0.1), -1) << "the first run ended";

  // Killed without a chance to clean up: the kernel drops the lock, the
  // newest checkpoint is intact and resumes.
  kill(-first.pid(), SIGKILL);
  first.wait(30);
  const auto steps = checkpointSteps(run);
  ASSERT_FALSE(steps.empty());
  const int64_t last = steps.back();
  ptrain::test::ProcessResult resumed =
      runPtrain({"run", "--resume", "--run-dir", run, "--nproc", "1", "train.steps=" + std::to_string(last + 2),
                 "--allow-changes"},
                {}, 120);
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_TRUE(contains(resumed.output, "resumed from step " + std::to_string(last))) << resumed.output;
}

// SIGTERM, as Slurm and Kubernetes send it before they kill: the workers
// finish their step, save it, and the job exits 75; --resume continues on the
// same curve as a run that was never stopped.
TEST(Chaos, SigtermSavesAtTheNextStepBoundaryAndResumes) {
  TempDir dir;
  const std::string run = dir.path() + "/run";
  Background job({"run", kQuickstart, "--nproc", "2", "optimizer.lr_schedule=constant", "train.steps=100000",
                  "--run-dir", run},
                 dir.path() + "/job.log");
  ASSERT_TRUE(waitFor([&] { return trainingLines(run) >= 12; }, 120)) << readFile(dir.path() + "/job.log");
  job.signal(SIGTERM);
  const int code = job.wait(60);
  const std::string out = readFile(dir.path() + "/job.log");
  ASSERT_EQ(code, 75) << out;
  const auto steps = checkpointSteps(run);
  ASSERT_EQ(steps.size(), 1u) << out;
  const int64_t saved = steps.front();
  EXPECT_GE(saved, 12);
  EXPECT_TRUE(contains(out, "ptrain: stopped by SIGTERM after step " + std::to_string(saved) + ": checkpoint step_" +
                                std::to_string(saved) + " saved; continue with: ptrain run --resume --run-dir " + run))
      << out;
  const auto exitRecord = nlohmann::json::parse(readFile(run + "/exit.json"));
  EXPECT_EQ(exitRecord["result"], 75);

  // The run's own recipe, another length: a change that needs saying.
  const std::string target = "train.steps=" + std::to_string(saved + 3);
  ptrain::test::ProcessResult refused = runPtrain({"run", "--resume", "--run-dir", run, target}, {}, 60);
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_TRUE(contains(refused.output, "differs from the run's")) << refused.output;
  EXPECT_TRUE(contains(refused.output, "train.steps: 100000 -> " + std::to_string(saved + 3))) << refused.output;
  ptrain::test::ProcessResult resumed = runPtrain({"run", "--resume", "--run-dir", run, target, "--allow-changes"}, {}, 120);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const auto after = losses(run);
  ASSERT_EQ(after.count(static_cast<int>(saved) + 3), 1u);

  // The same steps, never stopped (a constant schedule: its learning rate
  // does not depend on train.steps).
  const std::string reference = dir.path() + "/reference";
  ptrain::test::ProcessResult ref =
      runPtrain({"run", kQuickstart, "--nproc", "2", "optimizer.lr_schedule=constant",
                 "train.steps=" + std::to_string(saved + 3), "--run-dir", reference, "checkpoint.save_final=false"},
                {}, 300);
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  const auto expected = losses(reference);
  for (int s = static_cast<int>(saved) + 1; s <= static_cast<int>(saved) + 3; ++s) {
    ASSERT_EQ(expected.count(s), 1u);
    EXPECT_NEAR(after.at(s), expected.at(s), 1e-6 * std::abs(expected.at(s))) << "step " << s;
  }
}

// SIGTERM while checkpoints are being written (a save every step of a model
// whose save takes a while): the save in progress finishes, the run stops at
// that step boundary with 75, and every checkpoint on disk is whole and
// resumes.
TEST(Chaos, SigtermDuringSavesLeavesEveryCheckpointWhole) {
  TempDir dir;
  const std::string run = dir.path() + "/run";
  Background job({"run", kQuickstart, "--nproc", "2", "train.steps=100000", "checkpoint.every=1", "checkpoint.keep=0",
                  "model.hidden_size=256", "model.num_layers=4", "--run-dir", run},
                 dir.path() + "/job.log");
  ASSERT_TRUE(waitFor([&] { return checkpointSteps(run).size() >= 3; }, 120)) << readFile(dir.path() + "/job.log");
  job.signal(SIGTERM);
  ASSERT_EQ(job.wait(60), 75) << readFile(dir.path() + "/job.log");
  const auto steps = checkpointSteps(run);
  for (int64_t step : steps) {
    const auto meta = nlohmann::json::parse(readFile(run + "/checkpoints/step_" + std::to_string(step) + "/meta.json"));
    EXPECT_EQ(meta["step"], step);
  }
  // No save was left half-written, and the newest resumes.
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(run + "/checkpoints", ec)) {
    EXPECT_NE(e.path().filename().string().front(), '.') << e.path();
  }
  ptrain::test::ProcessResult resumed =
      runPtrain({"run", "--resume", "--run-dir", run, "train.steps=" + std::to_string(steps.back() + 1),
                 "--allow-changes"},
                {}, 120);
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
}

// Workers another launcher started (torchrun's variables): rank 0 takes the
// folder's lock itself, and a worker saves on SIGTERM by itself.
TEST(Chaos, WorkersOfAnotherLauncherLockAndSaveThemselves) {
  TempDir dir;
  const std::string run = dir.path() + "/run";
  const int port = ptrain::test::freePort();
  const std::vector<std::string> torchrun = {"RANK=0", "WORLD_SIZE=1", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=1",
                                             "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(port)};
  // Background inherits this process's environment: set it for the child.
  for (const auto& e : torchrun) putenv(strdup(e.c_str()));
  Background worker({"run", kQuickstart, "train.steps=100000", "--run-dir", run}, dir.path() + "/worker.log");
  for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) {
    unsetenv(name);
  }
  ASSERT_TRUE(waitFor([&] { return trainingLines(run) >= 3; }, 120)) << readFile(dir.path() + "/worker.log");
  ptrain::test::ProcessResult second = runPtrain({"run", kQuickstart, "--nproc", "1", "--run-dir", run}, {}, 60);
  EXPECT_EQ(second.exit_code, 2) << second.output;
  EXPECT_TRUE(contains(second.output, "pid " + std::to_string(worker.pid()) + ", since ")) << second.output;
  worker.signal(SIGTERM);
  EXPECT_EQ(worker.wait(60), 75) << readFile(dir.path() + "/worker.log");
  EXPECT_EQ(checkpointSteps(run).size(), 1u);
}

// SIGUSR1 (Slurm's --signal=USR1@T before a time limit) does the same.
TEST(Chaos, Sigusr1SavesToo) {
  TempDir dir;
  const std::string run = dir.path() + "/run";
  Background job({"run", kQuickstart, "--nproc", "1", "train.steps=100000", "--run-dir", run}, dir.path() + "/job.log");
  ASSERT_TRUE(waitFor([&] { return trainingLines(run) >= 3; }, 120)) << readFile(dir.path() + "/job.log");
  job.signal(SIGUSR1);
  ASSERT_EQ(job.wait(60), 75) << readFile(dir.path() + "/job.log");
  EXPECT_EQ(checkpointSteps(run).size(), 1u);
  EXPECT_TRUE(contains(readFile(dir.path() + "/job.log"), "ptrain: stopped by SIGUSR1 after step "));

  // checkpoint.on_signal: [] turns it off: SIGTERM then stops without a save.
  const std::string off = dir.path() + "/off";
  Background plain({"run", kQuickstart, "--nproc", "1", "train.steps=100000", "checkpoint.on_signal=[]", "--run-dir", off},
                   dir.path() + "/off.log");
  ASSERT_TRUE(waitFor([&] { return trainingLines(off) >= 3; }, 120)) << readFile(dir.path() + "/off.log");
  plain.signal(SIGTERM);
  EXPECT_EQ(plain.wait(60), 128 + SIGTERM) << readFile(dir.path() + "/off.log");
  EXPECT_TRUE(checkpointSteps(off).empty());
}

// A run that diverges (fp32, a learning rate of 1e4) stops at the first
// non-finite step with exit code 4 and one line naming it; no checkpoint
// holds that state, so --resume would start from the last good step. With
// on_nonfinite: skip, the steps are skipped up to the limit.
TEST(Chaos, ADivergingRunStopsBeforeSavingNaN) {
  TempDir dir;
  const std::string run = dir.path() + "/run";
  ptrain::test::ProcessResult r =
      runPtrain({"run", kQuickstart, "--nproc", "1", "optimizer.lr=1e4", "optimizer.warmup_steps=0", "train.steps=60",
                 "checkpoint.every=1", "checkpoint.keep=0", "--run-dir", run},
                {}, 300);
  ASSERT_EQ(r.exit_code, 4) << r.output;
  const auto said = verdicts(r.output);
  // The rank's one line, then the launcher's verdict.
  ASSERT_EQ(said.size(), 2u) << r.output;
  EXPECT_EQ(said[1], "ptrain: rank 0 exited with code 4");
  EXPECT_TRUE(contains(said[0], ": not finite, the run diverged; nothing of this state was saved")) << said[0];
  const auto steps = checkpointSteps(run);
  const auto trained = losses(run);
  ASSERT_FALSE(trained.empty());
  const int stoppedAt = trained.rbegin()->first;
  EXPECT_TRUE(std::isnan(trained.rbegin()->second) || std::isinf(trained.rbegin()->second));
  EXPECT_TRUE(contains(said[0], "ptrain: step " + std::to_string(stoppedAt) + ": loss ")) << said[0];
  // Every saved step is before the non-finite one.
  for (int64_t s : steps) EXPECT_LT(s, stoppedAt);

  const std::string skipping = dir.path() + "/skip";
  ptrain::test::ProcessResult k =
      runPtrain({"run", kQuickstart, "--nproc", "1", "optimizer.lr=1e4", "optimizer.warmup_steps=0", "train.steps=60",
                 "train.on_nonfinite=skip", "train.nonfinite_skip_limit=3", "--run-dir", skipping},
                {}, 300);
  EXPECT_EQ(k.exit_code, 4) << k.output;
  EXPECT_TRUE(contains(k.output, "(4 steps in a row, over train.nonfinite_skip_limit=3)")) << k.output;
  EXPECT_TRUE(contains(k.output, "update skipped (train.on_nonfinite: skip; 3 in a row")) << k.output;
  EXPECT_TRUE(checkpointSteps(skipping).empty());
}

// --resume without a recipe takes the run's; a finished run says so and
// exits 0; --from-step continues from an earlier checkpoint (the later ones
// set aside) on the same curve.
TEST(Chaos, ResumeRules) {
  TempDir dir;
  const std::string run = dir.path() + "/run";
  ptrain::test::ProcessResult r =
      runPtrain({"run", kQuickstart, "--nproc", "1", "train.steps=10", "checkpoint.every=2", "checkpoint.keep=0",
                 "train.eval_every=0", "--run-dir", run},
                {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto original = losses(run);
  ASSERT_EQ(original.size(), 10u);

  ptrain::test::ProcessResult finished = runPtrain({"run", "--resume", "--run-dir", run}, {}, 60);
  EXPECT_EQ(finished.exit_code, 0) << finished.output;
  EXPECT_TRUE(contains(finished.output, run + ": the run has finished: checkpoint step_10 is at train.steps=10"))
      << finished.output;
  EXPECT_FALSE(contains(finished.output, "final loss")) << finished.output;

  ptrain::test::ProcessResult missing = runPtrain({"run", "--resume", "--run-dir", run, "--from-step", "5"}, {}, 60);
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_TRUE(contains(missing.output, "--from-step 5: no complete checkpoint step_5 there; it has step_2, step_4, "
                                       "step_6, step_8, step_10"))
      << missing.output;

  ptrain::test::ProcessResult earlier = runPtrain({"run", "--resume", "--run-dir", run, "--from-step", "4"}, {}, 300);
  ASSERT_EQ(earlier.exit_code, 0) << earlier.output;
  EXPECT_TRUE(contains(earlier.output, "resumed from step 4")) << earlier.output;
  EXPECT_TRUE(fs::is_directory(run + "/checkpoints/step_6.set-aside"));
  EXPECT_TRUE(fs::is_directory(run + "/checkpoints/step_10.set-aside"));
  // The same curve (to rounding: a new process's buffers may align
  // differently under the host kernels).
  const auto again = losses(run);
  for (int s = 5; s <= 10; ++s) EXPECT_NEAR(again.at(s), original.at(s), 1e-6 * original.at(s)) << "step " << s;

  // A damaged meta.json is one line naming it; nothing is changed.
  std::ofstream(run + "/checkpoints/step_8/meta.json") << "{\"step\": 8, \"rng\": ";
  ptrain::test::ProcessResult damaged = runPtrain({"run", "--resume", "--run-dir", run, "--from-step", "8"}, {}, 120);
  EXPECT_EQ(damaged.exit_code, 2) << damaged.output;
  EXPECT_TRUE(contains(damaged.output, run + "/checkpoints/step_8/meta.json: not valid JSON")) << damaged.output;
  EXPECT_TRUE(fs::is_directory(run + "/checkpoints/step_6"));

  // A file where the folder should be: one line.
  const std::string file = dir.write("not-a-folder", "x");
  ptrain::test::ProcessResult asFile = runPtrain({"run", kQuickstart, "--run-dir", file}, {}, 60);
  EXPECT_EQ(asFile.exit_code, 2) << asFile.output;
  EXPECT_EQ(verdicts(asFile.output),
            std::vector<std::string>{"ptrain: --run-dir " + file +
                                     " is a file, not a folder: give a folder (it is created if missing)"})
      << asFile.output;
}

// A command that is refused leaves the run folder as it found it: a resume
// with a recipe its checkpoint cannot take keeps the run's recipe.yaml (the
// next plain resume works), `ptrain checkpoint consolidate` of a damaged step
// leaves no output and never writes over a folder that holds files, and a
// step without its index.json is named as that, not as another run's.
TEST(Chaos, ARefusedCommandLeavesTheFolderAsItFoundIt) {
  TempDir dir;
  const std::string run = dir.path() + "/run";
  ptrain::test::ProcessResult r = runPtrain({"run", kQuickstart, "--nproc", "1", "train.steps=4", "checkpoint.every=2",
                                             "checkpoint.keep=0", "train.eval_every=0", "--run-dir", run},
                                            {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string recipe = readFile(run + "/recipe.yaml");

  // Another model size: refused once the checkpoint is read; recipe.yaml as it was.
  ptrain::test::ProcessResult refused =
      runPtrain({"run", "--resume", "--run-dir", run, "model.hidden_size=32", "train.steps=6", "--allow-changes"}, {},
                120);
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_EQ(readFile(run + "/recipe.yaml"), recipe);
  EXPECT_FALSE(fs::exists(run + "/recipe.before-step_4.yaml"));
  // A change the checkpoint takes: recorded, with the run's recipe kept beside it.
  ptrain::test::ProcessResult longer =
      runPtrain({"run", "--resume", "--run-dir", run, "train.steps=6", "--allow-changes"}, {}, 120);
  ASSERT_EQ(longer.exit_code, 0) << longer.output;
  EXPECT_EQ(readFile(run + "/recipe.before-step_4.yaml"), recipe);
  EXPECT_TRUE(contains(readFile(run + "/recipe.yaml"), "steps: 6")) << readFile(run + "/recipe.yaml");
  EXPECT_EQ(checkpointSteps(run), (std::vector<int64_t>{2, 4, 6}));

  // consolidate: a truncated shard, then a flipped byte; no output either time.
  const std::string step = run + "/checkpoints/step_6";
  const std::string out = dir.path() + "/whole";
  for (const bool truncate : {true, false}) {
    const std::string copy = dir.path() + (truncate ? "/truncated" : "/flipped");
    fs::copy(step, copy, fs::copy_options::recursive);
    const std::string shard = copy + "/model.rank00000.safetensors";
    if (truncate) {
      fs::resize_file(shard, fs::file_size(shard) / 2);
    } else {
      std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(static_cast<std::streamoff>(fs::file_size(shard) - 17));
      f.put('\x7f');
    }
    ptrain::test::ProcessResult damaged = runPtrain({"checkpoint", "consolidate", copy, out}, {}, 60);
    EXPECT_EQ(damaged.exit_code, 2) << damaged.output;
    EXPECT_TRUE(contains(damaged.output, shard + ":")) << damaged.output;
    EXPECT_FALSE(fs::exists(out)) << damaged.output;
    for (const auto& e : fs::directory_iterator(dir.path())) {
      EXPECT_NE(e.path().filename().string().rfind(".whole", 0), 0u) << "left behind: " << e.path();
    }
  }
  // A folder that holds a file is never written over; an empty one is filled.
  fs::create_directories(out);
  std::ofstream(out + "/notes.txt") << "mine";
  ptrain::test::ProcessResult occupied = runPtrain({"checkpoint", "consolidate", step, out}, {}, 60);
  EXPECT_EQ(occupied.exit_code, 2) << occupied.output;
  EXPECT_TRUE(contains(occupied.output, out + ": exists and is not empty; give a new folder")) << occupied.output;
  EXPECT_EQ(readFile(out + "/notes.txt"), "mine");
  EXPECT_EQ(std::distance(fs::directory_iterator(out), fs::directory_iterator()), 1);
  fs::remove(out + "/notes.txt");
  ptrain::test::ProcessResult intoEmpty = runPtrain({"checkpoint", "consolidate", step, out}, {}, 60);
  EXPECT_EQ(intoEmpty.exit_code, 0) << intoEmpty.output;
  EXPECT_TRUE(fs::exists(out + "/model.safetensors")) << intoEmpty.output;

  // A step folder without its index.json: named, on resume and on consolidate.
  fs::remove(run + "/checkpoints/step_6/index.json");
  const std::string missing = run + "/checkpoints/step_6/index.json: missing";
  ptrain::test::ProcessResult resume = runPtrain({"run", "--resume", "--run-dir", run, "train.steps=8",
                                                  "--allow-changes"}, {}, 120);
  EXPECT_EQ(resume.exit_code, 2) << resume.output;
  EXPECT_TRUE(contains(resume.output, missing)) << resume.output;
  EXPECT_FALSE(contains(resume.output, "holds no tensors")) << resume.output;
  EXPECT_TRUE(contains(readFile(run + "/recipe.yaml"), "steps: 6"));
  ptrain::test::ProcessResult consolidate =
      runPtrain({"checkpoint", "consolidate", run + "/checkpoints/step_6", dir.path() + "/whole2"}, {}, 60);
  EXPECT_EQ(consolidate.exit_code, 2) << consolidate.output;
  EXPECT_TRUE(contains(consolidate.output, missing)) << consolidate.output;
  EXPECT_FALSE(fs::exists(dir.path() + "/whole2"));
}

// What `run` refuses before starting, `check` refuses too, with the same
// line and exit code, and `run` makes no folder for it.
TEST(Chaos, CheckRefusesWhatRunRefuses) {
  TempDir dir;
  struct Case {
    std::string override_;
    std::string expected;
    int code;
  };
  const std::string tooLarge = "is predicted to need ";
  const std::vector<Case> cases = {
      {"trainer.name=no_such_trainer", "<command line>: trainer.name: no trainer plugin named 'no_such_trainer'", 2},
      {"communication.backend=mpi", "communication.backend: no comm plugin named 'mpi' is installed", 2},
      {"checkpoint.on_signal=[SIGKILL]", "checkpoint.on_signal: 'SIGKILL' is not a signal ptrain saves on", 2},
      // Sizes no tensor of this host can hold: the out-of-memory class.
      {"model.hidden_size=1000000", tooLarge, 3},
      {"train.global_batch_size=2147483648", tooLarge, 3},
  };
  // The other trainers' sizes, likewise.
  const std::string configs = ptrain::test::sourceDir() + "/configs";
  for (const auto& [recipe, override_] : std::vector<std::pair<std::string, std::string>>{
           {configs + "/recommender/recsys_small.yaml", "model.scale=1e9"},
           {configs + "/detection/mosaic_dp2.yaml", "data.canvas=40000"}}) {
    ptrain::test::ProcessResult check = runPtrain({"check", recipe, override_}, {}, 60);
    EXPECT_EQ(check.exit_code, 3) << override_ << "\n" << check.output;
    EXPECT_EQ(verdicts(check.output).size(), 1u) << check.output;
    const std::string run = dir.path() + "/never";
    ptrain::test::ProcessResult r = runPtrain({"run", recipe, override_, "--run-dir", run}, {}, 60);
    EXPECT_EQ(r.exit_code, 3) << override_ << "\n" << r.output;
    EXPECT_FALSE(fs::exists(run)) << override_;
  }
  for (const auto& c : cases) {
    ptrain::test::ProcessResult check = runPtrain({"check", kQuickstart, c.override_}, {}, 60);
    EXPECT_EQ(check.exit_code, c.code) << c.override_ << "\n" << check.output;
    EXPECT_EQ(verdicts(check.output).size(), 1u) << check.output;
    EXPECT_TRUE(contains(check.output, c.expected)) << c.override_ << "\n" << check.output;
    const std::string run = dir.path() + "/never";
    ptrain::test::ProcessResult r = runPtrain({"run", kQuickstart, c.override_, "--run-dir", run}, {}, 60);
    EXPECT_EQ(r.exit_code, c.code) << c.override_ << "\n" << r.output;
    EXPECT_EQ(verdicts(r.output).size(), 1u) << r.output;
    EXPECT_TRUE(contains(r.output, c.expected)) << c.override_ << "\n" << r.output;
    EXPECT_FALSE(fs::exists(run)) << c.override_;
  }
}

// A full disk on rank 0 while it saves (the file-size limit stands in for a
// full disk: the same failing write, ENOSPC's EFBIG twin): rank 0's own error
// is the cause the launcher and exit.json name, not rank 1 that lost it, and
// no partial checkpoint is left.
TEST(Chaos, AFailedWriteBlamesTheRankThatFailed) {
  TempDir dir;
  const std::string run = dir.path() + "/run";
  // 256 KiB: the logs and metrics fit, a checkpoint of the quickstart's
  // 450 KiB of weights does not. SIGXFSZ ignored, as the launcher's
  // inherited dispositions pass on to the workers: the write then fails
  // with EFBIG instead of killing the writer.
  const std::string script = "ulimit -f 256; trap '' XFSZ; exec " + ptrain::test::ptrainBinary() + " run " +
                             kQuickstart + " --nproc 2 train.steps=3 checkpoint.every=2 train.eval_every=0 --run-dir " +
                             run;
  ptrain::test::ProcessResult r = ptrain::test::runProcess({"/bin/bash", "-c", script}, {}, 300);
  ASSERT_NE(r.exit_code, 0) << r.output;
  const auto record = nlohmann::json::parse(readFile(run + "/exit.json"));
  EXPECT_EQ(record["first_failure_rank"], 0) << r.output;
  EXPECT_NE(record["result"], 5) << r.output;
  EXPECT_EQ(record["result"], r.exit_code);
  EXPECT_TRUE(contains(r.output, "File too large")) << r.output;
  EXPECT_TRUE(checkpointSteps(run).empty());
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(run + "/checkpoints", ec)) {
    ADD_FAILURE() << "left behind: " << e.path();
  }
  // And the doctor names rank 0 too.
  ptrain::test::ProcessResult d = runPtrain({"doctor", run}, {}, 60);
  EXPECT_TRUE(contains(d.output, "rank 0")) << d.output;
}

// A disk that really fills up: a 2 MiB tmpfs (in a user and mount namespace
// of its own, where the machine allows one), kept full by a writer that takes
// every page freed. Rank 0's "No space left on device" is the cause named,
// and exit.json is still written, into the space the launcher took at start.
TEST(Chaos, AFullDiskIsBlamedOnItsRankAndExitJsonIsStillWritten) {
  TempDir dir;
  const std::string mountPoint = dir.path() + "/disk";
  const std::string out = dir.path() + "/out";
  fs::create_directories(mountPoint);
  fs::create_directories(out);
  ptrain::test::ProcessResult probe =
      ptrain::test::runProcess({"/usr/bin/unshare", "--user", "--map-root-user", "--mount", "/bin/sh", "-c",
                                "mount -t tmpfs -o size=64k tmpfs " + mountPoint},
                               {}, 30);
  if (probe.exit_code != 0) {
    GTEST_SKIP() << "no tmpfs can be mounted here (unprivileged user namespaces are off: " << probe.output
                 << "); AFailedWriteBlamesTheRankThatFailed simulates the failing write instead";
  }
  const std::string run = mountPoint + "/run";
  const std::string script =
      "set -u\n"
      "mount -t tmpfs -o size=2m tmpfs " + mountPoint + "\n" +
      ptrain::test::ptrainBinary() + " run " + kQuickstart +
      " --nproc 2 train.steps=200 checkpoint.every=100 train.eval_every=0 --run-dir " + run + " > " + out +
      "/log 2>&1 &\n"
      "P=$!\n"
      "while [ ! -s " + run + "/metrics.jsonl ]; do sleep 0.05; done\n"
      "( i=0; while kill -0 $P 2>/dev/null; do dd if=/dev/zero of=" + mountPoint +
      "/fill$i bs=4k 2>/dev/null; i=$((i+1)); done ) &\n"
      "wait $P; echo $? > " + out + "/rc\n"
      "cp " + run + "/exit.json " + out + "/ 2>/dev/null\n"
      "ls -A " + run + "/checkpoints > " + out + "/checkpoints\n"
      "df -k " + mountPoint + " | tail -1 > " + out + "/df\n";
  ptrain::test::ProcessResult r = ptrain::test::runProcess(
      {"/usr/bin/unshare", "--user", "--map-root-user", "--mount", "/bin/sh", "-c", script}, {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string log = readFile(out + "/log");
  EXPECT_TRUE(contains(log, "No space left on device")) << log;
  EXPECT_TRUE(contains(readFile(out + "/df"), " 100% ")) << readFile(out + "/df");
  ASSERT_TRUE(fs::exists(out + "/exit.json")) << log;
  const auto record = nlohmann::json::parse(readFile(out + "/exit.json"));
  EXPECT_EQ(record["first_failure_rank"], 0) << log;
  EXPECT_EQ(std::to_string(record["result"].get<int>()) + "\n", readFile(out + "/rc")) << log;
  EXPECT_NE(record["result"], 5);
  // The save that failed left nothing behind.
  EXPECT_EQ(readFile(out + "/checkpoints"), "");
}

// A damaged or foreign file on the plugin path is named in one line (exit
// 2), never a crash of every command.
TEST(Chaos, ADamagedPluginIsNamedNotACrash) {
  TempDir dir;
  std::string plugin;
  for (const auto& e : fs::recursive_directory_iterator(ptrain::test::binaryDir() + "/lib/ptrain/plugins")) {
    if (e.path().extension() == ".so") {
      plugin = e.path().string();
      break;
    }
  }
  ASSERT_FALSE(plugin.empty());
  const std::string bytes = readFile(plugin);
  const std::string truncatedDir = dir.path() + "/truncated";
  fs::create_directories(truncatedDir);
  std::ofstream(truncatedDir + "/libbroken.so", std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  const std::string foreignDir = dir.path() + "/foreign";
  fs::create_directories(foreignDir);
  std::ofstream(foreignDir + "/libnotes.so") << std::string(20, '#') + " these are notes, not a library, named as one "
                                              << std::string(40, '#') << "\n";

  for (const auto& [folder, why] : std::vector<std::pair<std::string, std::string>>{
           {truncatedDir, "not a usable plugin library: truncated: "}, {foreignDir, "not a usable plugin library: not an ELF file"}}) {
    for (const auto& args : std::vector<std::vector<std::string>>{
             {"plugins", "--path", folder}, {"check", kQuickstart, "plugins.paths=[" + folder + "]"}}) {
      ptrain::test::ProcessResult r = runPtrain(args, {}, 60);
      EXPECT_EQ(r.exit_code, 2) << r.output;
      const auto said = verdicts(r.output);
      ASSERT_EQ(said.size(), 1u) << r.output;
      EXPECT_TRUE(contains(said[0], folder + "/lib")) << said[0];
      EXPECT_TRUE(contains(said[0], why)) << said[0];
    }
  }
}

// Recipes beyond the reader's bounds, and files that are not recipes, are
// refused in one line before they can take minutes or gigabytes.
TEST(Chaos, UnboundedRecipesAreRefusedInOneLine) {
  TempDir dir;
  struct Case {
    std::string path;
    std::string expected;
  };
  std::vector<Case> cases;
  // An alias bomb: 10^9 values from a few hundred bytes.
  std::string bomb = "a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n";
  std::string previous = "a";
  for (char c = 'b'; c <= 'j'; ++c) {
    bomb += std::string(1, c) + ": &" + c + " [";
    for (int i = 0; i < 10; ++i) bomb += (i ? ", *" : "*") + previous;
    bomb += "]\n";
    previous = std::string(1, c);
  }
  cases.push_back({dir.write("bomb.yaml", bomb), "the recipe expands to more than 100000 values"});
  // Nested far deeper than any recipe.
  cases.push_back({dir.write("deep.yaml", "train: {steps: " + std::string(100, '[') + std::string(100, ']') + "}\n"),
                   "nested more than 32 levels deep"});
  // Too large.
  cases.push_back({dir.write("large.yaml", "# " + std::string(2 << 20, 'x') + "\n"), "bytes, over the 1048576"});
  // An include graph that doubles at each level.
  for (int i = 0; i < 12; ++i) {
    const std::string next = "g" + std::to_string(i + 1) + ".yaml";
    dir.write("g" + std::to_string(i) + ".yaml", i < 11 ? "defaults: [" + next + ", " + next + "]\n" : "train: {steps: 1}\n");
  }
  cases.push_back({dir.path() + "/g0.yaml", "the recipe reads more than 64 files through its defaults"});
  // Not a regular file.
  const std::string fifo = dir.path() + "/pipe.yaml";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
  cases.push_back({fifo, "is not a regular file"});
  cases.push_back({"/dev/zero", "is not a regular file"});
  for (const auto& c : cases) {
    for (const std::vector<std::string>& args : {std::vector<std::string>{"check", c.path},
                                                 std::vector<std::string>{"run", c.path, "--run-dir", dir.path() + "/never"}}) {
      ptrain::test::ProcessResult r = runPtrain(args, {}, 20);
      ASSERT_FALSE(r.timed_out) << c.path;
      EXPECT_EQ(r.exit_code, 2) << c.path << "\n" << r.output.substr(0, 2000);
      const auto said = verdicts(r.output);
      ASSERT_EQ(said.size(), 1u) << c.path << "\n" << r.output.substr(0, 2000);
      EXPECT_TRUE(contains(said[0], c.expected)) << said[0];
    }
  }
  EXPECT_FALSE(fs::exists(dir.path() + "/never"));
}

// The command line's own mistakes: one line that says what is valid.
TEST(Chaos, CommandLineMistakesSayWhatIsValid) {
  ptrain::test::ProcessResult misspelt = runPtrain({"rnu", kQuickstart}, {}, 30);
  EXPECT_EQ(misspelt.exit_code, 2);
  EXPECT_EQ(misspelt.output, "ptrain: 'rnu' is not a ptrain command; did you mean 'run'? (ptrain --help lists them)\n");
  ptrain::test::ProcessResult zero = runPtrain({"run", kQuickstart, "--nproc", "0"}, {}, 30);
  EXPECT_EQ(zero.exit_code, 2);
  EXPECT_EQ(zero.output, "ptrain: --nproc 0: expected a whole number of at least 1 (worker processes on this host)\n");
}

// The doctor on what users do: a run stopped on purpose is not a failure, a
// recipe or a damaged exit.json is one line, and the commands it suggests run
// on that folder without failing for the reason diagnosed.
TEST(Chaos, TheDoctorIsRightWhereUsersNeedIt) {
  TempDir dir;
  const std::string run = dir.path() + "/run";
  Background job({"run", kQuickstart, "--nproc", "1", "train.steps=100000", "--run-dir", run}, dir.path() + "/job.log");
  ASSERT_TRUE(waitFor([&] { return trainingLines(run) >= 3; }, 120));
  job.signal(SIGINT);
  EXPECT_EQ(job.wait(60), 130);
  ptrain::test::ProcessResult d = runPtrain({"doctor", run}, {}, 60);
  EXPECT_EQ(d.exit_code, 0) << d.output;
  EXPECT_TRUE(contains(d.output, ": stopped by the user or scheduler\n")) << d.output;
  EXPECT_TRUE(contains(d.output, "ptrain run " + run + "/recipe.yaml --run-dir " + run + "-retry")) << d.output;

  ptrain::test::ProcessResult recipe = runPtrain({"doctor", kQuickstart}, {}, 60);
  EXPECT_EQ(recipe.exit_code, 2);
  EXPECT_EQ(verdicts(recipe.output).size(), 1u) << recipe.output;
  EXPECT_TRUE(contains(recipe.output, "is a recipe, not a run")) << recipe.output;

  std::ofstream(run + "/exit.json") << "{\"result\": ";
  ptrain::test::ProcessResult damaged = runPtrain({"doctor", run}, {}, 60);
  EXPECT_EQ(damaged.exit_code, 2);
  EXPECT_EQ(verdicts(damaged.output).size(), 1u) << damaged.output;
  EXPECT_TRUE(contains(damaged.output, run + "/exit.json: not valid JSON")) << damaged.output;

  // A diverged run: the suggested command (a tenth of the learning rate, no
  // checkpoint to resume) trains without diverging.
  const std::string diverged = dir.path() + "/diverged";
  ptrain::test::ProcessResult nan = runPtrain(
      {"run", kQuickstart, "--nproc", "1", "optimizer.lr=1e3", "train.steps=40", "--run-dir", diverged}, {}, 300);
  ASSERT_EQ(nan.exit_code, 4) << nan.output;
  ptrain::test::ProcessResult advice = runPtrain({"doctor", diverged}, {}, 60);
  EXPECT_EQ(advice.exit_code, 1) << advice.output;
  EXPECT_TRUE(contains(advice.output, ": loss NaN\n")) << advice.output;
  std::string command;
  {
    std::istringstream in(advice.output);
    for (std::string line; std::getline(in, line);) {
      const auto at = line.find("ptrain run ");
      if (at != std::string::npos) command = line.substr(at, line.find("   ", at) - at);
    }
  }
  ASSERT_FALSE(command.empty()) << advice.output;
  EXPECT_TRUE(contains(command, "optimizer.lr=100 ")) << command;
  std::vector<std::string> args;
  {
    std::istringstream words(command.substr(std::string("ptrain ").size()));
    for (std::string w; words >> w;) args.push_back(w);
  }
  args.push_back("train.steps=40");
  ptrain::test::ProcessResult again = runPtrain(args, {}, 300);
  EXPECT_NE(again.exit_code, 4) << command << "\n" << again.output;
}
