// The distributed optimizer (optimizer.distributed) against the non-sharded
// optimizer on the same layout: the same losses and parameters within 1e-6
// over 20 steps (dp 2 and 4, with tensor parallelism, bf16 masters, SGD, and
// buckets small enough that parameters straddle the ranks' ranges), a
// fraction of the optimizer memory, and checkpoint state with the same
// entries and values as the non-sharded optimizer's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <tuple>

#include <torch/torch.h>

#include "checkpoint_fixture.h"
#include "llm_runtime_fixture.h"
#include "ptrain/engine/memory_settings.h"
#include "support/test_support.h"

namespace ptrain {
namespace {

using namespace llm_fixture;

struct Case {
  int world, tp;
  std::vector<std::string> overrides;
};

std::string describe(const Case& c) {
  std::string s = "world " + std::to_string(c.world) + " tp " + std::to_string(c.tp);
  for (const auto& o : c.overrides) s += " " + o;
  return s;
}

// Losses of `steps` steps and the final parameters of this rank, with the
// optimizer sharded or not.
struct TrainedRun {
  std::vector<double> losses;
  std::vector<std::pair<std::string, at::Tensor>> initial, params;
  double memOptimizer = 0;
  checkpoint_fixture::WholeTensors checkpoint;
};

// Where the ranks' checkpoints meet: one folder per port (one per forked job).
std::string checkpointFolder(int port, bool distributed) {
  return (std::filesystem::temp_directory_path() /
          ("ptrain-dist-opt-" + std::to_string(port) + (distributed ? "-sharded" : "-plain")))
      .string();
}

TrainedRun train(Communicator& comm, const Case& c, bool distributed, int steps, int port) {
  llm::LlmTrainer trainer{PluginContext{}};
  std::vector<std::string> o = layoutOverrides(c.tp, 1, c.tp > 1);
  o.insert(o.end(), c.overrides.begin(), c.overrides.end());
  // About 2,500 floats a bucket: parameters straddle the ranks' ranges.
  o.push_back("parallel.grad_bucket_size_mb=0.01");
  o.push_back(std::string("optimizer.distributed=") + (distributed ? "true" : "false"));
  o.push_back("train.steps=" + std::to_string(steps));
  Recipe recipe = llmRecipe(trainer, o);
  trainer.setup(recipe);
  ModelRuntime rt(comm, registry(), [&](const ModelBuild& b) { return trainer.buildModel(b); },
                  llmOptions(recipe, comm.layout(), true));
  TrainedRun run;
  for (auto& [name, p] : rt.model().localParameters()) run.initial.emplace_back(name, p.detach().clone());
  const int dp = c.world / c.tp;
  for (int step = 0; step < steps; ++step) {
    StepResult r = llmStep(rt, trainer, step, 8 / dp / 2);
    EXPECT_TRUE(r.applied);
    run.losses.push_back(r.loss);
    if (step == 0) run.memOptimizer = r.stats.at("mem_optimizer");
  }
  for (auto& [name, p] : rt.model().localParameters()) run.params.emplace_back(name, p.detach().clone());
  const std::string folder = checkpointFolder(port, distributed);
  run.checkpoint = checkpoint_fixture::wholeTensors(rt, comm, folder);
  if (comm.rank() == 0) std::filesystem::remove_all(folder);
  return run;
}

PTRAIN_LONG_TEST(DistributedOptimizerRanks, MatchesTheNonShardedOptimizerOver20Steps) {
  const std::vector<Case> cases = {
      {2, 1, {}},
      {4, 1, {"optimizer.name=sgd", "optimizer.momentum=0.9", "optimizer.lr=0.05"}},
      {4, 2, {}},
      {2, 1, {"precision.name=bf16"}},
  };
  for (const Case& c : cases) {
    std::string failures = test::runRanks(c.world, [&c](int rank, int size, int port) {
      auto comm = worldOf(rank, size, port, layoutOf(size, c.tp, 1));
      TrainedRun plain = train(*comm, c, false, 20, port);
      TrainedRun sharded = train(*comm, c, true, 20, port);
      // float32: the same arithmetic, so 1e-6. bf16: parameters are their
      // masters rounded to 8 bits of mantissa, so a last-bit difference of a
      // master (which of libtorch's kernels, AVX2 or AVX-512, converts or
      // sums a tensor decides such bits) can flip a parameter by 2^-8 and
      // the curves part after some steps; they must stay within bf16's
      // resolution.
      const bool bf16 = std::find(c.overrides.begin(), c.overrides.end(), "precision.name=bf16") != c.overrides.end();
      const double lossTolerance = bf16 ? 4e-3 : 1e-6;
      const double stateTolerance = 1e-5;  // float32 checkpoints; bf16's masters below
      for (size_t step = 0; step < plain.losses.size(); ++step) {
        EXPECT_LT(test::relDiff(sharded.losses[step], plain.losses[step]), lossTolerance) << "step " << step;
      }
      ASSERT_EQ(sharded.params.size(), plain.params.size());
      const bool fp32 = plain.params.front().second.scalar_type() == at::kFloat;
      for (size_t i = 0; fp32 && i < plain.params.size(); ++i) {
        const at::Tensor expected = plain.params[i].second.to(at::kDouble);
        const double diff = (sharded.params[i].second.to(at::kDouble) - expected).abs().max().item<double>();
        // A parameter whose gradient is only rounding noise (the key bias:
        // softmax ignores a shift shared by every key) takes Adam steps of
        // about lr in random directions, which any other order of additions
        // (tensor-parallel sums before data-parallel ones) redraws: such a
        // parameter agrees to a small part of how far it moved.
        const double moved = (expected - plain.initial[i].second.to(at::kDouble)).abs().max().item<double>();
        EXPECT_LT(diff, 1e-6 + 1e-3 * moved) << plain.params[i].first << " moved " << moved;
      }
      // bf16 parameters are their masters rounded: the masters are compared
      // in the checkpoint state below.
      // Moments (and bf16's masters) split over dp ranks; the sharded side
      // keeps float32 copies of its ranges in every precision.
      const int dp = size / c.tp;
      EXPECT_LT(sharded.memOptimizer, plain.memOptimizer * (fp32 ? 1.5 : 1.0) / dp + 64 * 1024)
          << sharded.memOptimizer << " vs " << plain.memOptimizer;

      // Checkpoints: the same entries, the same values.
      if (comm->rank() != 0) return;
      std::map<std::string, at::Tensor> expected(plain.checkpoint.optimizer.begin(), plain.checkpoint.optimizer.end());
      ASSERT_EQ(sharded.checkpoint.optimizer.size(), expected.size());
      for (const auto& [name, t] : sharded.checkpoint.optimizer) {
        ASSERT_TRUE(expected.count(name)) << name;
        ASSERT_TRUE(t.sizes().equals(expected[name].sizes())) << name;
        const double diff = (t.to(at::kDouble) - expected[name].to(at::kDouble)).abs().max().item<double>();
        if (bf16) {
          // Once the curves part, gradients differ and so do the moments;
          // a master agrees to a part of how far it moved from the start.
          // The qkv bias holds the key bias, whose gradient is rounding
          // noise alone (see above): in bf16 its walk is redrawn entirely.
          if (name.rfind("master.", 0) != 0 || name.find("qkv.bias") != std::string::npos) continue;
          const std::string param = name.substr(std::strlen("master."));
          double moved = 0;
          for (const auto& [n, initial] : plain.initial) {
            if (n == param) moved = (expected[name] - initial.to(at::kFloat)).abs().max().item<double>();
          }
          EXPECT_LT(diff, 1e-6 + 0.25 * moved) << name << " moved " << moved;
          continue;
        }
        const double scale = std::max(1e-3, expected[name].to(at::kDouble).abs().max().item<double>());
        EXPECT_LT(diff / scale, stateTolerance) << name;
      }
    });
    EXPECT_EQ(failures, "") << describe(c);
  }
}

// Overlapping the gradient reduction with backward changes when the
// collectives run, never what they sum: with parallel.overlap_grad_reduce on
// and off, the same losses and parameters bit for bit, for the data plugin's
// all-reduce and the distributed optimizer's reduce-scatter, including the
// buckets whose gradients other plugins complete after backward
// (sequence-parallel LayerNorms, the tied embedding of a pipeline's two ends).
TEST(DistributedOptimizerRanks, OverlapChangesNothingBitForBit) {
  struct OverlapCase {
    int world, tp, pp;
    bool distributed;
  };
  for (const OverlapCase& c : {OverlapCase{2, 1, 1, false}, OverlapCase{2, 1, 1, true}, OverlapCase{4, 2, 1, true},
                               OverlapCase{4, 1, 2, true}}) {
    std::string failures = test::runRanks(c.world, [&c](int rank, int size, int port) {
      auto comm = worldOf(rank, size, port, layoutOf(size, c.tp, c.pp));
      auto run = [&](bool overlap) {
        llm::LlmTrainer trainer{PluginContext{}};
        std::vector<std::string> o = layoutOverrides(c.tp, c.pp, c.tp > 1);
        o.push_back("parallel.grad_bucket_size_mb=0.01");
        o.push_back(std::string("optimizer.distributed=") + (c.distributed ? "true" : "false"));
        o.push_back(std::string("parallel.overlap_grad_reduce=") + (overlap ? "true" : "false"));
        Recipe recipe = llmRecipe(trainer, o);
        trainer.setup(recipe);
        ModelRuntime rt(*comm, registry(), [&](const ModelBuild& b) { return trainer.buildModel(b); },
                        llmOptions(recipe, comm->layout(), true));
        std::vector<double> losses;
        std::vector<double> overlapped;
        const int dp = size / (c.tp * c.pp);
        for (int step = 0; step < 4; ++step) {
          StepResult r = llmStep(rt, trainer, step, 8 / dp / 2);
          losses.push_back(r.loss);
          overlapped.push_back(r.stats.count("dp_overlapped_bytes") ? r.stats.at("dp_overlapped_bytes") : -1);
        }
        std::vector<at::Tensor> params;
        for (auto& [name, p] : rt.model().localParameters()) params.push_back(p.detach().clone());
        return std::make_tuple(losses, params, overlapped);
      };
      auto [lossesOn, paramsOn, overlappedOn] = run(true);
      auto [lossesOff, paramsOff, overlappedOff] = run(false);
      EXPECT_EQ(lossesOn, lossesOff);
      ASSERT_EQ(paramsOn.size(), paramsOff.size());
      for (size_t i = 0; i < paramsOn.size(); ++i) EXPECT_TRUE(torch::equal(paramsOn[i], paramsOff[i])) << i;
      // The overlap happened: buckets were on the wire during backward.
      EXPECT_GT(overlappedOn.back(), 0);
      EXPECT_EQ(overlappedOff.back(), 0);
    });
    EXPECT_EQ(failures, "") << "world " << c.world << " tp " << c.tp << " pp " << c.pp << " distributed "
                            << c.distributed;
  }
}

TEST(DistributedOptimizer, WarnsWhenThereIsNoDataParallelGroupToShardOver) {
  llm::LlmTrainer trainer{PluginContext{}};
  Recipe recipe = llmRecipe(trainer, {"optimizer.distributed=true"});
  auto warnings = memorySettingWarnings(recipe, 1, 1);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("optimizer.distributed"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("set it to false"), std::string::npos) << warnings[0];
  EXPECT_TRUE(memorySettingWarnings(recipe, 2, 2).empty());
  EXPECT_TRUE(memorySettingWarnings(llmRecipe(trainer, {}), 1, 1).empty());
}

}  // namespace
}  // namespace ptrain
