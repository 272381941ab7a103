// The planner's cost model: what one rank of a layout holds in memory and how
// long a training step takes, for a GPT-shaped transformer on a described
// device, without running anything. `ptrain plan` prints it (docs/planning.md).
//
// Memory per rank (the pipeline's first and last stages, the fullest ones):
//   parameters   the rank's share, counted as ptrain builds the model: each
//                block's weights split by tp (row-parallel biases and layer
//                norms replicated), experts by ep and etp, the vocabulary
//                embedding by tp, positions whole; the first stage holds the
//                embedding, the last the head (and, with tied embeddings
//                under a pipeline, its own copy of the embedding);
//   gradients    4 bytes per parameter (float32 main gradients in bf16/fp16);
//   optimizer    AdamW: two float32 moments, plus float32 masters for bf16 and
//                fp16; SGD with momentum: one; under the distributed optimizer
//                divided by the data-parallel size, plus float32 copies and
//                reduced gradients of the rank's ranges;
//   activations  Korthikanti et al. (2022): per block s b h (34 + 5 a s / h)
//                bytes in 16-bit (general ffn: 11 + 5as/h attention, 3 + 4f/h
//                MLP, 4 layer norms), divided by tp as sequence parallelism
//                allows (10 + (8 + 4f/h) / t without it), the attention core
//                dropped by selective recomputation, only the block's input
//                kept by full recomputation (plus one block recomputing);
//                doubled for float32; times the micro-batches a stage holds
//                at once (1F1B: min(pp, m), interleaved: that times
//                1 + (pp - 1) / (pp vpp), GPipe: m); MoE blocks' MLP part
//                times top-k; the last stage adds its float32 logits;
//   buffers      the data plugin's bucket buffers (one gradient's worth when
//                dp > 1 and the optimizer is not distributed);
//   reserved     what the process holds before any tensor (the device's).
// Offload keeps one block's parameters resident (offload.params), none of the
// gradients (offload.grads) or optimizer state (offload.optimizer).
//
// Time per step: model FLOPs (forward 2 b s (4h^2 + 2hf) + 4 b s^2 h per
// block, MoE MLPs times top-k, the head 2 b s h V; backward twice forward;
// recomputation adds its forward again) over the device's peak times its
// efficiency, split over tp and pp; the pipeline bubble ((pp - 1) / (vpp m)
// of the compute, GPipe (pp - 1) / m); tensor-parallel traffic (four
// all-reduces' worth of b s h per block and micro-batch, 2 (t - 1) / t of it
// on the wire), pipeline sends (b s h per micro-batch and direction), the
// expert all-to-alls (four of b s k h (ep - 1) / ep per MoE block), the
// data-parallel all-reduce of the gradients (2 (d - 1) / d; hidden behind
// the last micro-batch's backward when overlapped), and offload copies, each
// over the link it takes (inside a node, or across nodes once the group
// spans them); and a fixed cost per operator dispatched (about 150 per block
// and micro-batch forward and backward, 100 for the embedding, head and
// loss, 50 per block for the optimizer, counted with log.count_ops) and per
// collective (four per block and micro-batch under tp, two sends per
// micro-batch and chunk under pp, four all-to-alls per MoE block, one per
// gradient bucket of 4 MiB under dp, two per step for the loss and the norm),
// which is what a small model's step is made of.
//
// Thread-safety: pure functions over values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ptrain/core/error.h"
#include "ptrain/layout/model_shape.h"

namespace ptrain::plan {

// One device kind, with its published peak rates.
struct DeviceSpec {
  std::string name;
  double memory_gib = 0;
  double peak_tflops_fp32 = 0;   // dense, no tensor cores (TF32 not assumed)
  double peak_tflops_half = 0;   // dense bf16/fp16 on tensor cores
  double efficiency = 0.5;       // fraction of peak a transformer step reaches
  double intra_node_gbps = 0;    // GB/s per device inside a node (NVLink bus bandwidth)
  double inter_node_gbps = 0;    // GB/s per device across nodes
  double offload_gbps = 0;       // GB/s between the device and its offload tier
  int per_node = 8;
  double reserved_gib = 0;       // held before any tensor (context, libraries)
  // Fixed costs that do not shrink with the work: each operator dispatched
  // (host overhead and kernel launch) and each collective, whatever its size.
  double op_latency_us = 0;
  double comm_latency_us = 0;
};

// A100-40G, A100-80G, V100-16G, V100-32G, H100-80G, H200-141G (and `host`,
// whose rates come from a measurement: hostDevice()).
PTRAIN_API const std::vector<DeviceSpec>& devicePresets();
// Null when there is no preset of that name.
PTRAIN_API const DeviceSpec* findDevicePreset(const std::string& name);
// The preset of a CUDA device by the name and memory it reports (e.g. "NVIDIA
// H100 80GB HBM3", 79.1 -> H100-80G); null for a generation without one.
PTRAIN_API const DeviceSpec* presetForCudaDevice(const std::string& name, double memoryGib);

// Parameters of the whole model, and those one rank of `stage` holds.
PTRAIN_API int64_t parameterCount(const ModelShape& shape);
PTRAIN_API int64_t parametersOnRank(const ModelShape& shape, const Layout& layout, int64_t stage);

// One rank of `stage` (0 .. pp - 1).
PTRAIN_API MemoryEstimate estimateMemory(const ModelShape& shape, const Layout& layout, const DeviceSpec& device,
                                         int64_t stage);
// The fuller of the first and the last stage.
PTRAIN_API MemoryEstimate peakMemory(const ModelShape& shape, const Layout& layout, const DeviceSpec& device);

struct TimeEstimate {
  double compute = 0, bubble = 0, tp_comm = 0, pp_comm = 0, ep_comm = 0, dp_comm = 0, offload = 0;  // seconds
  double latency = 0;  // operators and collectives, by count (DeviceSpec::op_latency_us, comm_latency_us)
  double flops = 0;  // model FLOPs of the step, every rank together
  double total() const { return compute + bubble + tp_comm + pp_comm + ep_comm + dp_comm + offload + latency; }
};

PTRAIN_API TimeEstimate estimateStepTime(const ModelShape& shape, const Layout& layout, const DeviceSpec& device);

// When the layout does not fit `device`: the next steps of the flowchart,
// each a recipe override with the memory it is predicted to leave
// (offload.params=true; then halving train.micro_batch_size; then
// model.recompute=selective, full; then optimizer.distributed=true when
// dp > 1, else offload.optimizer=true; then offload.grads=true), each
// applied on top of the ones before, until one fits. When the last does not
// fit either, the layout needs more devices (tp, pp).
struct Advice {
  std::string override_text;  // e.g. "train.micro_batch_size=2"
  double total_bytes = 0;     // predicted peak per rank with it
  bool fits = false;
};
PTRAIN_API std::vector<Advice> adviseWhenOverMemory(const ModelShape& shape, const Layout& layout,
                                                    const DeviceSpec& device);

// One layout the search considered, with its predictions.
struct Candidate {
  Layout layout;
  MemoryEstimate memory;  // the peak stage's
  TimeEstimate time;
  double tokens_per_s = 0;
  bool fits = false;
};

// Every layout of `world` devices for the model (tp dividing the heads and
// the vocabulary and at most a node; pp dividing the layers; dp the rest;
// micro-batches dividing each data-parallel share of `base.global_batch`,
// at least pp of them under a pipeline;
// the interleaved schedule with two chunks per stage where the layers and
// micro-batches allow; for a MoE model every ep dividing the experts that
// tiles a stage's ranks (etp kept from `base`); sequence parallelism
// whenever tp > 1; recompute none, selective, full;
// parameter offload off and on; the distributed optimizer when dp > 1 and
// nothing is offloaded), with etp, precision and optimizer kept from
// `base`. Those that fit come first, by predicted tokens per second, then the
// rest by memory; at most `limit`.
PTRAIN_API std::vector<Candidate> searchLayouts(const ModelShape& shape, const Layout& base, const DeviceSpec& device,
                                                int64_t world, size_t limit = 10);

// A cluster of several device kinds, e.g. 4 x A100-80G beside 4 x V100-32G.
struct DeviceGroup {
  DeviceSpec device;
  int64_t count = 0;
};

// Each group's own best layout for its rows of the global batch.
struct GroupPlan {
  DeviceGroup group;
  int64_t rows = 0;  // of the global batch
  Candidate best;
  bool found = false;  // some layout of the group's devices holds its rows
};

// The global batch split two ways over the groups, each group planned with
// searchLayouts for its rows: evenly per device, and in proportion to each
// group's predicted rows per second (refined a few rounds, keeping the
// split whose slowest group is fastest). A step takes as long as its
// slowest group; the gain of the balanced split is even_time /
// balanced_time. Rows come in whole multiples of each group's device count.
struct HeterogeneousPlan {
  std::vector<GroupPlan> even, balanced;
  double even_time = 0, balanced_time = 0;  // seconds per step
};
PTRAIN_API HeterogeneousPlan planHeterogeneous(const ModelShape& shape, const Layout& base,
                                               const std::vector<DeviceGroup>& groups);

}  // namespace ptrain::plan
