// `ptrain plan RECIPE [--cluster FILE | --device NAME]`: the cost model's
// prediction for one rank of the recipe's layout (plan/cost_model.h) and,
// when it does not fit, what to change in the flowchart's order.
#include <unistd.h>

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>

#include <yaml-cpp/yaml.h>

#include "cli/commands.h"
#include "ptrain/core/logging.h"
#include "ptrain/core/device.h"
#include "ptrain/engine/recipe_layout.h"
#include "ptrain/engine/trainer.h"
#include "ptrain/layout/validation.h"
#include "ptrain/plan/cost_model.h"
#include "ptrain/plugin/registry.h"
#include "ptrain/recipe/recipe.h"
#include "ptrain/recipe/schema.h"

namespace ptrain::cli {

bool extendSchemaFromTrainer(const Recipe& recipe, Schema& schema, std::string* whyNot,
                             std::unique_ptr<Plugin>* trainerOut);

namespace {

constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kGiB = 1024.0 * kMiB;

// This machine as a device: its fp32 matrix-multiply rate, measured now
// (1024^3 products on every core for about half a second), its memory, and
// the loopback all-reduce bandwidth of Gloo measured by `ptrain bench-comm`
// (docs/communication.md: 1.2 GB/s bus bandwidth at 4 MiB). ptrain's host
// kernels compute bf16 and fp16 products in float32, so their rate is the
// same; a step without dropout reaches about 85% of the product rate (the large bench GPT:
// docs/performance.md).
plan::DeviceSpec hostDevice(int ranks) {
  // The workers share the machine: each of `ranks` gets its share of what
  // every core together computes. (One thread measured alone would overstate
  // a share where the cores are hyperthreads of fewer physical ones, or
  // share their memory bandwidth, as two ranks on this machine's two cores
  // do: a dp=2 step takes longer than a dp=1 step with two threads.)
  const int cores = static_cast<int>(std::max<long>(1, ::sysconf(_SC_NPROCESSORS_ONLN)));
  const int previousThreads = at::get_num_threads();
  at::set_num_threads(cores);
  const double flops = measureHostMatmulFlops(1024, 0.5);
  at::set_num_threads(previousThreads);
  plan::DeviceSpec d;
  d.name = "host";
  d.peak_tflops_fp32 = flops / 1e12 / std::max(1, ranks);
  d.peak_tflops_half = d.peak_tflops_fp32;
  d.efficiency = 0.85;
  d.memory_gib = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGESIZE)) / kGiB;
  d.intra_node_gbps = 1.2;
  d.inter_node_gbps = 1.2;
  d.offload_gbps = 8.0;  // the disk tier's pages in the page cache: memory copies
  d.per_node = cores;
  d.reserved_gib = 170 * kMiB / kGiB;  // a worker before its model: libraries, allocator, communicator
  // A step of the quickstart (607 operators on tensors of a few KB) takes
  // about 50 ms on one thread here: dispatch, autograd and allocation, not
  // arithmetic. A Gloo collective of a few KB over loopback takes 40-230 us
  // (docs/communication.md).
  d.op_latency_us = 60;
  d.comm_latency_us = 100;
  return d;
}

std::string presetNames() {
  std::string names;
  for (const auto& p : plan::devicePresets()) names += (names.empty() ? "" : ", ") + p.name;
  return names;
}

// A cluster file: groups of devices, each a preset by name or a full
// description, e.g.
//   groups:
//     - {device: A100-80G, count: 4}
//     - {device: V100-32G, count: 4}
std::vector<plan::DeviceGroup> groupsFromCluster(const std::string& path) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    throw ConfigError(path + ": cluster file not found");
  } catch (const YAML::Exception& e) {
    throw ConfigError(path + ":" + std::to_string(e.mark.line + 1) + ":" + std::to_string(e.mark.column + 1) +
                      ": YAML syntax error: " + e.msg);
  }
  auto where = [&](const YAML::Node& n) {
    return path + ":" + std::to_string(n.Mark().line + 1) + ":" + std::to_string(n.Mark().column + 1) + ": ";
  };
  const YAML::Node groups = root["groups"];
  if (!groups || !groups.IsSequence() || groups.size() == 0) {
    throw ConfigError(path + ": groups: expected a list of device groups, e.g. [{device: A100-80G, count: 8}]");
  }
  std::vector<plan::DeviceGroup> out;
  for (const YAML::Node& g : groups) {
    const YAML::Node device = g["device"];
    plan::DeviceSpec d;
    if (device && device.IsScalar()) {
      const std::string name = device.as<std::string>();
      const plan::DeviceSpec* preset = plan::findDevicePreset(name);
      if (preset == nullptr) {
        throw ConfigError(where(device) + "device: '" + name + "' is not a preset; use one of " + presetNames() +
                          ", or describe it (memory_gib, peak_tflops_fp32, peak_tflops_half, ...)");
      }
      d = *preset;
    } else if (device && device.IsMap()) {
      auto number = [&](const char* key, double fallback) {
        const YAML::Node n = device[key];
        if (!n) return fallback;
        try {
          return n.as<double>();
        } catch (const YAML::Exception&) {
          throw ConfigError(where(n) + "device." + key + ": expected a number, got '" + n.as<std::string>() + "'");
        }
      };
      d.name = device["name"] ? device["name"].as<std::string>() : "custom";
      d.memory_gib = number("memory_gib", 0);
      d.peak_tflops_fp32 = number("peak_tflops_fp32", 0);
      d.peak_tflops_half = number("peak_tflops_half", d.peak_tflops_fp32);
      d.efficiency = number("efficiency", 0.5);
      d.intra_node_gbps = number("intra_node_gbps", 100);
      d.inter_node_gbps = number("inter_node_gbps", 12.5);
      d.offload_gbps = number("offload_gbps", 12);
      d.per_node = static_cast<int>(number("per_node", 8));
      d.reserved_gib = number("reserved_gib", 1);
      d.op_latency_us = number("op_latency_us", 10);
      d.comm_latency_us = number("comm_latency_us", 20);
      if (d.memory_gib <= 0 || d.peak_tflops_fp32 <= 0) {
        throw ConfigError(where(device) + "device: memory_gib and peak_tflops_fp32 must be above 0");
      }
    } else {
      throw ConfigError(where(g) + "device: missing; name a preset (e.g. A100-80G) or describe the device");
    }
    try {
      if (g["per_node"]) d.per_node = g["per_node"].as<int>();
      const int64_t count = g["count"] ? g["count"].as<int64_t>() : 0;
      if (count < 1) throw ConfigError(where(g) + "count: expected the group's number of devices (1 or more)");
      out.push_back({d, count});
    } catch (const YAML::Exception&) {
      throw ConfigError(where(g) + "count and per_node: expected whole numbers");
    }
  }
  return out;
}

std::string mib(double bytes) {
  char buf[32];
  if (bytes >= kGiB) std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / kGiB);
  else std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / kMiB);
  return buf;
}

std::string seconds(double s) {
  char buf[32];
  if (s >= 1) std::snprintf(buf, sizeof buf, "%.3f s", s);
  else std::snprintf(buf, sizeof buf, "%.2f ms", s * 1e3);
  return buf;
}

// The best layouts of the world for the model, beside the recipe's own.
int printSearch(const plan::ModelShape& m, const plan::Layout& mine, const plan::DeviceSpec& device) {
  const auto candidates = plan::searchLayouts(m, mine, device, mine.world(), 10);
  const double capacity = device.memory_gib * kGiB;
  std::printf("best layouts of %lld x %s, by predicted tokens/s within memory (memory: the fullest rank):\n",
              static_cast<long long>(mine.world()), device.name.c_str());
  std::printf("  %2s %3s %3s %3s %6s %-10s %-8s %-9s %12s %6s %10s %10s\n", "#", "tp", "pp", "dp", "micro",
              "recompute", "offload", "dist-opt", "memory", "used", "step", "tokens/s");
  int rank = 0;
  for (const auto& c : candidates) {
    const plan::Layout& l = c.layout;
    std::printf("  %2d %3lld %3lld %3lld %6lld %-10s %-8s %-9s %12s %5.0f%% %10s %10.0f%s\n", ++rank,
                static_cast<long long>(l.tp), static_cast<long long>(l.pp), static_cast<long long>(l.dp),
                static_cast<long long>(l.micro_batch), l.recompute.c_str(), l.offload_params ? "params" : "-",
                l.distributed_optimizer ? "yes" : "-", mib(c.memory.total()).c_str(),
                100 * c.memory.total() / capacity, seconds(c.time.total()).c_str(), c.tokens_per_s,
                c.fits ? "" : "  does not fit");
  }
  const auto mineMemory = plan::peakMemory(m, mine, device);
  const auto mineTime = plan::estimateStepTime(m, mine, device);
  std::printf("the recipe's layout (tp %lld, pp %lld, dp %lld, micro-batch %lld): %s, %.0f%% of memory, %.0f "
              "tokens/s%s\n",
              static_cast<long long>(mine.tp), static_cast<long long>(mine.pp), static_cast<long long>(mine.dp),
              static_cast<long long>(mine.micro_batch), mib(mineMemory.total()).c_str(),
              100 * mineMemory.total() / capacity,
              static_cast<double>(mine.global_batch * m.seq) / mineTime.total(),
              mineMemory.total() <= capacity ? "" : ", does not fit");
  return candidates.empty() || !candidates.front().fits ? 2 : 0;
}

// The model's shape from the recipe's trainer, after its setup (which may
// derive sizes, e.g. the llm trainer's sequence length from its data).
plan::ModelShape shapeFromTrainer(Plugin& trainerPlugin, const Recipe& recipe, const std::string& fix) {
  auto& trainer = static_cast<Trainer&>(trainerPlugin);
  trainer.setup(recipe);
  const auto shape = trainer.modelShape();
  if (!shape) {
    throw ConfigError(recipe.location("trainer.name").str() + ": trainer '" + recipe.getString("trainer.name") +
                      "' does not describe its model's shape to the planner" + fix);
  }
  return *shape;
}

std::string layoutText(const plan::Layout& l) {
  std::string text = "tp " + std::to_string(l.tp) + " pp " + std::to_string(l.pp);
  if (l.vpp > 1) text += " vpp " + std::to_string(l.vpp);
  text += " dp " + std::to_string(l.dp);
  if (l.ep > 1) text += " ep " + std::to_string(l.ep);
  text += " micro " + std::to_string(l.micro_batch);
  if (l.recompute != "none") text += ", recompute " + l.recompute;
  if (l.offload_params) text += ", offload params";
  if (l.distributed_optimizer) text += ", distributed optimizer";
  return text;
}

// Several device kinds: each group's own layout for its rows, the batch
// split evenly and by the groups' predicted speed, and how to run the split.
int printHeterogeneous(const std::string& recipePath, const plan::ModelShape& m, const plan::Layout& base,
                       const std::vector<plan::DeviceGroup>& groups) {
  std::string names;
  int64_t devices = 0;
  for (const auto& g : groups) {
    names += (names.empty() ? "" : " + ") + std::to_string(g.count) + " x " + g.device.name;
    devices += g.count;
  }
  std::printf("cluster: %s; global batch %lld rows of %lld tokens, %s\n\n", names.c_str(),
              static_cast<long long>(base.global_batch), static_cast<long long>(m.seq), base.precision.c_str());
  const plan::HeterogeneousPlan hp = plan::planHeterogeneous(m, base, groups);
  std::printf("  %-10s %-18s %6s  %-52s %12s %10s\n", "split", "group", "rows", "the group's best layout", "memory",
              "step");
  auto print = [&](const char* name, const std::vector<plan::GroupPlan>& split, double time) {
    bool first = true;
    for (const auto& p : split) {
      const std::string group = std::to_string(p.group.count) + " x " + p.group.device.name;
      std::printf("  %-10s %-18s %6lld  %-52s %12s %10s\n", first ? name : "", group.c_str(),
                  static_cast<long long>(p.rows), p.found ? layoutText(p.best.layout).c_str() : "(nothing fits)",
                  p.found ? mib(p.best.memory.total()).c_str() : "-", p.found ? seconds(p.best.time.total()).c_str() : "-");
      first = false;
    }
    std::printf("  %-10s %-18s %6s  %-52s %12s %10s\n", "", "step (slowest)", "", "", "",
                time < 1e299 ? seconds(time).c_str() : "-");
  };
  print("even", hp.even, hp.even_time);
  print("by speed", hp.balanced, hp.balanced_time);
  for (const auto& p : hp.balanced) {
    if (!p.found) {
      std::printf("\n%d x %s holds no layout of the model for %lld rows: add devices to the group or plan it "
                  "without that group\n", static_cast<int>(p.group.count), p.group.device.name.c_str(),
                  static_cast<long long>(p.rows));
      return 2;
    }
  }
  std::printf("\npredicted gain of the split by speed over the even split: %.2fx (%.0f vs %.0f tokens/s)\n",
              hp.even_time / hp.balanced_time, static_cast<double>(base.global_batch * m.seq) / hp.balanced_time,
              static_cast<double>(base.global_batch * m.seq) / hp.even_time);

  // ptrain runs one model-parallel layout per job; uneven rows per
  // data-parallel rank it runs (parallel.data_parallel_shares).
  const plan::Layout& first = hp.balanced.front().best.layout;
  bool common = first.pp == 1;
  int64_t micro = 0;
  for (const auto& p : hp.balanced) {
    common = common && p.best.layout.tp == first.tp && p.best.layout.pp == first.pp && p.best.layout.ep == first.ep;
    micro = std::gcd(micro, p.best.layout.micro_batch);
  }
  if (common) {
    std::string shares;
    for (const auto& p : hp.balanced) {
      for (int64_t r = 0; r < p.best.layout.dp; ++r) {
        shares += (shares.empty() ? "" : ",") + std::to_string(p.rows / p.best.layout.dp);
      }
    }
    std::printf("to run it (ranks numbered group by group, as listed): ptrain run %s --nproc %lld "
                "parallel.tensor_model_parallel_size=%lld train.micro_batch_size=%lld "
                "parallel.data_parallel_shares=[%s]\n",
                recipePath.c_str(), static_cast<long long>(devices), static_cast<long long>(first.tp),
                static_cast<long long>(micro),
                shares.c_str());
  } else {
    std::printf("the groups' best layouts differ in tp, pp or ep, or use a pipeline: "
                "run them as device groups of one job (ranks numbered group by group, as listed)\n");
  }
  // The same split as device groups, each in its own layout: the recipe
  // section that runs it (docs/planning.md, "Device groups").
  std::printf("\nparallel.groups for the split by speed (ptrain run %s --nproc %lld, with this in the recipe):\n",
              recipePath.c_str(), static_cast<long long>(devices));
  std::printf("parallel:\n  groups:\n");
  const char* strongest = "none";
  bool distributed = false;
  std::vector<std::string> notes;
  for (const auto& p : hp.balanced) {
    const plan::Layout& l = p.best.layout;
    std::string name = p.group.device.name;
    std::replace(name.begin(), name.end(), ' ', '_');
    // A group whose plan interleaves runs the interleaved schedule on its own.
    const std::string chunks = l.vpp > 1 ? ", virtual_pipeline_model_parallel_size: " + std::to_string(l.vpp) : "";
    const std::string experts = l.ep > 1 ? ", expert_model_parallel_size: " + std::to_string(l.ep) : "";
    std::printf("    - {name: %s, ranks: %lld, tensor_model_parallel_size: %lld, pipeline_model_parallel_size: %lld%s%s, "
                "micro_batch_size: %lld, share: %lld}\n",
                name.c_str(), static_cast<long long>(p.group.count), static_cast<long long>(l.tp),
                static_cast<long long>(l.pp), chunks.c_str(), experts.c_str(), static_cast<long long>(l.micro_batch),
                static_cast<long long>(p.rows));
    if (l.recompute == "full" || (l.recompute == "selective" && std::string(strongest) == "none"))
      strongest = l.recompute == "full" ? "full" : "selective";
    distributed = distributed || l.distributed_optimizer;
    if (l.offload_params) notes.push_back(name + "'s plan offloads parameters: offload.params is the job's, set it for every group");
  }
  if (std::string(strongest) != "none") {
    std::printf("model:\n  recompute: %s   # the job's: the strongest any group's plan needs\n", strongest);
  }
  if (distributed) {
    std::printf("optimizer:\n  distributed: true   # the job's: a group's plan shards the optimizer\n");
  }
  for (const auto& n : notes) std::printf("# %s\n", n.c_str());
  return 0;
}

}  // namespace

plan::DeviceSpec resolvePlanDevice(const std::string& cluster, const std::string& device, int64_t* clusterCount,
                                   int hostRanks) {
  *clusterCount = 0;
  if (!cluster.empty()) {
    const auto groups = groupsFromCluster(cluster);
    if (groups.size() > 1) {
      throw ConfigError(cluster + ": " + std::to_string(groups.size()) + " groups of devices: a layout is sized for "
                        "one device kind; `ptrain plan --cluster " + cluster + "` plans each group and splits the batch");
    }
    *clusterCount = groups.front().count;
    return groups.front().device;
  }
  if (!device.empty() && device != "host") {
    const plan::DeviceSpec* preset = plan::findDevicePreset(device);
    if (preset == nullptr) {
      throw ConfigError("--device: '" + device + "' is not a preset; use host or one of " + presetNames());
    }
    return *preset;
  }
  return hostDevice(hostRanks);
}

plan::Layout planLayoutOf(const Recipe& recipe, const LayoutPlan& sized) {
  plan::Layout layout;
  layout.tp = sized.sizes.tp;
  layout.pp = sized.sizes.pp;
  layout.vpp = sized.sizes.vpp;
  layout.cp = sized.sizes.cp;
  layout.dp = sized.dp;
  layout.ep = sized.sizes.ep;
  layout.etp = sized.sizes.etp;
  layout.sequence_parallel = recipe.getBool("parallel.sequence_parallel");
  layout.schedule = recipe.getString("parallel.pipeline_schedule");
  layout.micro_batch = sized.micro_batch_size;
  layout.global_batch = sized.global_batch_size;
  if (recipe.has("model.recompute")) layout.recompute = recipe.getString("model.recompute");
  layout.precision = recipe.getString("precision.name");
  layout.optimizer = recipe.getString("optimizer.name");
  layout.sgd_momentum = recipe.getFloat("optimizer.momentum") > 0;
  layout.distributed_optimizer = recipe.getBool("optimizer.distributed");
  layout.overlap_grad_reduce = recipe.getBool("parallel.overlap_grad_reduce");
  layout.offload_params = recipe.getBool("offload.params");
  layout.offload_grads = recipe.getBool("offload.grads");
  layout.offload_optimizer = recipe.getBool("offload.optimizer");
  return layout;
}

std::string memoryText(double bytes) { return mib(bytes); }

namespace {

// The preset of a GPU from its name and memory ("NVIDIA A100-SXM4-80GB").
const plan::DeviceSpec* presetOfGpu(const std::string& name, double memoryGib) {
  auto has = [&](const char* part) { return name.find(part) != std::string::npos; };
  if (has("H200")) return plan::findDevicePreset("H200-141G");
  if (has("H100")) return plan::findDevicePreset("H100-80G");
  if (has("A100")) return plan::findDevicePreset(memoryGib > 48 ? "A100-80G" : "A100-40G");
  if (has("V100")) return plan::findDevicePreset(memoryGib > 20 ? "V100-32G" : "V100-16G");
  return nullptr;
}

}  // namespace

std::vector<std::string> autoLayoutOverrides(const std::string& path, const std::vector<std::string>& overrides,
                                             int world, int nnodes, std::string* summary) {
  Recipe recipe = Recipe::load(path, overrides);
  if (!writesAutoLayout(recipe)) return {};
  const SourceLocation where = recipe.location("parallel");
  recipe.set("parallel", "null");
  Schema schema;
  describeCoreKeys(schema);
  std::string whyNot;
  std::unique_ptr<Plugin> trainerPlugin;
  if (!extendSchemaFromTrainer(recipe, schema, &whyNot, &trainerPlugin)) {
    throw ConfigError(where.str() + ": parallel: auto asks the trainer for its model's shape, and there is none to "
                      "ask (" + whyNot + ")");
  }
  recipe.validate(schema);
  if (world <= 0) world = static_cast<int>(recipe.getInt("launch.nproc"));
  const auto shape = shapeFromTrainer(*trainerPlugin, recipe, "; parallel: auto needs it: write the layout under "
                                                             "parallel");

  plan::DeviceSpec device;
  const std::string requested = recipe.getString("device.type");
  if (requested == "cuda" || (requested == "auto" && cudaDeviceCount() > 0)) {
    const std::string gpu = cudaDeviceName(0);
    const plan::DeviceSpec* preset = presetOfGpu(gpu, cudaDeviceMemoryGib(0));
    if (preset == nullptr) {
      throw ConfigError(where.str() + ": parallel: auto has no preset for the GPU '" + gpu +
                        "'; write the layout under parallel (`ptrain plan --search --cluster FILE` with the GPU "
                        "described in FILE ranks them)");
    }
    device = *preset;
  } else {
    if (nnodes > 1) {
      throw ConfigError(where.str() + ": parallel: auto on " + std::to_string(nnodes) + " nodes of cpus: each node "
                        "would measure its own machine and might choose another layout; write the layout under "
                        "parallel (`ptrain plan --search` on one node ranks them)");
    }
    device = hostDevice(world);
  }

  LayoutPlan sized;
  sized.global_batch_size = recipe.getInt("train.global_batch_size");
  sized.micro_batch_size = 1;
  const plan::Layout base = planLayoutOf(recipe, sized);
  const auto best = plan::searchLayouts(shape, base, device, world, 1);
  if (best.empty() || !best.front().fits) {
    throw ConfigError(where.str() + ": parallel: auto: no layout of " + std::to_string(world) + " x " + device.name +
                      " holds the model" +
                      (best.empty() ? std::string(" (global_batch_size splits over none of them)")
                                    : " (the leanest needs " + mib(best.front().memory.total()) + " per rank)") +
                      ": use more processes (--nproc), or see `ptrain plan --search`");
  }
  const plan::Layout& l = best.front().layout;
  auto flag = [](bool b) { return std::string(b ? "true" : "false"); };
  std::vector<std::string> out = {
      "parallel=null",
      "parallel.tensor_model_parallel_size=" + std::to_string(l.tp),
      "parallel.pipeline_model_parallel_size=" + std::to_string(l.pp),
      "parallel.virtual_pipeline_model_parallel_size=" + std::to_string(l.vpp),
      "parallel.pipeline_schedule=" + l.schedule,
      "parallel.sequence_parallel=" + flag(l.sequence_parallel),
      "train.micro_batch_size=" + std::to_string(l.micro_batch),
      "model.recompute=" + l.recompute,
      "offload.params=" + flag(l.offload_params),
      "optimizer.distributed=" + flag(l.distributed_optimizer),
  };
  if (shape.num_experts > 0) out.push_back("parallel.expert_model_parallel_size=" + std::to_string(l.ep));
  char line[256];
  std::snprintf(line, sizeof line, "parallel: auto chose %s on %d x %s: %s per rank, %.0f tokens/s predicted",
                layoutText(l).c_str(), world, device.name.c_str(), mib(best.front().memory.total()).c_str(),
                best.front().tokens_per_s);
  *summary = line;
  return out;
}

// The memory table of `ptrain plan`: one column per stage (the first and,
// under a pipeline, the last), then the peak against the device.
void printMemoryTable(const std::vector<plan::MemoryEstimate>& stages, const plan::MemoryEstimate& peak,
                      double capacity) {
  std::printf("memory per rank          %s\n", stages.size() > 1 ? "first stage     last stage" : "");
  auto row = [&](const char* name, double plan::MemoryEstimate::*field) {
    std::printf("  %-22s", name);
    for (const auto& e : stages) std::printf(" %-15s", mib(e.*field).c_str());
    std::printf("\n");
  };
  row("parameters", &plan::MemoryEstimate::params);
  row("gradients", &plan::MemoryEstimate::grads);
  row("optimizer states", &plan::MemoryEstimate::optimizer);
  row("activations", &plan::MemoryEstimate::activations);
  row("communication buffers", &plan::MemoryEstimate::buffers);
  row("reserved", &plan::MemoryEstimate::reserved);
  std::printf("  %-22s", "total");
  for (const auto& e : stages) std::printf(" %-15s", mib(e.total()).c_str());
  std::printf("\n  %-22s", "micro-batches held");
  for (const auto& e : stages) std::printf(" %-15lld", static_cast<long long>(e.in_flight));
  std::printf("\n  %s of %s (%.0f%%): %s\n", mib(peak.total()).c_str(), mib(capacity).c_str(),
              100 * peak.total() / capacity, peak.total() <= capacity ? "fits" : "does NOT fit");
}

// `ptrain plan` for a trainer that counts its own memory per stage
// (Trainer::stageMemory): the memory table and whether it fits, or its JSON.
int printTrainerMemory(const PlanArgs& args, const std::string& trainerName, const Trainer& trainer,
                       const plan::Layout& layout, const plan::DeviceSpec& device, plan::MemoryEstimate first) {
  std::vector<plan::MemoryEstimate> stages{first};
  if (layout.pp > 1) stages.push_back(*trainer.stageMemory(layout, layout.pp - 1));
  for (auto& e : stages) e.reserved = device.reserved_gib * kGiB;
  const plan::MemoryEstimate& peak =
      stages.size() > 1 && stages[1].total() > stages[0].total() ? stages[1] : stages[0];
  const double capacity = device.memory_gib * kGiB;
  if (args.json) {
    // The first and the last stage (the stages between hold no tables).
    std::string perStage;
    for (const auto& e : stages) perStage += (perStage.empty() ? "" : ", ") + std::to_string(static_cast<int64_t>(e.total()));
    std::printf("{\"device\": \"%s\", \"memory_bytes\": %.0f, \"memory_capacity_bytes\": %.0f, \"params_bytes\": %.0f, "
                "\"grads_bytes\": %.0f, \"optimizer_bytes\": %.0f, \"activations_bytes\": %.0f, \"buffers_bytes\": %.0f, "
                "\"reserved_bytes\": %.0f, \"stage\": %lld, \"stage_memory_bytes\": [%s]}\n",
                device.name.c_str(), peak.total(), capacity, peak.params, peak.grads, peak.optimizer, peak.activations,
                peak.buffers, peak.reserved, static_cast<long long>(peak.stage), perStage.c_str());
    return 0;
  }
  std::printf("%s: trainer %s (memory as the trainer counts it; no step time: not a GPT-shaped model)\n",
              args.recipe.c_str(), trainerName.c_str());
  std::printf("layout: world=%lld tp=%lld pp=%lld dp=%lld ep=%lld, micro-batch %lld, %lld micro-batches per step, %s\n",
              static_cast<long long>(layout.world()), static_cast<long long>(layout.tp),
              static_cast<long long>(layout.pp), static_cast<long long>(layout.dp), static_cast<long long>(layout.ep),
              static_cast<long long>(layout.micro_batch), static_cast<long long>(layout.microBatches()),
              layout.precision.c_str());
  std::printf("device: %s, %.1f GiB\n\n", device.name.c_str(), device.memory_gib);
  printMemoryTable(stages, peak, capacity);
  return peak.total() <= capacity ? 0 : 2;
}

int cmdPlan(const PlanArgs& args) {
  Recipe recipe = Recipe::load(args.recipe, args.overrides);
  Schema schema;
  describeCoreKeys(schema);
  std::string whyNot;
  std::unique_ptr<Plugin> trainerPlugin;
  if (!extendSchemaFromTrainer(recipe, schema, &whyNot, &trainerPlugin)) {
    throw ConfigError(recipe.location("trainer.name").str() + ": trainer.name: ptrain plan asks the trainer for its "
                      "model's shape, and there is none to ask (" + whyNot + ")");
  }
  recipe.validate(schema);

  if (!args.cluster.empty()) {
    const auto groups = groupsFromCluster(args.cluster);
    if (groups.size() > 1) {
      const plan::ModelShape shape = shapeFromTrainer(*trainerPlugin, recipe, "");
      LayoutPlan sized;
      sized.global_batch_size = recipe.getInt("train.global_batch_size");
      sized.micro_batch_size = 1;
      return printHeterogeneous(args.recipe, shape, planLayoutOf(recipe, sized), groups);
    }
  }
  int64_t clusterCount = 0;
  const plan::DeviceSpec device =
      resolvePlanDevice(args.cluster, args.device, &clusterCount,
                        args.nproc > 0 ? args.nproc : static_cast<int>(recipe.getInt("launch.nproc")));
  const int world = args.nproc > 0 ? args.nproc
                    : clusterCount > 0 ? static_cast<int>(clusterCount)
                                       : static_cast<int>(recipe.getInt("launch.nproc"));
  const LayoutRequest request = layoutRequestFromRecipe(recipe, world);
  const auto problems = checkLayout(request);
  if (!problems.empty()) {
    std::string text;
    for (const auto& p : problems) text += (text.empty() ? "" : "\n") + p;
    throw ConfigError(text);
  }
  const plan::Layout layout = planLayoutOf(recipe, planLayout(request));
  {
    // A model that is not GPT-shaped: the trainer's own count of what a rank
    // holds, memory only.
    auto& trainer = static_cast<Trainer&>(*trainerPlugin);
    trainer.setup(recipe);
    if (!trainer.modelShape()) {
      if (auto first = trainer.stageMemory(layout, 0)) {
        return printTrainerMemory(args, recipe.getString("trainer.name"), trainer, layout, device, *first);
      }
    }
  }
  const plan::ModelShape m = shapeFromTrainer(*trainerPlugin, recipe, "");

  if (args.json) {
    const plan::MemoryEstimate peak = plan::peakMemory(m, layout, device);
    const plan::TimeEstimate t = plan::estimateStepTime(m, layout, device);
    std::printf("{\"device\": \"%s\", \"memory_bytes\": %.0f, \"memory_capacity_bytes\": %.0f, \"params_bytes\": %.0f, "
                "\"grads_bytes\": %.0f, \"optimizer_bytes\": %.0f, \"activations_bytes\": %.0f, \"buffers_bytes\": %.0f, "
                "\"reserved_bytes\": %.0f, \"step_s\": %.6g, \"compute_s\": %.6g, \"bubble_s\": %.6g, \"tp_comm_s\": %.6g, "
                "\"pp_comm_s\": %.6g, \"ep_comm_s\": %.6g, \"dp_comm_s\": %.6g, \"offload_s\": %.6g, \"latency_s\": %.6g}\n",
                device.name.c_str(), peak.total(), device.memory_gib * kGiB, peak.params, peak.grads, peak.optimizer,
                peak.activations, peak.buffers, peak.reserved, t.total(), t.compute, t.bubble, t.tp_comm, t.pp_comm,
                t.ep_comm, t.dp_comm, t.offload, t.latency);
    return 0;
  }
  std::printf("%s: %s, %lld layers, hidden %lld, %lld heads, ffn %lld, sequence %lld, vocabulary %lld%s: %.2f M "
              "parameters\n",
              args.recipe.c_str(), m.name.c_str(), static_cast<long long>(m.num_layers),
              static_cast<long long>(m.hidden), static_cast<long long>(m.heads), static_cast<long long>(m.ffnSize()),
              static_cast<long long>(m.seq), static_cast<long long>(m.vocab),
              m.num_experts > 0 ? (", " + std::to_string(m.num_experts) + " experts").c_str() : "",
              static_cast<double>(plan::parameterCount(m)) / 1e6);
  std::printf("layout: world=%lld tp=%lld pp=%lld dp=%lld ep=%lld%s, micro-batch %lld, %lld micro-batches per step, "
              "%s, recompute %s%s%s\n",
              static_cast<long long>(layout.world()), static_cast<long long>(layout.tp),
              static_cast<long long>(layout.pp), static_cast<long long>(layout.dp), static_cast<long long>(layout.ep),
              layout.sequence_parallel ? " sp" : "", static_cast<long long>(layout.micro_batch),
              static_cast<long long>(layout.microBatches()), layout.precision.c_str(), layout.recompute.c_str(),
              layout.distributed_optimizer ? ", distributed optimizer" : "",
              layout.offload_params || layout.offload_grads || layout.offload_optimizer ? ", offload" : "");
  std::printf("device: %s, %.1f GiB, %.1f TFLOP/s fp32, %.1f TFLOP/s bf16/fp16, %.0f%% of peak, %.1f GB/s in a node, "
              "%.1f GB/s across%s\n\n",
              device.name.c_str(), device.memory_gib, device.peak_tflops_fp32, device.peak_tflops_half,
              100 * device.efficiency, device.intra_node_gbps, device.inter_node_gbps,
              device.name == "host" ? " (products measured now)" : "");

  if (args.search) return printSearch(m, layout, device);

  std::vector<plan::MemoryEstimate> stages{plan::estimateMemory(m, layout, device, 0)};
  if (layout.pp > 1) stages.push_back(plan::estimateMemory(m, layout, device, layout.pp - 1));
  const plan::MemoryEstimate peak = plan::peakMemory(m, layout, device);
  const double capacity = device.memory_gib * kGiB;
  printMemoryTable(stages, peak, capacity);
  std::printf("\n");

  const plan::TimeEstimate t = plan::estimateStepTime(m, layout, device);
  std::printf("time per step\n");
  const std::pair<const char*, double> parts[] = {
      {"compute", t.compute},   {"pipeline bubble", t.bubble}, {"tensor-parallel comm", t.tp_comm},
      {"pipeline sends", t.pp_comm}, {"expert all-to-all", t.ep_comm}, {"data-parallel comm", t.dp_comm},
      {"offload copies", t.offload}, {"fixed costs", t.latency}};
  for (const auto& [name, value] : parts)
    if (value > 0 || std::string(name) == "compute") std::printf("  %-22s %s\n", name, seconds(value).c_str());
  const double tokens = static_cast<double>(layout.global_batch) * static_cast<double>(m.seq);
  std::printf("  %-22s %s, %.0f tokens/s\n", "total", seconds(t.total()).c_str(), tokens / t.total());

  if (peak.total() > capacity) {
    std::printf("\nto fit (the diagnosis flowchart's order, each on top of the ones before):\n");
    const auto advice = plan::adviseWhenOverMemory(m, layout, device);
    for (const auto& a : advice) {
      std::printf("  %-32s %s%s\n", a.override_text.c_str(), mib(a.total_bytes).c_str(), a.fits ? "  fits" : "");
    }
    if (advice.empty() || !advice.back().fits) {
      std::printf("  (still over: split the model over more devices, "
                  "parallel.tensor_model_parallel_size or pipeline_model_parallel_size, with --nproc to match)\n");
    }
    return 2;
  }
  return 0;
}

}  // namespace ptrain::cli
