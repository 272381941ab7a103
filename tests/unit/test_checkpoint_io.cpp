// Atomic checkpoint folders: complete-or-absent under thrown errors and
// SIGKILL, replacing a step, pruning, leftovers, and the JSON helpers.
#include "ptrain/engine/checkpoint_io.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "ptrain/engine/safetensors.h"
#include "support/test_support.h"

namespace fs = std::filesystem;
using ptrain::CheckpointError;
using ptrain::test::TempDir;

namespace {

void writeText(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

// Everything in RUN_DIR/checkpoints, sorted by name.
std::vector<std::string> entries(const std::string& runDir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(fs::path(runDir) / "checkpoints")) out.push_back(e.path().filename());
  std::sort(out.begin(), out.end());
  return out;
}

// A checkpoint with one file "state.txt" holding `text`.
void saveText(const std::string& runDir, int64_t step, const std::string& text) {
  ptrain::writeCheckpointAtomically(runDir, step, [&](const std::string& tmp) { writeText(tmp + "/state.txt", text); });
}

std::string stateOf(const std::string& runDir, int64_t step) {
  return ptrain::test::readFile(ptrain::checkpointDir(runDir, step) + "/state.txt");
}

template <typename Fn>
std::string errorOf(Fn&& fn) {
  try {
    fn();
  } catch (const CheckpointError& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("other exception: ") + e.what();
  }
  return "no exception";
}

using Steps = std::vector<int64_t>;

}  // namespace

TEST(CheckpointIo, DirectoryNames) {
  EXPECT_EQ(ptrain::checkpointDir("/runs/a", 12), "/runs/a/checkpoints/step_12");
  EXPECT_EQ(ptrain::checkpointDir("rel", 0), "rel/checkpoints/step_0");
}

TEST(CheckpointIo, WritesListsAndLeavesNothingHidden) {
  TempDir dir;
  const std::string run = dir.path() + "/run";
  EXPECT_EQ(ptrain::listCheckpoints(run), Steps{});
  EXPECT_EQ(ptrain::latestCheckpoint(run), std::nullopt);

  std::string seenTmp;
  ptrain::writeCheckpointAtomically(run, 10, [&](const std::string& tmp) {
    seenTmp = tmp;
    // Hidden while being written, and invisible to readers.
    EXPECT_EQ(fs::path(tmp).filename().string(), ".tmp-step_10-" + std::to_string(getpid()));
    EXPECT_EQ(ptrain::listCheckpoints(run), Steps{});
    writeText(tmp + "/state.txt", "ten");
    writeText(tmp + "/sub/deep.bin", "nested");
  });
  EXPECT_FALSE(fs::exists(seenTmp));
  saveText(run, 2, "two");
  saveText(run, 30, "thirty");

  EXPECT_EQ(ptrain::listCheckpoints(run), (Steps{2, 10, 30}));
  EXPECT_EQ(ptrain::latestCheckpoint(run), 30);
  EXPECT_EQ(stateOf(run, 10), "ten");
  EXPECT_EQ(ptrain::test::readFile(ptrain::checkpointDir(run, 10) + "/sub/deep.bin"), "nested");
  EXPECT_EQ(stateOf(run, 30), "thirty");
  EXPECT_EQ(entries(run), (std::vector<std::string>{"step_10", "step_2", "step_30"}));
}

TEST(CheckpointIo, ListTakesOnlyCanonicalStepFolders) {
  TempDir dir;
  const std::string root = dir.path() + "/checkpoints";
  for (const char* name : {"step_4", "step_007", "step_-1", "step_x", "step_5.bak", "step_", ".tmp-step_9-123",
                           ".old-step_11-5", "other"}) {
    fs::create_directories(root + "/" + name);
  }
  writeText(root + "/step_8", "a file, not a folder");
  EXPECT_EQ(ptrain::listCheckpoints(dir.path()), Steps{4});
  EXPECT_EQ(ptrain::latestCheckpoint(dir.path()), 4);
}

TEST(CheckpointIo, ThrowingWriterLeavesEverythingAsItWas) {
  TempDir dir;
  const std::string run = dir.path();
  saveText(run, 1, "one");
  saveText(run, 5, "five");
  auto failingWriter = [](const std::string& tmp) {
    writeText(tmp + "/state.txt", "half writ");
    throw std::runtime_error("disk full");
  };
  // A new step.
  try {
    ptrain::writeCheckpointAtomically(run, 2, failingWriter);
    ADD_FAILURE() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "disk full");  // propagated unchanged
  }
  // A rerun of an existing step.
  EXPECT_THROW(ptrain::writeCheckpointAtomically(run, 5, failingWriter), std::runtime_error);
  // The writer's own ptrain error keeps its type.
  EXPECT_THROW(ptrain::writeCheckpointAtomically(
                   run, 3, [](const std::string&) { throw CheckpointError("model.safetensors: cannot create"); }),
               CheckpointError);

  EXPECT_EQ(ptrain::listCheckpoints(run), (Steps{1, 5}));
  EXPECT_EQ(stateOf(run, 1), "one");
  EXPECT_EQ(stateOf(run, 5), "five");
  EXPECT_EQ(entries(run), (std::vector<std::string>{"step_1", "step_5"}));
}

TEST(CheckpointIo, WriterKilledMidwayLeavesPreviousIntact) {
  TempDir dir;
  const std::string run = dir.path();
  saveText(run, 1, "one");

  int ready[2];
  int block[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(block), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(ready[0]);
    close(block[1]);
    try {
      ptrain::writeCheckpointAtomically(run, 2, [&](const std::string& tmp) {
        writeText(tmp + "/state.txt", "partial");
        char c = 'r';
        if (write(ready[1], &c, 1) != 1) _exit(3);
        // Blocks until the parent kills us: nobody ever writes to `block`.
        (void)!read(block[0], &c, 1);
      });
    } catch (...) {
      _exit(4);
    }
    _exit(5);
  }
  close(ready[1]);
  close(block[0]);
  pollfd p{ready[0], POLLIN, 0};
  const bool signalled = poll(&p, 1, 20000) == 1;
  kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  close(ready[0]);
  close(block[1]);
  ASSERT_TRUE(signalled) << "the child never reached the middle of writeFiles";
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "status " << status;

  const std::string leftover = ".tmp-step_2-" + std::to_string(child);
  EXPECT_EQ(entries(run), (std::vector<std::string>{leftover, "step_1"}));
  EXPECT_EQ(ptrain::test::readFile(run + "/checkpoints/" + leftover + "/state.txt"), "partial");
  EXPECT_EQ(ptrain::listCheckpoints(run), Steps{1});
  EXPECT_EQ(ptrain::latestCheckpoint(run), 1);
  EXPECT_EQ(stateOf(run, 1), "one");

  // The next successful save clears the leftover.
  saveText(run, 2, "two");
  EXPECT_EQ(entries(run), (std::vector<std::string>{"step_1", "step_2"}));
  EXPECT_EQ(stateOf(run, 2), "two");
}

// Both ways of replacing: the atomic swap and the rename-aside fallback.
class CheckpointReplace : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { ptrain::detail::setCheckpointRenameExchange(GetParam()); }
  void TearDown() override { ptrain::detail::setCheckpointRenameExchange(true); }
};

TEST_P(CheckpointReplace, RerunReplacesAnExistingStep) {
  TempDir dir;
  const std::string run = dir.path();
  saveText(run, 4, "four");
  ptrain::writeCheckpointAtomically(run, 5, [](const std::string& tmp) {
    writeText(tmp + "/state.txt", "first");
    writeText(tmp + "/only_in_first.txt", "x");
  });
  saveText(run, 5, "second");
  EXPECT_EQ(stateOf(run, 5), "second");
  EXPECT_FALSE(fs::exists(ptrain::checkpointDir(run, 5) + "/only_in_first.txt"));
  EXPECT_EQ(stateOf(run, 4), "four");
  EXPECT_EQ(entries(run), (std::vector<std::string>{"step_4", "step_5"}));
  // A failing rerun of the same step changes nothing.
  EXPECT_THROW(ptrain::writeCheckpointAtomically(run, 5, [](const std::string&) { throw std::runtime_error("x"); }),
               std::runtime_error);
  EXPECT_EQ(stateOf(run, 5), "second");
  EXPECT_EQ(entries(run), (std::vector<std::string>{"step_4", "step_5"}));
}

INSTANTIATE_TEST_SUITE_P(SwapOrAside, CheckpointReplace, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "RenameExchange" : "RenameAside";
                         });

TEST(CheckpointIo, NextSaveRestoresAStrandedAsideCopy) {
  // What a crash between the two renames of a replace leaves behind where
  // the filesystem cannot swap folders atomically.
  TempDir dir;
  const std::string run = dir.path();
  saveText(run, 1, "one");
  writeText(run + "/checkpoints/.old-step_3-99999/state.txt", "three");
  EXPECT_EQ(ptrain::listCheckpoints(run), Steps{1});
  saveText(run, 4, "four");
  EXPECT_EQ(ptrain::listCheckpoints(run), (Steps{1, 3, 4}));
  EXPECT_EQ(stateOf(run, 3), "three");
  EXPECT_EQ(entries(run), (std::vector<std::string>{"step_1", "step_3", "step_4"}));
}

TEST(CheckpointIo, NextSaveRemovesOnlyItsOwnLeftovers) {
  TempDir dir;
  const std::string run = dir.path();
  saveText(run, 1, "one");
  const std::string root = run + "/checkpoints";
  writeText(root + "/.tmp-step_7-1234/state.txt", "dead save");
  writeText(root + "/.deleting-step_0-55/state.txt", "half pruned");
  writeText(root + "/.old-step_1-77/state.txt", "stale copy of a step that exists");
  writeText(root + "/notes.txt", "the user's own file");
  writeText(root + "/.hidden_user_file", "also the user's");
  saveText(run, 8, "eight");
  EXPECT_EQ(entries(run), (std::vector<std::string>{".hidden_user_file", "notes.txt", "step_1", "step_8"}));
  EXPECT_EQ(stateOf(run, 1), "one");
}

TEST(CheckpointIo, PruneKeepsTheNewestAndTheOneJustWritten) {
  TempDir dir;
  const std::string run = dir.path();
  for (int64_t s : {1, 2, 3, 4, 5}) saveText(run, s, std::to_string(s));

  ptrain::pruneCheckpoints(run, 0);  // keep everything
  EXPECT_EQ(ptrain::listCheckpoints(run), (Steps{1, 2, 3, 4, 5}));
  ptrain::pruneCheckpoints(run, 10);
  EXPECT_EQ(ptrain::listCheckpoints(run), (Steps{1, 2, 3, 4, 5}));
  ptrain::pruneCheckpoints(run, 2, 5);
  EXPECT_EQ(ptrain::listCheckpoints(run), (Steps{4, 5}));
  EXPECT_EQ(stateOf(run, 4), "4");
  EXPECT_EQ(entries(run), (std::vector<std::string>{"step_4", "step_5"}));

  // A run resumed from step 4 while step 100 of an abandoned run exists: with
  // keep=1 the newest is 100, yet the step 6 just written survives.
  saveText(run, 100, "stale");
  saveText(run, 6, "six");
  ptrain::pruneCheckpoints(run, 1, 6);
  EXPECT_EQ(ptrain::listCheckpoints(run), (Steps{6, 100}));
  EXPECT_EQ(stateOf(run, 6), "six");
  EXPECT_EQ(entries(run), (std::vector<std::string>{"step_100", "step_6"}));
}

TEST(CheckpointIo, NegativeStepIsABug) {
  TempDir dir;
  EXPECT_THROW(ptrain::writeCheckpointAtomically(dir.path(), -1, [](const std::string&) {}), ptrain::InternalError);
}

TEST(CheckpointIo, RunDirThatIsAFile) {
  TempDir dir;
  const std::string run = dir.path() + "/run";
  writeText(run + "/checkpoints", "not a folder");
  EXPECT_EQ(errorOf([&] { saveText(run, 1, "x"); }), run + "/checkpoints: exists and is not a folder");
}

TEST(CheckpointJson, WritesReadsAndReportsErrors) {
  TempDir dir;
  const std::string path = dir.path() + "/meta.json";
  const nlohmann::json meta = {{"step", 12}, {"rng", {{"seed", 7}}}, {"recipe", "a: 1\n"}};
  ptrain::writeJsonFile(path, meta);
  // Read by hand: indented text with a final newline.
  const std::string text = ptrain::test::readFile(path);
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n');
  EXPECT_NE(text.find("\n  \"step\": 12"), std::string::npos) << text;
  EXPECT_EQ(nlohmann::json::parse(text), meta);
  EXPECT_EQ(ptrain::readJsonFile(path), meta);

  // Replacing leaves no temporary file behind.
  ptrain::writeJsonFile(path, {{"step", 13}});
  EXPECT_EQ(ptrain::readJsonFile(path).at("step"), 13);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir.path())) names.push_back(e.path().filename());
  EXPECT_EQ(names, std::vector<std::string>{"meta.json"});

  const std::string missing = dir.path() + "/nope.json";
  EXPECT_EQ(errorOf([&] { ptrain::readJsonFile(missing); }), missing + ": file not found");

  const std::string bad = dir.path() + "/bad.json";
  writeText(bad, "{\"step\": ");
  const std::string err = errorOf([&] { ptrain::readJsonFile(bad); });
  const std::string prefix = bad + ": not valid JSON ([json.exception.parse_error.101] parse error";
  EXPECT_EQ(err.substr(0, prefix.size()), prefix) << err;
  EXPECT_EQ(err.find('\n'), std::string::npos) << err;

  const std::string noDir = dir.path() + "/missing/meta.json";
  EXPECT_EQ(errorOf([&] { ptrain::writeJsonFile(noDir, meta); }),
            noDir + ": cannot create (No such file or directory)");
}

TEST(CheckpointIo, SafetensorsAndMetaInOneCheckpoint) {
  TempDir dir;
  const std::string run = dir.path();
  const at::Tensor w = at::arange(12, at::kFloat).reshape({3, 4});
  ptrain::writeCheckpointAtomically(run, 3, [&](const std::string& tmp) {
    ptrain::saveSafetensors(tmp + "/model.safetensors", {{"w", w}});
    ptrain::writeJsonFile(tmp + "/meta.json", {{"step", 3}});
  });
  const std::string ckpt = ptrain::checkpointDir(run, 3);
  EXPECT_EQ(ptrain::readJsonFile(ckpt + "/meta.json").at("step"), 3);
  auto model = ptrain::loadSafetensors(ckpt + "/model.safetensors");
  EXPECT_TRUE(at::equal(model.get("w"), w));
  EXPECT_EQ(model.get("w")[2][3].item<float>(), 11.0f);
}
