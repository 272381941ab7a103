// The words a trainer and the planner share about a model's size: its shape
// (a GPT-shaped transformer), a layout with its memory levers, and what one
// rank of a pipeline stage holds. Trainer::modelShape() and
// Trainer::stageMemory() answer in them; the layout checks (`ptrain check`,
// `ptrain run`) read the shape, and the planner (plan/cost_model.h) sizes
// layouts with them. They live in the layout part, below the engine, so that
// the trainer interface does not depend on the planner.
//
// Thread-safety: plain values.
#pragma once

#include <cstdint>
#include <string>

#include "ptrain/core/error.h"

namespace ptrain::plan {

// A GPT-shaped transformer (a trainer describes its model with
// Trainer::modelShape()).
struct ModelShape {
  std::string name = "gpt";
  int64_t num_layers = 0;
  int64_t hidden = 0;
  int64_t heads = 0;
  int64_t ffn = 0;          // 0: 4 * hidden
  int64_t seq = 0;
  int64_t vocab = 0;        // rows of the embedding (padded)
  bool tied_embeddings = true;
  int64_t num_experts = 0;  // 0: dense
  int64_t topk = 2;
  int64_t moe_layer_freq = 1;  // blocks 0, freq, 2 freq, ... are MoE

  int64_t ffnSize() const { return ffn > 0 ? ffn : 4 * hidden; }
  bool isMoeBlock(int64_t index) const { return num_experts > 0 && index % (moe_layer_freq > 0 ? moe_layer_freq : 1) == 0; }
};

// What a plan decides: the parallel layout and the memory levers.
struct PTRAIN_API Layout {
  int64_t tp = 1, pp = 1, vpp = 1, dp = 1, cp = 1, ep = 1, etp = 1;
  bool sequence_parallel = false;
  std::string schedule = "1f1b";   // 1f1b, interleaved, gpipe
  int64_t micro_batch = 1;
  int64_t global_batch = 1;
  std::string recompute = "none";  // none, selective, full
  std::string precision = "fp32";  // fp32, bf16, fp16
  std::string optimizer = "adamw"; // adamw, sgd
  bool sgd_momentum = false;
  bool distributed_optimizer = false;
  bool overlap_grad_reduce = true;
  bool offload_params = false, offload_grads = false, offload_optimizer = false;

  int64_t world() const { return tp * pp * cp * dp; }
  int64_t microBatches() const;  // per step and data-parallel rank
};

// What one rank of pipeline stage `stage` holds, in bytes.
struct MemoryEstimate {
  int64_t stage = 0;
  int64_t in_flight = 1;  // micro-batches whose activations the stage holds at once
  double params = 0, grads = 0, optimizer = 0, activations = 0, buffers = 0, reserved = 0;  // bytes
  double total() const { return params + grads + optimizer + activations + buffers + reserved; }
};

}  // namespace ptrain::plan
