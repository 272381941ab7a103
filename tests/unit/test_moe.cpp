// The MoE layer (nn/moe.h) and the expert plugin:
//   - the router, the capacity rule, the load-balancing and z losses and the
//     token permutation against references written here, element by element;
//   - the layer against a per-token mixture of its experts' MLPs, and its
//     auxiliary losses' gradient against autograd of the reference objective;
//   - a GPT-MoE on every ep x tp x dp layout (one with pp 2, three with
//     expert tensor parallelism) against the single-rank run over 20 steps,
//     aux loss included;
//   - with a capacity factor under ep 2, each rank's dropped tokens and
//     outputs against the whole layer on that rank's tokens.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "ptrain/comm/communicator.h"
#include "ptrain/comm/process_group.h"
#include "ptrain/nn/moe.h"
#include "support/test_support.h"
#include "unit/llm_runtime_fixture.h"

namespace ptrain {
namespace {

using namespace llm_fixture;

// The k largest entries of a row (ties: the lower index first), by hand.
std::vector<int64_t> topIndices(const std::vector<float>& row, int64_t k) {
  std::vector<int64_t> idx(row.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return row[a] > row[b]; });
  idx.resize(static_cast<size_t>(k));
  return idx;
}

std::vector<float> rowOf(const at::Tensor& t, int64_t r) {
  at::Tensor row = t[r].contiguous().to(at::kFloat);
  return std::vector<float>(row.data_ptr<float>(), row.data_ptr<float>() + row.numel());
}

std::vector<double> softmaxOf(const std::vector<double>& v) {
  const double m = *std::max_element(v.begin(), v.end());
  std::vector<double> out;
  double total = 0;
  for (double x : v) total += std::exp(x - m);
  for (double x : v) out.push_back(std::exp(x - m) / total);
  return out;
}

TEST(MoeRouter, TopKThenSoftmaxPreSoftmaxAndSigmoidMatchTheDefinitions) {
  torch::manual_seed(3);
  const at::Tensor logits = torch::randn({7, 5});
  for (const char* score : {"softmax", "sigmoid"}) {
    for (bool pre : {false, true}) {
      if (std::string(score) == "sigmoid" && pre) continue;
      nn::Routing r = nn::routeTokens(logits, 2, score, pre, std::nullopt, false);
      for (int64_t t = 0; t < 7; ++t) {
        const std::vector<float> row = rowOf(logits, t);
        const auto chosen = topIndices(row, 2);
        std::vector<double> all(row.begin(), row.end()), gates;
        if (std::string(score) == "softmax") {
          if (pre) {
            const auto p = softmaxOf(all);
            gates = {p[chosen[0]], p[chosen[1]]};
          } else {
            gates = softmaxOf({row[chosen[0]], row[chosen[1]]});
          }
        } else {
          const double a = 1 / (1 + std::exp(-row[chosen[0]])), b = 1 / (1 + std::exp(-row[chosen[1]]));
          gates = {a / (a + b), b / (a + b)};
        }
        for (int64_t e = 0; e < 5; ++e) {
          const bool picked = e == chosen[0] || e == chosen[1];
          EXPECT_EQ(r.routing_map[t][e].item<bool>(), picked) << score << " token " << t << " expert " << e;
          const double want = e == chosen[0] ? gates[0] : e == chosen[1] ? gates[1] : 0.0;
          EXPECT_NEAR(r.probs[t][e].item<double>(), want, 1e-6) << score << " pre " << pre;
        }
      }
      EXPECT_EQ(r.tokens_per_expert.sum().item<int64_t>(), 14);
    }
  }
}

TEST(MoeRouter, CapacityKeepsEachExpertsMostProbableTokens) {
  torch::manual_seed(4);
  const int64_t n = 12, experts = 4, k = 2;
  const at::Tensor logits = torch::randn({n, experts}) * 2;
  EXPECT_EQ(nn::expertCapacity(n, k, experts, 0.5), 3);  // ceil(12 * 2 / 4 * 0.5)
  EXPECT_EQ(nn::expertCapacity(10, 1, 4, 1.0), 3);       // ceil(2.5)
  nn::Routing dropless = nn::routeTokens(logits, k, "softmax", false, std::nullopt, false);
  nn::Routing capped = nn::routeTokens(logits, k, "softmax", false, 0.5, false);
  nn::Routing padded = nn::routeTokens(logits, k, "softmax", false, 0.5, true);
  for (int64_t e = 0; e < experts; ++e) {
    // The reference: the expert's tokens by gate, descending; it keeps the first 3.
    std::vector<std::pair<double, int64_t>> byGate;
    for (int64_t t = 0; t < n; ++t) byGate.emplace_back(dropless.probs[t][e].item<double>(), t);
    std::stable_sort(byGate.begin(), byGate.end(), [](auto& a, auto& b) { return a.first > b.first; });
    for (size_t i = 0; i < byGate.size(); ++i) {
      const int64_t t = byGate[i].second;
      const bool chosen = dropless.routing_map[t][e].item<bool>();
      EXPECT_EQ(capped.routing_map[t][e].item<bool>(), chosen && i < 3) << "token " << t << " expert " << e;
      EXPECT_EQ(padded.routing_map[t][e].item<bool>(), i < 3) << "padded token " << t << " expert " << e;
      EXPECT_DOUBLE_EQ(capped.probs[t][e].item<double>(), chosen && i < 3 ? byGate[i].first : 0.0);
    }
    EXPECT_EQ(padded.routing_map.select(1, e).sum().item<int64_t>(), 3);
  }
  // Capacity does not change what the load-balancing loss counts.
  EXPECT_TRUE(torch::equal(capped.tokens_per_expert, dropless.tokens_per_expert));
}

TEST(MoeRouter, AuxAndZLossesFollowMegatronsFormulas) {
  torch::manual_seed(5);
  const int64_t n = 6, experts = 4, k = 2;
  const at::Tensor logits = torch::randn({n, experts});
  nn::Routing r = nn::routeTokens(logits, k, "softmax", false, std::nullopt, false);
  // switch: E * coeff / (N^2 k) * sum_i (sum_t softmax_ti) * count_i
  double expected = 0;
  std::vector<double> pSum(experts, 0.0), count(experts, 0.0);
  for (int64_t t = 0; t < n; ++t) {
    const std::vector<float> row = rowOf(logits, t);
    const auto p = softmaxOf(std::vector<double>(row.begin(), row.end()));
    for (int64_t e = 0; e < experts; ++e) pSum[e] += p[e];
    for (int64_t e : topIndices(row, k)) count[e] += 1;
  }
  for (int64_t e = 0; e < experts; ++e) expected += pSum[e] * count[e];
  expected *= experts * 0.01 / (double(n) * n * k);
  EXPECT_NEAR(nn::switchLoadBalancingLoss(r.aux_scores, r.tokens_per_expert, k, 0.01).item<double>(), expected, 1e-8);
  // Two sequence shards: each rank's loss over its half, counts of both; the halves add up to the whole.
  at::Tensor half0 = nn::switchLoadBalancingLoss(r.aux_scores.narrow(0, 0, 3), r.tokens_per_expert, k, 0.01, 2);
  at::Tensor half1 = nn::switchLoadBalancingLoss(r.aux_scores.narrow(0, 3, 3), r.tokens_per_expert, k, 0.01, 2);
  EXPECT_NEAR((half0 + half1).item<double>(), expected, 1e-8);
  // z: coeff * mean over tokens of logsumexp^2.
  double z = 0;
  for (int64_t t = 0; t < n; ++t) {
    double total = 0;
    for (float v : rowOf(logits, t)) total += std::exp(static_cast<double>(v));
    z += std::log(total) * std::log(total);
  }
  EXPECT_NEAR(nn::routerZLoss(logits, 0.001).item<double>(), 0.001 * z / n, 1e-9);
}

TEST(MoePermutation, SortsByExpertThenTokenAndCombinesByGate) {
  torch::manual_seed(6);
  const int64_t n = 5, experts = 3, h = 2;
  at::Tensor tokens = torch::randn({n, h});
  at::Tensor map = torch::tensor({1, 0, 1, 0, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 0}, at::kBool).view({n, experts});
  at::Tensor probs = torch::rand({n, experts}) * map.to(at::kFloat);
  nn::Permutation p = nn::permuteTokens(tokens, map, probs);
  std::vector<int64_t> expectOrder;
  for (int64_t e = 0; e < experts; ++e)
    for (int64_t t = 0; t < n; ++t)
      if (map[t][e].item<bool>()) expectOrder.push_back(t);
  ASSERT_EQ(p.token_index.numel(), static_cast<int64_t>(expectOrder.size()));
  for (size_t i = 0; i < expectOrder.size(); ++i) {
    EXPECT_EQ(p.token_index[i].item<int64_t>(), expectOrder[i]);
    EXPECT_TRUE(torch::equal(p.tokens[i], tokens[expectOrder[i]]));
  }
  EXPECT_EQ(p.expert_counts, (std::vector<int64_t>{3, 2, 3}));
  // Combine: each token's rows weighted by their gates and summed.
  at::Tensor rows = torch::randn({p.token_index.numel(), h});
  at::Tensor combined = nn::unpermuteTokens(rows, p, n);
  for (int64_t t = 0; t < n; ++t) {
    at::Tensor want = torch::zeros({h});
    size_t i = 0;
    for (int64_t e = 0; e < experts; ++e)
      for (int64_t s = 0; s < n; ++s)
        if (map[s][e].item<bool>()) {
          if (s == t) want += probs[s][e] * rows[static_cast<int64_t>(i)];
          ++i;
        }
    EXPECT_TRUE(torch::allclose(combined[t], want, 1e-6, 1e-7)) << "token " << t;
  }
}

// The layer's output is, per token, sum over its chosen experts of gate *
// MLP_e(x); its router gradient includes the aux losses' at the context's scale.
TEST(MoeLayer, IsTheGateWeightedMixtureOfItsExpertsAndBackpropagatesTheAuxLosses) {
  torch::manual_seed(7);
  nn::MoeConfig c;
  c.num_experts = 4;
  c.topk = 2;
  c.hidden_size = 6;
  c.ffn_hidden_size = 10;
  c.aux_loss_coeff = 0.1;
  c.z_loss_coeff = 0.01;
  nn::MoeLayer layer(c);
  for (auto& p : layer->parameters()) p.data().normal_(0, 0.5);
  auto context = std::make_shared<nn::MoeStepContext>(1, 4);
  context->aux_gradient_scale = 0.25;
  layer->setStepContext(context);
  at::Tensor x = torch::randn({2, 3, 6});
  at::Tensor y = layer(x);

  // Reference: a loop over tokens and their experts, in float64.
  auto W = [&](const char* name) { return layer->named_parameters()[name].detach().to(at::kDouble); };
  at::Tensor router = W("router.weight"), w1 = W("experts.fc1.weight"), b1 = W("experts.fc1.bias");
  at::Tensor w2 = W("experts.fc2.weight"), b2 = W("experts.fc2.bias");
  at::Tensor flat = x.reshape({-1, 6}).to(at::kDouble);
  for (int64_t t = 0; t < 6; ++t) {
    const at::Tensor logit = torch::mv(router, flat[t]);
    std::vector<float> row = rowOf(logit.unsqueeze(0), 0);
    const auto chosen = topIndices(row, 2);
    const auto gates = softmaxOf({row[chosen[0]], row[chosen[1]]});
    at::Tensor want = torch::zeros({6}, at::kDouble);
    for (int j = 0; j < 2; ++j) {
      const int64_t e = chosen[j];
      at::Tensor hdn = torch::gelu(torch::mv(w1[e], flat[t]) + b1[e], "tanh");
      want += gates[j] * (torch::mv(w2[e], hdn) + b2[e]);
    }
    EXPECT_TRUE(torch::allclose(y.reshape({-1, 6})[t].to(at::kDouble), want, 1e-5, 1e-6)) << "token " << t;
  }

  // Gradient: d/dW_r of y.sum() + 0.25 * (aux + z), the reference by autograd
  // over the formulas (routing fixed as chosen above).
  y.sum().backward();
  at::Tensor wr = layer->router->weight.detach().clone().requires_grad_(true);
  at::Tensor logits = torch::matmul(x.reshape({-1, 6}), wr.t());
  nn::Routing r = nn::routeTokens(logits, 2, "softmax", false, std::nullopt, false);
  at::Tensor aux = nn::switchLoadBalancingLoss(r.aux_scores, r.tokens_per_expert, 2, 0.1);
  at::Tensor z = nn::routerZLoss(logits, 0.01);
  nn::Permutation p = nn::permuteTokens(x.reshape({-1, 6}), r.routing_map, r.probs);
  std::vector<at::Tensor> outs;
  int64_t off = 0;
  for (int64_t e = 0; e < 4; ++e) {
    at::Tensor rows = p.tokens.narrow(0, off, p.expert_counts[e]);
    off += p.expert_counts[e];
    at::Tensor hdn = torch::gelu(torch::matmul(rows, layer->fc1->weight[e].detach().t()) + layer->fc1->bias[e].detach(), "tanh");
    outs.push_back(torch::matmul(hdn, layer->fc2->weight[e].detach().t()) + layer->fc2->bias[e].detach());
  }
  at::Tensor ref = nn::unpermuteTokens(torch::cat(outs), p, 6);
  (ref.sum() + 0.25 * (aux + z)).backward();
  EXPECT_TRUE(torch::allclose(layer->router->weight.grad(), wr.grad(), 1e-5, 1e-7));
  EXPECT_NEAR(context->aux_loss, aux.item<double>(), 1e-7);
  EXPECT_NEAR(context->z_loss, z.item<double>(), 1e-7);
  EXPECT_DOUBLE_EQ(context->routed, 12);
}

// ---- layouts ----

std::vector<std::string> moeRecipe(int tp, int pp, int ep, int etp = 1) {
  std::vector<std::string> o = {"model.num_experts=4",
                                "model.moe_router_topk=2",
                                "model.moe_aux_loss_coeff=0.01",
                                "model.moe_z_loss_coeff=0.001",
                                "model.moe_layer_freq=1",
                                "train.micro_batch_size=2",
                                "parallel.tensor_model_parallel_size=" + std::to_string(tp),
                                "parallel.pipeline_model_parallel_size=" + std::to_string(pp),
                                "parallel.expert_model_parallel_size=" + std::to_string(ep),
                                "parallel.expert_tensor_parallel_size=" + std::to_string(etp),
                                std::string("parallel.sequence_parallel=") + (tp > 1 ? "true" : "false")};
  return o;
}

struct Curve {
  std::vector<double> loss, aux;
};

Curve trainMoe(Communicator& comm, llm::LlmTrainer& trainer, const Recipe& recipe, int steps) {
  ModelRuntime rt(comm, registry(), [&](const ModelBuild& b) { return trainer.buildModel(b); },
                  llmOptions(recipe, comm.layout(), true));
  Curve c;
  for (int step = 0; step < steps; ++step) {
    StepResult r = llmStep(rt, trainer, step, 2);
    EXPECT_TRUE(r.applied);
    c.loss.push_back(r.loss);
    c.aux.push_back(r.stats.count("moe_aux_loss") ? r.stats.at("moe_aux_loss") + r.stats.at("moe_z_loss") : -1);
  }
  return c;
}

struct MoeCase {
  int world, tp, pp, ep, etp = 1;
};

class MoeLayouts : public ::testing::TestWithParam<MoeCase> {};

TEST_P(MoeLayouts, TwentyStepsMatchOneRankAuxLossIncluded) {
  const MoeCase c = GetParam();
  constexpr int kSteps = 20;
  std::string failures = test::runRanks(c.world, [c](int rank, int size, int port) {
    Curve reference;
    {
      llm::LlmTrainer single{PluginContext{}};
      Recipe plain = llmRecipe(single, moeRecipe(1, 1, 1));
      single.setup(plain);
      auto loop = Communicator::loopback();
      reference = trainMoe(*loop, single, plain, kSteps);
    }
    llm::LlmTrainer trainer{PluginContext{}};
    Recipe recipe = llmRecipe(trainer, moeRecipe(c.tp, c.pp, c.ep, c.etp));
    trainer.setup(recipe);
    auto comm = worldOf(rank, size, port, layoutOf(size, c.tp, c.pp, c.ep, c.etp));
    Curve got = trainMoe(*comm, trainer, recipe, kSteps);
    for (int step = 0; step < kSteps; ++step) {
      const double tol = step == 0 ? 1e-5 : 1e-4;
      EXPECT_LT(test::relDiff(got.loss[step], reference.loss[step]), tol) << "step " << step;
      EXPECT_LT(test::relDiff(got.aux[step], reference.aux[step]), tol) << "aux loss, step " << step;
    }
  });
  EXPECT_EQ(failures, "");
}

INSTANTIATE_TEST_SUITE_P(Plugins, MoeLayouts,
                         ::testing::Values(MoeCase{2, 1, 1, 1}, MoeCase{2, 1, 1, 2}, MoeCase{2, 2, 1, 1},
                                           MoeCase{2, 2, 1, 2}, MoeCase{4, 2, 1, 1}, MoeCase{4, 2, 1, 2},
                                           MoeCase{4, 2, 1, 4}, MoeCase{4, 1, 2, 2}, MoeCase{2, 2, 1, 1, 2},
                                           MoeCase{4, 2, 1, 2, 2}, MoeCase{4, 1, 1, 2, 2}),
                         [](const ::testing::TestParamInfo<MoeCase>& info) {
                           const MoeCase& c = info.param;
                           return "world" + std::to_string(c.world) + "_tp" + std::to_string(c.tp) + "_pp" +
                                  std::to_string(c.pp) + "_ep" + std::to_string(c.ep) +
                                  (c.etp > 1 ? "_etp" + std::to_string(c.etp) : "");
                         });

// With a capacity factor, routing is per rank's tokens: under ep 2 each
// rank's outputs and drops equal the whole layer's on that rank's tokens.
TEST(MoeRanks, CapacityDropsAndOutputsEqualOneRankComputingTheSameRouting) {
  std::string failures = test::runRanks(2, [](int rank, int size, int port) {
    nn::MoeConfig c;
    c.num_experts = 4;
    c.topk = 2;
    c.hidden_size = 8;
    c.ffn_hidden_size = 12;
    c.capacity_factor = 0.75;
    torch::manual_seed(9);
    nn::MoeLayer whole(c);
    for (auto& p : whole->parameters()) p.data().normal_(0, 0.5);
    // The same weights, this rank's two experts.
    nn::MoeLayer mine(c);
    {
      torch::NoGradGuard g;
      auto src = whole->named_parameters();
      for (auto& item : mine->named_parameters()) {
        at::Tensor full = src[item.key()];
        const bool expert = item.key().rfind("experts.", 0) == 0;
        item.value().set_data(expert ? full.narrow(0, rank * 2, 2).clone() : full.clone());
      }
    }
    auto comm = worldOf(rank, size, port, layoutOf(2, 1, 1, 2));
    auto state = std::make_shared<nn::ExpertParallelState>();
    state->ep_group = comm->groupsFor(comm->layout())->group(GroupKind::kExpert);
    state->ep_rank = rank;
    state->ep_size = 2;
    mine->setExpertParallel(state);
    auto ctxMine = std::make_shared<nn::MoeStepContext>(1, 4), ctxWhole = std::make_shared<nn::MoeStepContext>(1, 4);
    mine->setStepContext(ctxMine);
    whole->setStepContext(ctxWhole);
    torch::manual_seed(100 + rank);  // each rank its own tokens
    at::Tensor x = torch::randn({3, 5, 8}).requires_grad_(true);
    at::Tensor xw = x.detach().clone().requires_grad_(true);
    at::Tensor y = mine(x), yw = whole(xw);
    EXPECT_TRUE(torch::allclose(y, yw, 1e-5, 1e-6));
    EXPECT_GT(ctxWhole->dropped, 0);
    EXPECT_DOUBLE_EQ(ctxMine->dropped, ctxWhole->dropped);
    y.pow(2).sum().backward();
    yw.pow(2).sum().backward();
    EXPECT_TRUE(torch::allclose(x.grad(), xw.grad(), 1e-5, 1e-6));
  });
  EXPECT_EQ(failures, "");
}

}  // namespace
}  // namespace ptrain
