// GPU tests: ptrain's CUDA path against the host path it must match. Each
// test skips with "no CUDA device" where none is visible (every CI machine),
// and ctest lists it as skipped; tools/device/check.sh runs them on a GPU
// (ctest -L gpu).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <execinfo.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <iostream>
#include <functional>
#include <limits>
#include <utility>
#include <vector>
#include <map>
#include <string>

#include "ptrain/core/device.h"
#include "ptrain/engine/optimizer.h"
#include "ptrain/nn/attention.h"
#include "ptrain/nn/fused.h"
#include "support/test_support.h"

namespace fs = std::filesystem;

namespace {

// A fault of this process (three tests ended in a segmentation fault after
// their last assertion on the first GPU machine) prints where it happened
// before the process dies, so the device check's log shows the stack.
void printStackAndDie(int signal) {
  void* frames[64];
  const int n = backtrace(frames, 64);
  const char header[] = "\n*** fatal signal in the GPU tests; stack:\n";
  (void)!write(2, header, sizeof(header) - 1);
  backtrace_symbols_fd(frames, n, 2);
  std::signal(signal, SIG_DFL);
  std::raise(signal);
}

const bool kStackOnFault = [] {
  for (int s : {SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL}) std::signal(s, printStackAndDie);
  return true;
}();

#define SKIP_WITHOUT_CUDA()                                  \
  do {                                                       \
    if (ptrain::cudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

double maxRelDiff(const at::Tensor& got, const at::Tensor& want) {
  at::Tensor g = got.detach().cpu().to(at::kDouble), w = want.detach().cpu().to(at::kDouble);
  return ((g - w).abs().max() / (w.abs().max() + 1e-12)).item<double>();
}

}  // namespace

// The device is chosen as the recipe says: auto takes the GPU, cuda without
// one is a clear error (tested on CPU machines in test_device.cpp).
TEST(Cuda, SelectDeviceTakesTheLocalRanksGpu) {
  SKIP_WITHOUT_CUDA();
  at::Device d = ptrain::selectDevice("auto", 0);
  EXPECT_TRUE(d.is_cuda());
  EXPECT_EQ(d.index(), 0);
  EXPECT_EQ(ptrain::defaultCommBackend(d), "nccl");
}

// The one-pass AdamW kernel on the GPU against the host kernel on the same
// numbers, over tensors whose sizes exercise the 4-wide and the scalar path.
TEST(Cuda, FusedAdamwMatchesHostKernel) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(3);
  std::vector<std::pair<std::string, at::Tensor>> host, device;
  for (int64_t n : {1, 7, 1024, 4099}) {
    at::Tensor p = torch::randn({n});
    host.emplace_back("p" + std::to_string(n), p.clone());
    device.emplace_back("p" + std::to_string(n), p.clone().cuda());
  }
  ptrain::OptimizerOptions o;
  o.weight_decay = 0.1;
  auto onHost = ptrain::makeOptimizer(host, o);
  auto onDevice = ptrain::makeOptimizer(device, o);
  for (int step = 0; step < 5; ++step) {
    for (size_t i = 0; i < host.size(); ++i) {
      at::Tensor g = torch::randn(host[i].second.sizes());
      host[i].second.mutable_grad() = g.clone();
      device[i].second.mutable_grad() = g.clone().cuda();
    }
    ASSERT_TRUE(onHost->step(1e-2, 0.5));
    ASSERT_TRUE(onDevice->step(1e-2, 0.5));
  }
  for (size_t i = 0; i < host.size(); ++i) {
    EXPECT_LT(maxRelDiff(device[i].second, host[i].second), 1e-5) << host[i].first;
  }
  auto hs = onHost->state(), ds = onDevice->state();
  ASSERT_EQ(hs.size(), ds.size());
  for (size_t i = 0; i < hs.size(); ++i) EXPECT_LT(maxRelDiff(ds[i].second, hs[i].second), 1e-5) << hs[i].first;
}

// The fused device attention against the libtorch-ops reference on the
// host: outputs and the gradient of the fused qkv input.
TEST(Cuda, FusedAttentionMatchesHostReference) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(5);
  const int64_t batch = 2, length = 16, heads = 4, d = 8;
  at::Tensor qkv = torch::randn({batch, length, heads * 3 * d});
  at::Tensor mask = torch::full({length, length}, -std::numeric_limits<float>::infinity()).triu(1);
  at::Tensor upstream = torch::randn({batch, length, heads * d});

  at::Tensor hostIn = qkv.clone().requires_grad_(true);
  at::Tensor hostOut = ptrain::nn::batchedAttention(hostIn, d, 0.35, mask);
  (hostOut * upstream).sum().backward();

  at::Tensor devIn = qkv.clone().cuda().requires_grad_(true);
  ASSERT_TRUE(ptrain::nn::deviceAttentionApplies(devIn));
  at::Tensor devOut = ptrain::nn::multiHeadAttention(devIn, d, 0.35, mask.cuda());
  (devOut * upstream.cuda()).sum().backward();

  EXPECT_LT(maxRelDiff(devOut, hostOut), 1e-4);
  EXPECT_LT(maxRelDiff(devIn.grad(), hostIn.grad()), 1e-4);
}

namespace {

const char* kTinyRecipe = R"(
name: tiny
trainer: {name: llm}
model: {num_layers: 2, hidden_size: 32, num_attention_heads: 2, seq_length: 8}
data: {name: arithmetic, digits: 1, operations: [add], eval_size: 32}
train: {steps: 20, global_batch_size: 16, micro_batch_size: 4, seed: 7, eval_every: 0, log_every: 5}
optimizer: {name: adamw, lr: 0.003, lr_schedule: cosine, warmup_steps: 3, clip_grad: 1.0}
checkpoint: {every: 10, keep: 3}
log: {progress: lines}
)";

std::map<int, double> losses(const std::string& runDir) {
  std::map<int, double> out;
  for (const auto& [step, text] : ptrain::test::readTrainingSteps(runDir)) {
    out[step] = nlohmann::json::parse(text)["loss"].get<double>();
  }
  return out;
}

// `ptrain run RECIPE` on the GPU in TMP/NAME, no checkpoints between, with
// EXTRA overrides: its losses by step and its output.
std::pair<std::map<int, double>, std::string> runOnGpu(const ptrain::test::TempDir& tmp, const std::string& recipe,
                                                       const std::string& name, const std::vector<std::string>& extra) {
  std::vector<std::string> args{"run", recipe, "--nproc", "1", "--run-dir", tmp.path() + "/" + name,
                                "device=cuda", "checkpoint.every=0"};
  args.insert(args.end(), extra.begin(), extra.end());
  auto r = ptrain::test::runPtrain(args, {}, 300);
  EXPECT_EQ(r.exit_code, 0) << name << ": " << r.output;
  return {losses(tmp.path() + "/" + name), r.output};
}

}  // namespace

// Training on the GPU follows the CPU run (float32 on both; the kernels
// differ, so to rounding), and its checkpoints are device-independent: the
// GPU run's step-10 checkpoint resumes on the CPU.
TEST(Cuda, TrainingMatchesCpuAndCheckpointsResumeOnCpu) {
  SKIP_WITHOUT_CUDA();
  ptrain::test::TempDir tmp;
  const std::string recipe = tmp.write("tiny.yaml", kTinyRecipe);
  auto run = [&](const std::string& dir, std::vector<std::string> extra) {
    std::vector<std::string> args{"run", recipe, "--nproc", "1", "--run-dir", dir};
    args.insert(args.end(), extra.begin(), extra.end());
    return ptrain::test::runPtrain(args, {}, 300);
  };
  auto r = run(tmp.path() + "/cpu", {"device=cpu"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run(tmp.path() + "/gpu", {"device=cuda"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("cuda"), std::string::npos) << r.output;
  auto cpu = losses(tmp.path() + "/cpu"), gpu = losses(tmp.path() + "/gpu");
  ASSERT_EQ(cpu.size(), gpu.size());
  for (const auto& [step, loss] : cpu) EXPECT_LT(ptrain::test::relDiff(gpu[step], loss), 2e-3) << "step " << step;

  const std::string resumed = tmp.path() + "/resumed";
  fs::create_directories(resumed + "/checkpoints");
  fs::copy(tmp.path() + "/gpu/checkpoints/step_10", resumed + "/checkpoints/step_10", fs::copy_options::recursive);
  r = run(resumed, {"device=cpu", "--resume", "--allow-changes"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto after = losses(resumed);
  ASSERT_EQ(after.count(20), 1u) << r.output;
  EXPECT_LT(ptrain::test::relDiff(after[20], gpu[20]), 2e-3);
}

// The NCCL plugin behind ptrain's ProcessGroup: bench-comm checks every
// collective's result exactly (#wrong 0) on one GPU.
TEST(Cuda, NcclCollectivesAreExact) {
  SKIP_WITHOUT_CUDA();
  auto r = ptrain::test::runPtrain({"bench-comm", "--backend", "nccl", "--nproc", "1", "--max-bytes", "1048576",
                                    "--iters", "3", "--warmup", "1"},
                                   {}, 180);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("backend nccl"), std::string::npos) << r.output;
}

// The fused kernels' CUDA versions (fused_kernels.cu) against the host
// kernels on the same values, forward and backward, in float32 and bf16.
TEST(Cuda, FusedKernelsMatchTheHostKernels) {
  SKIP_WITHOUT_CUDA();
  using Fn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;
  auto compare = [](const Fn& fn, const std::vector<at::Tensor>& inputs, at::ScalarType dtype, double tol,
                    const std::string& what) {
    std::vector<at::Tensor> host, device;
    for (const auto& t : inputs) {
      host.push_back(t.to(dtype).detach().requires_grad_(true));
      device.push_back(t.to(dtype).to(at::kCUDA).detach().requires_grad_(true));
    }
    auto outHost = fn(host), outDevice = fn(device);
    at::Tensor lossHost = torch::zeros({}), lossDevice = torch::zeros({}, at::kCUDA);
    for (size_t i = 0; i < outHost.size(); ++i) {
      EXPECT_LT(maxRelDiff(outDevice[i], outHost[i]), tol) << what << " output " << i;
      at::Tensor up = torch::sin(torch::arange(outHost[i].numel(), torch::kFloat) * 0.37).view(outHost[i].sizes());
      lossHost = lossHost + (outHost[i].to(at::kFloat) * up).sum();
      lossDevice = lossDevice + (outDevice[i].to(at::kFloat) * up.to(at::kCUDA)).sum();
    }
    lossHost.backward();
    lossDevice.backward();
    for (size_t i = 0; i < inputs.size(); ++i) {
      EXPECT_LT(maxRelDiff(device[i].grad(), host[i].grad()), tol) << what << " gradient " << i;
    }
  };
  torch::manual_seed(7);
  at::Tensor mask = torch::full({5, 7}, -std::numeric_limits<float>::infinity()).triu(3);
  mask[2].fill_(-std::numeric_limits<float>::infinity());
  for (auto [dtype, tol] : {std::pair<at::ScalarType, double>{at::kFloat, 1e-5}, {at::kBFloat16, 2e-2}}) {
    compare([&](const auto& in) { return std::vector<at::Tensor>{ptrain::nn::fusedMaskedSoftmax(in[0], 0.3, mask.to(in[0].device()))}; },
            {torch::randn({3, 5, 7})}, dtype, tol, "masked softmax");
    compare([](const auto& in) { return std::vector<at::Tensor>{ptrain::nn::fusedBiasGelu(in[0], in[1])}; },
            {torch::randn({9, 33}), torch::randn({33})}, dtype, tol, "bias gelu");
    at::Tensor noise = ptrain::nn::dropoutNoise(torch::empty({9, 33}), 0.25);
    compare([&](const auto& in) {
      return std::vector<at::Tensor>{ptrain::nn::fusedBiasDropoutAdd(in[0], in[1], in[2], noise.to(in[0].device(), in[0].scalar_type()))};
    }, {torch::randn({9, 33}), torch::randn({33}), torch::randn({9, 33})}, dtype, tol, "bias dropout add");
    compare([](const auto& in) {
      auto [y, sum] = ptrain::nn::fusedAddLayerNorm(in[0], in[1], in[2], in[3], 1e-5);
      return std::vector<at::Tensor>{y, sum};
    }, {torch::randn({9, 65}), torch::randn({9, 65}), torch::randn({65}), torch::randn({65})}, dtype, tol, "add layernorm");
  }
}

// The pinned host tier (offload/tiered on cuda) trains the run without
// offload: parameters and gradients bit for bit (the same kernels on the
// same numbers), the optimizer stepping on the host with the host AdamW
// kernel to float32 rounding. Clipping is off: the norm of gradients that
// rest on the host is summed there, equal only to rounding.
TEST(Cuda, PinnedHostOffloadTrainsTheSameRun) {
  SKIP_WITHOUT_CUDA();
  ptrain::test::TempDir tmp;
  const std::string recipe = tmp.write("tiny.yaml", kTinyRecipe);
  auto run = [&](const std::string& name, std::vector<std::string> extra) {
    extra.push_back("optimizer.clip_grad=0");
    return runOnGpu(tmp, recipe, name, extra).first;
  };
  struct Variant {
    std::string name;
    std::vector<std::string> base, offload;
    double tolerance;  // 0: bitwise
  };
  const std::vector<std::string> all{"offload.params=true", "offload.grads=true", "offload.optimizer=true"};
  const std::vector<Variant> variants{
      {"params", {}, {"offload.params=true"}, 0},
      {"grads", {}, {"offload.grads=true"}, 0},
      {"params_grads_recompute", {"model.recompute=full"}, {"offload.params=true", "offload.grads=true"}, 0},
      {"optimizer", {}, {"offload.optimizer=true"}, 1e-4},
      {"all", {}, all, 1e-4},
      // The float32 masters differ by rounding between the two AdamW kernels;
      // rounded to bf16 weights, one ulp in a weight (2^-8) moves the loss
      // by ~1e-4 (measured on an H200: 1.6e-4 at most over 20 steps).
      {"all_bf16", {"precision.name=bf16"}, all, 1e-3},
  };
  std::map<std::string, std::map<int, double>> plain;
  for (const Variant& v : variants) {
    std::string baseName = "plain";
    for (const auto& o : v.base) baseName += "_" + o.substr(o.find('=') + 1);
    if (plain.count(baseName) == 0) plain[baseName] = run(baseName, v.base);
    std::vector<std::string> with = v.base;
    with.insert(with.end(), v.offload.begin(), v.offload.end());
    auto got = run(v.name, with);
    const auto& want = plain[baseName];
    ASSERT_EQ(got.size(), want.size()) << v.name;
    for (const auto& [step, loss] : want) {
      if (v.tolerance == 0) EXPECT_EQ(got.at(step), loss) << v.name << " step " << step;
      else EXPECT_LT(ptrain::test::relDiff(got.at(step), loss), v.tolerance) << v.name << " step " << step;
    }
  }
}

// What the tier is for: with every block's parameters, gradients and the
// optimizer's state at rest on the host, the device holds about one block
// at a time. A model whose blocks hold nearly all of its 12.6M parameters
// (the vocabulary is 16 tokens): the device's peak falls below half. Both
// runs recompute their blocks: without it, autograd's saved views of every
// block's weights keep their device copies alive from forward to backward
// (docs/memory.md), and the parameters' part of the saving is lost.
TEST(Cuda, PinnedHostOffloadLowersTheDevicePeak) {
  SKIP_WITHOUT_CUDA();
  ptrain::test::TempDir tmp;
  const std::string recipe = tmp.write("tiny.yaml", kTinyRecipe);
  auto peak = [&](const std::string& name, std::vector<std::string> extra) {
    std::vector<std::string> args{"run", recipe, "--nproc", "1", "--run-dir", tmp.path() + "/" + name,
                                  "device=cuda", "model.num_layers=4", "model.hidden_size=512",
                                  "model.num_attention_heads=8", "model.recompute=full", "train.steps=3",
                                  "checkpoint.every=0"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto r = ptrain::test::runPtrain(args, {}, 300);
    EXPECT_EQ(r.exit_code, 0) << name << ": " << r.output;
    double mb = 0;
    for (const auto& [step, text] : ptrain::test::readTrainingSteps(tmp.path() + "/" + name)) {
      mb = std::max(mb, nlohmann::json::parse(text).value("peak_device_mb", 0.0));
    }
    return mb;
  };
  const double plain = peak("plain", {});
  const double offloaded =
      peak("offloaded", {"offload.params=true", "offload.grads=true", "offload.optimizer=true"});
  std::cout << "peak device memory: " << plain << " MB without offload, " << offloaded << " MB with it\n";
  EXPECT_GT(plain, 150);
  EXPECT_LT(offloaded, 0.5 * plain);
}

// bf16 on the GPU: bf16 weights and activations through the fused kernels
// and fused attention, float32 master weights and gradients. It follows the
// float32 GPU run to bf16's resolution (8 bits of mantissa: the curves part
// by about 1e-2 relative over 20 steps) and learns as much.
TEST(Cuda, Bf16TrainsAsFloat32DoesOnTheGpu) {
  SKIP_WITHOUT_CUDA();
  ptrain::test::TempDir tmp;
  const std::string recipe = tmp.write("tiny.yaml", kTinyRecipe);
  const auto fp32 = runOnGpu(tmp, recipe, "fp32", {}).first;
  const auto bf16 = runOnGpu(tmp, recipe, "bf16",
                             {"precision.name=bf16", "fusion.layernorm=true", "fusion.bias_gelu=true",
                              "fusion.bias_dropout_add=true"})
                        .first;
  ASSERT_EQ(fp32.size(), bf16.size());
  for (const auto& [step, loss] : fp32) EXPECT_LT(ptrain::test::relDiff(bf16.at(step), loss), 5e-2) << "step " << step;
  EXPECT_LT(bf16.rbegin()->second, 0.8 * bf16.begin()->second);
}

// device.tf32: float32 matrix products on TF32 tensor cores (10-bit mantissa
// inputs): the run follows the full float32 one to about 1e-3, and the
// switch reaches libtorch (the run's first line says so).
TEST(Cuda, Tf32FollowsFloat32) {
  SKIP_WITHOUT_CUDA();
  ptrain::test::TempDir tmp;
  const std::string recipe = tmp.write("tiny.yaml", kTinyRecipe);
  const auto [fp32, fp32Out] = runOnGpu(tmp, recipe, "fp32", {"device.tf32=false"});
  const auto [tf32, tf32Out] = runOnGpu(tmp, recipe, "tf32", {"device.tf32=true"});
  EXPECT_NE(tf32Out.find("tf32 on"), std::string::npos) << tf32Out;
  ASSERT_EQ(fp32.size(), tf32.size());
  for (const auto& [step, loss] : fp32) EXPECT_LT(ptrain::test::relDiff(tf32.at(step), loss), 1e-2) << "step " << step;
}
