// The SDK as a CMake package (docs/plugins.md, docs/building.md): `cmake
// --install` of this tree, then tests/fixtures/sdk_consumer, a C++20 project
// with flags of its own, built against the install with find_package(ptrain).
// The package must give the project ptrain::core and ptrain_add_plugin() and
// change nothing else; a QUIET find that cannot succeed must fail softly; the
// installed libraries must not point into this build tree.
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/test_support.h"

namespace fs = std::filesystem;
using ptrain::test::readFile;
using ptrain::test::runProcess;
using ptrain::test::TempDir;

namespace {

// The cmake that configured this build: `cmake --install` must match it.
const std::string kCmake = PTRAIN_CMAKE_COMMAND;
// No library path from the environment: what is found is found through RPATHs.
const std::vector<std::string> kBare{"PTRAIN_PLUGIN_PATH=", "LD_LIBRARY_PATH="};

std::string consumerSource() { return ptrain::test::sourceDir() + "/tests/fixtures/sdk_consumer"; }

// `cmake --install` of this build tree into `prefix`.
void install(const std::string& prefix) {
  const auto r = runProcess({kCmake, "--install", ptrain::test::binaryDir(), "--prefix", prefix}, {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(fs::exists(prefix + "/lib/cmake/ptrain/ptrain-config.cmake")) << r.output;
}

ptrain::test::ProcessResult configure(const std::string& source, const std::string& build,
                                      const std::vector<std::string>& cacheArgs) {
  std::vector<std::string> args{kCmake, "-S", source, "-B", build};
  args.insert(args.end(), cacheArgs.begin(), cacheArgs.end());
  return runProcess(args, {}, 300);
}

// The value of `name` in a build folder's CMakeCache.txt ("" when absent).
std::string cacheValue(const std::string& build, const std::string& name) {
  std::istringstream lines(readFile(build + "/CMakeCache.txt"));
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(name + ":", 0) == 0) {
      const auto eq = line.find('=');
      return eq == std::string::npos ? "" : line.substr(eq + 1);
    }
  }
  return "";
}

// The compile command of the entry of compile_commands.json whose file ends in `source`.
std::string compileCommand(const std::string& build, const std::string& source) {
  const auto commands = nlohmann::json::parse(readFile(build + "/compile_commands.json"));
  for (const auto& entry : commands) {
    const std::string file = entry.at("file");
    if (file.size() >= source.size() && file.compare(file.size() - source.size(), source.size(), source) == 0) {
      return entry.at("command");
    }
  }
  ADD_FAILURE() << "no compile command for " << source << " in " << commands.dump(1);
  return "";
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// `text` with each run of white space made one space: CMake wraps the
// messages of a failed find_package.
std::string squeezed(const std::string& text) { return std::regex_replace(text, std::regex(R"(\s+)"), " "); }

// `text` as a regular expression that matches it literally.
std::string literal(const std::string& text) {
  return std::regex_replace(text, std::regex(R"([.^$|()\[\]{}*+?\\])"), R"(\$&)");
}

// The program `name` as found on PATH (runProcess takes a path).
std::string onPath(const std::string& name) {
  std::istringstream folders(std::getenv("PATH") ? std::getenv("PATH") : "/usr/bin:/bin");
  std::string folder;
  while (std::getline(folders, folder, ':')) {
    if (!folder.empty() && fs::exists(folder + "/" + name)) return folder + "/" + name;
  }
  ADD_FAILURE() << name << " is not on PATH";
  return name;
}

// The folders of a library's or program's RUNPATH (or RPATH), as readelf prints them.
std::vector<std::string> runpath(const std::string& file) {
  static const std::string readelf = onPath("readelf");
  const auto r = runProcess({readelf, "-d", file});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::vector<std::string> folders;
  const std::regex entry(R"(\((RUNPATH|RPATH)\)[^\[]*\[([^\]]*)\])");
  for (std::sregex_iterator it(r.output.begin(), r.output.end(), entry), end; it != end; ++it) {
    std::istringstream parts((*it)[2].str());
    std::string folder;
    while (std::getline(parts, folder, ':')) folders.push_back(folder);
  }
  return folders;
}

}  // namespace

// The consumer's standard, flags and Torch_DIR survive find_package(ptrain);
// its program runs on the installed core and its plugin loads into the
// installed ptrain; the installed RUNPATHs are relative.
TEST(SdkPackage, Cxx20ProjectBuildsAgainstTheInstalledPackageAndKeepsItsSettings) {
  TempDir tmp;
  const std::string prefix = tmp.path() + "/prefix";
  ASSERT_NO_FATAL_FAILURE(install(prefix));

  // Installed plugins find the core through $ORIGIN only; the core and the
  // binary find lib/ through $ORIGIN (and a libtorch outside the system
  // folders, PyPI's in .venv-torch, by its own folder); nothing points into
  // the build tree.
  int plugins = 0;
  for (const auto& file : fs::recursive_directory_iterator(prefix + "/lib/ptrain/plugins")) {
    if (file.path().extension() != ".so") continue;
    ++plugins;
    EXPECT_EQ(runpath(file.path().string()), std::vector<std::string>{"$ORIGIN/../../.."}) << file.path();
  }
  EXPECT_GT(plugins, 10);
  const std::vector<std::string> coreAndBinary{prefix + "/lib/libptrain_core.so", prefix + "/bin/ptrain"};
  for (const auto& file : coreAndBinary) {
    const auto folders = runpath(file);
    ASSERT_FALSE(folders.empty()) << file;
    EXPECT_EQ(folders.front(), "$ORIGIN/../lib") << file;
    for (const auto& folder : folders) {
      EXPECT_FALSE(has(folder, ptrain::test::binaryDir())) << file << ": " << folder;
    }
  }

  const std::string build = tmp.path() + "/build";
  auto r = configure(consumerSource(), build, {"-DCMAKE_PREFIX_PATH=" + prefix, "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Nothing directory-wide, no CMAKE_* setting changed by the package.
  EXPECT_TRUE(has(r.output, "sdk_consumer: CMAKE_CXX_STANDARD=20 CMAKE_CXX_VISIBILITY_PRESET= "
                            "CMAKE_POSITION_INDEPENDENT_CODE= COMPILE_OPTIONS=[-Wall;-Wextra] "
                            "COMPILE_DEFINITIONS=[SDK_CONSUMER_OWN_DEFINITION=1] INCLUDE_DIRECTORIES=[] "
                            "LINK_OPTIONS=[]"))
      << r.output;
  // Given no libtorch, the consumer gets the one ptrain was built with.
  const std::string torchDir = cacheValue(ptrain::test::binaryDir(), "Torch_DIR");
  ASSERT_FALSE(torchDir.empty());
  EXPECT_EQ(fs::canonical(cacheValue(build, "Torch_DIR")), fs::canonical(torchDir));

  r = runProcess({kCmake, "--build", build}, {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;

  // The program: C++20 (its static_assert), its own flags, and ptrain::core's
  // usage requirements, without the plugin settings.
  const std::string program = compileCommand(build, "/consumer.cpp");
  EXPECT_TRUE(has(program, "-std=c++20") || has(program, "-std=gnu++20")) << program;
  EXPECT_FALSE(has(program, "++17")) << program;
  for (const std::string& flag : std::vector<std::string>{"-Wall", "-Wextra", "-DSDK_CONSUMER_OWN_DEFINITION=1",
                                                         "-DUSE_C10D_GLOO", "-fopenmp", prefix + "/include"}) {
    EXPECT_TRUE(has(program, flag)) << flag << " missing: " << program;
  }
  for (const char* flag : {"-fvisibility", "-fPIC"}) {
    EXPECT_FALSE(has(program, flag)) << flag << " set on the program: " << program;
  }
  // The plugin: the same, plus what ptrain_add_plugin sets on its target.
  const std::string plugin = compileCommand(build, "/echo_plugin.cpp");
  EXPECT_TRUE(has(plugin, "-std=c++20") || has(plugin, "-std=gnu++20")) << plugin;
  EXPECT_FALSE(has(plugin, "++17")) << plugin;
  for (const char* flag : {"-Wall", "-Wextra", "-DUSE_C10D_GLOO", "-fopenmp", "-fPIC", "-fvisibility=hidden",
                          "-fvisibility-inlines-hidden"}) {
    EXPECT_TRUE(has(plugin, flag)) << flag << " missing: " << plugin;
  }

  r = runProcess({build + "/sdk_consumer", ptrain::test::sourceDir() + "/configs/quickstart.yaml"}, kBare);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r.output, "recipe quickstart: train.steps=3000 optimizer.name=adamw")) << r.output;
  EXPECT_TRUE(has(r.output, "layout world=8 tp=2 cp=1 pp=2 dp=2")) << r.output;
  EXPECT_TRUE(has(r.output, "tensor groups: [0,1] [2,3] [4,5] [6,7]")) << r.output;
  EXPECT_TRUE(has(r.output, "pipeline groups: [0,4] [1,5] [2,6] [3,7]")) << r.output;

  // The C++20 plugin passes the installed loader's checks (ABI, build tag).
  r = runProcess({prefix + "/bin/ptrain", "plugins"},
                 {"PTRAIN_PLUGIN_PATH=" + build + "/plugins", "LD_LIBRARY_PATH="});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex("parallel +sdk_consumer_echo +0\\.1\\.0 +" + literal(build) +
                                                     "/plugins/parallel/libptrain_parallel_sdk_consumer_echo\\.so")))
      << r.output;

  // A Torch_DIR of the consumer's own is kept, not replaced by ptrain's: the
  // same libtorch, written another way.
  const std::string ownTorchDir = torchDir + "/../" + fs::path(torchDir).filename().string();
  r = configure(consumerSource(), build, {"-DTorch_DIR=" + ownTorchDir});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(cacheValue(build, "Torch_DIR"), ownTorchDir);
  EXPECT_TRUE(has(r.output, "Torch_DIR=" + ownTorchDir)) << r.output;
}

// find_package(ptrain QUIET) leaves ptrain "not found", and the project going,
// when ptrain cannot be used: another version asked for, a dependency missing,
// a libtorch other than the one ptrain was built with. REQUIRED fails with the
// reason.
TEST(SdkPackage, QuietFindFailsSoftly) {
  TempDir tmp;
  const std::string prefix = tmp.path() + "/prefix";
  ASSERT_NO_FATAL_FAILURE(install(prefix));
  const std::string probe = consumerSource() + "/probe";
  const std::string where = "-DCMAKE_PREFIX_PATH=" + prefix;

  auto r = configure(probe, tmp.path() + "/found", {where, "-DPROBE_VERSION=0.1"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r.output, "sdk_probe: ptrain 0.1.0 found")) << r.output;

  r = configure(probe, tmp.path() + "/version", {where, "-DPROBE_VERSION=99"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r.output, "sdk_probe: ptrain not found")) << r.output;
  EXPECT_FALSE(has(r.output, "CMake Error")) << r.output;

  r = configure(probe, tmp.path() + "/dependency", {where, "-DCMAKE_DISABLE_FIND_PACKAGE_yaml-cpp=ON"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r.output, "sdk_probe: ptrain not found (ptrain could not be found because dependency "
                            "yaml-cpp could not be found.)"))
      << r.output;
  EXPECT_FALSE(has(r.output, "CMake Error")) << r.output;

  // A libtorch of another version, named by the consumer's Torch_DIR.
  const std::string otherTorch = tmp.path() + "/other-torch";
  tmp.write("other-torch/TorchConfig.cmake", "set(TORCH_LIBRARIES \"\")\n");
  tmp.write("other-torch/TorchConfigVersion.cmake",
            "set(PACKAGE_VERSION \"0.0.1\")\nset(PACKAGE_VERSION_COMPATIBLE TRUE)\n");
  r = configure(probe, tmp.path() + "/torch", {where, "-DTorch_DIR=" + otherTorch});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex("sdk_probe: ptrain not found \\(ptrain 0\\.1\\.0 was built "
                                                     "against libtorch [0-9.]+ \\(.*\\); the libtorch found is "
                                                     "0\\.0\\.1 \\(Torch_DIR=" + literal(otherTorch) + "\\)")))
      << r.output;
  EXPECT_FALSE(has(r.output, "CMake Error")) << r.output;
  EXPECT_EQ(cacheValue(tmp.path() + "/torch", "Torch_DIR"), otherTorch);

  // REQUIRED (the consumer project): the configure step fails with that reason.
  r = configure(consumerSource(), tmp.path() + "/required", {where, "-DTorch_DIR=" + otherTorch});
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(squeezed(r.output), "the libtorch found is 0.0.1 (Torch_DIR=" + otherTorch + ")")) << r.output;
}
