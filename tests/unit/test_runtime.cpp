// ModelRuntime, step hooks, the optimizer interface and placements, in one
// process (a loopback communicator) and, where ranks must talk, in forked
// processes over Gloo on 127.0.0.1. Every result is compared with an
// independent reference: a hand-written libtorch loop, torch::optim, a run
// without the hook under test, or the whole model built on one rank.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ptrain/comm/communicator.h"
#include "ptrain/core/logging.h"
#include "ptrain/engine/optimizer.h"
#include "ptrain/engine/parallel.h"
#include "ptrain/engine/placement.h"
#include "ptrain/engine/runtime.h"
#include "ptrain/engine/trainer.h"
#include "ptrain/comm/rank_env.h"
#include "ptrain/plugin/registry.h"
#include "ptrain/recipe/recipe.h"
#include "ptrain/recipe/schema.h"
#include "support/test_support.h"
#include "unit/llm_runtime_fixture.h"
#include "../../trainers/llm/gpt_model.h"
#include "../../trainers/llm/llm_trainer.h"
#include "ptrain/datasets/arithmetic.h"

namespace ptrain {
namespace {

using namespace llm_fixture;

// ---- a small model: embed -> residual MLP blocks -> linear head, MSE ----

class MlpModel : public StagedModel {
 public:
  static constexpr int kIn = 4, kWidth = 8;

  MlpModel(int blocks, const ModelBuild& build) : blocks_(blocks) {
    root_ = std::make_shared<torch::nn::Module>();
    if (build.embed) embed_ = root_->register_module("embed", torch::nn::Linear(kIn, kWidth));
    auto container = root_->register_module("blocks", std::make_shared<torch::nn::Module>());
    for (int i = 0; i < blocks; ++i) {
      if (build.buildsBlock(i)) built_.emplace(i, container->register_module(std::to_string(i), torch::nn::Linear(kWidth, kWidth)));
    }
    if (build.head) head_ = root_->register_module("head", torch::nn::Linear(kWidth, 1));
    // Every parameter from a stream of its own (name-seeded), scaled small.
    const int64_t base = torch::randint(1 << 30, {1}, torch::kInt64).item<int64_t>();
    torch::NoGradGuard noGrad;
    for (auto& item : root_->named_parameters()) {
      at::Generator g = at::detail::createCPUGenerator(static_cast<uint64_t>(base) + std::hash<std::string>{}(item.key()));
      item.value().copy_(torch::empty(item.value().sizes()).normal_(0, 0.3, g));
    }
  }
  torch::nn::Module& module() override { return *root_; }
  int numBlocks() const override { return blocks_; }
  int64_t blockCost(int) override { return kWidth * kWidth + kWidth; }
  std::string blockPrefix(int i) const override { return "blocks." + std::to_string(i) + "."; }
  std::vector<std::string> embedPrefixes() const override { return {"embed."}; }
  std::vector<std::string> headPrefixes() const override { return {"head."}; }
  at::Tensor embed(const Batch& b) override { return embed_(b.at("x")); }
  at::Tensor runBlock(int i, const at::Tensor& h) override { return h + torch::tanh(built_.at(i)(h)); }
  LossOutput head(const at::Tensor& h, const Batch& b) override {
    at::Tensor diff = head_(h) - b.at("y");
    return LossOutput{(diff * diff).sum(), static_cast<double>(b.size())};
  }

 private:
  int blocks_;
  std::shared_ptr<torch::nn::Module> root_;
  torch::nn::Linear embed_{nullptr}, head_{nullptr};
  std::map<int, torch::nn::Linear> built_;
};

Batch mlpBatch(int step, int rows = 8) {
  torch::manual_seed(500 + step);
  Batch b;
  b.tensors.emplace("x", torch::randn({rows, MlpModel::kIn}));
  b.tensors.emplace("y", torch::randn({rows, 1}));
  return b;
}

OptimizerOptions adamw(double lr = 1e-2) {
  OptimizerOptions o;
  o.name = "adamw";
  o.lr = lr;
  o.weight_decay = 0.1;
  o.clip_grad = 0.5;
  o.schedule = "linear";
  o.warmup_steps = 2;
  o.total_steps = 6;
  return o;
}

struct LocalRuntime {
  std::unique_ptr<Communicator> comm = Communicator::loopback();
  std::unique_ptr<ModelRuntime> runtime;
  explicit LocalRuntime(std::optional<OptimizerOptions> optimizer = adamw(), int blocks = 3) {
    RuntimeOptions o;
    o.seed = 21;
    o.optimizer = optimizer;
    runtime = std::make_unique<ModelRuntime>(
        *comm, registry(), [blocks](const ModelBuild& b) { return std::make_shared<MlpModel>(blocks, b); }, o);
  }
  StepResult step(int index, int dataStep) {
    Batch batch = mlpBatch(dataStep);
    StepInput in;
    in.step = index;
    in.micro_batches = runtime->microBatches(batch, 4);
    in.loss_divisor = static_cast<double>(batch.size());
    return runtime->step(in);
  }
  std::map<std::string, at::Tensor> params() {
    std::map<std::string, at::Tensor> out;
    for (const auto& item : runtime->model().module().named_parameters()) out[item.key()] = item.value().detach().clone();
    return out;
  }
};

// ---- the runtime against a hand-written libtorch loop ----

TEST(ModelRuntime, StepsLikeAHandWrittenLoop) {
  LocalRuntime rt;
  // The reference: the same model (same seed), libtorch's AdamW in the same
  // two groups, clip_grad_norm_, the same schedule, the whole batch at once.
  torch::manual_seed(21);
  MlpModel ref(3, ModelBuild{});
  std::vector<at::Tensor> decay, plain;
  for (const auto& p : ref.module().parameters()) (p.dim() >= 2 ? decay : plain).push_back(p);
  const OptimizerOptions o = adamw();
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(o.lr).weight_decay(0.1)));
  groups.emplace_back(plain, std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(o.lr).weight_decay(0.0)));
  torch::optim::AdamW reference(std::move(groups));

  for (int step = 0; step < 5; ++step) {
    StepResult r = rt.step(step, step);
    Batch b = mlpBatch(step);
    reference.zero_grad();
    LossOutput out = ref.head(ref.runBlock(2, ref.runBlock(1, ref.runBlock(0, ref.embed(b)))), b);
    (out.loss_sum / 8.0).backward();
    const double norm = torch::nn::utils::clip_grad_norm_(ref.module().parameters(), o.clip_grad);
    const double lr = learningRate(o, step);
    for (auto& g : reference.param_groups()) static_cast<torch::optim::AdamWOptions&>(g.options()).lr(lr);
    reference.step();

    EXPECT_TRUE(r.applied);
    // float32 sums in another order (two micro-batches vs one batch).
    EXPECT_LT(test::relDiff(r.loss, out.loss_sum.item<double>() / 8.0), 1e-5) << "step " << step;
    EXPECT_NEAR(r.grad_norm, norm, 1e-5 * norm) << "step " << step;
    EXPECT_DOUBLE_EQ(r.lr, lr);
  }
  auto mine = rt.params();
  for (const auto& item : ref.module().named_parameters()) {
    EXPECT_TRUE(torch::allclose(mine.at(item.key()), item.value(), 1e-4, 1e-6)) << item.key();
  }
  EXPECT_EQ(rt.runtime->optimizer()->stepCount(), 5);
}

TEST(ModelRuntime, MicroBatchesAreThisRanksEvenSlices) {
  LocalRuntime rt;
  Batch b = mlpBatch(0);
  auto micro = rt.runtime->microBatches(b, 2);
  ASSERT_EQ(micro.size(), 4u);
  EXPECT_TRUE(torch::equal(micro[3].at("x"), b.at("x").narrow(0, 6, 2)));
  EXPECT_THROW(rt.runtime->microBatches(b, 3), ConfigError);
  EXPECT_EQ(rt.runtime->microBatches(b, 0).size(), 1u);
}

TEST(ModelRuntime, InferenceOnlyRuntimeRefusesToTrain) {
  LocalRuntime rt(std::nullopt);
  EXPECT_EQ(rt.runtime->optimizer(), nullptr);
  Batch b = mlpBatch(0);
  StepInput in;
  in.micro_batches = {b};
  try {
    rt.runtime->step(in);
    FAIL() << "expected an error";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("built for inference only"), std::string::npos) << e.what();
  }
  // Inference runs in eval mode without gradient, and leaves train mode on.
  rt.runtime->inference([&](StagedModel& model, const EvalContext& ctx) {
    EXPECT_FALSE(model.module().is_training());
    EXPECT_FALSE(torch::GradMode::is_enabled());
    EXPECT_EQ(ctx.num_shards, 1);
    EXPECT_TRUE(model.forward(b).loss_sum.defined());
  });
  EXPECT_TRUE(rt.runtime->model().module().is_training());
}

// ---- hooks ----

// Vetoes the steps it is told to, and counts what it saw.
struct VetoHooks : StepHooks {
  std::set<int64_t> veto;
  std::vector<std::string> events;
  int64_t current = -1;
  void beginStep(const StepInfo& info) override {
    current = info.step;
    events.push_back("begin" + std::to_string(info.step));
  }
  void beforeBackward(int index, int count) override { events.push_back("bwd" + std::to_string(index) + "/" + std::to_string(count)); }
  void finishGradients() override { events.push_back("finish"); }
  bool mayStep(const GradientCheck& check) override {
    events.push_back("may");
    EXPECT_TRUE(std::isfinite(check.grad_norm));
    return veto.count(current) == 0;
  }
  void afterStep(const StepResult& r) override { events.push_back(r.applied ? "applied" : "skipped"); }
};

TEST(StepHooks, AVetoSkipsTheUpdateAndTheScheduleWaits) {
  LocalRuntime vetoed, reference;
  auto hooks = std::make_shared<VetoHooks>();
  hooks->veto = {1};
  vetoed.runtime->addHooks(hooks);
  // Steps 0..3 with step 1 vetoed must equal steps on batches 0, 2, 3.
  std::vector<StepResult> results;
  for (int s = 0; s < 4; ++s) results.push_back(vetoed.step(s, s));
  auto before = vetoed.params();
  reference.step(0, 0);
  reference.step(1, 2);
  reference.step(2, 3);
  EXPECT_FALSE(results[1].applied);
  EXPECT_TRUE(results[0].applied && results[2].applied && results[3].applied);
  // The skipped step's learning rate is the one the next applied step uses.
  EXPECT_DOUBLE_EQ(results[1].lr, results[2].lr);
  EXPECT_EQ(vetoed.runtime->optimizer()->stepCount(), 3);
  auto ref = reference.params();
  for (const auto& [name, t] : before) EXPECT_TRUE(torch::equal(t, ref.at(name))) << name;
  EXPECT_EQ((std::vector<std::string>(hooks->events.begin(), hooks->events.begin() + 12)),
            (std::vector<std::string>{"begin0", "bwd0/2", "bwd1/2", "finish", "may", "applied", "begin1", "bwd0/2",
                                      "bwd1/2", "finish", "may", "skipped"}));
}

TEST(StepHooks, AVetoLeavesParametersAndOptimizerStateUntouched) {
  LocalRuntime rt;
  rt.step(0, 0);
  auto params = rt.params();
  auto state = rt.runtime->optimizer()->state();
  auto hooks = std::make_shared<VetoHooks>();
  hooks->veto = {1};
  rt.runtime->addHooks(hooks);
  StepResult r = rt.step(1, 1);
  EXPECT_FALSE(r.applied);
  for (const auto& [name, t] : rt.params()) EXPECT_TRUE(torch::equal(t, params.at(name))) << name;
  auto after = rt.runtime->optimizer()->state();
  ASSERT_EQ(after.size(), state.size());
  for (size_t i = 0; i < state.size(); ++i) EXPECT_TRUE(torch::equal(after[i].second, state[i].second)) << state[i].first;
  // Gradients of the skipped step are gone, not carried into the next.
  for (const auto& p : rt.runtime->model().module().parameters()) {
    if (p.grad().defined()) {
      EXPECT_EQ(p.grad().abs().sum().item<double>(), 0.0);
    }
  }
}

// Activation recomputation through runBlock: the block runs without
// keeping its activations, and again during backward.
struct Recompute : torch::autograd::Function<Recompute> {
  static inline int recomputed = 0;
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const BlockRunner* run) {
    ctx->saved_data["run"] = reinterpret_cast<int64_t>(run);
    ctx->save_for_backward({x});
    torch::NoGradGuard noGrad;
    return (*run)(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto* run = reinterpret_cast<const BlockRunner*>(ctx->saved_data["run"].toInt());
    at::Tensor x = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    {
      torch::AutoGradMode on(true);
      ++recomputed;
      at::Tensor y = (*run)(x);
      torch::autograd::backward({y}, {grads[0]});
    }
    return {x.grad(), at::Tensor()};
  }
};

// Wraps every block: records forward and backward events, and recomputes.
struct BlockHooks : StepHooks {
  std::vector<std::string> events;
  std::vector<std::unique_ptr<BlockRunner>> runners;  // alive until backward
  bool recompute = false;
  at::Tensor runBlock(int index, const at::Tensor& input, const BlockRunner& next) override {
    events.push_back("fwd" + std::to_string(index));
    if (!recompute || !torch::GradMode::is_enabled()) return next(input);
    runners.push_back(std::make_unique<BlockRunner>(next));
    return Recompute::apply(input, runners.back().get());
  }
  bool observesBlockBackward() const override { return true; }
  void beforeBlockBackward(int index) override { events.push_back("in" + std::to_string(index)); }
  void afterBlockBackward(int index) override { events.push_back("out" + std::to_string(index)); }
  void beginStep(const StepInfo&) override {
    events.clear();
    runners.clear();
  }
};

TEST(StepHooks, BlockWrappersSeeEveryBlockForwardAndBackward) {
  LocalRuntime wrapped, plain;
  auto hooks = std::make_shared<BlockHooks>();
  wrapped.runtime->addHooks(hooks);
  StepResult a = wrapped.step(0, 0);
  StepResult b = plain.step(0, 0);
  // Two micro-batches of three blocks; backward meets them in reverse.
  const std::vector<std::string> one{"fwd0", "fwd1", "fwd2", "in2", "out2", "in1", "out1", "in0", "out0"};
  std::vector<std::string> expected = one;
  expected.insert(expected.end(), one.begin(), one.end());
  EXPECT_EQ(hooks->events, expected);
  EXPECT_EQ(a.loss, b.loss);
  EXPECT_EQ(a.grad_norm, b.grad_norm);
  auto pa = wrapped.params(), pb = plain.params();
  for (const auto& [name, t] : pa) EXPECT_TRUE(torch::equal(t, pb.at(name))) << name;
}

TEST(StepHooks, ARecomputingWrapperTrainsTheSameModel) {
  LocalRuntime wrapped, plain;
  auto hooks = std::make_shared<BlockHooks>();
  hooks->recompute = true;
  Recompute::recomputed = 0;
  wrapped.runtime->addHooks(hooks);
  for (int s = 0; s < 3; ++s) {
    StepResult a = wrapped.step(s, s);
    StepResult b = plain.step(s, s);
    EXPECT_NEAR(a.loss, b.loss, 1e-7 * std::fabs(b.loss)) << "step " << s;
    EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-6 * b.grad_norm) << "step " << s;
  }
  // Each block ran again in backward: 3 blocks x 2 micro-batches x 3 steps.
  EXPECT_EQ(Recompute::recomputed, 18);
  auto pa = wrapped.params(), pb = plain.params();
  for (const auto& [name, t] : pa) EXPECT_TRUE(torch::allclose(t, pb.at(name), 1e-6, 1e-7)) << name;
}

// A loss scale from a hook: backward starts from the scaled loss, the
// optimizer sees the unscaled gradient.
struct ScaleHooks : StepHooks {
  double scale = 1024;
  double lossScale() override { return scale; }
};

TEST(StepHooks, TheLossScaleIsRemovedBeforeNormAndUpdate) {
  LocalRuntime scaled, plain;
  scaled.runtime->addHooks(std::make_shared<ScaleHooks>());
  for (int s = 0; s < 3; ++s) {
    StepResult a = scaled.step(s, s);
    StepResult b = plain.step(s, s);
    EXPECT_EQ(a.loss_scale, 1024);
    EXPECT_EQ(a.loss, b.loss);
    EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-6 * b.grad_norm);
  }
  auto pa = scaled.params(), pb = plain.params();
  for (const auto& [name, t] : pa) EXPECT_TRUE(torch::allclose(t, pb.at(name), 1e-6, 1e-7)) << name;
}

// ---- the optimizer interface ----

TEST(OptimizerInterface, GroupsWithTheirOwnDecayAndLearningRate) {
  torch::manual_seed(3);
  std::vector<at::Tensor> mine{torch::randn({5, 3}).requires_grad_(), torch::randn({7}).requires_grad_(),
                               torch::randn({2, 2}).requires_grad_()};
  std::vector<at::Tensor> ref;
  for (const auto& p : mine) ref.push_back(p.detach().clone().requires_grad_());
  OptimizerOptions o;
  o.name = "sgd";
  o.momentum = 0.9;
  // Group "a": p0 and p2 at lr x 0.5 with decay 0.2; group "b": p1 at lr x 2 without.
  auto optimizer = makeOptimizer({{"p0", mine[0]}, {"p1", mine[1]}, {"p2", mine[2]}},
                                 {ParamGroup{"a", 0.2, 0.5, {0, 2}}, ParamGroup{"b", 0.0, 2.0, {1}}}, o);
  EXPECT_STREQ(optimizer->name(), "sgd");
  ASSERT_EQ(optimizer->groups().size(), 2u);
  EXPECT_EQ(optimizer->groups()[0].index, (std::vector<size_t>{0, 2}));
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{ref[0], ref[2]},
                      std::make_unique<torch::optim::SGDOptions>(torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(0.2)));
  groups.emplace_back(std::vector<at::Tensor>{ref[1]},
                      std::make_unique<torch::optim::SGDOptions>(torch::optim::SGDOptions(0.2).momentum(0.9)));
  torch::optim::SGD reference(std::move(groups), torch::optim::SGDOptions(0.1));
  for (int step = 0; step < 4; ++step) {
    torch::manual_seed(40 + step);
    for (size_t i = 0; i < mine.size(); ++i) {
      at::Tensor g = torch::randn(mine[i].sizes());
      mine[i].mutable_grad() = g.clone();
      ref[i].mutable_grad() = g.clone();
    }
    EXPECT_TRUE(optimizer->step(0.1));
    reference.step();
  }
  for (size_t i = 0; i < mine.size(); ++i) EXPECT_TRUE(torch::allclose(mine[i], ref[i], 1e-6, 1e-7)) << i;
  EXPECT_EQ(optimizer->stepCount(), 4);
  EXPECT_THROW(makeOptimizer({{"p0", mine[0]}}, {ParamGroup{"a", 0, 1, {0}}, ParamGroup{"b", 0, 1, {0}}}, o),
               InternalError);
  EXPECT_THROW(makeOptimizer({{"p0", mine[0]}}, std::vector<ParamGroup>{}, o), InternalError);
}

TEST(OptimizerInterface, MasterWeightsAccumulateInFloat32) {
  // A bfloat16 parameter with a float32 master against a float32 parameter:
  // the master follows the float32 run exactly, the parameter is its rounding.
  torch::manual_seed(4);
  at::Tensor full = torch::randn({16, 8});
  at::Tensor half = full.to(torch::kBFloat16).requires_grad_();
  at::Tensor reference = half.detach().to(torch::kFloat).requires_grad_();
  OptimizerOptions o;
  o.master_weights = true;
  o.weight_decay = 0.05;
  auto mixed = makeOptimizer({{"w", half}}, o);
  OptimizerOptions plainOptions = o;
  plainOptions.master_weights = false;
  auto plain = makeOptimizer({{"w", reference}}, plainOptions);
  ASSERT_TRUE(mixed->master(0).defined());
  EXPECT_EQ(mixed->master(0).scalar_type(), torch::kFloat);
  EXPECT_FALSE(plain->master(0).defined());
  for (int step = 0; step < 5; ++step) {
    torch::manual_seed(60 + step);
    at::Tensor g = torch::randn({16, 8}).to(torch::kBFloat16);
    half.mutable_grad() = g;
    reference.mutable_grad() = g.to(torch::kFloat);
    mixed->step(1e-2, 0.5);
    plain->step(1e-2, 0.5);
  }
  EXPECT_TRUE(torch::equal(mixed->master(0), reference.detach()));
  EXPECT_TRUE(torch::equal(half.detach(), reference.detach().to(torch::kBFloat16)));
  // The master is part of the state, and comes back from it.
  auto state = mixed->state();
  std::map<std::string, at::Tensor> saved;
  for (const auto& [name, t] : state) saved[name] = t.clone();
  EXPECT_EQ(saved.count("master.w"), 1u);
  EXPECT_EQ(saved.count("exp_avg.w"), 1u);
  auto again = makeOptimizer({{"w", half.detach().clone().requires_grad_()}}, o);
  again->load(saved, mixed->stepCount());
  EXPECT_TRUE(torch::equal(again->master(0), mixed->master(0)));
  EXPECT_EQ(again->stepCount(), 5);
}

// ---- placement ----

TEST(Placement, SlicesAndFullShapesFollowEveryShard) {
  Placement placement;
  EXPECT_TRUE(placement.held("w"));
  EXPECT_FALSE(placement.sharded("w"));
  placement.addShard("w", ShardSpec{GroupKind::kTensor, 0, 2, 1, 6});
  placement.addShard("w", ShardSpec{GroupKind::kExpert, 1, 4, 2, 8});
  EXPECT_THROW(placement.addShard("w", ShardSpec{GroupKind::kTensor, 2, 2, 0, 4}), InternalError);
  EXPECT_THROW(placement.addShard("w", ShardSpec{GroupKind::kContext, 0, 2, 0, 6}), InternalError);
  at::Tensor full = torch::arange(48).view({6, 8});
  at::Tensor mine = placement.of("w").sliceOfFull(full, "w");
  EXPECT_TRUE(torch::equal(mine, full.narrow(0, 3, 3).narrow(1, 4, 2)));
  EXPECT_EQ(placement.of("w").fullSizes(mine.sizes()), (std::vector<int64_t>{6, 8}));
  EXPECT_THROW(placement.of("w").sliceOfFull(torch::zeros({5, 8}), "w"), CheckpointError);
}

TEST(Placement, EachValueIsCountedInTheNormByOneRank) {
  // 8 ranks, tp 2 x pp 2 x dp 2 (Megatron order: tp fastest, then dp, then pp).
  LayoutSizes sizes;
  sizes.world = 8;
  sizes.tp = 2;
  sizes.pp = 2;
  ParallelLayout layout(sizes);
  Placement placement;
  placement.addShard("split", ShardSpec{GroupKind::kTensor, 0, 2, 0, 4});
  placement.edit("copy").mirror = true;
  placement.edit("other").held = false;
  std::vector<int> replicated, split;
  for (int rank = 0; rank < 8; ++rank) {
    if (placement.countedInNorm("whole", layout, rank)) replicated.push_back(rank);
    if (placement.countedInNorm("split", layout, rank)) split.push_back(rank);
    EXPECT_FALSE(placement.countedInNorm("copy", layout, rank));
    EXPECT_FALSE(placement.countedInNorm("other", layout, rank));
  }
  // One rank per stage for a replicated parameter (tp 0, dp 0), both tensor
  // shards for a split one.
  EXPECT_EQ(replicated, (std::vector<int>{0, 4}));
  EXPECT_EQ(split, (std::vector<int>{0, 1, 4, 5}));
  EXPECT_EQ(Placement::gradientReduceGroup(placement.of("whole"), layout), GroupKind::kData);
  placement.edit("expert").grid = ParamGrid::kExpert;
  EXPECT_EQ(Placement::gradientReduceGroup(placement.of("expert"), layout), GroupKind::kExpertData);
}

// ---- several ranks: the GPT of the llm trainer ----

// Each parallel plugin through the runtime, in forked ranks: three steps of
// a layout with every fused kernel on (fusion.*) against the same steps of the
// whole model on one rank without them.
struct LayoutCase {
  int world, tp, pp;
  bool sequenceParallel;
};

class RuntimeLayouts : public ::testing::TestWithParam<LayoutCase> {};

TEST_P(RuntimeLayouts, ThreeStepsMatchOneRank) {
  const LayoutCase c = GetParam();
  std::string failures = test::runRanks(c.world, [c](int rank, int size, int port) {
    std::vector<double> reference;
    {
      llm::LlmTrainer unfused{PluginContext{}};
      Recipe plain = llmRecipe(unfused, {});
      unfused.setup(plain);
      reference = singleRankLosses(unfused, plain);
    }
    llm::LlmTrainer trainer{PluginContext{}};
    std::vector<std::string> overrides = layoutOverrides(c.tp, c.pp, c.sequenceParallel);
    for (const char* f : {"masked_softmax", "bias_gelu", "layernorm", "bias_dropout_add"}) {
      overrides.push_back(std::string("fusion.") + f + "=true");
    }
    Recipe recipe = llmRecipe(trainer, overrides);
    trainer.setup(recipe);
    expectLayoutMatches(rank, size, port, trainer, recipe, c.tp, c.pp, reference,
                        [](int step) { return step == 0 ? 1e-5 : 1e-4; });
  });
  EXPECT_EQ(failures, "");
}

INSTANTIATE_TEST_SUITE_P(Plugins, RuntimeLayouts,
                         ::testing::Values(LayoutCase{2, 1, 1, false}, LayoutCase{2, 2, 1, false},
                                           LayoutCase{2, 2, 1, true}, LayoutCase{4, 2, 2, true},
                                           LayoutCase{4, 1, 2, false}),
                         [](const ::testing::TestParamInfo<LayoutCase>& info) {
                           const LayoutCase& c = info.param;
                           return "world" + std::to_string(c.world) + "_tp" + std::to_string(c.tp) + "_pp" +
                                  std::to_string(c.pp) + (c.sequenceParallel ? "_sp" : "");
                         });

// A pipeline stage builds only its own blocks, with the values the whole
// model has there, and trains what one rank trains.
TEST(ModelRuntimeRanks, PipelineStagesBuildOnlyTheirPartsFromTheSameWeights) {
  std::string failures = test::runRanks(2, [](int rank, int size, int port) {
    llm::LlmTrainer trainer{PluginContext{}};
    Recipe recipe = llmRecipe(trainer, {"parallel.pipeline_model_parallel_size=2"});
    trainer.setup(recipe);
    const std::vector<double> reference = singleRankLosses(trainer, recipe);
    auto comm = worldOf(rank, size, port, layoutOf(2, 1, 2));
    ModelRuntime rt(*comm, registry(), [&](const ModelBuild& b) { return trainer.buildModel(b); },
                    llmOptions(recipe, comm->layout(), true));
    // The whole model, built on one rank from the same seed.
    torch::manual_seed(5);
    auto whole = trainer.buildModel();
    auto wholeParams = whole->module().named_parameters();
    std::set<std::string> held;
    for (const auto& [name, t] : rt.model().localParameters()) {
      held.insert(name);
      ASSERT_TRUE(torch::equal(t, wholeParams[name])) << name;
    }
    const std::set<std::string> blocks = rank == 0 ? std::set<std::string>{"blocks.0.", "blocks.1."}
                                                   : std::set<std::string>{"blocks.2.", "blocks.3."};
    for (const auto& item : rt.model().module().named_parameters()) {
      const std::string& name = item.key();
      if (name.rfind("blocks.", 0) == 0) {
        EXPECT_EQ(blocks.count(name.substr(0, name.find('.', 7) + 1)), 1u) << "stage " << rank << " built " << name;
      }
    }
    EXPECT_EQ(held.count("embed.tokens.weight"), 1u);  // owner on stage 0, mirror on stage 1
    EXPECT_EQ(rt.model().placement.mirror("embed.tokens.weight"), rank == 1);
    EXPECT_EQ(held.count("head.ln_f.weight"), rank == 1 ? 1u : 0u);
    for (int step = 0; step < 3; ++step) {
      const double loss = llmStep(rt, trainer, step, 4).loss;
      EXPECT_LT(test::relDiff(loss, reference[static_cast<size_t>(step)]), 1e-5) << "step " << step;
    }
  });
  EXPECT_EQ(failures, "");
}

// Two runtimes on different layouts of the same two ranks: a rollout model
// at tp=2 generates answers (inference only) that become the training batch
// of an actor at dp=2, as a reinforcement-learning task does. Checked against
// the same work on one rank.
TEST(ModelRuntimeRanks, TwoLayoutsOnTheSameRanksProduceAndTrain) {
  std::string failures = test::runRanks(2, [](int rank, int size, int port) {
    llm::LlmTrainer trainer{PluginContext{}};
    Recipe recipe = llmRecipe(trainer, {});
    trainer.setup(recipe);
    auto prompts = [&]() {
      std::vector<std::vector<int64_t>> out;
      for (const auto& p : trainer.dataset().evalProblems()) out.push_back(datasets::ArithmeticTokenizer::encode(p.prompt()));
      return out;
    }();
    // What the rollout produces becomes a batch: prompt + generated answer,
    // the answer's tokens as the targets the loss counts.
    auto batchOf = [&](const std::vector<std::vector<int64_t>>& answers) {
      const int64_t length = 8, rows = static_cast<int64_t>(prompts.size());
      at::Tensor tokens = torch::zeros({rows, length}, torch::kInt64);
      at::Tensor targets = torch::zeros({rows, length}, torch::kInt64);
      at::Tensor mask = torch::zeros({rows, length});
      for (int64_t r = 0; r < rows; ++r) {
        std::vector<int64_t> row = prompts[static_cast<size_t>(r)];
        const int64_t answerStart = static_cast<int64_t>(row.size());
        row.insert(row.end(), answers[static_cast<size_t>(r)].begin(), answers[static_cast<size_t>(r)].end());
        row.resize(static_cast<size_t>(length + 1), datasets::ArithmeticTokenizer::kPad);
        for (int64_t t = 0; t < length; ++t) {
          tokens[r][t] = row[static_cast<size_t>(t)];
          targets[r][t] = row[static_cast<size_t>(t + 1)];
          const bool answer = t + 1 >= answerStart &&
                              t + 1 < answerStart + static_cast<int64_t>(answers[static_cast<size_t>(r)].size());
          mask[r][t] = answer ? 1.0 : 0.0;
        }
      }
      Batch b;
      b.tensors.emplace("tokens", tokens);
      b.tensors.emplace("targets", targets);
      b.tensors.emplace("loss_mask", mask);
      return b;
    };
    // Reference on one rank: decode, then one training step.
    std::vector<std::vector<int64_t>> refAnswers;
    double refLoss = 0;
    {
      auto comm = Communicator::loopback();
      ModelRuntime rollout(*comm, registry(), [&](const ModelBuild& b) { return trainer.buildModel(b); },
                           llmOptions(recipe, comm->layout(), false));
      ModelRuntime actor(*comm, registry(), [&](const ModelBuild& b) { return trainer.buildModel(b); },
                         llmOptions(recipe, comm->layout(), true));
      rollout.inference([&](StagedModel& m, const EvalContext&) {
        refAnswers = static_cast<llm::GptModel&>(m).greedyDecode(prompts, 3, datasets::ArithmeticTokenizer::kEos);
      });
      Batch batch = batchOf(refAnswers);
      StepInput in;
      in.micro_batches = actor.microBatches(batch, 0);
      in.loss_divisor = trainer.lossCount(batch);
      refLoss = actor.step(in).loss;
    }
    auto comm = worldOf(rank, size, port, layoutOf(2, 1, 1));  // the actor's layout: dp=2
    ModelRuntime rollout(*comm, registry(), [&](const ModelBuild& b) { return trainer.buildModel(b); },
                         llmOptions(recipe, layoutOf(2, 2, 1), false));  // tp=2
    ModelRuntime actor(*comm, registry(), [&](const ModelBuild& b) { return trainer.buildModel(b); },
                       llmOptions(recipe, comm->layout(), true));
    EXPECT_EQ(rollout.groups().group(GroupKind::kTensor)->size(), 2);
    EXPECT_EQ(actor.groups().group(GroupKind::kData)->size(), 2);
    std::vector<std::vector<int64_t>> answers;
    rollout.inference([&](StagedModel& m, const EvalContext&) {
      answers = static_cast<llm::GptModel&>(m).greedyDecode(prompts, 3, datasets::ArithmeticTokenizer::kEos);
    });
    EXPECT_EQ(answers, refAnswers);
    Batch batch = batchOf(answers);
    StepInput in;
    in.micro_batches = actor.microBatches(batch, 0);
    in.loss_divisor = trainer.lossCount(batch);
    EXPECT_LT(test::relDiff(actor.step(in).loss, refLoss), 1e-5);
  });
  EXPECT_EQ(failures, "");
}

}  // namespace
}  // namespace ptrain
