// Mixture of experts (Megatron-core's MoE layer), usable by any model.
//
//   tokens x [N, h] (every token of the input, flattened)
//   router:   logits = x W_r^T in float32 (W_r [E, h]); scores by softmax or
//             sigmoid; each token keeps its top-k experts (routeTokens)
//   capacity: optional; an expert over capacity drops its lowest-probability
//             tokens (a dropped token's MLP output is 0: the residual carries it)
//   dispatch: (token, expert) pairs sorted by expert (permuteTokens); under
//             expert parallelism an all-to-all over the ep group sends each
//             expert its tokens (split sizes exchanged first, so uneven); under
//             expert tensor parallelism the etp members then share what they
//             received (an uneven all-gather), and the chunks are regrouped
//             by local expert
//   experts:  the block's MLP per expert, fc1 -> GELU (tanh) -> fc2, as one
//             product per expert over its rows (no loop over tokens); weights
//             stacked along dimension 0, [E, ...], so an ep split is a slice
//   combine:  (etp: each member's partial outputs summed back to the member
//             that contributed the rows, a reduce-scatter) the reverse
//             all-to-all, then each token's outputs weighted by their gates
//             and summed (unpermuteTokens)
//
// Auxiliary losses (training only, Megatron's definitions):
//   load balancing (switch): coeff * E / (N^2 k) * sum_i f_i P_i, f_i the
//     top-k choices of expert i (before capacity), P_i the sum over tokens of
//     its routing probability (softmax over every expert; sigmoid scores
//     normalised per token). Under sequence parallelism each rank holds part
//     of the tokens: f is summed over the sequence group and N counts every
//     rank's tokens, so the ranks' losses add up to the whole sequence's.
//   z-loss: coeff * mean over tokens of logsumexp(logits)^2 (mean over every
//     rank's tokens under sequence parallelism).
// They enter backward the way Megatron's MoEAuxLossAutoScaler does: an
// identity on the router's output whose backward also gives the loss the
// gradient `MoeStepContext::aux_gradient_scale` (the runtime's loss scale /
// the micro-batches of the global batch), so pipeline stages need not carry
// them to the last stage.
//
// Thread-safety: one thread at a time, like every torch module.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/nn/module.h>

#include "ptrain/core/error.h"

namespace ptrain {
class ProcessGroup;
}

namespace ptrain::nn {

struct MoeConfig {
  int64_t num_experts = 0;
  int64_t topk = 2;                        // moe_router_topk
  int64_t hidden_size = 0;
  int64_t ffn_hidden_size = 0;             // each expert's MLP width
  std::string score_function = "softmax";  // moe_router_score_function: softmax or sigmoid
  bool pre_softmax = false;                // moe_router_pre_softmax: softmax over every expert, then top-k
  double aux_loss_coeff = 0;               // moe_aux_loss_coeff
  double z_loss_coeff = 0;                 // moe_z_loss_coeff
  std::optional<double> capacity_factor;   // moe_expert_capacity_factor; nullopt: dropless
  bool pad_to_capacity = false;            // moe_pad_expert_input_to_capacity
  bool fused_bias_gelu = false;            // fusion.bias_gelu in the experts' MLP
  int layer_number = 0;                    // this layer's block, for the per-layer statistics
};

// ---- the parts, as pure functions (the layer is built from them) ----

struct Routing {
  at::Tensor probs;              // [N, E] float32: each dispatched pair's gate, 0 elsewhere
  at::Tensor routing_map;        // [N, E] bool: the (token, expert) pairs dispatched
  at::Tensor tokens_per_expert;  // [E] int64: top-k choices per expert, before capacity
  at::Tensor aux_scores;         // [N, E] float32: what the load-balancing loss averages
};
// Megatron's topk_softmax_with_capacity (drop policy "probs"). `logits`
// [N, E] float32.
PTRAIN_API Routing routeTokens(const at::Tensor& logits, int64_t topk, const std::string& scoreFunction,
                               bool preSoftmax, std::optional<double> capacityFactor, bool padToCapacity);
// Tokens each expert takes: ceil(tokens * topk / experts * factor).
PTRAIN_API int64_t expertCapacity(int64_t tokens, int64_t topk, int64_t experts, double factor);
// The switch load-balancing loss of `auxScores` [N, E] (this rank's tokens)
// given `tokensPerExpert` [E] summed over the `sequenceShards` ranks that
// hold the sequence's tokens.
PTRAIN_API at::Tensor switchLoadBalancingLoss(const at::Tensor& auxScores, const at::Tensor& tokensPerExpert,
                                              int64_t topk, double coeff, int64_t sequenceShards = 1);
// coeff * sum over this rank's tokens of logsumexp^2 / (N * sequenceShards).
PTRAIN_API at::Tensor routerZLoss(const at::Tensor& logits, double coeff, int64_t sequenceShards = 1);

// The dispatched (token, expert) pairs sorted by expert, then token.
struct Permutation {
  at::Tensor tokens;       // [M, h]: the pairs' token rows
  at::Tensor token_index;  // [M] int64: which token each row came from
  at::Tensor gates;        // [M] float32: the pair's probability
  std::vector<int64_t> expert_counts;  // [E]: rows per expert
};
PTRAIN_API Permutation permuteTokens(const at::Tensor& tokens, const at::Tensor& routingMap, const at::Tensor& probs);
// out[t] = sum over the rows r of token t of gates[r] * expertOutput[r]; [N, h].
PTRAIN_API at::Tensor unpermuteTokens(const at::Tensor& expertOutput, const Permutation& permutation, int64_t numTokens);

// ---- the parallel state and the step's figures ----

// Set by the expert plugin (or a test); a layer without one holds every
// expert and routes on its own tokens.
struct PTRAIN_API ExpertParallelState {
  // The ranks that split the experts; null or one rank: every expert here.
  std::shared_ptr<ProcessGroup> ep_group;
  int ep_rank = 0;
  int ep_size = 1;
  // The ranks that split each expert's weights (expert tensor parallelism):
  // fc1 by output features, fc2 by input features, fc2's bias added by
  // member 0 only. Null or one rank: whole experts.
  std::shared_ptr<ProcessGroup> etp_group;
  int etp_rank = 0;
  int etp_size = 1;
  // The ranks holding the other parts of the same sequences (the tensor
  // group under sequence parallelism): the load-balancing loss counts tokens
  // over it. Null: this rank holds whole sequences.
  std::shared_ptr<ProcessGroup> sequence_group;
  int sequence_shards = 1;
};

// Shared by the MoE layers of one model: the aux losses' gradient and what
// the layers counted since reset() (this rank's forward passes in training).
struct PTRAIN_API MoeStepContext {
  explicit MoeStepContext(int numLayers = 0, int64_t numExperts = 0);
  void reset();

  int num_layers = 0;     // blocks of the whole model (a layer writes at its layer_number)
  int64_t num_experts = 0;
  double aux_gradient_scale = 1;  // d(backward's objective) / d(aux loss)
  // Sums over the forward passes: per layer and expert (row-major
  // [num_layers, num_experts]), the top-k choices; per layer, 1 when it ran.
  std::vector<double> tokens_per_expert;
  std::vector<double> layer_ran;
  double aux_loss = 0;       // load-balancing losses (with their coefficient)
  double z_loss = 0;         // z-losses (with their coefficient)
  double routed = 0;         // (token, expert) choices of the top-k
  double dropped = 0;        // choices dropped by capacity
  double a2a_bytes = 0;      // token bytes this rank sent to other ranks (dispatch and combine, forward and backward)
  double a2a_bytes_uniform = 0;  // the same under uniform routing: 4 * choices * h * bytes * (ep - 1) / ep
  double a2a_seconds = 0;    // time in the token all-to-alls
};

// Stacked linear weights of E experts: weight [E, out, in], bias [E, out].
class PTRAIN_API StackedLinearImpl : public torch::nn::Module {
 public:
  StackedLinearImpl(int64_t experts, int64_t in, int64_t out);
  at::Tensor weight, bias;
};
TORCH_MODULE(StackedLinear);

class PTRAIN_API MoeRouterImpl : public torch::nn::Module {
 public:
  MoeRouterImpl(int64_t experts, int64_t hidden);
  at::Tensor weight;  // [E, h]
};
TORCH_MODULE(MoeRouter);

// Parameter names: router.weight, experts.fc1.{weight,bias},
// experts.fc2.{weight,bias}. Under expert parallelism the experts' tensors
// hold this rank's slice of dimension 0, and under expert tensor parallelism
// fc1's weight and bias their slice of the ffn features (dimension 1) and
// fc2's weight its slice of dimension 2 (ExpertParallelState).
class PTRAIN_API MoeLayerImpl : public torch::nn::Module {
 public:
  explicit MoeLayerImpl(const MoeConfig& config);
  // x [..., h] -> [..., h].
  at::Tensor forward(const at::Tensor& x);

  const MoeConfig& config() const { return config_; }
  // Names (relative to this module) of the tensors stacked over experts.
  static std::vector<std::string> expertParameterNames();
  // After the plugin sliced the expert tensors to this rank's experts.
  void setExpertParallel(std::shared_ptr<const ExpertParallelState> state);
  const ExpertParallelState* expertParallel() const { return ep_.get(); }
  void setStepContext(std::shared_ptr<MoeStepContext> context) { context_ = std::move(context); }

  MoeRouter router{nullptr};
  StackedLinear fc1{nullptr}, fc2{nullptr};  // registered under "experts"

 private:
  // The local experts' MLP over rows grouped by expert.
  at::Tensor runExperts(const at::Tensor& rows, const std::vector<int64_t>& rowsPerExpert);

  MoeConfig config_;
  std::shared_ptr<const ExpertParallelState> ep_;
  std::shared_ptr<MoeStepContext> context_;
};
TORCH_MODULE(MoeLayer);

// Forward: all-to-all of dim-0 rows over `group` (inputSplits[j] rows to
// member j, outputSplits[j] rows from it); backward: the reverse all-to-all
// of the gradient. `seconds` (optional) accumulates the time spent.
PTRAIN_API at::Tensor allToAllRows(const at::Tensor& input, ProcessGroup& group, std::vector<int64_t> inputSplits,
                                   std::vector<int64_t> outputSplits, double* seconds = nullptr);

}  // namespace ptrain::nn
