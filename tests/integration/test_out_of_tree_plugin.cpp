// The out-of-tree plugin flow of docs/plugins.md: build
// docs/examples/loopback_plugin against this build with only the generated
// SDK file, load it through PTRAIN_PLUGIN_PATH, and train with it.
#include <gtest/gtest.h>

#include "support/test_support.h"

using ptrain::test::runProcess;
using ptrain::test::TempDir;

TEST(OutOfTreePlugin, BuildsStandaloneLoadsAndTrains) {
  TempDir tmp;
  const std::string build = tmp.path() + "/build";
  auto r = runProcess({"/usr/bin/cmake", "-S", ptrain::test::sourceDir() + "/docs/examples/loopback_plugin", "-B",
                       build, "-DPTRAIN_BUILD_DIR=" + ptrain::test::binaryDir()},
                      {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = runProcess({"/usr/bin/cmake", "--build", build}, {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;

  const std::string env = "PTRAIN_PLUGIN_PATH=" + build + "/plugins";
  r = ptrain::test::runPtrain({"plugins"}, {env});
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
