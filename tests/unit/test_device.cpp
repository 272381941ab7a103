// The recipe's `device` on a machine without a GPU (every CI machine): auto
// means cpu, cuda is a clear ConfigError, and the comm backend follows.
// The GPU side is in tests/gpu.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "ptrain/core/device.h"
#include "support/test_support.h"

using ptrain::ConfigError;

TEST(Device, CpuAndAutoWithoutGpu) {
  if (ptrain::cudaDeviceCount() > 0) GTEST_SKIP() << "a CUDA device is visible; tests/gpu covers it";
  EXPECT_EQ(ptrain::selectDevice("cpu", 0), at::Device(at::kCPU));
  EXPECT_EQ(ptrain::selectDevice("auto", 3), at::Device(at::kCPU));
  EXPECT_EQ(ptrain::defaultCommBackend(at::Device(at::kCPU)), "gloo");
  EXPECT_EQ(ptrain::defaultCommBackend(at::Device(at::kCUDA, 1)), "nccl");
}

TEST(Device, CudaWithoutGpuIsAConfigError) {
  if (ptrain::cudaDeviceCount() > 0) GTEST_SKIP() << "a CUDA device is visible; tests/gpu covers it";
  try {
    ptrain::selectDevice("cuda", 0);
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("device: cuda"), std::string::npos) << what;
    EXPECT_NE(what.find("set device: cpu or auto"), std::string::npos) << what;
  }
  EXPECT_THROW(ptrain::selectDevice("tpu", 0), ConfigError);
}

// `ptrain run` with device: cuda on a machine without one: one line, exit 2.
TEST(Device, RunOnCudaWithoutGpuExitsTwoWithOneLine) {
  if (ptrain::cudaDeviceCount() > 0) GTEST_SKIP() << "a CUDA device is visible; tests/gpu covers it";
  ptrain::test::TempDir tmp;
  auto r = ptrain::test::runPtrain({"run", ptrain::test::sourceDir() + "/configs/quickstart.yaml", "--nproc", "1",
                                    "--run-dir", tmp.path() + "/run", "device=cuda", "train.steps=2"},
                                   {}, 120);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("device: cuda"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("terminate called"), std::string::npos) << r.output;
}
