#include "ptrain/nn/moe.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "ptrain/comm/process_group.h"
#include "ptrain/nn/deferred_init.h"
#include "ptrain/nn/fused.h"
#include "ptrain/nn/host_kernels.h"
#include "ptrain/nn/ops.h"

namespace ptrain::nn {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::vector<int64_t> toVector(const at::Tensor& t) {
  at::Tensor c = t.to(at::kCPU, at::kLong).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

int64_t sum(const std::vector<int64_t>& v, size_t begin, size_t end) {
  return std::accumulate(v.begin() + static_cast<std::ptrdiff_t>(begin), v.begin() + static_cast<std::ptrdiff_t>(end),
                         int64_t{0});
}

// Identity on `activation`; backward also gives `loss` the gradient *scale
// (Megatron's MoEAuxLossAutoScaler): an auxiliary loss joins backward where
// it was computed, on any pipeline stage.
struct AttachLossFn : torch::autograd::Function<AttachLossFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& activation, const at::Tensor& loss,
                            const double* scale) {
    ctx->saved_data["scale"] = *scale;
    ctx->saved_data["loss_dtype"] = static_cast<int64_t>(loss.scalar_type());
    return activation.clone();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const double scale = ctx->saved_data["scale"].toDouble();
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["loss_dtype"].toInt());
    at::Tensor lossGrad = torch::full({}, scale, grads[0].options().dtype(dtype));
    return {grads[0], lossGrad, at::Tensor()};
  }
};

struct AllToAllFn : torch::autograd::Function<AllToAllFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, ProcessGroup* group,
                            std::vector<int64_t> inputSplits, std::vector<int64_t> outputSplits, double* seconds) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(group);
    ctx->saved_data["in"] = inputSplits;
    ctx->saved_data["out"] = outputSplits;
    ctx->saved_data["seconds"] = reinterpret_cast<int64_t>(seconds);
    return exchange(input, *group, inputSplits, outputSplits, seconds);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto* group = reinterpret_cast<ProcessGroup*>(ctx->saved_data["group"].toInt());
    auto* seconds = reinterpret_cast<double*>(ctx->saved_data["seconds"].toInt());
    const auto in = ctx->saved_data["in"].toIntVector();
    const auto out = ctx->saved_data["out"].toIntVector();
    return {exchange(grads[0].contiguous(), *group, out, in, seconds), at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }

  static at::Tensor exchange(const at::Tensor& input, ProcessGroup& group, const std::vector<int64_t>& inputSplits,
                             const std::vector<int64_t>& outputSplits, double* seconds) {
    const auto start = std::chrono::steady_clock::now();
    std::vector<int64_t> shape = input.sizes().vec();
    shape[0] = sum(outputSplits, 0, outputSplits.size());
    at::Tensor output = at::empty(shape, input.options());
    AllToAllOptions opts;
    opts.input_split_sizes = inputSplits;
    opts.output_split_sizes = outputSplits;
    at::Tensor in = input.contiguous();
    group.allToAll(output, in, opts)->wait();
    if (seconds != nullptr) {
      *seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    return output;
  }
};

}  // namespace

// ---------------------------------------------------------------- routing

int64_t expertCapacity(int64_t tokens, int64_t topk, int64_t experts, double factor) {
  return static_cast<int64_t>(std::ceil(static_cast<double>(tokens * topk) / static_cast<double>(experts) * factor));
}

Routing routeTokens(const at::Tensor& logits, int64_t topk, const std::string& scoreFunction, bool preSoftmax,
                    std::optional<double> capacityFactor, bool padToCapacity) {
  PTRAIN_CHECK(logits.dim() == 2 && topk >= 1 && topk <= logits.size(1), "routeTokens: logits of shape ",
               logits.sizes(), " with top-k ", topk);
  const int64_t numExperts = logits.size(1);
  Routing r;
  at::Tensor probs, topIndices;
  if (scoreFunction == "softmax") {
    if (preSoftmax) {
      std::tie(probs, topIndices) = at::topk(torch::softmax(logits, -1), topk, 1);
    } else {
      at::Tensor top;
      std::tie(top, topIndices) = at::topk(logits, topk, 1);
      probs = torch::softmax(top, -1);
    }
    r.aux_scores = torch::softmax(logits, -1);
  } else if (scoreFunction == "sigmoid") {
    at::Tensor scores = torch::sigmoid(logits);
    std::tie(probs, topIndices) = at::topk(scores, topk, 1);
    if (topk > 1) probs = probs / (probs.sum(-1, true) + 1e-20);
    r.aux_scores = scores / (scores.sum(-1, true) + 1e-20);
  } else {
    throw ConfigError("moe_router_score_function '" + scoreFunction + "': use softmax or sigmoid");
  }
  at::Tensor gates = torch::zeros_like(logits).scatter(1, topIndices, probs);
  at::Tensor topkMap = torch::zeros_like(logits, logits.options().dtype(at::kBool)).scatter(1, topIndices, true);
  r.tokens_per_expert = topkMap.sum(0).to(at::kLong);
  if (!capacityFactor) {
    r.probs = gates;
    r.routing_map = topkMap;
    return r;
  }
  // Each expert keeps its `capacity` most probable tokens (drop policy
  // "probs"); with padding it takes exactly that many, zero gates included.
  const int64_t capacity = std::min(logits.size(0), expertCapacity(logits.size(0), topk, numExperts, *capacityFactor));
  at::Tensor capacityIndices = std::get<1>(at::topk(gates.detach(), capacity, 0, true, false));
  at::Tensor capacityMask = torch::zeros_like(topkMap).scatter(0, capacityIndices, true);
  r.routing_map = padToCapacity ? capacityMask : topkMap.logical_and(capacityMask);
  r.probs = gates * r.routing_map.to(gates.scalar_type());
  return r;
}

at::Tensor switchLoadBalancingLoss(const at::Tensor& auxScores, const at::Tensor& tokensPerExpert, int64_t topk,
                                   double coeff, int64_t sequenceShards) {
  const double numTokens = static_cast<double>(auxScores.size(0) * sequenceShards);
  const double numExperts = static_cast<double>(auxScores.size(1));
  at::Tensor perExpert = auxScores.sum(0);
  return (perExpert * tokensPerExpert.to(perExpert.scalar_type())).sum() *
         (numExperts * coeff / (numTokens * numTokens * static_cast<double>(topk)));
}

at::Tensor routerZLoss(const at::Tensor& logits, double coeff, int64_t sequenceShards) {
  const double numTokens = static_cast<double>(logits.size(0) * sequenceShards);
  return torch::logsumexp(logits, -1).square().sum() * (coeff / numTokens);
}

// ------------------------------------------------------------ permutation

Permutation permuteTokens(const at::Tensor& tokens, const at::Tensor& routingMap, const at::Tensor& probs) {
  const int64_t n = routingMap.size(0);
  at::Tensor byExpert = routingMap.t().contiguous();  // [E, N]
  Permutation p;
  p.token_index = torch::arange(n, torch::TensorOptions(at::kLong).device(tokens.device()))
                      .unsqueeze(0)
                      .expand_as(byExpert)
                      .masked_select(byExpert);
  p.gates = probs.t().contiguous().masked_select(byExpert);
  p.tokens = tokens.index_select(0, p.token_index);
  p.expert_counts = toVector(byExpert.sum(1));
  return p;
}

at::Tensor unpermuteTokens(const at::Tensor& expertOutput, const Permutation& p, int64_t numTokens) {
  at::Tensor weighted = expertOutput * p.gates.to(expertOutput.scalar_type()).unsqueeze(1);
  return torch::zeros({numTokens, expertOutput.size(1)}, expertOutput.options()).index_add(0, p.token_index, weighted);
}

at::Tensor allToAllRows(const at::Tensor& input, ProcessGroup& group, std::vector<int64_t> inputSplits,
                        std::vector<int64_t> outputSplits, double* seconds) {
  return AllToAllFn::apply(input, &group, std::move(inputSplits), std::move(outputSplits), seconds);
}

// ---------------------------------------------------------------- modules

MoeStepContext::MoeStepContext(int numLayers, int64_t numExperts) : num_layers(numLayers), num_experts(numExperts) {
  reset();
}

void MoeStepContext::reset() {
  tokens_per_expert.assign(static_cast<size_t>(num_layers * num_experts), 0.0);
  layer_ran.assign(static_cast<size_t>(num_layers), 0.0);
  aux_loss = z_loss = routed = dropped = a2a_bytes = a2a_bytes_uniform = a2a_seconds = 0;
}

StackedLinearImpl::StackedLinearImpl(int64_t experts, int64_t in, int64_t out) {
  // Uninitialised on its own (the model draws every parameter); without
  // storage under a DeferredInit, where the expert plugin keeps this rank's
  // experts before anything is allocated.
  weight = register_parameter("weight", splittableParameter({experts, out, in}, [&] { return torch::empty({experts, out, in}); }));
  bias = register_parameter("bias", splittableParameter({experts, out}, [&] { return torch::zeros({experts, out}); }));
}

MoeRouterImpl::MoeRouterImpl(int64_t experts, int64_t hidden) {
  weight = register_parameter("weight", torch::empty({experts, hidden}));
}

MoeLayerImpl::MoeLayerImpl(const MoeConfig& c) : config_(c) {
  PTRAIN_CHECK_AS(ConfigError, c.num_experts >= 1 && c.hidden_size >= 1 && c.ffn_hidden_size >= 1,
                  "moe: num_experts, hidden and ffn sizes must be positive (got ", c.num_experts, ", ", c.hidden_size,
                  ", ", c.ffn_hidden_size, ")");
  PTRAIN_CHECK_AS(ConfigError, c.topk >= 1 && c.topk <= c.num_experts, "moe: moe_router_topk=", c.topk,
                  " must be between 1 and num_experts=", c.num_experts);
  router = register_module("router", MoeRouter(c.num_experts, c.hidden_size));
  auto experts = register_module("experts", std::make_shared<torch::nn::Module>());
  fc1 = experts->register_module("fc1", StackedLinear(c.num_experts, c.hidden_size, c.ffn_hidden_size));
  fc2 = experts->register_module("fc2", StackedLinear(c.num_experts, c.ffn_hidden_size, c.hidden_size));
}

std::vector<std::string> MoeLayerImpl::expertParameterNames() {
  return {"experts.fc1.weight", "experts.fc1.bias", "experts.fc2.weight", "experts.fc2.bias"};
}

void MoeLayerImpl::setExpertParallel(std::shared_ptr<const ExpertParallelState> state) {
  if (state) {
    PTRAIN_CHECK(state->ep_size >= 1 && config_.num_experts % state->ep_size == 0 &&
                     fc1->weight.size(0) == config_.num_experts / state->ep_size,
                 "moe: ", fc1->weight.size(0), " local experts of ", config_.num_experts, " for ep=", state->ep_size);
    PTRAIN_CHECK(state->etp_size >= 1 && fc1->weight.size(1) * state->etp_size == config_.ffn_hidden_size,
                 "moe: ", fc1->weight.size(1), " ffn features per expert of ", config_.ffn_hidden_size, " for etp=",
                 state->etp_size);
  }
  ep_ = std::move(state);
}

at::Tensor MoeLayerImpl::runExperts(const at::Tensor& rows, const std::vector<int64_t>& rowsPerExpert) {
  // Every local expert runs, even on no rows: its gradient is then a defined
  // zero, which the data-parallel reduction over its replicas expects.
  const auto w1 = fc1->weight.unbind(0), b1 = fc1->bias.unbind(0);
  const auto w2 = fc2->weight.unbind(0), b2 = fc2->bias.unbind(0);
  // Under expert tensor parallelism fc2's outputs are partial sums over the
  // etp members: its bias joins on member 0 only.
  const bool fc2Bias = !ep_ || ep_->etp_rank == 0;
  std::vector<at::Tensor> outputs;
  int64_t offset = 0;
  for (size_t e = 0; e < rowsPerExpert.size(); ++e) {
    at::Tensor x = rows.narrow(0, offset, rowsPerExpert[e]);
    offset += rowsPerExpert[e];
    at::Tensor hidden = config_.fused_bias_gelu ? nn::fusedBiasGelu(nn::linear(x, w1[e]), b1[e])
                                                : nn::gelu(nn::linear(x, w1[e], b1[e]));
    outputs.push_back(nn::linear(hidden, w2[e], fc2Bias ? b2[e] : at::Tensor()));
  }
  return torch::cat(outputs, 0);
}

at::Tensor MoeLayerImpl::forward(const at::Tensor& input) {
  const int64_t h = config_.hidden_size, numExperts = config_.num_experts;
  const at::Tensor x = input.reshape({-1, h});
  const int64_t n = x.size(0);
  const bool training = is_training() && torch::GradMode::is_enabled();
  MoeStepContext* stats = training ? context_.get() : nullptr;
  static const double kUnitScale = 1.0;
  const double* auxScale = context_ ? &context_->aux_gradient_scale : &kUnitScale;
  const int64_t shards = ep_ ? ep_->sequence_shards : 1;

  // Router, in float32.
  at::Tensor logits = torch::matmul(x.to(at::kFloat), router->weight.to(at::kFloat).t());
  if (training && config_.z_loss_coeff > 0) {
    at::Tensor z = routerZLoss(logits, config_.z_loss_coeff, shards);
    if (stats) stats->z_loss += z.item<double>();
    logits = AttachLossFn::apply(logits, z, auxScale);
  }
  Routing routing = routeTokens(logits, config_.topk, config_.score_function, config_.pre_softmax,
                                config_.capacity_factor, config_.pad_to_capacity);
  at::Tensor probs = routing.probs;
  if (training) {
    // The choices of every rank holding part of these sequences.
    at::Tensor counts = routing.tokens_per_expert.to(at::kDouble);
    if (ep_ && ep_->sequence_group && ep_->sequence_shards > 1) ep_->sequence_group->allreduce(counts)->wait();
    if (config_.aux_loss_coeff > 0) {
      at::Tensor aux = switchLoadBalancingLoss(routing.aux_scores, counts, config_.topk, config_.aux_loss_coeff, shards);
      if (stats) stats->aux_loss += aux.item<double>();
      probs = AttachLossFn::apply(probs, aux, auxScale);
    }
    if (stats) {
      // Per layer: this rank's own choices (the world sum counts each once).
      const auto mine = toVector(routing.tokens_per_expert);
      for (int64_t e = 0; e < numExperts; ++e) {
        stats->tokens_per_expert[static_cast<size_t>(config_.layer_number * numExperts + e)] += static_cast<double>(mine[e]);
      }
      stats->layer_ran[static_cast<size_t>(config_.layer_number)] = 1;
      const double chosen = static_cast<double>(n * config_.topk);
      stats->routed += chosen;
      stats->dropped += chosen - routing.routing_map.logical_and(routing.probs.detach() > 0).sum().item<double>();
    }
  }

  Permutation perm = permuteTokens(x, routing.routing_map, probs);
  const int epSize = ep_ ? ep_->ep_size : 1;
  const int etpSize = ep_ ? ep_->etp_size : 1;
  const int64_t local = numExperts / epSize;
  double* seconds = stats ? &stats->a2a_seconds : nullptr;
  at::Tensor expertOut;
  if (epSize == 1 && etpSize == 1) {
    expertOut = runExperts(perm.tokens, perm.expert_counts);
  } else {
    // 1. Over ep: each member gets the rows of the experts it holds. First
    // every member's row count per local expert, [ep, local].
    at::Tensor arrived = perm.tokens;
    std::vector<int64_t> received = perm.expert_counts;  // [source][local expert]
    std::vector<int64_t> sendSplits, recvSplits;
    if (epSize > 1) {
      ProcessGroup& group = *ep_->ep_group;
      sendSplits.resize(static_cast<size_t>(epSize));
      for (int j = 0; j < epSize; ++j) sendSplits[j] = sum(perm.expert_counts, j * local, (j + 1) * local);
      at::Tensor sendCounts = torch::tensor(perm.expert_counts, at::kLong);
      at::Tensor recvCounts = at::empty_like(sendCounts);
      group.allToAll(recvCounts, sendCounts)->wait();
      received = toVector(recvCounts);
      recvSplits.resize(static_cast<size_t>(epSize));
      for (int j = 0; j < epSize; ++j) recvSplits[j] = sum(received, j * local, (j + 1) * local);
      arrived = allToAllRows(perm.tokens, group, sendSplits, recvSplits, seconds);
    }
    // 2. Over etp: every member computes its share of the features for the
    // rows all members received: they share them (an all-to-all that sends
    // each member the same rows; its backward sums the members' gradients).
    const int64_t mine = arrived.size(0);
    std::vector<int64_t> chunks = received;  // [etp member][source][local expert]
    std::vector<int64_t> memberRows{mine};
    at::Tensor pool = arrived;
    if (etpSize > 1) {
      ProcessGroup& group = *ep_->etp_group;
      at::Tensor mineCounts = torch::tensor(received, at::kLong);
      at::Tensor allCounts = at::empty({etpSize * mineCounts.numel()}, mineCounts.options());
      group.allgather(allCounts, mineCounts)->wait();
      chunks = toVector(allCounts);
      memberRows.assign(static_cast<size_t>(etpSize), 0);
      for (int t = 0; t < etpSize; ++t) memberRows[t] = sum(chunks, t * received.size(), (t + 1) * received.size());
      pool = allToAllRows(arrived.repeat({etpSize, 1}), group, std::vector<int64_t>(etpSize, mine), memberRows,
                          seconds);
    }
    // 3. The chunks (member, source, expert) regrouped by expert.
    std::vector<int64_t> chunkStart(chunks.size());
    std::exclusive_scan(chunks.begin(), chunks.end(), chunkStart.begin(), int64_t{0});
    std::vector<int64_t> order, rowsPerExpert(static_cast<size_t>(local), 0);
    order.reserve(static_cast<size_t>(pool.size(0)));
    const int sources = epSize;
    for (int64_t e = 0; e < local; ++e) {
      for (int t = 0; t < etpSize; ++t) {
        for (int j = 0; j < sources; ++j) {
          const size_t c = static_cast<size_t>((t * sources + j) * local + e);
          for (int64_t r = 0; r < chunks[c]; ++r) order.push_back(chunkStart[c] + r);
          rowsPerExpert[static_cast<size_t>(e)] += chunks[c];
        }
      }
    }
    at::Tensor index = torch::tensor(order, at::kLong).to(x.device());
    at::Tensor computed = runExperts(pool.index_select(0, index), rowsPerExpert);
    at::Tensor back = torch::zeros_like(computed).index_copy(0, index, computed);
    // 4. Over etp: each member's partial outputs of my rows, summed.
    if (etpSize > 1) {
      back = allToAllRows(back, *ep_->etp_group, memberRows, std::vector<int64_t>(etpSize, mine), seconds)
                 .view({etpSize, mine, h})
                 .sum(0);
    }
    // 5. Over ep: back to the ranks the tokens came from.
    expertOut = epSize > 1 ? allToAllRows(back, *ep_->ep_group, recvSplits, sendSplits, seconds) : back;

    if (stats && epSize > 1) {
      const double rowBytes = static_cast<double>(h * x.element_size());
      const int64_t sentAway = perm.tokens.size(0) - sendSplits[static_cast<size_t>(ep_->ep_rank)];
      const int64_t returned = mine - recvSplits[static_cast<size_t>(ep_->ep_rank)];
      // Forward dispatch and combine; backward the same amounts reversed.
      stats->a2a_bytes += 2.0 * rowBytes * static_cast<double>(sentAway + returned);
      stats->a2a_bytes_uniform +=
          4.0 * rowBytes * static_cast<double>(n * config_.topk) * static_cast<double>(epSize - 1) / epSize;
    }
  }
  return unpermuteTokens(expertOut, perm, n).view(input.sizes());
}

}  // namespace ptrain::nn
