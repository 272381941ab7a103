// The out-of-tree plugin flow of docs/plugins.md: build
// docs/examples/loopback_plugin against this build with only the generated
// SDK file, load it through PTRAIN_PLUGIN_PATH, and train with it.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/test_support.h"

using ptrain::test::readFile;
using ptrain::test::runProcess;
using ptrain::test::TempDir;

namespace {

// The cmake that configured this build.
const std::string kCmake = PTRAIN_CMAKE_COMMAND;

// Configures and builds the example plugin into `build`, with `cacheArgs`
// saying which ptrain to build against.
void buildExample(const std::string& build, const std::vector<std::string>& cacheArgs) {
  std::vector<std::string> configure{kCmake, "-S", ptrain::test::sourceDir() + "/docs/examples/loopback_plugin",
                                     "-B", build, "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON"};
  configure.insert(configure.end(), cacheArgs.begin(), cacheArgs.end());
  auto r = runProcess(configure, {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = runProcess({kCmake, "--build", build}, {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // libtorch's at::parallel_for is an OpenMP loop expanded in the plugin's
  // own code: without the flag its loops would run on one thread.
  const std::string commands = readFile(build + "/compile_commands.json");
  ASSERT_NE(commands.find("loopback_backend.cpp"), std::string::npos) << commands;
  EXPECT_NE(commands.find("-fopenmp"), std::string::npos) << commands;
}

}  // namespace

TEST(OutOfTreePlugin, BuildsStandaloneLoadsAndTrains) {
  TempDir tmp;
  const std::string build = tmp.path() + "/build";
  ASSERT_NO_FATAL_FAILURE(buildExample(build, {"-DPTRAIN_BUILD_DIR=" + ptrain::test::binaryDir()}));

  const std::string env = "PTRAIN_PLUGIN_PATH=" + build + "/plugins";
  auto r = ptrain::test::runPtrain({"plugins"}, {env});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("comm       loopback       1.0.0     " + build + "/plugins/libptrain_comm_loopback.so"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("comm       gloo"), std::string::npos) << r.output;

  // One process, collectives through the out-of-tree backend.
  r = ptrain::test::runPtrain({"run", ptrain::test::sourceDir() + "/configs/quickstart.yaml", "--nproc", "1",
                               "--run-dir", tmp.path() + "/run", "communication.backend=loopback", "train.steps=3",
                               "data.eval_size=8", "model.num_layers=1", "model.hidden_size=32"},
                              {env});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("final loss"), std::string::npos) << r.output;
}
