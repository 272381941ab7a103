// offload/tiered on the cpu's disk tier: parameters, gradients and optimizer
// states in a memory-mapped file give bitwise the losses and parameters of
// the same run without offload (fp32 and bf16, with full recomputation,
// under tensor, pipeline and data parallelism); the file leaves nothing
// behind; the checks refuse what cannot work, one line each.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <filesystem>

#include "llm_runtime_fixture.h"
#include "ptrain/engine/memory_settings.h"
#include "ptrain/engine/offload.h"

namespace ptrain {
namespace {

using namespace llm_fixture;
namespace fs = std::filesystem;

struct Trained {
  std::vector<double> losses;
  std::vector<at::Tensor> params;
  std::map<std::string, double> stats;
};

Trained train(Communicator& comm, std::vector<std::string> overrides, const std::string& folder, int steps) {
  llm::LlmTrainer trainer{PluginContext{}};
  overrides.push_back("model.dropout=0.1");
  Recipe recipe = llmRecipe(trainer, overrides);
  trainer.setup(recipe);
  RuntimeOptions options = llmOptions(recipe, comm.layout(), true);
  options.offload.folder = folder;
  Trained out;
  {
    ModelRuntime rt(comm, registry(), [&](const ModelBuild& b) { return trainer.buildModel(b); }, options);
    const int dp = comm.layout().sizes().world / (comm.layout().sizes().tp * comm.layout().sizes().pp);
    for (int step = 0; step < steps; ++step) {
      StepResult r = llmStep(rt, trainer, step, 8 / dp / 2);
      out.losses.push_back(r.loss);
      if (step == steps - 1) out.stats = r.stats;
    }
    for (auto& [name, p] : rt.model().localParameters()) out.params.push_back(p.detach().clone());
  }
  return out;
}

void expectSame(const Trained& offloaded, const Trained& plain, const std::string& what) {
  ASSERT_EQ(offloaded.losses.size(), plain.losses.size());
  for (size_t i = 0; i < plain.losses.size(); ++i) EXPECT_EQ(offloaded.losses[i], plain.losses[i]) << what << " step " << i;
  ASSERT_EQ(offloaded.params.size(), plain.params.size());
  for (size_t i = 0; i < plain.params.size(); ++i) {
    EXPECT_TRUE(torch::equal(offloaded.params[i], plain.params[i])) << what << " parameter " << i;
  }
}

const std::vector<std::string> kEverything = {"offload.params=true", "offload.grads=true", "offload.optimizer=true"};

TEST(Offload, DiskTierGivesBitwiseTheLossesAndParametersOfARunWithoutIt) {
  test::TempDir tmp;
  auto comm = Communicator::loopback();
  struct Variant {
    std::vector<std::string> base, offload;
  };
  const std::vector<Variant> variants = {
      {{}, kEverything},
      {{}, {"offload.params=true"}},
      {{}, {"offload.optimizer=true"}},
      {{}, {"offload.grads=true"}},
      {{"model.recompute=full"}, kEverything},
      {{"precision.name=bf16"}, kEverything},
  };
  for (const Variant& v : variants) {
    std::string what;
    for (const auto& o : v.base) what += o + " ";
    for (const auto& o : v.offload) what += o + " ";
    Trained plain = train(*comm, v.base, tmp.path(), 4);
    std::vector<std::string> with = v.base;
    with.insert(with.end(), v.offload.begin(), v.offload.end());
    Trained offloaded = train(*comm, with, tmp.path() + "/offload", 4);
    expectSame(offloaded, plain, what);
    EXPECT_GT(offloaded.stats.at("offload_file_bytes"), 0) << what;
    if (with.size() > v.base.size() && v.offload.front() == "offload.params=true") {
      EXPECT_GT(offloaded.stats.at("offload_in_bytes"), 0) << what;
    }
    // The file is unlinked as soon as it is mapped (and the folder removed
    // with the tier).
    const std::string folder = tmp.path() + "/offload";
    EXPECT_TRUE(!fs::exists(folder) || fs::is_empty(folder)) << what;
  }
}

TEST(OffloadRanks, TensorPipelineAndDataParallelLayoutsOffloadExactly) {
  struct Layout {
    int tp, pp;
  };
  for (Layout l : {Layout{2, 1}, Layout{1, 2}, Layout{1, 1}}) {
    std::string failures = test::runRanks(2, [l](int rank, int size, int port) {
      test::TempDir tmp;
      auto comm = worldOf(rank, size, port, layoutOf(size, l.tp, l.pp));
      std::vector<std::string> base = layoutOverrides(l.tp, l.pp, l.tp > 1);
      Trained plain = train(*comm, base, tmp.path(), 3);
      std::vector<std::string> with = base;
      with.insert(with.end(), kEverything.begin(), kEverything.end());
      Trained offloaded = train(*comm, with, tmp.path() + "/offload", 3);
      expectSame(offloaded, plain, "offload");
    });
    EXPECT_EQ(failures, "") << "tp " << l.tp << " pp " << l.pp;
  }
}

TEST(Offload, ChecksRefuseAFolderItCannotWriteAndTheDistributedOptimizer) {
  llm::LlmTrainer trainer{PluginContext{}};
  test::TempDir tmp;
  Recipe off = llmRecipe(trainer, {});
  EXPECT_TRUE(checkOffload(off).empty());
  EXPECT_TRUE(checkOffloadFolder(off, "/nonexistent-file-parent/run").empty());

  Recipe on = llmRecipe(trainer, {"offload.params=true"});
  EXPECT_TRUE(checkOffload(on).empty());
  EXPECT_TRUE(checkOffloadFolder(on, tmp.path() + "/not/yet/made").empty());
  // A file where the run folder would be made.
  const std::string file = tmp.write("plain-file", "x");
  auto problems = checkOffloadFolder(on, file + "/run");
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("not writable"), std::string::npos) << problems[0];
  EXPECT_NE(problems[0].find("--run-dir"), std::string::npos) << problems[0];

  Recipe both = llmRecipe(trainer, {"offload.optimizer=true", "optimizer.distributed=true"});
  problems = checkOffload(both);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("optimizer.distributed"), std::string::npos) << problems[0];
}

// Each tier serves one kind of device: naming the other's is one line with
// the fix; on cuda the pinned tier writes no files, so no folder is checked.
TEST(Offload, ChecksRefuseTheTierOfTheOtherDevice) {
  llm::LlmTrainer trainer{PluginContext{}};
  Recipe pinnedOnCpu = llmRecipe(trainer, {"device=cpu", "offload.params=true", "offload.tier=pinned"});
  auto problems = checkOffload(pinnedOnCpu);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("offload.tier=pinned serves the cuda device"), std::string::npos) << problems[0];
  EXPECT_NE(problems[0].find("set offload.tier to auto or disk"), std::string::npos) << problems[0];

  Recipe diskOnCuda = llmRecipe(trainer, {"device=cuda", "offload.params=true", "offload.tier=disk"});
  problems = checkOffload(diskOnCuda);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("offload.tier=disk serves the cpu device"), std::string::npos) << problems[0];
  EXPECT_TRUE(checkOffload(llmRecipe(trainer, {"device=cuda", "offload.params=true"})).empty());
  EXPECT_TRUE(checkOffloadFolder(llmRecipe(trainer, {"device=cuda", "offload.params=true"}), "/proc/run").empty());
}

// Parameter offload on cuda saves device memory only with full recomputation
// (measured on an H200): a warning says so, and nothing else warns.
TEST(Offload, ParamsOnCudaWithoutRecomputationWarn) {
  llm::LlmTrainer trainer{PluginContext{}};
  auto warnings = offloadWarnings(llmRecipe(trainer, {"device=cuda", "offload.params=true"}));
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("offload.params=true on cuda with model.recompute=none"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("set model.recompute: full"), std::string::npos) << warnings[0];
  EXPECT_EQ(memorySettingWarnings(llmRecipe(trainer, {"device=cuda", "offload.params=true"}), 1, 1).size(), 1u);
  EXPECT_TRUE(offloadWarnings(llmRecipe(trainer, {"device=cuda", "offload.params=true", "model.recompute=full"})).empty());
  EXPECT_TRUE(offloadWarnings(llmRecipe(trainer, {"device=cuda", "offload.optimizer=true"})).empty());
  EXPECT_TRUE(offloadWarnings(llmRecipe(trainer, {"device=cpu", "offload.params=true"})).empty());
}

}  // namespace
}  // namespace ptrain
