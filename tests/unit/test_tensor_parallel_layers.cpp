// Tensor-parallel building blocks on real ranks (forked processes, Gloo over
// 127.0.0.1), each against the unsharded torch computation:
//   - every communication function of nn/tp_comm.h, forward and backward,
//     against cat / sum / slice of every rank's tensors built here;
//   - ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding (lookup
//     and tied projection), with and without sequence parallelism, against
//     torch's linear / embedding on the full weights: outputs, input gradients
//     and each rank's weight gradient = its slice of the full gradient;
//   - vocab-parallel cross entropy and argmax with a padded vocabulary;
//   - applyTensorParallel on a small StagedModel (specs, partial gradients,
//     errors) and shardedDropout against torch::dropout.
// Layer tests run in float64 so that "exact" means agreement to ~1e-12.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <functional>
#include <limits>
#include <memory>

#include "ptrain/comm/backend.h"
#include "ptrain/comm/process_group.h"
#include "ptrain/comm/store.h"
#include "ptrain/core/logging.h"
#include "ptrain/engine/model.h"
#include "ptrain/engine/recipe_layout.h"
#include "ptrain/engine/tensor_parallel.h"
#include "ptrain/nn/cross_entropy.h"
#include "ptrain/nn/parallel_layers.h"
#include "ptrain/nn/tp_comm.h"
#include "ptrain/plugin/registry.h"
#include "ptrain/recipe/key_specs.h"
#include "ptrain/recipe/recipe.h"
#include "ptrain/recipe/schema.h"
#include "support/test_support.h"
#include "../../trainers/llm/gpt_model.h"
#include "../../trainers/llm/llm_trainer.h"
#include "ptrain/datasets/arithmetic.h"

namespace nn = ptrain::nn;
using nn::TensorParallelState;

namespace {

// One forked rank's Gloo group over all ranks of the test.
class GlooRank {
 public:
  GlooRank(int rank, int size, int port) {
    // Ranks share two cores: one intra-op thread each.
    at::set_num_threads(1);
    registry_ = std::make_unique<ptrain::PluginRegistry>(
        std::vector<std::string>{ptrain::test::binaryDir() + "/lib/ptrain/plugins/comm/libptrain_comm_gloo.so"});
    ptrain::PluginContext ctx;
    ctx.logger = ptrain::logger();
    ctx.rank = rank;
    ctx.world_size = size;
    plugin_ = registry_->create(ptrain::plugin_kind::kComm, "gloo", ctx);
    ptrain::TcpStoreOptions so;
    so.port = port;
    so.is_server = rank == 0;
    so.world_size = size;
    so.timeout = std::chrono::seconds(30);
    store_ = ptrain::createTcpStore(so);
    ptrain::GroupOptions go;
    go.name = "tp";
    for (int r = 0; r < size; ++r) go.ranks.push_back(r);
    go.global_rank = rank;
    go.timeout = std::chrono::seconds(30);
    group_ = static_cast<ptrain::CommBackend*>(plugin_.get())->createGroup(store_, go);
  }
  ~GlooRank() {
    group_->barrier()->wait();
    group_.reset();
  }
  std::shared_ptr<ptrain::ProcessGroup> group() const { return group_; }

 private:
  std::unique_ptr<ptrain::PluginRegistry> registry_;
  std::unique_ptr<ptrain::Plugin> plugin_;
  std::shared_ptr<ptrain::Store> store_;
  std::shared_ptr<ptrain::ProcessGroup> group_;
};

// Runs body(state) on `size` forked ranks; fails the test if any rank fails.
void onRanks(int size, bool sequenceParallel, const std::function<void(std::shared_ptr<TensorParallelState>)>& body) {
  std::string failures = ptrain::test::runRanks(
      size,
      [&](int rank, int n, int port) {
        GlooRank gloo(rank, n, port);
        body(TensorParallelState::create(gloo.group(), sequenceParallel));
      },
      90);
  EXPECT_EQ(failures, "") << "tp=" << size << " sequence_parallel=" << sequenceParallel;
}

// A tensor that every rank can rebuild: the one of rank `who` in a test.
at::Tensor tensorOf(int who, std::vector<int64_t> shape, int salt = 0) {
  torch::manual_seed(static_cast<uint64_t>(1000 * salt + who + 1));
  return torch::randn(shape, torch::kFloat64);
}

void expectClose(const at::Tensor& actual, const at::Tensor& expected, const std::string& what, double tol = 1e-12) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  const double err = (actual.to(torch::kFloat64) - expected.to(torch::kFloat64)).abs().max().item<double>();
  const double scale = std::max(1.0, expected.abs().max().item<double>());
  EXPECT_LE(err, tol * scale) << what << ": max abs error " << err;
}

at::Tensor sliceOf(const at::Tensor& full, int64_t dim, int rank, int size) {
  const int64_t k = full.size(dim) / size;
  return full.narrow(dim, rank * k, k);
}

// The sum of every rank's tensor, in rank order.
at::Tensor sumOver(int size, const std::function<at::Tensor(int)>& of) {
  at::Tensor s = of(0).clone();
  for (int q = 1; q < size; ++q) s += of(q);
  return s;
}

at::Tensor catOver(int size, int64_t dim, const std::function<at::Tensor(int)>& of) {
  std::vector<at::Tensor> parts;
  for (int q = 0; q < size; ++q) parts.push_back(of(q));
  return torch::cat(parts, dim);
}

class TpSizes : public ::testing::TestWithParam<int> {};

// ---- communication functions ----

TEST_P(TpSizes, CopyAndReduceRegions) {
  const int n = GetParam();
  onRanks(n, false, [n](std::shared_ptr<TensorParallelState> tp) {
    const int r = tp->rank;
    auto x = [](int q) { return tensorOf(q, {3, 5}, 1); };
    auto w = [](int q) { return tensorOf(q, {3, 5}, 2); };  // upstream gradient of rank q

    at::Tensor in = x(r).requires_grad_();
    at::Tensor out = nn::copyToTpRegion(in, *tp);
    expectClose(out, x(r), "copy forward");
    out.backward(w(r));
    expectClose(in.grad(), sumOver(n, w), "copy backward = all-reduce");

    at::Tensor in2 = x(r).requires_grad_();
    at::Tensor out2 = nn::reduceFromTpRegion(in2, *tp);
    expectClose(out2, sumOver(n, x), "reduce forward = all-reduce");
    out2.backward(w(r));
    expectClose(in2.grad(), w(r), "reduce backward = identity");
    EXPECT_EQ(tp->comm_bytes.load(), 2 * 3 * 5 * 8);
  });
}

TEST_P(TpSizes, GatherAndScatterLastDim) {
  const int n = GetParam();
  onRanks(n, false, [n](std::shared_ptr<TensorParallelState> tp) {
    const int r = tp->rank;
    auto x = [](int q) { return tensorOf(q, {2, 3, 4}, 3); };
    auto w = [n](int q) { return tensorOf(q, {2, 3, 4 * n}, 4); };

    at::Tensor in = x(r).requires_grad_();
    at::Tensor out = nn::gatherFromTpRegion(in, *tp);
    expectClose(out, catOver(n, 2, x), "gather forward");
    out.backward(w(r));
    expectClose(in.grad(), sliceOf(w(r), 2, r, n), "gather backward = own slice");

    at::Tensor full = tensorOf(0, {2, 3, 4 * n}, 5).requires_grad_();
    at::Tensor mine = nn::scatterToTpRegion(full, *tp);
    expectClose(mine, sliceOf(full.detach(), 2, r, n), "scatter forward");
    auto g = [](int q) { return tensorOf(q, {2, 3, 4}, 6); };
    mine.backward(g(r));
    expectClose(full.grad(), catOver(n, 2, g), "scatter backward = all-gather");
  });
}

TEST_P(TpSizes, SequenceParallelRegions) {
  const int n = GetParam();
  onRanks(n, true, [n](std::shared_ptr<TensorParallelState> tp) {
    const int r = tp->rank;
    const int64_t s = 2;  // sequence positions per rank; layout [batch 3, sequence, hidden 4]
    auto shard = [s](int q) { return tensorOf(q, {3, s, 4}, 7); };
    auto fullGrad = [n, s](int q) { return tensorOf(q, {3, s * n, 4}, 8); };

    for (bool partial : {true, false}) {
      at::Tensor in = shard(r).requires_grad_();
      at::Tensor out = nn::gatherFromSequenceParallelRegion(in, *tp, 1, partial);
      expectClose(out, catOver(n, 1, shard), "sp gather forward");
      out.backward(fullGrad(r));
      at::Tensor expected = partial ? sliceOf(sumOver(n, fullGrad), 1, r, n) : sliceOf(fullGrad(r), 1, r, n);
      expectClose(in.grad(), expected, partial ? "sp gather backward = reduce-scatter" : "sp gather backward = split");
    }

    auto full = [n, s](int q) { return tensorOf(q, {3, s * n, 4}, 9); };
    at::Tensor in = full(r).requires_grad_();
    at::Tensor out = nn::reduceScatterToSequenceParallelRegion(in, *tp, 1);
    expectClose(out, sliceOf(sumOver(n, full), 1, r, n), "sp reduce-scatter forward", 1e-12);
    out.backward(shard(r));
    expectClose(in.grad(), catOver(n, 1, shard), "sp reduce-scatter backward = all-gather");

    at::Tensor same = full(0).requires_grad_();
    at::Tensor mine = nn::scatterToSequenceParallelRegion(same, *tp, 1);
    expectClose(mine, sliceOf(full(0), 1, r, n), "sp scatter forward");
    mine.backward(shard(r));
    expectClose(same.grad(), catOver(n, 1, shard), "sp scatter backward = all-gather");

    // The sequence dimension may be any dimension, e.g. the first ([s, b, h]).
    at::Tensor front = tensorOf(r, {s, 3, 4}, 10).requires_grad_();
    at::Tensor gathered = nn::gatherFromSequenceParallelRegion(front, *tp, 0);
    expectClose(gathered, catOver(n, 0, [s](int q) { return tensorOf(q, {s, 3, 4}, 10); }), "sp gather dim 0");
  });
}

TEST(TensorParallelComm, SizeOneIsIdentityWithoutCommunication) {
  auto tp = std::make_shared<TensorParallelState>();  // no group, size 1
  at::Tensor x = torch::randn({2, 4}, torch::kFloat64).requires_grad_();
  EXPECT_TRUE(nn::copyToTpRegion(x, *tp).is_same(x));
  EXPECT_TRUE(nn::reduceFromTpRegion(x, *tp).is_same(x));
  EXPECT_TRUE(nn::gatherFromTpRegion(x, *tp).is_same(x));
  EXPECT_TRUE(nn::scatterToTpRegion(x, *tp).is_same(x));
  EXPECT_TRUE(nn::gatherFromSequenceParallelRegion(x, *tp, 0).is_same(x));
  EXPECT_TRUE(nn::reduceScatterToSequenceParallelRegion(x, *tp, 0).is_same(x));
  EXPECT_TRUE(nn::scatterToSequenceParallelRegion(x, *tp, 0).is_same(x));
  EXPECT_EQ(tp->comm_bytes.load(), 0);
}

// ---- layers ----

// Keeps this rank's slice of every parameter the layer splits and hands it
// the state, as applyTensorParallel does for a model's plan.
template <typename Impl>
void shardLayer(Impl& layer, const std::shared_ptr<TensorParallelState>& tp) {
  torch::NoGradGuard noGrad;
  for (const auto& [name, dim] : layer.splitParameters()) {
    at::Tensor p = layer.named_parameters()[name];
    p.set_data(sliceOf(p, dim, tp->rank, tp->size).clone());
  }
  layer.setTensorParallel(tp);
}

TEST_P(TpSizes, ColumnParallelLinearMatchesLinear) {
  const int n = GetParam();
  for (bool sp : {false, true}) {
    for (bool gather : {false, true}) {
      onRanks(n, sp, [n, sp, gather](std::shared_ptr<TensorParallelState> tp) {
        const int r = tp->rank;
        torch::manual_seed(11);
        nn::ColumnParallelLinear layer(6, 4 * n);
        layer->to(torch::kFloat64);
        const at::Tensor w = layer->weight.detach().clone(), b = layer->bias.detach().clone();
        shardLayer(*layer, tp);
        layer->gather_output = gather;

        const at::Tensor x = tensorOf(0, {3, 2 * n, 6}, 12);  // [batch, sequence, in]
        const at::Tensor up = tensorOf(0, {3, 2 * n, 4 * n}, 13);
        // Reference: torch's linear on the full weight, full input.
        at::Tensor xr = x.clone().requires_grad_(), wr = w.clone().requires_grad_(), br = b.clone().requires_grad_();
        at::Tensor yr = torch::nn::functional::linear(xr, wr, br);
        yr.backward(up);

        at::Tensor xin = (sp ? sliceOf(x, 1, r, n) : x).clone().requires_grad_();
        at::Tensor y = layer(xin);
        expectClose(y, gather ? yr.detach() : sliceOf(yr.detach(), 2, r, n), "column forward");
        // Each rank receives the upstream gradient of its own outputs (or of
        // all of them, identically, when gathered).
        y.backward(gather ? up : sliceOf(up, 2, r, n));
        expectClose(xin.grad(), sp ? sliceOf(xr.grad(), 1, r, n) : xr.grad(), "column input grad");
        expectClose(layer->weight.grad(), sliceOf(wr.grad(), 0, r, n), "column weight grad slice");
        expectClose(layer->bias.grad(), sliceOf(br.grad(), 0, r, n), "column bias grad slice");
      });
    }
  }
}

TEST_P(TpSizes, RowParallelLinearMatchesLinear) {
  const int n = GetParam();
  for (bool sp : {false, true}) {
    for (bool inputIsParallel : {true, false}) {
      onRanks(n, sp, [n, sp, inputIsParallel](std::shared_ptr<TensorParallelState> tp) {
        const int r = tp->rank;
        torch::manual_seed(21);
        nn::RowParallelLinear layer(4 * n, 6);
        layer->to(torch::kFloat64);
        {
          torch::NoGradGuard g;
          layer->bias.normal_();  // a non-zero bias shows it is added once
        }
        const at::Tensor w = layer->weight.detach().clone(), b = layer->bias.detach().clone();
        shardLayer(*layer, tp);
        layer->input_is_parallel = inputIsParallel;

        const at::Tensor x = tensorOf(0, {3, 2 * n, 4 * n}, 22);
        const at::Tensor up = tensorOf(0, {3, 2 * n, 6}, 23);
        at::Tensor xr = x.clone().requires_grad_(), wr = w.clone().requires_grad_(), br = b.clone().requires_grad_();
        at::Tensor yr = torch::nn::functional::linear(xr, wr, br);
        yr.backward(up);

        at::Tensor xin = (inputIsParallel ? sliceOf(x, 2, r, n) : x).clone().requires_grad_();
        at::Tensor y = layer(xin);
        expectClose(y, sp ? sliceOf(yr.detach(), 1, r, n) : yr.detach(), "row forward");
        y.backward(sp ? sliceOf(up, 1, r, n) : up);
        // With a full input every rank sees only its features' gradient
        // (split backward = all-gather): the whole input gradient.
        expectClose(xin.grad(), inputIsParallel ? sliceOf(xr.grad(), 2, r, n) : xr.grad(), "row input grad");
        expectClose(layer->weight.grad(), sliceOf(wr.grad(), 1, r, n), "row weight grad slice");
        // Under sequence parallelism the bias gradient is a partial sum: the
        // shards' parts add up to the full gradient.
        at::Tensor bg = sp ? nn::allReduceSum(layer->bias.grad(), *tp) : layer->bias.grad();
        expectClose(bg, br.grad(), "row bias grad");
        EXPECT_EQ(layer->sequenceParallelPartialParameters(), std::vector<std::string>{"bias"});
      });
    }
  }
}

TEST_P(TpSizes, VocabParallelEmbeddingMatchesEmbedding) {
  const int n = GetParam();
  for (bool sp : {false, true}) {
    onRanks(n, sp, [n, sp](std::shared_ptr<TensorParallelState> tp) {
      const int r = tp->rank;
      const int64_t vocab = 4 * n, hidden = 5;
      torch::manual_seed(31);
      nn::VocabParallelEmbedding layer(vocab, hidden);
      layer->to(torch::kFloat64);
      const at::Tensor w = layer->weight.detach().clone();
      shardLayer(*layer, tp);

      // Every id of the vocabulary, some twice, so each rank's rows are hit.
      at::Tensor ids = torch::arange(vocab, torch::kInt64).flip(0).repeat({2}).view({2, vocab});
      const at::Tensor up = tensorOf(0, {2, vocab, hidden}, 32);
      at::Tensor wr = w.clone().requires_grad_();
      at::Tensor er = torch::embedding(wr, ids);
      er.backward(up);
      at::Tensor e = layer(ids);
      expectClose(e, er.detach(), "embedding forward");
      e.backward(up);
      expectClose(layer->weight.grad(), sliceOf(wr.grad(), 0, r, n), "embedding grad slice");

      // The tied projection: logits of this rank's rows.
      layer->weight.mutable_grad() = at::Tensor();
      const at::Tensor h = tensorOf(0, {2, 2 * n, hidden}, 33);
      const at::Tensor upl = tensorOf(0, {2, 2 * n, vocab}, 34);
      at::Tensor hr = h.clone().requires_grad_(), wr2 = w.clone().requires_grad_();
      at::Tensor lr = torch::nn::functional::linear(hr, wr2);
      lr.backward(upl);
      at::Tensor hin = (sp ? sliceOf(h, 1, r, n) : h).clone().requires_grad_();
      at::Tensor logits = layer->projectToVocab(hin);
      expectClose(logits, sliceOf(lr.detach(), 2, r, n), "projection forward");
      logits.backward(sliceOf(upl, 2, r, n));
      expectClose(hin.grad(), sp ? sliceOf(hr.grad(), 1, r, n) : hr.grad(), "projection input grad");
      expectClose(layer->weight.grad(), sliceOf(wr2.grad(), 0, r, n), "projection weight grad slice");
    });
  }
}

TEST(ParallelLayers, OneRankIsTorchLinearAndEmbedding) {
  torch::manual_seed(41);
  nn::ColumnParallelLinear col(5, 7);
  nn::RowParallelLinear row(7, 3);
  nn::VocabParallelEmbedding emb(9, 5);
  // A size-1 state behaves as no state.
  auto one = std::make_shared<TensorParallelState>();
  row->setTensorParallel(one);
  at::Tensor x = torch::randn({2, 5});
  at::Tensor h = col(x);
  EXPECT_TRUE(torch::equal(h, torch::addmm(col->bias, x, col->weight.t())));
  EXPECT_TRUE(torch::equal(row(h), torch::nn::functional::linear(h, row->weight, row->bias)));
  at::Tensor ids = torch::tensor({0, 8, 3}, torch::kInt64);
  EXPECT_TRUE(torch::equal(emb(ids), emb->weight.index_select(0, ids)));
  EXPECT_TRUE(torch::equal(emb->projectToVocab(x), torch::matmul(x, emb->weight.t())));
  EXPECT_EQ(col->splitParameters(), (std::vector<std::pair<std::string, int>>{{"weight", 0}, {"bias", 0}}));
  EXPECT_EQ(row->splitParameters(), (std::vector<std::pair<std::string, int>>{{"weight", 1}}));
  EXPECT_EQ(emb->splitParameters(), (std::vector<std::pair<std::string, int>>{{"weight", 0}}));
}

// ---- vocab-parallel cross entropy ----

// Cross entropy written out: log(sum exp) - target logit over the first
// `valid` entries.
at::Tensor referenceCrossEntropy(const at::Tensor& logits, const at::Tensor& targets, int64_t valid) {
  at::Tensor x = logits.narrow(-1, 0, valid);
  return torch::logsumexp(x, -1) - x.gather(-1, targets.unsqueeze(-1)).squeeze(-1);
}

TEST_P(TpSizes, VocabParallelCrossEntropyWithPadding) {
  const int n = GetParam();
  // 16 * n entries of which only `valid` are real: with n = 4 whole ranks
  // hold nothing but padding.
  for (int64_t valid : {int64_t{16} * n, int64_t{5}, int64_t{16} * n - 3}) {
    onRanks(n, false, [n, valid](std::shared_ptr<TensorParallelState> tp) {
      const int r = tp->rank;
      const int64_t vocab = 16 * n;
      at::Tensor logits = tensorOf(0, {3, 4, vocab}, 51) * 3;
      torch::manual_seed(52);
      at::Tensor targets = torch::randint(valid, {3, 4}, torch::kInt64);
      targets[0][0] = valid - 1;  // the last real entry
      targets[0][1] = 0;
      const at::Tensor up = tensorOf(0, {3, 4}, 53);

      at::Tensor lr = logits.clone().requires_grad_();
      at::Tensor ref = referenceCrossEntropy(lr, targets, valid);
      ref.backward(up);

      at::Tensor mine = sliceOf(logits, 2, r, n).clone().requires_grad_();
      at::Tensor loss = nn::vocabParallelCrossEntropy(mine, targets, valid, tp.get());
      EXPECT_EQ(loss.scalar_type(), torch::kFloat32);
      expectClose(loss, ref.detach(), "vocab-parallel CE forward", 1e-6);
      loss.backward(up.to(torch::kFloat32));
      ASSERT_EQ(mine.grad().scalar_type(), torch::kFloat64);
      expectClose(mine.grad(), sliceOf(lr.grad(), 2, r, n), "vocab-parallel CE grad slice", 1e-6);
      // Padding gets exactly zero gradient.
      const int64_t k = vocab / n;
      for (int64_t j = 0; j < k; ++j) {
        if (r * k + j >= valid) {
          EXPECT_EQ(mine.grad().select(2, j).abs().max().item<double>(), 0.0);
        }
      }

      // Greedy choice over the whole vocabulary, padding never.
      at::Tensor pick = nn::vocabParallelArgmax(mine.detach(), valid, tp.get());
      EXPECT_TRUE(torch::equal(pick, logits.narrow(-1, 0, valid).argmax(-1))) << "argmax valid=" << valid;
    });
  }
}

TEST_P(TpSizes, VocabParallelArgmaxTiesPickTheFirstId) {
  const int n = GetParam();
  onRanks(n, false, [n](std::shared_ptr<TensorParallelState> tp) {
    const int64_t k = 3, vocab = k * n;
    // Row 0: the max (5) at ids 1 and vocab-2 (the last rank's) -> 1. Row 1:
    // max at the last two ranks' first ids -> (n-2)*k. Row 2: the padding
    // entry (vocab-1) holds the largest value.
    at::Tensor full = torch::zeros({3, vocab});
    full[0][1] = 5;
    full[0][vocab - 2] = 5;
    full[1][(n - 2) * k] = 7;
    full[1][(n - 1) * k] = 7;
    full[2][vocab - 1] = 9;
    full[2][2] = 1;
    at::Tensor pick = nn::vocabParallelArgmax(sliceOf(full, 1, tp->rank, n), vocab - 1, tp.get());
    EXPECT_EQ(pick[0].item<int64_t>(), 1);
    EXPECT_EQ(pick[1].item<int64_t>(), (n - 2) * k);
    EXPECT_EQ(pick[2].item<int64_t>(), 2);
  });
}

TEST(VocabParallelCrossEntropy, OneRankIsTorchCrossEntropyOverRealEntries) {
  torch::manual_seed(61);
  at::Tensor logits = torch::randn({6, 12}, torch::kFloat32).requires_grad_();
  at::Tensor targets = torch::randint(10, {6}, torch::kInt64);
  at::Tensor loss = nn::vocabParallelCrossEntropy(logits, targets, 10, nullptr);
  at::Tensor ref = torch::nn::functional::cross_entropy(
      logits.narrow(1, 0, 10), targets, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
  EXPECT_TRUE(torch::equal(loss, ref));
  loss.sum().backward();
  EXPECT_EQ(logits.grad().narrow(1, 10, 2).abs().max().item<float>(), 0.0f);
  EXPECT_TRUE(torch::equal(nn::vocabParallelArgmax(logits, 10, nullptr), logits.narrow(1, 0, 10).argmax(1)));
}

// ---- applyTensorParallel on a StagedModel ----

// The tensor-parallel split of every parameter the placement records one for.
std::map<std::string, ptrain::ShardSpec> tensorShards(ptrain::StagedModel& model) {
  std::map<std::string, ptrain::ShardSpec> out;
  for (const auto& item : model.module().named_parameters()) {
    if (const auto* spec = model.placement.of(item.key()).shardAlong(ptrain::GroupKind::kTensor)) {
      out.emplace(item.key(), *spec);
    }
  }
  return out;
}

// embed (vocab-parallel) -> LayerNorm -> column -> gelu -> row -> tied head.
class ToyModel : public ptrain::StagedModel {
 public:
  struct Root : torch::nn::Module {
    Root() {
      emb = register_module("emb", nn::VocabParallelEmbedding(8, 6));
      ln = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({6})));
      up = register_module("up", nn::ColumnParallelLinear(6, 8));
      down = register_module("down", nn::RowParallelLinear(8, 6));
    }
    nn::VocabParallelEmbedding emb{nullptr};
    torch::nn::LayerNorm ln{nullptr};
    nn::ColumnParallelLinear up{nullptr};
    nn::RowParallelLinear down{nullptr};
  };
  explicit ToyModel(bool supportsTp) : supportsTp_(supportsTp) { root_ = std::make_shared<Root>(); }
  torch::nn::Module& module() override { return *root_; }
  int numBlocks() const override { return 1; }
  std::string blockPrefix(int) const override { return ""; }
  std::vector<std::string> embedPrefixes() const override { return {"emb."}; }
  std::vector<std::string> headPrefixes() const override { return {}; }
  at::Tensor embed(const ptrain::Batch& b) override { return root_->emb(b.at("tokens")); }
  at::Tensor runBlock(int, const at::Tensor& h) override {
    return h + root_->down(torch::gelu(root_->up(root_->ln(h))));
  }
  ptrain::LossOutput head(const at::Tensor& h, const ptrain::Batch& b) override {
    at::Tensor logits = root_->emb->projectToVocab(h);
    ptrain::LossOutput out;
    out.loss_sum = nn::vocabParallelCrossEntropy(logits, b.at("targets"), 7, state_.get()).sum();
    out.count = static_cast<double>(b.at("targets").numel());
    return out;
  }
  ptrain::TensorParallelPlan tensorParallelPlan() override {
    if (!supportsTp_) return StagedModel::tensorParallelPlan();
    return {{{"emb.", root_->emb.get()}, {"up.", root_->up.get()}, {"down.", root_->down.get()}},
            {"ln.weight", "ln.bias"}};
  }
  void setTensorParallel(std::shared_ptr<const TensorParallelState> state) override {
    if (!supportsTp_) StagedModel::setTensorParallel(state);
    state_ = std::move(state);
  }
  std::shared_ptr<Root> root_;
  std::shared_ptr<const TensorParallelState> state_;
  bool supportsTp_;
};

TEST_P(TpSizes, ApplyTensorParallelShardsInPlaceAndMatchesOneRank) {
  const int n = GetParam();
  onRanks(n, false, [n](std::shared_ptr<TensorParallelState> tp) {
    const int r = tp->rank;
    ptrain::Batch batch;
    batch.tensors.emplace("tokens", torch::tensor({{0, 3, 6, 1}, {2, 5, 4, 6}}, torch::kInt64));
    batch.tensors.emplace("targets", torch::tensor({{3, 6, 1, 0}, {5, 4, 6, 2}}, torch::kInt64));

    torch::manual_seed(71);
    ToyModel full(true);
    ptrain::LossOutput ref = full.forward(batch);
    ref.loss_sum.backward();

    torch::manual_seed(71);
    ToyModel model(true);
    const at::Tensor* upWeight = &model.root_->up->weight;
    const auto impl = upWeight->unsafeGetTensorImpl();
    std::vector<std::string> partial = nn::applyTensorParallel(model, tp);
    EXPECT_TRUE(partial.empty());  // no sequence parallelism
    EXPECT_EQ(model.root_->up->weight.unsafeGetTensorImpl(), impl) << "the parameter object is kept";
    const auto shards = tensorShards(model);
    ASSERT_EQ(shards.size(), 4u);
    const auto& spec = shards.at("down.weight");
    EXPECT_EQ(spec.dim, 1);
    EXPECT_EQ(spec.num_shards, n);
    EXPECT_EQ(spec.index, r);
    EXPECT_EQ(spec.full_size, 8);
    EXPECT_EQ(shards.count("down.bias"), 0u);
    EXPECT_EQ(shards.at("up.bias").dim, 0);
    EXPECT_EQ(shards.at("emb.weight").full_size, 8);
    EXPECT_EQ(model.state_, tp);

    ptrain::LossOutput out = model.forward(batch);
    EXPECT_NEAR(out.loss_sum.item<double>(), ref.loss_sum.item<double>(), 1e-5 * ref.loss_sum.item<double>());
    out.loss_sum.backward();
    auto fullParams = full.module().named_parameters();
    for (const auto& p : model.module().named_parameters()) {
      auto it = shards.find(p.key());
      at::Tensor expected = fullParams[p.key()].grad();
      if (it != shards.end()) expected = sliceOf(expected, it->second.dim, r, n);
      expectClose(p.value().grad(), expected, "grad of " + p.key(), 1e-5);
    }
  });
}

TEST_P(TpSizes, ApplyTensorParallelListsPartialGradientsUnderSequenceParallelism) {
  const int n = GetParam();
  onRanks(n, true, [](std::shared_ptr<TensorParallelState> tp) {
    torch::manual_seed(72);
    ToyModel model(true);
    std::vector<std::string> partial = nn::applyTensorParallel(model, tp);
    EXPECT_EQ(partial, (std::vector<std::string>{"down.bias", "ln.weight", "ln.bias"}));
  });
}

TEST(ApplyTensorParallel, RefusesModelsWithoutSupportAndIndivisibleSizes) {
  auto unconnected = std::make_shared<TensorParallelState>();
  unconnected->size = 3;  // no communication happens before the checks
  ToyModel plain(false);
  try {
    nn::applyTensorParallel(plain, unconnected);
    FAIL() << "expected ConfigError";
  } catch (const ptrain::ConfigError& e) {
    EXPECT_STREQ(e.what(),
                 "parallel.tensor_model_parallel_size: this model does not support tensor parallelism; set it to 1");
  }
  ToyModel toy(true);
  try {
    nn::applyTensorParallel(toy, unconnected);
    FAIL() << "expected ConfigError";
  } catch (const ptrain::ConfigError& e) {
    EXPECT_STREQ(e.what(),
                 "parallel.tensor_model_parallel_size: 3 does not divide emb.weight (vocab-parallel, size 8 along "
                 "dim 0); use a size that divides 8");
  }
}

// ---- dropout of shards ----

TEST(ShardedDropout, ShardsTogetherDropWhatOneRankDrops) {
  at::Tensor x = torch::randn({2, 8, 5});
  torch::manual_seed(81);
  at::Tensor ref = torch::dropout(x, 0.3, true);
  std::vector<at::Tensor> parts;
  for (int i = 0; i < 4; ++i) {
    torch::manual_seed(81);  // every rank's generator in the same state
    parts.push_back(nn::shardedDropout(x.narrow(1, 2 * i, 2), 0.3, true, 1, 4, i));
  }
  EXPECT_TRUE(torch::equal(torch::cat(parts, 1), ref));
  EXPECT_TRUE(torch::equal(nn::shardedDropout(x, 0.3, false, 1, 4, 0), x));
  // Some entries were dropped and the rest scaled, so this is not a no-op.
  EXPECT_GT((ref == 0).sum().item<int64_t>(), 0);
}

// ---- the GPT of the llm trainer ----

struct GptCase {
  int tp;
  bool sp;
  bool tied;
};

class GptTensorParallel : public ::testing::TestWithParam<GptCase> {};

// The trainer's GPT, built twice from one seed: once whole, once sharded with
// applyTensorParallel (as the tensor plugin does), on the same batch with
// dropout on and the generator in the same state. The sharded model's loss is
// the whole model's, and every parameter's gradient (partial ones all-reduced
// as the plugin's finishGradients does) is its slice of the whole model's.
// Greedy decoding picks the same tokens.
TEST_P(GptTensorParallel, GradientsAreSlicesOfTheSingleRankGradients) {
  const GptCase c = GetParam();
  onRanks(c.tp, c.sp, [c](std::shared_ptr<TensorParallelState> tp) {
    ptrain::llm::LlmTrainer trainer(ptrain::PluginContext{});
    ptrain::Schema schema;
    ptrain::describeCoreKeys(schema);
    trainer.describeKeys(schema);
    ptrain::Recipe recipe = ptrain::Recipe::fromString(
        "trainer: {name: llm}\n"
        "model: {num_layers: 2, hidden_size: 32, num_attention_heads: 4, seq_length: 8, dropout: 0.1}\n"
        "data: {digits: 1, eval_size: 6}\n"
        "train: {steps: 1, global_batch_size: 4}\n",
        "<test>",
        {"parallel.tensor_model_parallel_size=" + std::to_string(c.tp),
         std::string("parallel.sequence_parallel=") + (c.sp ? "true" : "false"),
         std::string("model.tie_embeddings=") + (c.tied ? "true" : "false")});
    recipe.validate(schema);
    trainer.setup(recipe);
    const ptrain::Batch batch = trainer.globalBatch(0, 4);

    auto run = [&](ptrain::StagedModel& m) {
      m.module().train();
      torch::manual_seed(99);  // the dropout masks
      ptrain::LossOutput out = m.forward(batch);
      (out.loss_sum / out.count).backward();
      return out.loss_sum.item<double>();
    };
    torch::manual_seed(5);
    auto full = trainer.buildModel();
    const double fullLoss = run(*full);

    torch::manual_seed(5);
    auto model = trainer.buildModel();
    std::vector<std::string> partial = nn::applyTensorParallel(*model, tp);
    EXPECT_EQ(partial.size(), c.sp ? 2u * 4 + 2 + 2 * 2 : 0u);  // 2 LNs + 2 row biases per layer, ln_f
    const double loss = run(*model);
    EXPECT_NEAR(loss, fullLoss, 1e-5 * std::fabs(fullLoss));

    auto named = model->module().named_parameters();
    for (const auto& name : partial) named[name].mutable_grad() = nn::allReduceSum(named[name].grad(), *tp);
    auto fullParams = full->module().named_parameters();
    ASSERT_EQ(named.size(), fullParams.size());
    size_t split = 0;
    const auto shards = tensorShards(*model);
    for (const auto& p : named) {
      at::Tensor expected = fullParams[p.key()].grad();
      auto it = shards.find(p.key());
      if (it != shards.end()) {
        expected = sliceOf(expected, it->second.dim, tp->rank, tp->size);
        ++split;
      }
      ASSERT_TRUE(p.value().grad().defined()) << p.key();
      expectClose(p.value().grad(), expected, "grad of " + p.key(), 2e-5);
    }
    // embed.tokens + qkv, proj, fc1 (weight, bias), fc2 (weight) per layer (+ head.lm).
    EXPECT_EQ(split, 1u + 2 * 6 + (c.tied ? 0 : 1));

    // Greedy decoding of held-out prompts: the same tokens.
    std::vector<std::vector<int64_t>> prompts;
    for (const auto& problem : trainer.dataset().evalProblems()) {
      prompts.push_back(ptrain::datasets::ArithmeticTokenizer::encode(problem.prompt()));
    }
    auto& gptFull = static_cast<ptrain::llm::GptModel&>(*full);
    auto& gpt = static_cast<ptrain::llm::GptModel&>(*model);
    gptFull.module().eval();
    gpt.module().eval();
    const int64_t eos = ptrain::datasets::ArithmeticTokenizer::kEos;
    EXPECT_EQ(gpt.greedyDecode(prompts, 4, eos), gptFull.greedyDecode(prompts, 4, eos));
  });
}

INSTANTIATE_TEST_SUITE_P(Gpt, GptTensorParallel,
                         ::testing::Values(GptCase{2, false, true}, GptCase{2, true, false}, GptCase{4, false, false},
                                           GptCase{4, true, true}),
                         [](const ::testing::TestParamInfo<GptCase>& info) {
                           return "tp" + std::to_string(info.param.tp) + (info.param.sp ? "_sp" : "") +
                                  (info.param.tied ? "_tied" : "_untied");
                         });

// What LlmTrainer::setup says about a recipe: "" or the ConfigError.
std::string llmSetupError(const std::vector<std::string>& overrides, ptrain::llm::GptConfig* config = nullptr) {
  ptrain::llm::LlmTrainer trainer(ptrain::PluginContext{});
  ptrain::Schema schema;
  ptrain::describeCoreKeys(schema);
  trainer.describeKeys(schema);
  try {
    ptrain::Recipe recipe = ptrain::Recipe::fromString(
        "trainer: {name: llm}\nmodel: {num_layers: 1, hidden_size: 16, num_attention_heads: 4}\n"
        "data: {digits: 1}\ntrain: {steps: 1, global_batch_size: 4}\n",
        "r.yaml", overrides);
    recipe.validate(schema);
    trainer.setup(recipe);
  } catch (const ptrain::ConfigError& e) {
    return e.what();
  }
  if (config != nullptr) *config = trainer.modelConfig();
  return "";
}

TEST(LlmTrainerTensorParallel, VocabularyPadsToAFixedMultipleThatTpMustDivide) {
  ptrain::llm::GptConfig c;
  ASSERT_EQ(llmSetupError({}, &c), "");
  EXPECT_EQ(c.vocab_size, 16);
  EXPECT_EQ(c.validVocab(), 16);
  EXPECT_EQ(c.make_vocab_size_divisible_by, 128);  // Megatron's default, whatever tp is
  EXPECT_EQ(c.paddedVocab(), 128);
  ASSERT_EQ(llmSetupError({"parallel.tensor_model_parallel_size=4"}, &c), "");
  EXPECT_EQ(c.paddedVocab(), 128);
  ASSERT_EQ(llmSetupError({"model.make_vocab_size_divisible_by=5", "model.vocab_size=17"}, &c), "");
  EXPECT_EQ(c.paddedVocab(), 20);
  EXPECT_EQ(c.validVocab(), 16);  // the data's ids; the rest is never predicted

  EXPECT_EQ(llmSetupError({"model.make_vocab_size_divisible_by=6", "parallel.tensor_model_parallel_size=4"}),
            "<command line>: model.make_vocab_size_divisible_by: the padded vocabulary of 18 (vocab_size 16 rounded "
            "up to a multiple of 6) is not divisible by parallel.tensor_model_parallel_size=4; use a multiple of 4");
}

TEST(LlmTrainerTensorParallel, SequenceParallelNeedsADerivedSeqLengthThatSplits) {
  // 1-digit addition: the derived seq_length is 6.
  EXPECT_EQ(llmSetupError({"parallel.tensor_model_parallel_size=4", "parallel.sequence_parallel=true"}),
            "r.yaml:2:1: model.seq_length: 6 (derived) is not divisible by parallel.tensor_model_parallel_size=4, "
            "which sequence_parallel needs; set model.seq_length to 8");
  EXPECT_EQ(llmSetupError({"parallel.tensor_model_parallel_size=2", "parallel.sequence_parallel=true"}), "");
  EXPECT_EQ(llmSetupError({"parallel.tensor_model_parallel_size=4", "parallel.sequence_parallel=true",
                           "model.seq_length=8"}),
            "");
}

// ---- layout rules ----

// A model without attention heads still splits its hidden size across tp
// (with heads, the heads rule covers it).
TEST(TensorParallelLayout, HiddenSizeMustSplitWithoutHeads) {
  ptrain::Schema schema;
  ptrain::describeCoreKeys(schema);
  ptrain::keys::addTransformerShape(schema);
  auto check = [&](const std::vector<std::string>& overrides) {
    ptrain::Recipe r = ptrain::Recipe::fromString(
        "trainer: {name: rec}\nmodel: {hidden_size: 30}\ntrain: {steps: 1, global_batch_size: 8}\n", "r.yaml",
        overrides);
    r.validate(schema);
    return ptrain::checkLayout(r, 4);
  };
  EXPECT_EQ(check({"parallel.tensor_model_parallel_size=4", "model.ffn_hidden_size=8"}),
            std::vector<std::string>{"<command line>: tensor_model_parallel_size=4 does not divide hidden_size=30: "
                                     "use 1, 2, 3, 5, 6, 10, 15 or 30"});
  EXPECT_EQ(check({"parallel.tensor_model_parallel_size=2", "model.ffn_hidden_size=8"}), std::vector<std::string>{});
}

INSTANTIATE_TEST_SUITE_P(Tp, TpSizes, ::testing::Values(2, 4),
                         [](const ::testing::TestParamInfo<int>& info) { return "tp" + std::to_string(info.param); });

}  // namespace
