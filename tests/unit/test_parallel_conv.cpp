// Tensor-parallel convolutions (nn/parallel_conv.h) on real ranks (forked
// processes, Gloo over 127.0.0.1), each against the unsharded computation:
//   - ColumnParallelConv2d (with and without gather_output) and
//     RowParallelConv2d (with and without input_is_parallel) against
//     torch's conv2d on the full weights in float64: outputs, input gradients,
//     and each rank's weight and bias gradient = its slice of the full one;
//   - a small conv stack sharded by applyTensorParallel from its
//     TensorParallelPlan (column conv -> batch norm -> relu -> row conv ->
//     relu -> column conv -> group norm -> relu -> row conv), tp x dp in
//     {1, 2}^2, in float32: outputs and the gathered full gradients at step
//     1 within 1e-5, then 20 SGD steps with the gathered full weights within
//     1e-4; the full weights gathered along each placement's split (as a
//     checkpoint saves them) and sliced back into a fresh sharded model (as a
//     checkpoint loads them at another tp);
//   - ChannelParallelGroupNorm refusing groups that straddle ranks.
// Batch-norm statistics are per data-parallel replica (as torch's BatchNorm2d
// under DDP), so the reference for dp = 2 is the single-rank module run on
// each replica's half of the batch with the gradients summed.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>

#include "ptrain/comm/backend.h"
#include "ptrain/comm/process_group.h"
#include "ptrain/comm/store.h"
#include "ptrain/core/logging.h"
#include "ptrain/engine/model.h"
#include "ptrain/engine/tensor_parallel.h"
#include "ptrain/nn/parallel_conv.h"
#include "ptrain/nn/tp_comm.h"
#include "ptrain/plugin/registry.h"
#include "support/test_support.h"

namespace nn = ptrain::nn;
using nn::TensorParallelState;

namespace {

// One forked rank of a tp x dp grid (rank = dp_index * tp + tp_index): its
// tensor-parallel state and, for dp > 1, its data-parallel group.
class GridRank {
 public:
  GridRank(int rank, int tp, int dp, int port) {
    // Ranks share two cores: one intra-op thread each.
    at::set_num_threads(1);
    const int world = tp * dp;
    const int tpIndex = rank % tp;
    const int dpIndex = rank / tp;
    if (world > 1) {
      registry_ = std::make_unique<ptrain::PluginRegistry>(std::vector<std::string>{
          ptrain::test::binaryDir() + "/lib/ptrain/plugins/comm/libptrain_comm_gloo.so"});
      ptrain::PluginContext ctx;
      ctx.logger = ptrain::logger();
      ctx.rank = rank;
      ctx.world_size = world;
      plugin_ = registry_->create(ptrain::plugin_kind::kComm, "gloo", ctx);
      ptrain::TcpStoreOptions so;
      so.port = port;
      so.is_server = rank == 0;
      so.world_size = world;
      so.timeout = std::chrono::seconds(30);
      store_ = ptrain::createTcpStore(so);
    }
    auto group = [&](const std::string& name, std::vector<int> ranks) {
      ptrain::GroupOptions go;
      go.name = name;
      go.ranks = std::move(ranks);
      go.global_rank = rank;
      go.timeout = std::chrono::seconds(30);
      return static_cast<ptrain::CommBackend*>(plugin_.get())->createGroup(store_, go);
    };
    if (tp > 1) {
      std::vector<int> members;
      for (int t = 0; t < tp; ++t) members.push_back(dpIndex * tp + t);
      tpGroup_ = group("tp" + std::to_string(dpIndex), members);
      tp_ = TensorParallelState::create(tpGroup_, false);
    } else {
      tp_ = std::make_shared<TensorParallelState>();  // one rank: no group needed
    }
    if (dp > 1) {
      std::vector<int> members;
      for (int d = 0; d < dp; ++d) members.push_back(d * tp + tpIndex);
      dpGroup_ = group("dp" + std::to_string(tpIndex), members);
    }
  }
  ~GridRank() {
    if (tpGroup_) tpGroup_->barrier()->wait();
    if (dpGroup_) dpGroup_->barrier()->wait();
    tpGroup_.reset();
    dpGroup_.reset();
  }
  std::shared_ptr<TensorParallelState> tp() const { return tp_; }
  ptrain::ProcessGroup* dp() const { return dpGroup_.get(); }

 private:
  std::unique_ptr<ptrain::PluginRegistry> registry_;
  std::unique_ptr<ptrain::Plugin> plugin_;
  std::shared_ptr<ptrain::Store> store_;
  std::shared_ptr<ptrain::ProcessGroup> tpGroup_, dpGroup_;
  std::shared_ptr<TensorParallelState> tp_;
};

// Runs body(grid rank, dp index) on tp x dp forked ranks; fails the test if
// any rank fails.
void onGrid(int tp, int dp, const std::function<void(GridRank&, int dpIndex)>& body) {
  std::string failures = ptrain::test::runRanks(
      tp * dp,
      [&](int rank, int, int port) {
        GridRank grid(rank, tp, dp, port);
        body(grid, rank / tp);
      },
      60);
  EXPECT_EQ(failures, "") << "tp=" << tp << " dp=" << dp;
}

void expectClose(const at::Tensor& actual, const at::Tensor& expected, const std::string& what, double tol) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  const double err = (actual.to(torch::kFloat64) - expected.to(torch::kFloat64)).abs().max().item<double>();
  const double scale = std::max(1.0, expected.abs().max().item<double>());
  EXPECT_LE(err, tol * scale) << what << ": max abs error " << err;
}

at::Tensor sliceOf(const at::Tensor& full, int64_t dim, int rank, int size) {
  const int64_t k = full.size(dim) / size;
  return full.narrow(dim, rank * k, k);
}

at::Tensor seeded(std::vector<int64_t> shape, uint64_t seed, at::ScalarType dtype = torch::kFloat32) {
  torch::manual_seed(seed);
  return torch::randn(shape, torch::kFloat64).to(dtype);
}

// ---- the layers against torch's conv2d, float64 ----

TEST(ParallelConvLayers, ColumnAndRowMatchConv2dOnTheFullWeights) {
  const int n = 2;
  onGrid(n, 1, [n](GridRank& grid, int) {
    auto tp = grid.tp();
    const int r = tp->rank;
    nn::ParallelConv2dOptions o(3, 4, 3);
    o.stride = {2, 1};
    o.padding = {1, 1};
    const at::Tensor x = seeded({2, 3, 8, 8}, 1, torch::kFloat64);

    for (bool gather : {false, true}) {
      torch::manual_seed(7);
      nn::ColumnParallelConv2d full(o);
      full->to(torch::kFloat64);
      at::Tensor xf = x.clone().requires_grad_();
      at::Tensor ref = full(xf);
      at::Tensor refUp = seeded(ref.sizes().vec(), 2, torch::kFloat64);
      ref.backward(refUp);

      torch::manual_seed(7);
      nn::ColumnParallelConv2d col(o);
      col->to(torch::kFloat64);
      col->gather_output = gather;
      {
        torch::NoGradGuard g;
        col->weight.set_data(sliceOf(col->weight, 0, r, n).clone());
        col->bias.set_data(sliceOf(col->bias, 0, r, n).clone());
      }
      col->setTensorParallel(tp);
      at::Tensor xs = x.clone().requires_grad_();
      at::Tensor out = col(xs);
      expectClose(out, gather ? ref : sliceOf(ref, 1, r, n), "column output", 1e-12);
      out.backward(gather ? refUp : sliceOf(refUp, 1, r, n).contiguous());
      expectClose(xs.grad(), xf.grad(), "column input grad", 1e-12);
      expectClose(col->weight.grad(), sliceOf(full->weight.grad(), 0, r, n), "column weight grad", 1e-12);
      expectClose(col->bias.grad(), sliceOf(full->bias.grad(), 0, r, n), "column bias grad", 1e-12);
    }

    nn::ParallelConv2dOptions ro(4, 3, 3);
    ro.padding = {1, 1};
    const at::Tensor h = seeded({2, 4, 6, 6}, 3, torch::kFloat64);
    for (bool inputIsParallel : {true, false}) {
      torch::manual_seed(8);
      nn::RowParallelConv2d full(ro);
      full->to(torch::kFloat64);
      at::Tensor hf = h.clone().requires_grad_();
      at::Tensor ref = full(hf);
      const at::Tensor up = seeded(ref.sizes().vec(), 4, torch::kFloat64);
      ref.backward(up);

      torch::manual_seed(8);
      nn::RowParallelConv2d row(ro);
      row->to(torch::kFloat64);
      row->input_is_parallel = inputIsParallel;
      {
        torch::NoGradGuard g;
        row->weight.set_data(sliceOf(row->weight, 1, r, n).clone());
      }
      row->setTensorParallel(tp);
      at::Tensor hs = (inputIsParallel ? sliceOf(h, 1, r, n) : h).clone().requires_grad_();
      at::Tensor out = row(hs);
      expectClose(out, ref, "row output", 1e-12);
      out.backward(up);
      expectClose(hs.grad(), inputIsParallel ? sliceOf(hf.grad(), 1, r, n) : hf.grad(), "row input grad", 1e-12);
      expectClose(row->weight.grad(), sliceOf(full->weight.grad(), 1, r, n), "row weight grad", 1e-12);
      expectClose(row->bias.grad(), full->bias.grad(), "row bias grad (added once)", 1e-12);
    }
  });
}

TEST(ParallelConvLayers, OneRankIsTorchConvBatchNormAndGroupNorm) {
  nn::ParallelConv2dOptions o(3, 4, 3);
  o.padding = {1, 1};
  torch::manual_seed(9);
  nn::ColumnParallelConv2d col(o);
  torch::manual_seed(9);
  torch::nn::Conv2d ref(torch::nn::Conv2dOptions(3, 4, 3).padding(1));
  // The same draws; the bounds may differ in the last bit (torch derives
  // theirs from kaiming_uniform_'s gain).
  EXPECT_TRUE(torch::allclose(col->weight, ref->weight, 1e-6, 0)) << "drawn as torch's Conv2d";
  EXPECT_TRUE(torch::allclose(col->bias, ref->bias, 1e-6, 0));
  const at::Tensor x = seeded({2, 3, 8, 8}, 5);
  EXPECT_TRUE(torch::allclose(col(x), ref(x)));

  nn::ChannelParallelBatchNorm2d bn(4);
  torch::nn::BatchNorm2d bnRef(4);
  const at::Tensor h = seeded({2, 4, 5, 5}, 6);
  EXPECT_TRUE(torch::allclose(bn(h), bnRef(h)));
  EXPECT_TRUE(torch::allclose(bn->running_mean, bnRef->running_mean));
  EXPECT_TRUE(torch::allclose(bn->running_var, bnRef->running_var));
  bn->eval();
  bnRef->eval();
  EXPECT_TRUE(torch::allclose(bn(h), bnRef(h)));

  nn::ChannelParallelGroupNorm gn(2, 4);
  torch::nn::GroupNorm gnRef(2, 4);
  EXPECT_TRUE(torch::allclose(gn(h), gnRef(h)));
}

TEST(ParallelConvLayers, GroupNormRefusesGroupsThatStraddleRanks) {
  auto three = std::make_shared<TensorParallelState>();
  three->size = 3;  // the check comes before any communication
  nn::ChannelParallelGroupNorm gn(4, 12);
  gn->setTensorParallel(three);
  try {
    gn(torch::randn({1, 4, 2, 2}));
    FAIL() << "expected ConfigError";
  } catch (const ptrain::ConfigError& e) {
    EXPECT_STREQ(e.what(),
                 "parallel.tensor_model_parallel_size: 3 does not divide the 4 groups of a ChannelParallelGroupNorm "
                 "over 12 channels (a group would straddle two ranks); use a size that divides 4");
  }
}

// ---- a conv stack sharded from its plan, tp x dp ----

// image [N, 3, 8, 8] -> column conv -> batch norm -> relu -> row conv -> relu
// -> column conv (stride 2) -> group norm -> relu -> row conv -> [N, 2, 4, 4].
class ConvStackModel : public ptrain::StagedModel {
 public:
  struct Root : torch::nn::Module {
    Root() {
      nn::ParallelConv2dOptions c1(3, 8, 3), c2(8, 4, 3), c3(4, 8, 3), c4(8, 2, 1);
      c1.padding = c2.padding = c3.padding = {1, 1};
      c3.stride = {2, 2};
      conv1 = register_module("conv1", nn::ColumnParallelConv2d(c1));
      bn = register_module("bn", nn::ChannelParallelBatchNorm2d(8));
      conv2 = register_module("conv2", nn::RowParallelConv2d(c2));
      conv3 = register_module("conv3", nn::ColumnParallelConv2d(c3));
      gn = register_module("gn", nn::ChannelParallelGroupNorm(4, 8));
      conv4 = register_module("conv4", nn::RowParallelConv2d(c4));
    }
    at::Tensor forward(const at::Tensor& x) {
      at::Tensor h = torch::relu(conv2(torch::relu(bn(conv1(x)))));
      return conv4(torch::relu(gn(conv3(h))));
    }
    nn::ColumnParallelConv2d conv1{nullptr};
    nn::ChannelParallelBatchNorm2d bn{nullptr};
    nn::RowParallelConv2d conv2{nullptr};
    nn::ColumnParallelConv2d conv3{nullptr};
    nn::ChannelParallelGroupNorm gn{nullptr};
    nn::RowParallelConv2d conv4{nullptr};
  };
  ConvStackModel() { root_ = std::make_shared<Root>(); }
  torch::nn::Module& module() override { return *root_; }
  int numBlocks() const override { return 1; }
  std::string blockPrefix(int) const override { return ""; }
  std::vector<std::string> embedPrefixes() const override { return {}; }
  std::vector<std::string> headPrefixes() const override { return {}; }
  at::Tensor embed(const ptrain::Batch& b) override { return b.at("images"); }
  at::Tensor runBlock(int, const at::Tensor& x) override { return root_->forward(x); }
  ptrain::LossOutput head(const at::Tensor& y, const ptrain::Batch& b) override {
    ptrain::LossOutput out;
    out.loss_sum = (y - b.at("targets")).pow(2).sum();
    out.count = static_cast<double>(y.numel());
    return out;
  }
  // Declared as the linear layers are: each parallel layer with its prefix.
  ptrain::TensorParallelPlan tensorParallelPlan() override {
    return {{{"conv1.", root_->conv1.get()},
             {"bn.", root_->bn.get()},
             {"conv2.", root_->conv2.get()},
             {"conv3.", root_->conv3.get()},
             {"gn.", root_->gn.get()},
             {"conv4.", root_->conv4.get()}},
            {}};
  }
  void setTensorParallel(std::shared_ptr<const TensorParallelState>) override {}
  std::shared_ptr<Root> root_;
};

// The full tensor of a parameter: gathered along its tensor-parallel split,
// as a checkpoint saves it.
at::Tensor fullOf(ptrain::StagedModel& model, const std::string& name, const at::Tensor& local,
                  const TensorParallelState& tp) {
  const auto* spec = model.placement.of(name).shardAlong(ptrain::GroupKind::kTensor);
  return spec == nullptr ? local : nn::allGatherAlong(local, tp, spec->dim);
}

struct GridCase {
  int tp;
  int dp;
};

class ParallelConvStack : public ::testing::TestWithParam<GridCase> {};

TEST_P(ParallelConvStack, MatchesTheSingleRankModuleOver20SgdSteps) {
  const GridCase c = GetParam();
  onGrid(c.tp, c.dp, [c](GridRank& grid, int dpIndex) {
    auto tp = grid.tp();
    const int64_t batch = 4, perReplica = batch / c.dp;
    const double count = batch * 2 * 4 * 4;  // items of the global batch's loss
    auto images = [](int step) { return seeded({4, 3, 8, 8}, 100 + step); };
    auto targets = [](int step) { return seeded({4, 2, 4, 4}, 200 + step); };

    torch::manual_seed(11);
    ConvStackModel full;
    torch::manual_seed(11);
    ConvStackModel model;
    nn::applyTensorParallel(model, tp);

    // The expected splits: column weights along out, row weights along in,
    // norm parameters along the channels; row biases replicated.
    const std::map<std::string, int> expectedDims{{"conv1.weight", 0}, {"conv1.bias", 0}, {"bn.weight", 0},
                                                  {"bn.bias", 0},      {"conv2.weight", 1}, {"conv3.weight", 0},
                                                  {"conv3.bias", 0},   {"gn.weight", 0},    {"gn.bias", 0},
                                                  {"conv4.weight", 1}};
    for (const auto& p : model.module().named_parameters()) {
      const auto* spec = model.placement.of(p.key()).shardAlong(ptrain::GroupKind::kTensor);
      auto it = expectedDims.find(p.key());
      if (c.tp == 1 || it == expectedDims.end()) {
        EXPECT_EQ(spec, nullptr) << p.key();
      } else {
        ASSERT_NE(spec, nullptr) << p.key();
        EXPECT_EQ(spec->dim, it->second) << p.key();
        EXPECT_EQ(spec->index, tp->rank) << p.key();
      }
    }

    const double lr = 0.05;
    torch::optim::SGD refOpt(full.module().parameters(), torch::optim::SGDOptions(lr).momentum(0.9));
    torch::optim::SGD opt(model.module().parameters(), torch::optim::SGDOptions(lr).momentum(0.9));
    auto fullNamed = full.module().named_parameters();
    for (int step = 0; step < 20; ++step) {
      const double tol = step == 0 ? 1e-5 : 1e-4;
      const at::Tensor x = images(step), y = targets(step);
      // Reference: the single-rank module on each replica's rows (batch-norm
      // statistics per replica), gradients summed.
      refOpt.zero_grad();
      at::Tensor refOut;
      double refLoss = 0;
      for (int d = 0; d < c.dp; ++d) {
        at::Tensor out = full.root_->forward(x.narrow(0, d * perReplica, perReplica));
        at::Tensor loss = (out - y.narrow(0, d * perReplica, perReplica)).pow(2).sum() / count;
        loss.backward();
        refLoss += loss.item<double>();
        if (d == dpIndex) refOut = out.detach();
      }
      opt.zero_grad();
      at::Tensor out = model.root_->forward(x.narrow(0, dpIndex * perReplica, perReplica));
      at::Tensor loss = (out - y.narrow(0, dpIndex * perReplica, perReplica)).pow(2).sum() / count;
      loss.backward();
      at::Tensor lossSum = loss.detach().clone();
      if (grid.dp() != nullptr) {
        grid.dp()->allreduce(lossSum)->wait();
        for (auto& p : model.module().parameters()) grid.dp()->allreduce(p.mutable_grad())->wait();
      }
      EXPECT_NEAR(lossSum.item<double>(), refLoss, tol * std::max(1.0, std::fabs(refLoss))) << "step " << step;
      if (step == 0) {
        expectClose(out, refOut, "output at step 1", tol);
        for (const auto& p : model.module().named_parameters()) {
          expectClose(fullOf(model, p.key(), p.value().grad(), *tp), fullNamed[p.key()].grad(),
                      "full gradient of " + p.key() + " at step 1", tol);
        }
      }
      opt.step();
      refOpt.step();
    }
    for (const auto& p : model.module().named_parameters()) {
      expectClose(fullOf(model, p.key(), p.value(), *tp), fullNamed[p.key()], "full " + p.key() + " after 20 steps",
                  1e-4);
    }
    if (c.dp == 1) {
      // One replica: running statistics are the slices of the reference's,
      // and eval mode (which uses them) agrees.
      auto& bn = *model.root_->bn;
      expectClose(nn::allGatherAlong(bn.running_mean, *tp, 0), full.root_->bn->running_mean, "running mean", 1e-4);
      expectClose(nn::allGatherAlong(bn.running_var, *tp, 0), full.root_->bn->running_var, "running variance", 1e-4);
      model.module().eval();
      full.module().eval();
      torch::NoGradGuard g;
      expectClose(model.root_->forward(images(99)), full.root_->forward(images(99)), "eval output", 1e-4);
    }

    // A checkpoint's round trip to another tp: the full tensors (gathered as
    // above) sliced by a fresh sharded model's placement give its shards.
    torch::manual_seed(12);  // other initial values, overwritten by the load
    ConvStackModel loaded;
    nn::applyTensorParallel(loaded, tp);
    auto mine = model.module().named_parameters();
    torch::NoGradGuard g;
    for (auto& p : loaded.module().named_parameters()) {
      const at::Tensor fullTensor = fullOf(model, p.key(), mine[p.key()], *tp);
      p.value().copy_(loaded.placement.of(p.key()).sliceOfFull(fullTensor, p.key()));
      EXPECT_TRUE(torch::equal(p.value(), mine[p.key()])) << p.key();
    }
  });
}

INSTANTIATE_TEST_SUITE_P(ParallelConv, ParallelConvStack,
                         ::testing::Values(GridCase{1, 1}, GridCase{2, 1}, GridCase{1, 2}, GridCase{2, 2}),
                         [](const ::testing::TestParamInfo<GridCase>& info) {
                           return "tp" + std::to_string(info.param.tp) + "_dp" + std::to_string(info.param.dp);
                         });

}  // namespace
