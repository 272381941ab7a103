#include "ptrain/layout/validation.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "ptrain/core/text.h"
#include "ptrain/pipeline/schedule.h"

namespace ptrain {
namespace {

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> low, high;
  for (int64_t d = 1; d * d <= n; ++d) {
    if (n % d != 0) continue;
    low.push_back(d);
    if (d != n / d) high.push_back(n / d);
  }
  low.insert(low.end(), high.rbegin(), high.rend());
  return low;
}

// "8 or 12": the multiples of `step` on either side of `n` (only the upper
// one when the lower would be 0).
std::string nearMultiples(int64_t n, int64_t step) {
  int64_t lo = (n / step) * step;
  int64_t hi = lo + step;
  if (lo <= 0) return std::to_string(hi);
  return std::to_string(lo) + " or " + std::to_string(hi);
}

std::string list(const std::vector<int64_t>& v) { return text::joinOr(v); }

// The request's sizes, with 0 for model sizes it leaves unset, and where
// each message points.
struct Values {
  const LayoutRequest& q;
  int64_t world;
  int64_t tp, pp, vpp, cp, ep, etp;
  bool sequenceParallel;
  std::string schedule;

  explicit Values(const LayoutRequest& request)
      : q(request),
        world(request.world),
        tp(request.tp),
        pp(request.pp),
        vpp(request.vpp),
        cp(request.cp),
        ep(request.ep),
        etp(request.etp),
        sequenceParallel(request.sequence_parallel),
        schedule(request.pipeline_schedule) {}

  static int64_t model(const std::optional<int64_t>& size) { return size.value_or(0); }

  bool isWritten(const std::string& key) const { return q.written.count(key) > 0; }

  // "<where the key is>: ", or nothing when the request cannot say.
  std::string written(const std::string& key) const { return q.where ? q.where(key) + ": " : ""; }

  // Location of the key to blame: the first of `keys` written by the user,
  // else where the first one would go.
  std::string at(std::initializer_list<const char*> keys) const {
    for (const char* k : keys) {
      if (isWritten(k)) return written(k);
    }
    return written(*keys.begin());
  }
};

const char* kTp = "parallel.tensor_model_parallel_size";
const char* kPp = "parallel.pipeline_model_parallel_size";
const char* kVpp = "parallel.virtual_pipeline_model_parallel_size";
const char* kCp = "parallel.context_parallel_size";
const char* kEp = "parallel.expert_model_parallel_size";
const char* kEtp = "parallel.expert_tensor_parallel_size";
const char* kSp = "parallel.sequence_parallel";
const char* kSchedule = "parallel.pipeline_schedule";
const char* kLayout = "parallel.pipeline_layout";
const char* kLayers = "model.num_layers";
const char* kHeads = "model.num_attention_heads";
const char* kHidden = "model.hidden_size";
const char* kFfn = "model.ffn_hidden_size";
const char* kExperts = "model.num_experts";
const char* kTopk = "model.moe_router_topk";
const char* kSeq = "model.seq_length";
const char* kGlobal = "train.global_batch_size";
const char* kMicro = "train.micro_batch_size";
const char* kShares = "parallel.data_parallel_shares";

std::string worldMessage(int64_t world, const std::string& names, int64_t product) {
  return "world size " + std::to_string(world) + " is not divisible by " + names + "=" + std::to_string(product) +
         ": use --nproc " + nearMultiples(world, product) + ", or sizes whose product divides " +
         std::to_string(world) + " (" + list(divisors(world)) + ")";
}

// Blame the sizes that are not 1, the user's first.
std::string blameGrid(const Values& v, std::vector<std::pair<const char*, int64_t>> sizes) {
  for (const auto& [k, n] : sizes) {
    if (n > 1 && v.isWritten(k)) return v.written(k);
  }
  for (const auto& [k, n] : sizes) {
    if (n > 1) return v.written(k);
  }
  return v.written(sizes.front().first);
}

bool denseGridFits(const Values& v) { return v.world % (v.tp * v.pp * v.cp) == 0; }

std::string shareList(const std::vector<double>& shares) {
  std::string out;
  for (double s : shares) out += (out.empty() ? "" : ", ") + text::formatNumber(s);
  return "[" + out + "]";
}

// Whole micro-batches for each rank as near to its share as they come
// (largest remainders first), as rows: a fix to suggest.
std::string nearestWholeShares(int64_t global, int64_t micro, const std::vector<double>& shares) {
  const int64_t micros = global / micro;
  double total = 0;
  for (double s : shares) total += s;
  std::vector<int64_t> counts(shares.size());
  std::vector<std::pair<double, size_t>> remainders;
  int64_t given = 0;
  for (size_t i = 0; i < shares.size(); ++i) {
    const double exact = static_cast<double>(micros) * shares[i] / total;
    counts[i] = std::max<int64_t>(1, static_cast<int64_t>(exact));
    given += counts[i];
    remainders.push_back({exact - static_cast<double>(counts[i]), i});
  }
  std::sort(remainders.rbegin(), remainders.rend());
  for (size_t k = 0; given < micros && k < remainders.size(); ++k, ++given) ++counts[remainders[k].second];
  std::string out;
  for (int64_t c : counts) out += (out.empty() ? "" : ", ") + std::to_string(c * micro);
  return "[" + out + "]";
}

// The data-parallel shares' problems (at most one).
std::optional<std::string> sharesProblem(const LayoutRequest& request, const Values& v, int64_t dp) {
  auto n = [](int64_t x) { return std::to_string(x); };
  const auto& shares = request.data_parallel_shares;
  const int64_t global = request.global_batch_size;
  if (static_cast<int64_t>(shares.size()) != dp) {
    return v.at({kShares}) + "data_parallel_shares has " + n(static_cast<int64_t>(shares.size())) +
           " entries but the data-parallel size is dp=" + n(dp) + ": give one share per data-parallel rank";
  }
  for (double s : shares) {
    if (!(s > 0)) {
      return v.at({kShares}) + "data_parallel_shares " + shareList(shares) +
             ": every share must be above 0 (each rank takes global_batch_size * share / sum of shares rows)";
    }
  }
  if (!request.micro_batch_size) {
    return v.at({kShares}) + "data_parallel_shares needs train.micro_batch_size: the ranks take different numbers "
           "of micro-batches of one size; set it to a divisor of every rank's rows";
  }
  const int64_t micro = *request.micro_batch_size;
  const auto rows = dataParallelRows(global, dp, shares);
  bool whole = rows.has_value();
  if (whole) {
    for (int64_t r : *rows) whole = whole && r % micro == 0;
  }
  if (!whole) {
    return v.at({kShares, kGlobal}) + "global_batch_size=" + n(global) + " does not split by data_parallel_shares " +
           shareList(shares) + " into whole micro-batches of " + n(micro) + " rows on every rank: use shares " +
           (global % micro == 0 && global / micro >= dp ? nearestWholeShares(global, micro, shares)
                                                         : "that are whole multiples of micro_batch_size") +
           " (rows per rank)";
  }
  if (Values::model(request.num_experts) > 0 && v.ep > 1) {
    return v.at({kShares, kEp}) + "data_parallel_shares cannot be uneven with expert_model_parallel_size=" + n(v.ep) +
           ": expert parallelism exchanges tokens between data-parallel ranks in every micro-batch, so all must "
           "run the same number; remove data_parallel_shares, or set expert_model_parallel_size to 1";
  }
  if (v.pp > 1 && v.vpp > 1 && v.schedule == "interleaved") {
    for (size_t i = 0; i < rows->size(); ++i) {
      const int64_t m = (*rows)[i] / micro;
      if (m % v.pp != 0) {
        return v.at({kShares, kSchedule}) + "the interleaved schedule needs every data-parallel rank's micro-batches "
               "to be a multiple of pipeline_model_parallel_size=" + n(v.pp) + ", but rank " + n(static_cast<int64_t>(i)) +
               " takes " + n(m) + ": use shares in whole multiples of " + n(micro * v.pp) + " rows, or pipeline_schedule 1f1b";
      }
    }
  }
  return std::nullopt;
}

// "where: text" -> "where: parallel.groups[i] (name): text".
std::string inGroup(std::string line, size_t index, const std::string& name) {
  // A group's world is its ranks: say so in the layout's own messages.
  if (line.find("world size ") != std::string::npos) {
    for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
             {"world size ", "the group's "}, {" is not divisible by ", " ranks are not divisible by "},
             {": use --nproc ", ": give it ranks: "}}) {
      const size_t at = line.find(from);
      if (at != std::string::npos) line.replace(at, from.size(), to);
    }
  }
  // Its global batch is its rows of the job's; a pipeline_layout is not
  // a group's to give (refused beside groups).
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"global_batch_size=", "the group's rows of global_batch_size="},
           {"use global_batch_size ", "use shares that give it "},
           {", or give parallel.pipeline_layout", ""}}) {
    const size_t at = line.find(from);
    if (at != std::string::npos) line.replace(at, from.size(), to);
  }
  const std::string tag = "parallel.groups[" + std::to_string(index) + "] (" + name + "): ";
  const size_t cut = line.find(": ");
  if (cut == std::string::npos) return tag + line;
  return line.substr(0, cut + 2) + tag + line.substr(cut + 2);
}

std::string groupName(const LayoutRequest::Group& g, size_t index) {
  return g.name.empty() ? "group" + std::to_string(index) : g.name;
}

std::vector<double> groupShares(const LayoutRequest& request) {
  std::vector<double> shares;
  for (const auto& g : request.groups) shares.push_back(g.share > 0 ? g.share : static_cast<double>(g.ranks));
  return shares;
}

std::vector<std::string> checkGroups(const LayoutRequest& request) {
  std::vector<std::string> out = request.group_problems;
  if (!out.empty()) return out;
  const Values v(request);
  auto n = [](int64_t x) { return std::to_string(x); };
  const char* kGroups = "parallel.groups";
  // Each group names its own; a job-wide one would be a second, silent answer.
  for (const char* key : {kTp, kPp, kVpp, kCp, kEp, kEtp, kShares, kLayout}) {
    if (!v.isWritten(key)) continue;
    out.push_back(v.written(key) + key + " is set with parallel.groups, where each group has its own layout: " +
                  "move it into the groups' entries (tensor_model_parallel_size, pipeline_model_parallel_size, "
                  "micro_batch_size, share), or remove it");
  }
  int64_t ranks = 0;
  for (const auto& g : request.groups) ranks += g.ranks;
  if (ranks != request.world) {
    out.push_back(v.at({kGroups}) + "the device groups have " + n(ranks) + " ranks in all, the job " +
                  n(request.world) + ": run with --nproc " + n(ranks) + " (launch.nproc), or change the groups' ranks");
  }
  const auto shares = groupShares(request);
  const auto rows = dataParallelRows(request.global_batch_size, static_cast<int64_t>(shares.size()), shares);
  if (!rows) {
    std::string list;
    for (double s : shares) list += (list.empty() ? "" : ", ") + text::formatNumber(s);
    out.push_back(v.at({kGroups, kGlobal}) + "global_batch_size=" + n(request.global_batch_size) +
                  " does not split by the device groups' shares [" + list +
                  "] into whole rows: make global_batch_size a multiple of the shares' sum, or change the shares");
    return out;
  }
  for (size_t i = 0; i < request.groups.size(); ++i) {
    const LayoutRequest group = groupRequest(request, i);
    std::vector<std::string> lines = checkLayout(group);
    // The MoE rule engine/moe_settings.cpp checks for the job's tp, here for each group's.
    if (Values::model(request.num_experts) > 0 && group.tp > 1 && !request.sequence_parallel) {
      lines.push_back(Values(group).at({kTp}) + "tensor_model_parallel_size=" + n(group.tp) +
                      " with a MoE model needs sequence parallelism (each tensor rank routes its own sequence shard, "
                      "as in Megatron-LM); set parallel.sequence_parallel: true");
    }
    for (const auto& line : lines) out.push_back(inGroup(line, i, groupName(request.groups[i], i)));
  }
  return out;
}

}  // namespace

LayoutRequest groupRequest(const LayoutRequest& request, size_t index) {
  const LayoutRequest::Group& g = request.groups.at(index);
  LayoutRequest q = request;
  q.groups.clear();
  q.group_problems.clear();
  q.data_parallel_shares.clear();
  q.world = g.ranks;
  q.tp = g.tp;
  q.pp = g.pp;
  // A group with chunks interleaves; the job's pipeline_schedule is for the
  // groups without (the pipeline plugin runs the same rule).
  q.vpp = g.vpp;
  if (g.vpp > 1) q.pipeline_schedule = "interleaved";
  q.cp = 1;
  // Megatron's default expert tensor parallelism is the group's tp (for an
  // expert model; a dense one has no expert grid).
  q.ep = g.ep;
  q.etp = g.etp ? *g.etp : (request.num_experts.value_or(0) > 0 ? g.tp : 1);
  if (g.micro_batch_size) q.micro_batch_size = g.micro_batch_size;
  const auto shares = groupShares(request);
  const auto rows = dataParallelRows(request.global_batch_size, static_cast<int64_t>(shares.size()), shares);
  q.global_batch_size = rows ? (*rows)[index] : 0;
  // The group's own sizes are written at its entry.
  const std::string entry = g.where;
  auto outer = request.where;
  for (const char* key : {kTp, kPp, kVpp, kEp, kEtp, kMicro}) q.written.insert(key);
  q.where = [entry, outer](const std::string& key) {
    if (!entry.empty() && (key == kTp || key == kPp || key == kVpp || key == kEp || key == kEtp || key == kMicro ||
                           key == kGlobal)) {
      return entry;
    }
    return outer ? outer(key) : entry;
  };
  return q;
}

DeviceGroups deviceGroupsOf(const LayoutRequest& request) {
  std::vector<DeviceGroup> groups;
  const auto shares = groupShares(request);
  for (size_t i = 0; i < request.groups.size(); ++i) {
    const auto& g = request.groups[i];
    DeviceGroup d;
    d.name = groupName(g, i);
    d.sizes.world = static_cast<int>(g.ranks);
    d.sizes.tp = static_cast<int>(g.tp);
    d.sizes.pp = static_cast<int>(g.pp);
    d.sizes.vpp = static_cast<int>(g.vpp);
    // As planLayout: a dense model has no expert grid.
    const bool moe = request.num_experts.value_or(0) > 0;
    d.sizes.ep = moe ? static_cast<int>(g.ep) : 1;
    d.sizes.etp = moe ? static_cast<int>(g.etp ? *g.etp : g.tp) : 1;
    d.micro_batch_size = g.micro_batch_size ? g.micro_batch_size : request.micro_batch_size;
    d.share = shares[i];
    d.where = g.where;
    groups.push_back(std::move(d));
  }
  return DeviceGroups(std::move(groups));
}

std::vector<std::string> checkLayout(const LayoutRequest& request) {
  if (!request.groups.empty() || !request.group_problems.empty()) return checkGroups(request);
  std::vector<std::string> out;
  const Values v(request);
  if (request.world < 1) {
    out.push_back(v.written("launch.nproc") + "world size " + std::to_string(request.world) +
                  " is not valid: use --nproc 1 or more");
    return out;
  }
  auto n = [](int64_t x) { return std::to_string(x); };

  // The dense grid tp x cp x dp x pp must tile the world.
  const int64_t dense = v.tp * v.pp * v.cp;
  const bool denseOk = denseGridFits(v);
  if (!denseOk) {
    out.push_back(blameGrid(v, {{kTp, v.tp}, {kPp, v.pp}, {kCp, v.cp}}) +
                  worldMessage(v.world, "tensor_model_parallel_size*pipeline_model_parallel_size*context_parallel_size",
                               dense));
  }

  // The expert grid etp x ep x edp x pp over the same ranks (MoE only).
  const int64_t experts = Values::model(request.num_experts);
  if (experts > 0 && v.ep * v.etp > 1) {
    const int64_t grid = v.etp * v.ep * v.pp;
    if (v.world % grid != 0) {
      out.push_back(blameGrid(v, {{kEtp, v.etp}, {kEp, v.ep}, {kPp, v.pp}}) +
                    worldMessage(v.world,
                                 "expert_tensor_parallel_size*expert_model_parallel_size*pipeline_model_parallel_size",
                                 grid));
    }
  }

  // Interleaving needs model chunks, and model chunks need the interleaved schedule.
  if (v.vpp > 1 && v.pp == 1) {
    out.push_back(v.at({kVpp}) + "virtual_pipeline_model_parallel_size=" + n(v.vpp) +
                  " needs pipeline_model_parallel_size > 1: set pipeline_model_parallel_size to 2 or more, "
                  "or virtual_pipeline_model_parallel_size to 1");
  } else if (v.vpp > 1 && v.schedule != "interleaved") {
    out.push_back(v.at({kVpp, kSchedule}) + "virtual_pipeline_model_parallel_size=" + n(v.vpp) +
                  " needs pipeline_schedule=interleaved, not " + v.schedule +
                  ": set pipeline_schedule to interleaved, or virtual_pipeline_model_parallel_size to 1");
  }
  if (v.schedule == "interleaved" && v.vpp == 1) {
    out.push_back(v.at({kSchedule}) +
                  "pipeline_schedule=interleaved needs virtual_pipeline_model_parallel_size > 1: set it to 2 or "
                  "more, or use pipeline_schedule 1f1b");
  }

  // Blocks per stage.
  const int64_t layers = Values::model(request.num_layers);
  const int64_t stages = v.pp * v.vpp;
  const std::string stageNames = v.vpp > 1 ? "pipeline_model_parallel_size*virtual_pipeline_model_parallel_size"
                                           : "pipeline_model_parallel_size";
  if (request.pipeline_layout) {
    const std::vector<int64_t>& layout = *request.pipeline_layout;
    int64_t sum = 0;
    for (int64_t b : layout) sum += b;
    if (static_cast<int64_t>(layout.size()) != stages) {
      out.push_back(v.at({kLayout}) + "pipeline_layout has " + n(static_cast<int64_t>(layout.size())) +
                    (layout.size() == 1 ? " entry but " : " entries but ") + stageNames + "=" + n(stages) + ": give " +
                    (stages == 1 ? std::string("1 entry") : n(stages) + " entries") + ", one per stage");
    } else if (layers > 0 && sum != layers) {
      out.push_back(v.at({kLayout}) + "pipeline_layout sums to " + n(sum) + " but num_layers=" + n(layers) +
                    ": make the entries add up to " + n(layers));
    }
  } else if (layers > 0 && layers % stages != 0) {
    if (v.vpp > 1) {
      out.push_back(v.at({kPp, kVpp, kLayers}) + stageNames + "=" + n(stages) + " does not divide num_layers=" +
                    n(layers) + ": use sizes whose product is " + list(divisors(layers)) +
                    ", or give parallel.pipeline_layout");
    } else {
      out.push_back(v.at({kPp, kLayers}) + "pipeline_model_parallel_size=" + n(v.pp) + " does not divide num_layers=" +
                    n(layers) + ": use " + list(divisors(layers)) + ", or give parallel.pipeline_layout");
    }
  }

  // Tensor parallelism splits heads and the MLP; heads split the hidden size.
  const int64_t heads = Values::model(request.num_attention_heads);
  const int64_t hidden = Values::model(request.hidden_size);
  if (heads > 0 && heads % v.tp != 0) {
    out.push_back(v.at({kTp, kHeads}) + "tensor_model_parallel_size=" + n(v.tp) +
                  " does not divide num_attention_heads=" + n(heads) + ": use " + list(divisors(heads)));
  }
  if (heads > 0 && hidden > 0 && hidden % heads != 0) {
    out.push_back(v.at({kHeads, kHidden}) + "num_attention_heads=" + n(heads) + " does not divide hidden_size=" +
                  n(hidden) + ": use " + list(divisors(hidden)));
  }
  // With heads that split across tp and divide hidden, hidden splits too;
  // checked on its own only for models without attention heads.
  if (heads == 0 && hidden > 0 && hidden % v.tp != 0) {
    out.push_back(v.at({kTp, kHidden}) + "tensor_model_parallel_size=" + n(v.tp) + " does not divide hidden_size=" +
                  n(hidden) + ": use " + list(divisors(hidden)));
  }
  const int64_t ffnSet = Values::model(request.ffn_hidden_size);
  const int64_t ffn = ffnSet > 0 ? ffnSet : 4 * hidden;
  if (ffn > 0 && ffn % v.tp != 0) {
    out.push_back((ffnSet > 0 ? v.at({kTp, kFfn}) : v.at({kTp, kHidden})) + "tensor_model_parallel_size=" + n(v.tp) +
                  " does not divide ffn_hidden_size=" + n(ffn) + (ffnSet > 0 ? "" : " (4*hidden_size)") + ": use " +
                  list(divisors(ffn)));
  }

  // Experts.
  if (experts == 0 && v.ep > 1) {
    out.push_back(v.at({kEp}) + "expert_model_parallel_size=" + n(v.ep) +
                  " needs a MoE model, but num_experts=0: set model.num_experts to a multiple of " + n(v.ep) +
                  ", or expert_model_parallel_size to 1");
  }
  if (experts > 0 && experts % v.ep != 0) {
    out.push_back(v.at({kEp, kExperts}) + "expert_model_parallel_size=" + n(v.ep) + " does not divide num_experts=" +
                  n(experts) + ": use " + list(divisors(experts)));
  }
  if (experts > 0 && request.moe_router_topk) {
    const int64_t topk = *request.moe_router_topk;
    if (topk > experts) {
      out.push_back(v.at({kTopk, kExperts}) + "moe_router_topk=" + n(topk) + " exceeds num_experts=" + n(experts) +
                    ": use at most " + n(experts));
    }
  }

  // The global batch splits into micro-batches on every data-parallel rank.
  const bool shared = !request.data_parallel_shares.empty();
  if (denseOk && shared) {
    if (auto problem = sharesProblem(request, v, v.world / dense)) out.push_back(*problem);
  }
  if (denseOk && !shared) {
    const int64_t dp = v.world / dense;
    const int64_t global = request.global_batch_size;
    if (request.micro_batch_size) {
      const int64_t micro = *request.micro_batch_size;
      if (global % (micro * dp) != 0) {
        std::string fix = "use global_batch_size " + nearMultiples(global, micro * dp);
        if (global % dp == 0) fix += ", or micro_batch_size " + list(divisors(global / dp));
        out.push_back(v.at({kGlobal, kMicro}) + "global_batch_size=" + n(global) +
                      " is not divisible by micro_batch_size*dp=" + n(micro * dp) + " (micro_batch_size=" + n(micro) +
                      ", dp=" + n(dp) + "): " + fix);
      }
    } else if (global % dp != 0) {
      out.push_back(v.at({kGlobal}) + "global_batch_size=" + n(global) + " is not divisible by data-parallel size dp=" +
                    n(dp) + ", so micro_batch_size (not set) cannot default to global_batch_size/dp: use "
                    "global_batch_size " + nearMultiples(global, dp));
    }
  }

  // Megatron's interleaved schedule runs micro-batches in groups of pp.
  if (denseOk && !shared && v.pp > 1 && v.vpp > 1 && v.schedule == "interleaved") {
    const int64_t dp = v.world / dense;
    const int64_t global = request.global_batch_size;
    const int64_t micro = request.micro_batch_size ? *request.micro_batch_size : (global % dp == 0 ? global / dp : 0);
    if (micro > 0 && global % (micro * dp) == 0) {
      const int64_t m = global / (micro * dp);
      if (m % v.pp != 0) {
        out.push_back(v.at({kMicro, kGlobal, kSchedule}) + "the interleaved schedule needs the micro-batches per step (" +
                      n(m) + " = global_batch_size / (micro_batch_size*dp)) to be a multiple of "
                      "pipeline_model_parallel_size=" + n(v.pp) + ": use global_batch_size " +
                      nearMultiples(global, micro * dp * v.pp) + ", or pipeline_schedule 1f1b");
      }
    }
  }

  // Context parallelism splits the sequence; sequence parallelism splits each
  // context chunk again across the tensor-parallel group.
  const int64_t seq = Values::model(request.seq_length);
  bool seqOk = true;
  if (seq > 0 && v.cp > 1 && seq % v.cp != 0) {
    seqOk = false;
    out.push_back(v.at({kCp, kSeq}) + "context_parallel_size=" + n(v.cp) + " does not divide seq_length=" + n(seq) +
                  ": use seq_length " + nearMultiples(seq, v.cp) + ", or context_parallel_size " +
                  list(divisors(seq)));
  }
  if (seqOk && seq > 0 && v.sequenceParallel && v.tp > 1 && seq % (v.tp * v.cp) != 0) {
    const std::string names = v.cp > 1 ? "tensor_model_parallel_size*context_parallel_size"
                                       : "tensor_model_parallel_size";
    out.push_back(v.at({kSp}) + "sequence_parallel needs seq_length=" + n(seq) + " divisible by " + names + "=" +
                  n(v.tp * v.cp) + ": use seq_length " + nearMultiples(seq, v.tp * v.cp) +
                  ", or set sequence_parallel to false");
  }
  return out;
}

std::vector<std::string> layoutWarnings(const LayoutRequest& request) {
  std::vector<std::string> out;
  if (request.world < 1) return out;
  if (!request.groups.empty()) {
    if (!checkLayout(request).empty()) return out;
    bool anyTensorParallel = false;
    for (const auto& g : request.groups) anyTensorParallel = anyTensorParallel || g.tp > 1;
    for (size_t i = 0; i < request.groups.size(); ++i) {
      LayoutRequest group = groupRequest(request, i);
      // The job's sequence parallelism serves the groups with tp > 1; a
      // group without tensor parallelism has nothing to split, and loses nothing.
      if (anyTensorParallel && group.tp == 1) group.sequence_parallel = false;
      for (const auto& line : layoutWarnings(group)) {
        out.push_back(inGroup(line, i, groupName(request.groups[i], i)));
      }
    }
    return out;
  }
  const Values v(request);
  if (v.sequenceParallel && v.tp == 1) {
    out.push_back(v.at({kSp}) + "sequence_parallel has no effect with tensor_model_parallel_size=1; it is ignored");
  }
  const int64_t experts = Values::model(request.num_experts);
  if (experts == 0 && v.etp > 1) {
    out.push_back(v.at({kEtp}) + "expert_tensor_parallel_size=" + std::to_string(v.etp) +
                  " has no effect on a dense model (num_experts=0); it is ignored");
  }
  if (v.pp > 1 && checkLayout(request).empty()) {
    LayoutPlan plan = planLayout(request);
    if (plan.micro_batches < v.pp) {
      const auto kind = pipeline::scheduleFromName(v.schedule);
      const double bubble = pipeline::bubbleFormula(kind, static_cast<int>(v.pp), static_cast<int>(v.vpp),
                                                    static_cast<int>(plan.micro_batches));
      char figure[32];
      std::snprintf(figure, sizeof figure, "%.0f%%", 100.0 * bubble / (1.0 + bubble));
      out.push_back(v.at({kMicro, kGlobal}) + "only " + std::to_string(plan.micro_batches) +
                    (plan.micro_batches == 1 ? " micro-batch" : " micro-batches") +
                    " per step for pipeline_model_parallel_size=" + std::to_string(v.pp) +
                    ", so the pipeline cannot fill: stages sit idle " + figure + " of each step (bubble " +
                    (kind == pipeline::ScheduleKind::kInterleaved ? "(pp-1)/(vpp*m)" : "(pp-1)/m") + " = " +
                    text::formatNumber(bubble) + " of the compute time); make global_batch_size / "
                    "(micro_batch_size*dp) at least " + std::to_string(v.pp));
    }
  }
  return out;
}

LayoutPlan planLayout(const LayoutRequest& request) {
  std::vector<std::string> problems = checkLayout(request);
  if (!problems.empty()) throw ConfigError(problems.front());
  if (!request.groups.empty()) return planLayout(groupRequest(request, 0));
  const Values v(request);
  LayoutPlan plan;
  plan.sizes.world = static_cast<int>(v.world);
  plan.sizes.tp = static_cast<int>(v.tp);
  plan.sizes.cp = static_cast<int>(v.cp);
  plan.sizes.pp = static_cast<int>(v.pp);
  plan.sizes.vpp = static_cast<int>(v.vpp);
  // A dense model has no expert grid: checkLayout refuses ep > 1 there and
  // layoutWarnings reports etp > 1 as ignored, so both are 1.
  const bool moe = Values::model(request.num_experts) > 0;
  plan.sizes.ep = moe ? static_cast<int>(v.ep) : 1;
  plan.sizes.etp = moe ? static_cast<int>(v.etp) : 1;
  plan.dp = static_cast<int>(v.world / (v.tp * v.pp * v.cp));
  plan.edp = static_cast<int>(v.world / (int64_t{plan.sizes.etp} * plan.sizes.ep * v.pp));
  plan.global_batch_size = request.global_batch_size;
  plan.micro_batch_size_derived = !request.micro_batch_size;
  plan.micro_batch_size = plan.micro_batch_size_derived ? plan.global_batch_size / plan.dp : *request.micro_batch_size;
  plan.data_rows = *dataParallelRows(plan.global_batch_size, plan.dp, request.data_parallel_shares);
  plan.micro_batches = *std::min_element(plan.data_rows.begin(), plan.data_rows.end()) / plan.micro_batch_size;
  return plan;
}

std::optional<std::vector<int64_t>> dataParallelRows(int64_t global, int64_t dp, const std::vector<double>& shares) {
  if (dp < 1) return std::nullopt;
  if (shares.empty()) {
    if (global % dp != 0) return std::nullopt;
    return std::vector<int64_t>(static_cast<size_t>(dp), global / dp);
  }
  if (static_cast<int64_t>(shares.size()) != dp) return std::nullopt;
  double total = 0;
  for (double s : shares) {
    if (!(s > 0)) return std::nullopt;
    total += s;
  }
  std::vector<int64_t> rows;
  int64_t sum = 0;
  for (double s : shares) {
    const double exact = static_cast<double>(global) * s / total;
    const int64_t whole = static_cast<int64_t>(std::llround(exact));
    // Shares written as decimals (0.6, 0.4) are whole up to rounding.
    if (whole < 1 || std::abs(exact - static_cast<double>(whole)) > 1e-6 * std::max(1.0, exact)) return std::nullopt;
    rows.push_back(whole);
    sum += whole;
  }
  if (sum != global) return std::nullopt;
  return rows;
}

}  // namespace ptrain
