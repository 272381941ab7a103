// Activation recomputation (Megatron's activation checkpointing).
//
// recomputed(fn, inputs) returns fn(inputs) but keeps only the inputs for
// backward, not the activations inside fn: backward runs fn again, with every
// random number generator (the host's, and the device's in builds with CUDA)
// set back to where the first run started it, so dropout draws the same
// masks, then differentiates the second run. The result and the gradients
// equal those of fn without recomputation; the price is a second forward
// pass of fn during backward.
//
// fn must be a function of `inputs` and the module parameters it reads; the
// collectives it issues (tensor- or expert-parallel) are issued again in
// backward, in the same order on every rank. The first run is under no grad:
// code inside fn that records training-only figures (the MoE layer's) does so
// in the second run, once.
#pragma once

#include <functional>
#include <vector>

#include <ATen/core/Tensor.h>

#include "ptrain/core/error.h"

namespace ptrain::nn {

using RecomputedFunction = std::function<at::Tensor(const std::vector<at::Tensor>& inputs)>;

PTRAIN_API at::Tensor recomputed(RecomputedFunction fn, const std::vector<at::Tensor>& inputs);

}  // namespace ptrain::nn
