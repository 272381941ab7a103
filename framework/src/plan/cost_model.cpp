#include "ptrain/plan/cost_model.h"

#include <algorithm>
#include <cmath>

namespace ptrain::plan {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

double halfPrecision(const Layout& l) { return l.precision == "bf16" || l.precision == "fp16"; }
double paramBytes(const Layout& l) { return halfPrecision(l) ? 2 : 4; }
double activationBytes(const Layout& l) { return halfPrecision(l) ? 2 : 4; }

// Blocks of the pipeline stage `stage` (an even split, the first stages
// taking the remainder, as the pipeline plugin does without a layout).
int64_t blocksOf(const ModelShape& m, const Layout& l, int64_t stage) {
  const int64_t base = m.num_layers / l.pp, extra = m.num_layers % l.pp;
  return base + (stage < extra ? 1 : 0);
}
int64_t firstBlockOf(const ModelShape& m, const Layout& l, int64_t stage) {
  int64_t first = 0;
  for (int64_t s = 0; s < stage; ++s) first += blocksOf(m, l, s);
  return first;
}

// One block's parameters on one rank.
int64_t blockParameters(const ModelShape& m, const Layout& l, int64_t index) {
  const int64_t h = m.hidden, f = m.ffnSize(), t = l.tp;
  // qkv (column-parallel: weight and bias split), proj (row-parallel: bias
  // whole), two layer norms.
  int64_t n = (3 * h * h + 3 * h) / t + h * h / t + h + 4 * h;
  if (m.isMoeBlock(index)) {
    const int64_t experts = m.num_experts / l.ep, et = l.etp;
    // Router whole; per local expert fc1 [f, h] + bias [f] and fc2 [h, f]
    // split by etp, fc2's bias [h] on every rank's copy.
    n += m.num_experts * h + experts * ((f * h + f) / et + h * f / et + h);
  } else {
    // fc1 column-parallel, fc2 row-parallel.
    n += (f * h + f) / t + h * f / t + h;
  }
  return n;
}

int64_t embeddingParameters(const ModelShape& m, const Layout& l) {
  return m.vocab * m.hidden / l.tp + m.seq * m.hidden;
}
int64_t headParameters(const ModelShape& m, const Layout& l) {
  int64_t n = 2 * m.hidden;  // final layer norm
  if (!m.tied_embeddings) n += m.vocab * m.hidden / l.tp;
  // Tied, under a pipeline: the last stage keeps its own copy of the
  // vocabulary embedding (not the positions).
  else if (l.pp > 1) n += m.vocab * m.hidden / l.tp;
  return n;
}

// Korthikanti et al.'s bytes per block and micro-batch, for 16-bit
// activations, in units of s b h.
double blockActivationUnits(const ModelShape& m, const Layout& l, int64_t index, bool keepCore) {
  const double h = static_cast<double>(m.hidden), a = static_cast<double>(m.heads), s = static_cast<double>(m.seq);
  const double f = static_cast<double>(m.ffnSize()), t = static_cast<double>(l.tp);
  const double k = m.isMoeBlock(index) ? static_cast<double>(m.topk) : 1.0;
  // Attention core: softmax output, its dropout mask and output (5 a s / h).
  const double core = keepCore ? 5 * a * s / h : 0;
  // Whole tensors (layer-norm inputs 4, attention input 2, MLP input 2,
  // two dropout masks 2) and split ones (q, k, v, projection input 8; the
  // MLP's two f-wide tensors, GELU's input and output, 4 f / h, times top-k
  // for experts): 34 with f = 4h, as in the paper.
  const double whole = 10, split = 8 + 4 * f / h * k;
  if (l.tp == 1 || l.sequence_parallel) return (whole + split + core) / t;
  return whole + split / t + core / t;
}

}  // namespace


const std::vector<DeviceSpec>& devicePresets() {
  // Published dense peaks (fp32 without TF32; bf16/fp16 on tensor cores; V100
  // has no bf16, its fp16 rate is given), NVLink bus bandwidth per direction,
  // eager kernel launches of 6-10 us and NCCL's small-message latency,
  // one NIC per GPU (HDR 200 Gb/s for A100, EDR 100 Gb/s for V100, NDR
  // 400 Gb/s for H100/H200), PCIe to the host for offload. The efficiency is
  // the fraction of peak a well-tuned transformer step reaches (Megatron-LM
  // reports 40-55% on A100).
  static const std::vector<DeviceSpec> presets = {
      {"A100-40G", 40, 19.5, 312, 0.5, 300, 25, 25, 8, 1.0, 8, 20},
      {"A100-80G", 80, 19.5, 312, 0.5, 300, 25, 25, 8, 1.0, 8, 20},
      {"V100-16G", 16, 15.7, 125, 0.45, 150, 12.5, 12, 8, 0.8, 10, 25},
      {"V100-32G", 32, 15.7, 125, 0.45, 150, 12.5, 12, 8, 0.8, 10, 25},
      {"H100-80G", 80, 67, 989, 0.45, 450, 50, 50, 8, 1.2, 6, 15},
      {"H200-141G", 140, 67, 989, 0.45, 450, 50, 50, 8, 1.2, 6, 15},
  };
  return presets;
}

const DeviceSpec* findDevicePreset(const std::string& name) {
  for (const auto& d : devicePresets())
    if (d.name == name) return &d;
  return nullptr;
}

const DeviceSpec* presetForCudaDevice(const std::string& name, double memoryGib) {
  // "NVIDIA H100 80GB HBM3" -> H100-80G: the generation in the name, the
  // size the memory is closest to.
  const DeviceSpec* best = nullptr;
  for (const auto& d : devicePresets()) {
    const std::string generation = d.name.substr(0, d.name.find('-'));
    if (name.find(generation) == std::string::npos) continue;
    if (best == nullptr || std::abs(d.memory_gib - memoryGib) < std::abs(best->memory_gib - memoryGib)) best = &d;
  }
  return best;
}

int64_t parameterCount(const ModelShape& m) {
  Layout whole;
  int64_t n = embeddingParameters(m, whole) + 2 * m.hidden + (m.tied_embeddings ? 0 : m.vocab * m.hidden);
  for (int64_t b = 0; b < m.num_layers; ++b) {
    // Every expert of the model: counted at ep = 1.
    n += blockParameters(m, whole, b);
  }
  return n;
}

int64_t parametersOnRank(const ModelShape& m, const Layout& l, int64_t stage) {
  int64_t n = 0;
  if (stage == 0) n += embeddingParameters(m, l);
  if (stage == l.pp - 1) n += headParameters(m, l);
  const int64_t first = firstBlockOf(m, l, stage);
  for (int64_t b = first; b < first + blocksOf(m, l, stage); ++b) n += blockParameters(m, l, b);
  return n;
}

MemoryEstimate estimateMemory(const ModelShape& m, const Layout& l, const DeviceSpec& device, int64_t stage) {
  MemoryEstimate e;
  e.stage = stage;
  const double n = static_cast<double>(parametersOnRank(m, l, stage));
  const int64_t first = firstBlockOf(m, l, stage), blocks = blocksOf(m, l, stage);
  // Offloaded parameters: the embedding and head stay, one block comes in
  // at a time.
  double inBlocks = 0, largestBlock = 0;
  for (int64_t b = first; b < first + blocks; ++b) {
    const double count = static_cast<double>(blockParameters(m, l, b));
    inBlocks += count;
    largestBlock = std::max(largestBlock, count);
  }
  e.params = (l.offload_params ? n - inBlocks + largestBlock : n) * paramBytes(l);
  e.grads = l.offload_grads ? 0 : n * 4;
  // Optimizer: float32 state slots, plus masters for 16-bit parameters.
  const double slots = l.optimizer == "adamw" ? 2 : (l.sgd_momentum ? 1 : 0);
  const double masters = halfPrecision(l) ? 1 : 0;
  if (l.distributed_optimizer) {
    // The rank's ranges: slots, and float32 masters for 16-bit parameters
    // (float32 parameters are their own masters). The reduced gradients are
    // the rank's range of the gradient buffer, which the gradients are views
    // of.
    e.optimizer = n * 4 * (slots + masters) / static_cast<double>(l.dp);
  } else {
    e.optimizer = n * 4 * (slots + masters);
  }
  if (l.offload_optimizer) e.optimizer = 0;

  // Activations of the micro-batches the stage holds at once.
  const int64_t m_ = l.microBatches();
  int64_t inFlight = 1;
  double interleave = 1;
  if (l.pp > 1) {
    if (l.schedule == "gpipe") {
      inFlight = m_;
    } else {
      inFlight = std::min<int64_t>(l.pp - stage, m_);
      if (l.schedule == "interleaved" && l.vpp > 1) {
        interleave = 1 + static_cast<double>(l.pp - 1) / static_cast<double>(l.pp * l.vpp);
      }
    }
  }
  e.in_flight = inFlight;
  const double sbh = static_cast<double>(m.seq) * static_cast<double>(l.micro_batch) * static_cast<double>(m.hidden);
  const double scale = activationBytes(l) / 2;  // the counts are for 16-bit activations
  double perMicroBatch = 0, recomputing = 0;
  for (int64_t b = first; b < first + blocks; ++b) {
    const double full = blockActivationUnits(m, l, b, l.recompute != "selective");
    if (l.recompute == "full") {
      // The block's input (split by sp), and one block recomputing.
      perMicroBatch += 2.0 / (l.sequence_parallel ? static_cast<double>(l.tp) : 1.0);
      recomputing = std::max(recomputing, full);
    } else {
      perMicroBatch += full;
    }
  }
  e.activations = (perMicroBatch * static_cast<double>(inFlight) * interleave + recomputing) * sbh * scale;
  if (stage == l.pp - 1) {
    // Float32 logits and their gradient, this rank's share of the vocabulary.
    e.activations += 2 * 4.0 * static_cast<double>(m.seq) * static_cast<double>(l.micro_batch) *
                     static_cast<double>(m.vocab) / static_cast<double>(l.tp);
  }
  // The gradient buffer (the data plugin's, or the distributed optimizer's):
  // the gradients are views of it, unless offload keeps them elsewhere; then
  // it is a float32 copy of them.
  const bool buffered = l.dp > 1 || l.distributed_optimizer;
  e.buffers = buffered && (l.offload_grads || l.offload_params) ? n * 4 : 0;
  e.reserved = device.reserved_gib * kGiB;
  return e;
}

MemoryEstimate peakMemory(const ModelShape& m, const Layout& l, const DeviceSpec& device) {
  MemoryEstimate first = estimateMemory(m, l, device, 0);
  if (l.pp == 1) return first;
  MemoryEstimate last = estimateMemory(m, l, device, l.pp - 1);
  return last.total() > first.total() ? last : first;
}

TimeEstimate estimateStepTime(const ModelShape& m, const Layout& l, const DeviceSpec& device) {
  TimeEstimate e;
  const double h = static_cast<double>(m.hidden), f = static_cast<double>(m.ffnSize());
  const double s = static_cast<double>(m.seq), V = static_cast<double>(m.vocab);
  const double mbs = static_cast<double>(l.micro_batch);
  const double microBatches = static_cast<double>(l.microBatches());
  // Forward FLOPs of one micro-batch, over the whole model.
  double forward = 0, recomputed = 0;
  for (int64_t b = 0; b < m.num_layers; ++b) {
    const double k = m.isMoeBlock(b) ? static_cast<double>(m.topk) : 1.0;
    const double matmuls = 2 * mbs * s * (4 * h * h + 2 * h * f * k);
    const double core = 4 * mbs * s * s * h;
    forward += matmuls + core;
    if (l.recompute == "full") recomputed += matmuls + core;
    if (l.recompute == "selective") recomputed += core;
  }
  forward += 2 * mbs * s * h * V;
  const double perMicroBatch = 3 * forward + recomputed;
  e.flops = perMicroBatch * microBatches * static_cast<double>(l.dp);
  const double peak = (halfPrecision(l) ? device.peak_tflops_half : device.peak_tflops_fp32) * 1e12;
  const double rate = peak * device.efficiency;
  const double split = static_cast<double>(l.tp * l.pp);
  e.compute = perMicroBatch * microBatches / split / rate;
  const double bubbleShare = l.pp > 1 ? static_cast<double>(l.pp - 1) /
                                            ((l.schedule == "interleaved" ? static_cast<double>(l.vpp) : 1.0) *
                                             microBatches)
                                      : 0;
  e.bubble = e.compute * bubbleShare;

  auto gbps = [&](int64_t span) {
    // A group of `span` consecutive ranks stays inside a node when it fits in one.
    return (span <= device.per_node ? device.intra_node_gbps : device.inter_node_gbps) * 1e9;
  };
  const double actBytes = activationBytes(l);
  const double layersPerStage = static_cast<double>(m.num_layers) / static_cast<double>(l.pp);
  const double bsh = mbs * s * h * actBytes;
  if (l.tp > 1) {
    const double t = static_cast<double>(l.tp);
    e.tp_comm = layersPerStage * microBatches * 4 * 2 * (t - 1) / t * bsh / gbps(l.tp);
  }
  if (l.pp > 1) {
    const double chunks = l.schedule == "interleaved" ? static_cast<double>(l.vpp) : 1.0;
    e.pp_comm = 2 * microBatches * chunks * bsh / (l.sequence_parallel ? static_cast<double>(l.tp) : 1.0) /
                gbps(l.tp * l.pp);
  }
  if (m.num_experts > 0 && l.ep > 1) {
    double moeBlocks = 0;
    for (int64_t b = 0; b < m.num_layers; ++b) moeBlocks += m.isMoeBlock(b) ? 1 : 0;
    const double ep = static_cast<double>(l.ep);
    e.ep_comm = moeBlocks / static_cast<double>(l.pp) * microBatches * 4 * bsh * static_cast<double>(m.topk) *
                (ep - 1) / ep / gbps(l.ep * l.tp);
  }
  if (l.dp > 1) {
    const double d = static_cast<double>(l.dp);
    const double gradBytes = static_cast<double>(parametersOnRank(m, l, 0)) * 4;
    const double wire = 2 * (d - 1) / d * gradBytes / gbps(l.world());
    // Overlapped buckets hide behind the last micro-batch's backward (two
    // thirds of its compute): the data plugin's all-reduce, or the
    // distributed optimizer's reduce-scatter (half the wire); its all-gather
    // (the other half) runs on into the next step's first forward pass (a
    // third of a micro-batch's compute).
    const double hidden = l.overlap_grad_reduce ? 2.0 / 3.0 * e.compute / microBatches : 0;
    const double reduced = l.distributed_optimizer ? wire / 2 : wire;
    const double gathered = wire - reduced;
    const double gatherHidden = 1.0 / 3.0 * e.compute / microBatches;
    e.dp_comm = std::max(reduced - hidden, reduced * 0.1) + std::max(gathered - gatherHidden, gathered * 0.1);
  }
  {
    // Counts on the rank of the first stage (the last adds the head's).
    const double blocks = layersPerStage;
    const double ops = microBatches * (150 * blocks + 100) + 50 * blocks;
    double collectives = 2;
    if (l.tp > 1) collectives += 4 * blocks * microBatches;
    if (l.pp > 1) collectives += 2 * microBatches * (l.schedule == "interleaved" ? static_cast<double>(l.vpp) : 1.0);
    if (m.num_experts > 0 && l.ep > 1) {
      double moeBlocks = 0;
      for (int64_t b = 0; b < m.num_layers; ++b) moeBlocks += m.isMoeBlock(b) ? 1 : 0;
      collectives += 4 * moeBlocks / static_cast<double>(l.pp) * microBatches;
    }
    if (l.dp > 1) {
      const double gradBytes = static_cast<double>(parametersOnRank(m, l, 0)) * 4;
      collectives += std::ceil(gradBytes / (4.0 * (1 << 20))) * (l.distributed_optimizer ? 2 : 1);
    }
    e.latency = ops * device.op_latency_us * 1e-6 + collectives * device.comm_latency_us * 1e-6;
  }
  if (l.offload_params || l.offload_optimizer || l.offload_grads) {
    const double n = static_cast<double>(parametersOnRank(m, l, 0));
    double bytes = 0;
    if (l.offload_params) bytes += 2 * n * paramBytes(l) * microBatches + 2 * n * paramBytes(l);
    if (l.offload_grads) bytes += 2 * n * 4;
    if (l.offload_optimizer) bytes += 2 * n * 4 * (l.optimizer == "adamw" ? 2 : 1);
    e.offload = bytes / (device.offload_gbps * 1e9);
  }
  return e;
}

std::vector<Advice> adviseWhenOverMemory(const ModelShape& m, const Layout& l, const DeviceSpec& device) {
  std::vector<Advice> out;
  const double capacity = device.memory_gib * kGiB;
  Layout next = l;
  auto push = [&](const std::string& text) {
    const double total = peakMemory(m, next, device).total();
    out.push_back(Advice{text, total, total <= capacity});
    return total <= capacity;
  };
  if (peakMemory(m, next, device).total() <= capacity) return out;
  if (!next.offload_params) {
    next.offload_params = true;
    if (push("offload.params=true")) return out;
  }
  while (next.micro_batch > 1) {
    next.micro_batch /= 2;
    if (push("train.micro_batch_size=" + std::to_string(next.micro_batch))) return out;
  }
  for (const char* mode : {"selective", "full"}) {
    if (next.recompute == "full" || (next.recompute == "selective" && std::string(mode) == "selective")) continue;
    next.recompute = mode;
    if (push(std::string("model.recompute=") + mode)) return out;
  }
  // The distributed optimizer keeps its own ranges; it does not run beside
  // an offloaded tier (engine/offload.h refuses the pair).
  if (next.dp > 1 && !next.distributed_optimizer && !next.offload_optimizer && !next.offload_params &&
      !next.offload_grads) {
    next.distributed_optimizer = true;
    if (push("optimizer.distributed=true")) return out;
  }
  if (!next.offload_optimizer && !next.distributed_optimizer) {
    next.offload_optimizer = true;
    if (push("offload.optimizer=true")) return out;
  }
  if (!next.offload_grads) {
    next.offload_grads = true;
    if (push("offload.grads=true")) return out;
  }
  return out;
}

std::vector<Candidate> searchLayouts(const ModelShape& m, const Layout& base, const DeviceSpec& device,
                                     int64_t world, size_t limit) {
  std::vector<Candidate> all;
  const double capacity = device.memory_gib * kGiB;
  // Expert-parallel sizes: the recipe's for a dense model (1), every divisor
  // of the experts that tiles the ranks of a stage for a MoE model.
  auto expertSizes = [&](int64_t pp) {
    std::vector<int64_t> out;
    if (m.num_experts == 0) return std::vector<int64_t>{1};
    for (int64_t ep = 1; ep <= m.num_experts; ++ep) {
      if (m.num_experts % ep == 0 && (world / pp) % (ep * base.etp) == 0) out.push_back(ep);
    }
    return out;
  };
  for (int64_t tp = 1; tp <= world; ++tp) {
    if (world % tp != 0 || m.heads % tp != 0 || m.vocab % tp != 0 || tp > device.per_node) continue;
    for (int64_t pp = 1; pp * tp <= world; ++pp) {
      if ((world / tp) % pp != 0 || m.num_layers % pp != 0) continue;
      const int64_t dp = world / (tp * pp);
      if (base.global_batch % dp != 0) continue;
      const int64_t share = base.global_batch / dp;
      for (int64_t ep : expertSizes(pp)) {
        for (int64_t micro = 1; micro <= share; ++micro) {
          // A pipeline needs at least as many micro-batches as stages to fill
          // (`ptrain check` warns otherwise).
          if (share % micro != 0 || (pp > 1 && share / micro < pp)) continue;
          // The interleaved schedule (two model chunks per stage) where the
          // layers split into them and the micro-batches into groups of pp.
          const bool interleavable = pp > 1 && m.num_layers % (2 * pp) == 0 && (share / micro) % pp == 0;
          for (int64_t vpp = 1; vpp <= (interleavable ? 2 : 1); ++vpp) {
            const bool sp = tp > 1 && m.seq % tp == 0;
            for (const char* recompute : {"none", "selective", "full"}) {
              for (int offload = 0; offload < 2; ++offload) {
                for (int distributed = 0; distributed < (dp > 1 && offload == 0 ? 2 : 1); ++distributed) {
                  Layout l = base;
                  l.tp = tp;
                  l.pp = pp;
                  l.vpp = vpp;
                  l.dp = dp;
                  l.ep = ep;
                  l.sequence_parallel = sp;
                  l.schedule = vpp > 1 ? "interleaved" : "1f1b";
                  l.micro_batch = micro;
                  l.recompute = recompute;
                  l.offload_params = offload != 0;
                  l.offload_grads = l.offload_optimizer = false;
                  l.distributed_optimizer = distributed != 0;
                  Candidate c;
                  c.layout = l;
                  c.memory = peakMemory(m, l, device);
                  c.time = estimateStepTime(m, l, device);
                  c.tokens_per_s = static_cast<double>(l.global_batch * m.seq) / c.time.total();
                  c.fits = c.memory.total() <= capacity;
                  all.push_back(c);
                }
              }
            }
          }
        }
      }
    }
  }
  std::stable_sort(all.begin(), all.end(), [](const Candidate& a, const Candidate& b) {
    if (a.fits != b.fits) return a.fits;
    if (a.fits) return a.tokens_per_s > b.tokens_per_s;
    return a.memory.total() < b.memory.total();
  });
  if (all.size() > limit) all.resize(limit);
  return all;
}

namespace {

// `global` rows in whole multiples of each group's size, near `weights`
// (largest remainders first); empty when they cannot add up to `global`.
std::vector<int64_t> splitByWeight(int64_t global, const std::vector<double>& weights,
                                   const std::vector<int64_t>& units) {
  double total = 0;
  for (double w : weights) total += w;
  std::vector<int64_t> rows(weights.size());
  std::vector<std::pair<double, size_t>> remainders;
  int64_t left = global;
  for (size_t g = 0; g < weights.size(); ++g) {
    const double exact = static_cast<double>(global) * weights[g] / total / static_cast<double>(units[g]);
    const int64_t whole = std::max<int64_t>(1, static_cast<int64_t>(exact));
    rows[g] = whole * units[g];
    left -= rows[g];
    remainders.push_back({exact - static_cast<double>(whole), g});
  }
  std::sort(remainders.rbegin(), remainders.rend());
  for (bool placed = true; left > 0 && placed;) {
    placed = false;
    for (const auto& [fraction, g] : remainders) {
      if (units[g] <= left) {
        rows[g] += units[g];
        left -= units[g];
        placed = true;
        break;
      }
    }
  }
  // Too many rows handed out (every group's minimum) or some left over.
  if (left != 0) return {};
  return rows;
}

// Each group's best layout for its rows; the step takes as long as the slowest.
double planEachGroup(const ModelShape& m, const Layout& base, const std::vector<DeviceGroup>& groups,
                     const std::vector<int64_t>& rows, std::vector<GroupPlan>* out) {
  out->clear();
  double slowest = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    Layout l = base;
    l.global_batch = rows[g];
    const auto best = searchLayouts(m, l, groups[g].device, groups[g].count, 1);
    GroupPlan plan{groups[g], rows[g], {}, false};
    if (!best.empty()) {
      plan.best = best.front();
      plan.found = best.front().fits;
    }
    slowest = plan.found ? std::max(slowest, plan.best.time.total()) : 1e300;
    out->push_back(plan);
  }
  return slowest;
}

}  // namespace

HeterogeneousPlan planHeterogeneous(const ModelShape& m, const Layout& base, const std::vector<DeviceGroup>& groups) {
  PTRAIN_CHECK_AS(ConfigError, !groups.empty(), "a cluster needs at least one group of devices");
  HeterogeneousPlan out;
  std::vector<int64_t> units;
  std::vector<double> counts;
  for (const auto& g : groups) {
    units.push_back(g.count);
    counts.push_back(static_cast<double>(g.count));
  }
  // Even: every device the same rows.
  const auto even = splitByWeight(base.global_batch, counts, units);
  PTRAIN_CHECK_AS(ConfigError, !even.empty(), "global_batch_size=", base.global_batch,
                  " cannot be split in whole multiples of the groups' device counts; use a multiple of the devices");
  out.even_time = planEachGroup(m, base, groups, even, &out.even);
  // Balanced: rows in proportion to each group's rows per second, refined
  // until the slowest group no longer gets faster.
  out.balanced = out.even;
  out.balanced_time = out.even_time;
  std::vector<GroupPlan> current = out.even;
  for (int round = 0; round < 6; ++round) {
    std::vector<double> rates;
    for (const auto& p : current) {
      rates.push_back(p.found ? static_cast<double>(p.rows) / p.best.time.total() : 1e-9);
    }
    const auto rows = splitByWeight(base.global_batch, rates, units);
    if (rows.empty()) break;
    std::vector<GroupPlan> next;
    const double t = planEachGroup(m, base, groups, rows, &next);
    if (t < out.balanced_time) {
      out.balanced = next;
      out.balanced_time = t;
    }
    current = next;
  }
  return out;
}

}  // namespace ptrain::plan
