// `ptrain doctor` on real failures produced here: a worker killed mid-step, a
// collective that times out behind a stuck rank, a worker over its memory cap
// (train.max_memory_mb), a diverging fp16 run, a plugin built for another
// ABI, a layout that does not fit its world, a GRPO rollout whose size does
// not fit the actor's world, a configuration error; and a
// healthy run, which it leaves alone. Each run goes through `ptrain run`,
// whose launcher records launch.log and exit.json in the run folder.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "support/test_support.h"

namespace fs = std::filesystem;
using ptrain::test::runPtrain;
using ptrain::test::TempDir;

namespace {

std::string quickstart() { return ptrain::test::sourceDir() + "/configs/quickstart.yaml"; }

ptrain::test::ProcessResult doctor(const std::string& path) { return runPtrain({"doctor", path}, {}, 120); }

std::vector<std::string> runArgs(const std::string& runDir, std::vector<std::string> extra) {
  std::vector<std::string> args{"run", quickstart(), "--run-dir", runDir, "train.eval_every=0", "log.progress=lines",
                                "train.log_every=1"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// The worker of `rank` among the processes whose environment holds `tag`.
pid_t findWorker(const std::string& tag, int rank) {
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(entry.path() / "environ", std::ios::binary);
    std::string var;
    bool tagged = false, worker = false, ranked = false;
    while (std::getline(in, var, '\0')) {
      tagged = tagged || var == tag;
      worker = worker || var == "PTRAIN_WORKER=1";
      ranked = ranked || var == "RANK=" + std::to_string(rank);
    }
    if (tagged && worker && ranked) return static_cast<pid_t>(std::stol(name));
  }
  return 0;
}

// Starts a 2-rank run, waits until it has logged `steps` steps, then sends
// `signal` to rank 1; returns the run's result.
ptrain::test::ProcessResult runAndSignalRank1(const std::string& runDir, int signal, std::vector<std::string> extra) {
  const std::string tag = "PTRAIN_DOCTOR_TEST=" + std::to_string(getpid()) + "-" + std::to_string(signal);
  auto run = std::async(std::launch::async, [&] {
    return runPtrain(runArgs(runDir, extra), {tag}, 300);
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  pid_t pid = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    if (ptrain::test::readTrainingSteps(runDir).size() >= 2 && (pid = findWorker(tag, 1)) != 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_NE(pid, 0) << "rank 1 never started or never trained";
  if (pid != 0) kill(pid, signal);
  return run.get();
}

void expectDiagnosis(const ptrain::test::ProcessResult& r, const std::string& kind,
                     const std::vector<std::string>& texts) {
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find(": " + kind + "\n"), std::string::npos) << r.output;
  for (const auto& text : texts) EXPECT_NE(r.output.find(text), std::string::npos) << text << "\n" << r.output;
}

TEST(Doctor, AHealthyRunHasNothingToReport) {
  TempDir tmp;
  const std::string dir = tmp.path() + "/run";
  auto run = runPtrain(runArgs(dir, {"train.steps=5"}), {}, 300);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  ASSERT_TRUE(fs::exists(dir + "/launch.log"));
  EXPECT_NE(ptrain::test::readFile(dir + "/exit.json").find("\"result\": 0"), std::string::npos);
  auto r = doctor(dir);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("no failure found: 5 training steps"), std::string::npos) << r.output;
  // The run folder's recipe is what the doctor's commands start from: it
  // loads and resumes as the original did (an fp32 run, whose fp16 defaults
  // must not come back as keys that do not apply).
  auto check = runPtrain({"check", dir + "/recipe.yaml"}, {}, 120);
  EXPECT_EQ(check.exit_code, 0) << check.output;
  auto resumed = runPtrain({"run", dir + "/recipe.yaml", "--resume", "--run-dir", dir, "train.steps=6", "--allow-changes"}, {}, 300);
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_EQ(ptrain::test::readTrainingSteps(dir).count(6), 1u) << resumed.output;
}

// metrics.jsonl with damage in it (not only a last line cut by a crash):
// the whole lines are read, and the damage is named, not passed over.
TEST(Doctor, DamagedMetricsLinesAreNamed) {
  TempDir tmp;
  const std::string dir = tmp.path() + "/run";
  fs::create_directories(dir);
  tmp.write("run/metrics.jsonl", std::string("{\"step\":1,\"loss\":2.0}\n\x89PNG\n{\"step\":2,\"loss\":1.5}\n") +
                                     "{\"step\":3,\"lo");
  auto r = doctor(dir);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("no failure found: 2 training steps, last loss 1.5"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("note: 1 line of metrics.jsonl skipped as damaged; the first: " + dir +
                          "/metrics.jsonl:2:1: not UTF-8 (byte 0x89 at offset 22 of the file)"),
            std::string::npos)
      << r.output;
}

TEST(Doctor, AWorkerKilledMidRunIsALostRank) {
  TempDir tmp;
  const std::string dir = tmp.path() + "/run";
  auto run = runAndSignalRank1(dir, SIGKILL, {"train.steps=100000", "checkpoint.every=0"});
  EXPECT_NE(run.exit_code, 0) << run.output;
  // No checkpoint was saved (checkpoint.every=0): the command starts the
  // run's recipe again, since --resume would find nothing.
  expectDiagnosis(doctor(dir), "lost rank",
                  {"rank 1 was killed by SIGKILL", "exit.json: rank 1 was killed by SIGKILL first",
                   "ptrain run " + dir + "/recipe.yaml --run-dir " + dir + "-retry", "no checkpoint was saved"});
}

PTRAIN_LONG_TEST(Doctor, ACollectiveBehindAStuckRankTimesOut) {
  TempDir tmp;
  const std::string dir = tmp.path() + "/run";
  // Rank 1 stops (SIGSTOP) and never answers: rank 0's next collective waits
  // communication.timeout_s and fails; the launcher then stops everyone.
  auto run = runAndSignalRank1(dir, SIGSTOP, {"train.steps=100000", "communication.timeout_s=3"});
  EXPECT_NE(run.exit_code, 0) << run.output;
  expectDiagnosis(doctor(dir), "communication timeout",
                  {"timed out after", "communication.timeout_s=<more seconds>", "exit.json: rank 0 exited with code 1",
                   "the peer that never answered: rank 1", "; the peer that did not arrive: rank 1 (last finished step "});
}

PTRAIN_LONG_TEST(Doctor, AWorkerOverItsMemoryCapIsOutOfMemoryWithTheFlowchartsFixes) {
  TempDir tmp;
  // A 12.6M-parameter GPT (its weights, gradients and Adam states about 200 MB
  // a rank), first uncapped to learn its peak on this libtorch, then under a
  // cap 10% below it.
  const std::vector<std::string> model = {"model.hidden_size=512", "model.num_layers=4",
                                          "model.num_attention_heads=8", "checkpoint.save_final=false"};
  std::vector<std::string> free = {"train.steps=1"};
  free.insert(free.end(), model.begin(), model.end());
  auto uncapped = runPtrain(runArgs(tmp.path() + "/free", free), {}, 300);
  ASSERT_EQ(uncapped.exit_code, 0) << uncapped.output;
  const auto first = nlohmann::json::parse(ptrain::test::readTrainingSteps(tmp.path() + "/free").at(1));
  const int cap = static_cast<int>(0.9 * first["peak_rss_mb"].get<double>());
  const std::string capText = "train.max_memory_mb=" + std::to_string(cap);

  const std::string dir = tmp.path() + "/run";
  std::vector<std::string> extra = {"train.steps=3", capText};
  extra.insert(extra.end(), model.begin(), model.end());
  auto run = runPtrain(runArgs(dir, extra), {}, 300);
  EXPECT_EQ(run.exit_code, 3) << run.output;
  EXPECT_NE(run.output.find("out of memory: rank 0 of runtime 'model' reached"), std::string::npos) << run.output;
  auto r = doctor(dir);
  expectDiagnosis(r, "out of memory", {"over " + capText, "exit.json: rank", "exited with code 3"});
  // The first step offered is predicted to fit with 10% to spare, and is a
  // command that runs on this folder (no checkpoint: the recipe again, in a
  // new folder); run, it does not run out of memory.
  const std::string prefix = "ptrain run " + dir + "/recipe.yaml ";
  const auto at = r.output.find(prefix);
  ASSERT_NE(at, std::string::npos) << r.output;
  const std::string command = r.output.substr(at, r.output.find("   (predicted peak", at) - at);
  EXPECT_NE(command.find(" --run-dir " + dir + "-retry"), std::string::npos) << command;
  std::vector<std::string> args;
  std::istringstream words(command.substr(std::string("ptrain ").size()));
  for (std::string w; words >> w;) args.push_back(w);
  auto again = runPtrain(args, {}, 300);
  EXPECT_EQ(again.exit_code, 0) << command << "\n" << again.output;
}

// fp16's loss scale starts at 2^32 and backs off for its first dozen or so
// steps, skipping them: that search is normal, not a storm.
TEST(Doctor, AHealthyFp16RunIsNotAStorm) {
  TempDir tmp;
  const std::string dir = tmp.path() + "/run";
  auto run = runPtrain({"run", ptrain::test::sourceDir() + "/configs/llm/gpt_fp16.yaml", "--run-dir", dir,
                        "train.steps=200", "train.eval_every=0"},
                       {}, 300);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  int skipped = 0;
  for (const auto& [step, line] : ptrain::test::readTrainingSteps(dir)) {
    skipped += line.find("\"skipped\":true") != std::string::npos ? 1 : 0;
  }
  EXPECT_GE(skipped, 3) << "the loss scale's search skips steps at the start";
  auto r = doctor(dir);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("no failure found: 200 training steps"), std::string::npos) << r.output;
}

TEST(Doctor, APluginBuiltForAnotherAbiIsAPluginFailure) {
  TempDir tmp;
  // Refused before any folder is made: the user's saved output is the record.
  auto run = runPtrain(runArgs(tmp.path() + "/run", {"plugins.paths=[" + std::string(PTRAIN_FIXTURE_DIR) + "/bad_abi]"}),
                       {}, 120);
  EXPECT_EQ(run.exit_code, 2) << run.output;
  const std::string log = tmp.write("run.log", run.output);
  expectDiagnosis(doctor(log), "plugin load failure",
                  {"plugin ABI version 999", "rebuild the plugin against this ptrain"});
}

TEST(Doctor, ALayoutThatDoesNotFitItsWorldIsAMismatch) {
  TempDir tmp;
  auto run = runPtrain(runArgs(tmp.path() + "/run", {"--nproc", "3", "parallel.tensor_model_parallel_size=2"}), {},
                       120);
  EXPECT_EQ(run.exit_code, 2) << run.output;
  const std::string log = tmp.write("run.log", run.output);
  expectDiagnosis(doctor(log), "layout mismatch", {"world size 3 is not divisible by", "ptrain check RECIPE"});
}

TEST(Doctor, AnActorAndRolloutThatDoNotFitTheWorldAreAMismatch) {
  TempDir tmp;
  auto run = runPtrain({"run", ptrain::test::sourceDir() + "/configs/grpo/arith_grpo.yaml", "--run-dir",
                        tmp.path() + "/run", "--nproc", "4", "launch.nproc=4",
                        "actor_rollout_ref.rollout.tensor_model_parallel_size=3"},
                       {}, 120);
  EXPECT_EQ(run.exit_code, 2) << run.output;
  const std::string log = tmp.write("run.log", run.output);
  expectDiagnosis(doctor(log), "layout mismatch",
                  {"actor_rollout_ref.rollout.tensor_model_parallel_size=3 does not divide the world size 4",
                   "actor_rollout_ref.rollout.tensor_model_parallel_size=0"});
}

TEST(Doctor, AMisspelledKeyIsAConfigurationError) {
  TempDir tmp;
  auto run = runPtrain(runArgs(tmp.path() + "/run", {"optimizer.learning_rate=0.1"}), {}, 120);
  EXPECT_EQ(run.exit_code, 2) << run.output;
  const std::string log = tmp.write("run.log", run.output);
  expectDiagnosis(doctor(log), "configuration or data error", {"optimizer.learning_rate", "ptrain check RECIPE"});
}

TEST(Doctor, APathThatIsNeitherIsRefusedInOneLine) {
  auto r = doctor("/nonexistent/run");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(r.output, "ptrain: /nonexistent/run: no such run folder or log file\n");
}

}  // namespace
