// The planner's cost model (plan/cost_model.h): parameter counts equal those
// of the GPT ptrain builds, rank by rank (tp 2, pp 2 first and last stage,
// MoE at ep 2); the memory the first step reports (mem_params, mem_grads,
// mem_optimizer) equals the prediction to the byte, and the activations are
// within the tolerance stated below; the formulas agree with hand-computed
// cases; the advice follows the flowchart's order.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "llm_runtime_fixture.h"
#include "ptrain/core/host_allocator.h"
#include "ptrain/plan/cost_model.h"

namespace ptrain {
namespace {

using namespace llm_fixture;

plan::DeviceSpec roomyDevice() {
  plan::DeviceSpec d;
  d.name = "test";
  d.memory_gib = 1000;
  d.peak_tflops_fp32 = 1;
  d.peak_tflops_half = 2;
  d.efficiency = 0.5;
  d.intra_node_gbps = 10;
  d.inter_node_gbps = 1;
  d.offload_gbps = 1;
  d.reserved_gib = 0;
  return d;
}

// L=2, h=64, a=4, f=256, s=16, V=128, tied: the numbers worked by hand below.
plan::ModelShape smallShape() {
  plan::ModelShape m;
  m.num_layers = 2;
  m.hidden = 64;
  m.heads = 4;
  m.ffn = 256;
  m.seq = 16;
  m.vocab = 128;
  return m;
}

TEST(CostModel, HandComputedParametersMemoryAndFlops) {
  const plan::ModelShape m = smallShape();
  // Per block: qkv 3*64*64 + 3*64, proj 64*64 + 64, fc1 256*64 + 256,
  // fc2 64*256 + 64, two layer norms 4*64: 49,984. Embedding 128*64 + 16*64,
  // final layer norm 2*64.
  EXPECT_EQ(plan::parameterCount(m), 2 * 49984 + 9216 + 128);
  plan::Layout l;
  l.micro_batch = 2;
  l.global_batch = 2;
  const auto e = plan::estimateMemory(m, l, roomyDevice(), 0);
  EXPECT_EQ(e.params, 109312.0 * 4);
  EXPECT_EQ(e.grads, 109312.0 * 4);
  EXPECT_EQ(e.optimizer, 109312.0 * 8);  // AdamW's two float32 moments
  EXPECT_EQ(e.buffers, 0);               // dp = 1
  // Per block s*b*h (34 + 5*a*s/h) = 2048 * (34 + 5) bytes in 16-bit, twice
  // that in float32, two blocks; plus float32 logits and their gradient
  // 2 * 4 * s * b * V.
  EXPECT_EQ(e.activations, 2 * 2048.0 * 39 * 2 + 2 * 4.0 * 16 * 2 * 128);

  // Tensor parallel 2 with sequence parallelism: everything split; without
  // it, 10 units stay whole.
  l.tp = 2;
  l.sequence_parallel = true;
  EXPECT_EQ(plan::estimateMemory(m, l, roomyDevice(), 0).activations,
            2 * 2048.0 * 39 / 2 * 2 + 2 * 4.0 * 16 * 2 * 128 / 2);
  l.sequence_parallel = false;
  EXPECT_EQ(plan::estimateMemory(m, l, roomyDevice(), 0).activations,
            2 * 2048.0 * (10 + 29.0 / 2) * 2 + 2 * 4.0 * 16 * 2 * 128 / 2);
  // Full recomputation: each block's input (2 units), and one block whole.
  l.tp = 1;
  l.recompute = "full";
  EXPECT_EQ(plan::estimateMemory(m, l, roomyDevice(), 0).activations,
            (2 * 2.0 + 39) * 2048 * 2 + 2 * 4.0 * 16 * 2 * 128);
  // Selective: the attention core's 5 a s / h units go.
  l.recompute = "selective";
  EXPECT_EQ(plan::estimateMemory(m, l, roomyDevice(), 0).activations, 2 * 2048.0 * 34 * 2 + 2 * 4.0 * 16 * 2 * 128);

  // bf16: 2-byte parameters, float32 gradients, moments and masters.
  plan::Layout half;
  half.precision = "bf16";
  half.micro_batch = 2;
  half.global_batch = 2;
  const auto h = plan::estimateMemory(m, half, roomyDevice(), 0);
  EXPECT_EQ(h.params, 109312.0 * 2);
  EXPECT_EQ(h.optimizer, 109312.0 * 12);
  // The distributed optimizer at dp 4: moments and float32 copies of a
  // quarter; the reduced quarter of the gradients lies in the gradient
  // buffer, which the gradients are views of.
  half.dp = 4;
  half.global_batch = 8;
  half.distributed_optimizer = true;
  const auto d = plan::estimateMemory(m, half, roomyDevice(), 0);
  EXPECT_EQ(d.optimizer, 109312.0 * 12 / 4);
  EXPECT_EQ(d.grads, 109312.0 * 4);
  EXPECT_EQ(d.buffers, 0);

  // FLOPs of one step: forward per block 2*b*s*(4h^2 + 2hf) + 4*b*s^2*h =
  // 3,276,800, the head 2*b*s*h*V = 524,288; backward twice the forward.
  plan::Layout plain;
  plain.micro_batch = 2;
  plain.global_batch = 2;
  const auto t = plan::estimateStepTime(m, plain, roomyDevice());
  EXPECT_EQ(t.flops, 3 * (2 * 3276800.0 + 524288));
  EXPECT_GT(t.compute, 0);
}

TEST(CostModel, PipelineStagesHoldTheirBlocksEmbeddingAndMicroBatches) {
  plan::ModelShape m = smallShape();
  m.num_layers = 4;
  plan::Layout l;
  l.pp = 2;
  l.micro_batch = 1;
  l.global_batch = 8;
  // The first stage: embedding and two blocks; the last: two blocks, the
  // final layer norm and its own copy of the tied vocabulary rows.
  EXPECT_EQ(plan::parametersOnRank(m, l, 0), 9216 + 2 * 49984);
  EXPECT_EQ(plan::parametersOnRank(m, l, 1), 2 * 49984 + 128 + 8192);
  // 1F1B: the first stage holds pp micro-batches, the last one; GPipe all m.
  EXPECT_EQ(plan::estimateMemory(m, l, roomyDevice(), 0).in_flight, 2);
  EXPECT_EQ(plan::estimateMemory(m, l, roomyDevice(), 1).in_flight, 1);
  l.schedule = "gpipe";
  EXPECT_EQ(plan::estimateMemory(m, l, roomyDevice(), 0).in_flight, 8);
  // The bubble is (pp - 1) / m of the compute.
  l.schedule = "1f1b";
  const auto t = plan::estimateStepTime(m, l, roomyDevice());
  EXPECT_NEAR(t.bubble, t.compute / 8, 1e-12);
}

TEST(CostModel, AdviceFollowsTheFlowchartOffloadThenSmallerMicroBatches) {
  plan::ModelShape m = smallShape();
  m.num_layers = 24;
  m.hidden = 1024;
  m.heads = 16;
  m.ffn = 0;
  m.seq = 1024;
  plan::Layout l;
  l.micro_batch = 8;
  l.global_batch = 8;
  plan::DeviceSpec small = roomyDevice();
  small.memory_gib = 8;
  ASSERT_GT(plan::peakMemory(m, l, small).total(), 8.0 * (1 << 30));
  const auto advice = plan::adviseWhenOverMemory(m, l, small);
  ASSERT_GE(advice.size(), 2u);
  EXPECT_EQ(advice[0].override_text, "offload.params=true");
  EXPECT_EQ(advice[1].override_text, "train.micro_batch_size=4");
  EXPECT_TRUE(advice.back().fits);
  for (size_t i = 1; i < advice.size(); ++i) EXPECT_LT(advice[i].total_bytes, advice[i - 1].total_bytes);
  // A layout that fits needs no advice.
  EXPECT_TRUE(plan::adviseWhenOverMemory(smallShape(), plan::Layout{}, roomyDevice()).empty());
}

TEST(CostModel, SearchRanksValidLayoutsThatFitByThroughput) {
  plan::ModelShape m = smallShape();
  m.num_layers = 24;
  m.hidden = 2048;
  m.heads = 16;
  m.ffn = 0;
  m.seq = 2048;
  m.vocab = 51200;
  plan::Layout base;
  base.precision = "bf16";
  base.global_batch = 16;
  plan::DeviceSpec a100 = *plan::findDevicePreset("A100-40G");
  const auto found = plan::searchLayouts(m, base, a100, 8, 50);
  ASSERT_FALSE(found.empty());
  EXPECT_TRUE(found.front().fits);
  bool seenMiss = false;
  for (size_t i = 0; i < found.size(); ++i) {
    const plan::Layout& l = found[i].layout;
    EXPECT_EQ(l.tp * l.pp * l.dp, 8);
    EXPECT_EQ(m.heads % l.tp, 0);
    EXPECT_EQ(m.num_layers % l.pp, 0);
    EXPECT_EQ(base.global_batch % (l.dp * l.micro_batch), 0);
    EXPECT_EQ(found[i].fits, found[i].memory.total() <= 40.0 * (1 << 30));
    // Those that fit first, by predicted throughput.
    if (!found[i].fits) seenMiss = true;
    EXPECT_FALSE(seenMiss && found[i].fits) << i;
    if (i > 0 && found[i].fits) {
      EXPECT_LE(found[i].tokens_per_s, found[i - 1].tokens_per_s) << i;
    }
  }
  // A model that fits anywhere: nothing recomputed or offloaded in the best.
  const auto easy = plan::searchLayouts(smallShape(), plan::Layout{}, a100, 1, 5);
  ASSERT_FALSE(easy.empty());
  EXPECT_EQ(easy.front().layout.recompute, "none");
  EXPECT_FALSE(easy.front().layout.offload_params);
}

TEST(CostModel, SearchInterleavesAndSplitsExpertsWhereTheyFit) {
  plan::ModelShape m = smallShape();
  m.num_layers = 8;
  m.num_experts = 4;
  plan::Layout base;
  base.global_batch = 16;
  bool interleaved = false, experts = false;
  for (const auto& c : plan::searchLayouts(m, base, roomyDevice(), 4, 100000)) {
    const plan::Layout& l = c.layout;
    EXPECT_EQ(m.num_experts % l.ep, 0);
    EXPECT_EQ((4 / l.pp) % l.ep, 0);
    if (l.vpp > 1) {
      interleaved = true;
      EXPECT_EQ(l.schedule, "interleaved");
      EXPECT_EQ(m.num_layers % (l.pp * l.vpp), 0);
      EXPECT_EQ(l.microBatches() % l.pp, 0);
    }
    experts = experts || l.ep > 1;
  }
  EXPECT_TRUE(interleaved);
  EXPECT_TRUE(experts);
}

TEST(CostModel, HeterogeneousGroupsSplitTheBatchByPredictedSpeed) {
  // Two groups of two devices, one twice as fast, with no communication cost
  // to speak of: rows in proportion 2:1 make both groups take equally long,
  // a step two thirds of the even split's (the slow group's) time.
  plan::ModelShape m = smallShape();
  plan::DeviceSpec fast = roomyDevice(), slow = roomyDevice();
  fast.name = "fast";
  slow.name = "slow";
  fast.intra_node_gbps = slow.intra_node_gbps = fast.inter_node_gbps = slow.inter_node_gbps = 1e9;
  slow.peak_tflops_fp32 = fast.peak_tflops_fp32 / 2;
  plan::Layout base;
  base.global_batch = 24;
  const auto hp = plan::planHeterogeneous(m, base, {{fast, 2}, {slow, 2}});
  ASSERT_EQ(hp.even.size(), 2u);
  EXPECT_EQ(hp.even[0].rows, 12);
  EXPECT_EQ(hp.even[1].rows, 12);
  EXPECT_EQ(hp.balanced[0].rows, 16);
  EXPECT_EQ(hp.balanced[1].rows, 8);
  EXPECT_NEAR(hp.balanced_time / hp.even_time, 2.0 / 3.0, 0.02);
  // Equal groups: nothing to gain.
  const auto same = plan::planHeterogeneous(m, base, {{fast, 2}, {fast, 2}});
  EXPECT_EQ(same.balanced[0].rows, 12);
  EXPECT_DOUBLE_EQ(same.balanced_time, same.even_time);
  // A batch that cannot be split in whole multiples of the groups' sizes.
  base.global_batch = 3;
  EXPECT_THROW(plan::planHeterogeneous(m, base, {{fast, 2}, {slow, 2}}), ConfigError);
}

// Counted against the model ptrain builds: each rank's parameters, and what
// the first step reports of its memory.
struct Measured {
  int64_t parameters = 0;
  std::map<std::string, double> stats;
};

Measured measure(Communicator& comm, const std::vector<std::string>& overrides, const ParallelLayout& layout,
                 plan::ModelShape* shape) {
  llm::LlmTrainer trainer{PluginContext{}};
  Recipe recipe = llmRecipe(trainer, overrides);
  trainer.setup(recipe);
  *shape = *trainer.modelShape();
  ModelRuntime rt(comm, registry(), [&](const ModelBuild& b) { return trainer.buildModel(b); },
                  llmOptions(recipe, layout, true));
  Measured out;
  for (const auto& [name, p] : rt.model().localParameters()) out.parameters += p.numel();
  const int dp = layout.sizes().world / (layout.sizes().tp * layout.sizes().pp);
  out.stats = llmStep(rt, trainer, 0, 8 / dp / (layout.sizes().pp > 1 ? 2 : 1)).stats;
  return out;
}

plan::Layout planLayoutOf(int world, int tp, int pp, int ep, const std::string& precision, int64_t micro) {
  plan::Layout l;
  l.tp = tp;
  l.pp = pp;
  l.ep = ep;
  l.dp = world / (tp * pp);
  l.sequence_parallel = tp > 1;
  l.precision = precision;
  l.micro_batch = micro;
  l.global_batch = 8;
  return l;
}

TEST(CostModel, ParametersAndOptimizerBytesEqualTheBuiltModelsOnOneRank) {
  // As `ptrain run` does: the caching allocator counts the activations.
  installCachingHostAllocator();
  auto comm = Communicator::loopback();
  for (const std::string precision : {"fp32", "bf16"}) {
    plan::ModelShape shape;
    Measured got = measure(*comm, {"precision.name=" + precision}, comm->layout(), &shape);
    const plan::Layout l = planLayoutOf(1, 1, 1, 1, precision, 8);
    EXPECT_EQ(got.parameters, plan::parametersOnRank(shape, l, 0)) << precision;
    const auto e = plan::estimateMemory(shape, l, roomyDevice(), 0);
    EXPECT_EQ(got.stats.at("mem_params"), e.params) << precision;
    EXPECT_EQ(got.stats.at("mem_grads"), e.grads) << precision;
    EXPECT_EQ(got.stats.at("mem_optimizer"), e.optimizer) << precision;
    // Activations: Korthikanti et al.'s count is for Megatron's kernels, and
    // ptrain's keep somewhat less on this tiny model (0.83 of it in fp32, 0.76
    // in bf16; the large bench GPT: 0.99); docs/planning.md.
    const double ratio = got.stats.at("mem_activations") / e.activations;
    EXPECT_GT(ratio, 0.7) << precision;
    EXPECT_LT(ratio, 1.2) << precision;
  }
}

TEST(CostModelRanks, EachRanksParametersEqualTheBuiltModels) {
  struct Case {
    int tp, pp, ep;
    std::vector<std::string> overrides;
  };
  const std::vector<Case> cases = {
      {2, 1, 1, {}},
      {1, 2, 1, {}},
      {1, 1, 2, {"model.num_experts=4", "model.moe_layer_freq=2"}},
  };
  for (const Case& c : cases) {
    std::string failures = test::runRanks(2, [&c](int rank, int size, int port) {
      auto comm = worldOf(rank, size, port, layoutOf(size, c.tp, c.pp, c.ep));
      std::vector<std::string> o = layoutOverrides(c.tp, c.pp, c.tp > 1);
      o.insert(o.end(), c.overrides.begin(), c.overrides.end());
      if (c.ep > 1) o.push_back("parallel.expert_model_parallel_size=2");
      plan::ModelShape shape;
      Measured got = measure(*comm, o, comm->layout(), &shape);
      const int64_t stage = c.pp > 1 ? rank : 0;
      const plan::Layout l = planLayoutOf(size, c.tp, c.pp, c.ep, "fp32", c.pp > 1 ? 2 : 8 / (size / (c.tp * c.pp)));
      EXPECT_EQ(got.parameters, plan::parametersOnRank(shape, l, stage)) << "stage " << stage;
      EXPECT_EQ(got.stats.at("mem_params"), plan::estimateMemory(shape, l, roomyDevice(), stage).params);
    });
    EXPECT_EQ(failures, "") << "tp " << c.tp << " pp " << c.pp << " ep " << c.ep;
  }
}

}  // namespace
}  // namespace ptrain
