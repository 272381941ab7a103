// The out-of-tree plugin flow of docs/plugins.md: build
// docs/examples/loopback_plugin with only the SDK config, against this build
// tree and against an install of it, load it through PTRAIN_PLUGIN_PATH, and
// train with it.
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/test_support.h"

namespace fs = std::filesystem;
using ptrain::test::readFile;
using ptrain::test::runProcess;
using ptrain::test::TempDir;

namespace {

// The cmake that configured this build: `cmake --install` must match it.
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

// `ptrain plugins` as kind/name -> path, the path in normal form: an installed
// core names its folder as the loader found it through $ORIGIN
// (<prefix>/bin/../lib).
std::map<std::string, std::string> listedPlugins(const std::string& output) {
  std::map<std::string, std::string> plugins;
  std::istringstream lines(output);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    std::string kind, name, version, path;
    if (fields >> kind >> name >> version >> path && kind != "KIND") {
      plugins[kind + "/" + name] = fs::path(path).lexically_normal().string();
    }
  }
  return plugins;
}

}  // namespace

PTRAIN_LONG_TEST(OutOfTreePlugin, BuildsStandaloneLoadsAndTrains) {
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

// `cmake --install` into a fresh prefix gives a ptrain that runs from there
// alone, and an SDK that find_package(ptrain) builds the example against.
PTRAIN_LONG_TEST(OutOfTreePlugin, InstalledPtrainFindsItsPluginsAndBuildsTheExample) {
  TempDir tmp;
  const std::string prefix = fs::path(tmp.path() + "/prefix").lexically_normal().string();
  auto r = runProcess({kCmake, "--install", ptrain::test::binaryDir(), "--prefix", prefix}, {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(prefix + "/include/ptrain/comm/rank_env.h"));
  EXPECT_TRUE(fs::exists(prefix + "/lib/cmake/ptrain/PtrainPlugin.cmake"));
  // The command line's and the launcher's headers are not SDK: nothing installed implements them.
  EXPECT_FALSE(fs::exists(prefix + "/include/ptrain/cli"));
  EXPECT_FALSE(fs::exists(prefix + "/include/ptrain/launch"));

  // The installed binary loads the installed core (RPATH $ORIGIN/../lib), whose
  // default plugin folder is <prefix>/lib/ptrain/plugins; nothing comes from the build tree.
  const std::vector<std::string> bare{"PTRAIN_PLUGIN_PATH=", "LD_LIBRARY_PATH="};
  r = runProcess({prefix + "/bin/ptrain", "plugins"}, bare);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // The same plugins as the build tree's, each from the prefix.
  const auto inBuild = ptrain::test::runPtrain({"plugins"}, bare);
  ASSERT_EQ(inBuild.exit_code, 0) << inBuild.output;
  const std::string buildDir = ptrain::test::binaryDir() + "/lib/ptrain/plugins/";
  const std::string pluginDir = prefix + "/lib/ptrain/plugins/";
  std::map<std::string, std::string> builtIn;
  for (const auto& [plugin, path] : listedPlugins(inBuild.output)) {
    ASSERT_EQ(path.rfind(buildDir, 0), 0u) << path;
    builtIn[plugin] = pluginDir + path.substr(buildDir.size());
  }
  EXPECT_EQ(builtIn.count("comm/gloo"), 1u) << inBuild.output;
  EXPECT_EQ(builtIn.count("trainer/llm"), 1u) << inBuild.output;
  EXPECT_EQ(listedPlugins(r.output), builtIn) << r.output;
  EXPECT_EQ(r.output.find(ptrain::test::binaryDir()), std::string::npos) << r.output;

  // The example against the installed SDK config only, then installed beside
  // the built-in plugins, where the installed ptrain finds it by itself.
  const std::string build = tmp.path() + "/build";
  ASSERT_NO_FATAL_FAILURE(buildExample(build, {"-DCMAKE_PREFIX_PATH=" + prefix}));
  EXPECT_NE(readFile(build + "/compile_commands.json").find(prefix + "/include"), std::string::npos);
  r = runProcess({kCmake, "--install", build, "--prefix", prefix}, {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = runProcess({prefix + "/bin/ptrain", "plugins"}, bare);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto withExample = builtIn;
  withExample["comm/loopback"] = pluginDir + "comm/libptrain_comm_loopback.so";
  EXPECT_EQ(listedPlugins(r.output), withExample) << r.output;
}
