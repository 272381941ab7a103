// Layout checks: does a parallel layout split the model, the batch and the
// world it will run on?
//
// The checks read sizes, not a recipe: a LayoutRequest holds the parallel
// sizes, the model's shape and the batch, plus where each key was written so
// that every message can start with it. engine/recipe_layout.h builds a
// request from a validated Recipe (and has Recipe overloads of these
// functions). Each failure is one line, prefixed with the location of the
// offending key, naming both numbers and what would fit, e.g.
//   recipe.yaml:7:3: pipeline_model_parallel_size=3 does not divide num_layers=8: use 1, 2, 4 or 8, ...
// Model sizes a request leaves unset (a trainer without attention heads, say)
// are not checked.
//
// Thread-safety: pure functions of their arguments (and of `where`).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ptrain/core/error.h"
#include "ptrain/layout/device_groups.h"
#include "ptrain/layout/parallel_layout.h"

namespace ptrain {

// What the layout checks read. Sizes use Megatron-LM's names (the recipe
// keys in parallel.*, model.*, train.*); messages name the keys the same way.
struct LayoutRequest {
  int64_t world = 1;                 // ranks in the job
  int64_t tp = 1;                    // parallel.tensor_model_parallel_size
  int64_t cp = 1;                    // parallel.context_parallel_size
  int64_t pp = 1;                    // parallel.pipeline_model_parallel_size
  int64_t vpp = 1;                   // parallel.virtual_pipeline_model_parallel_size
  int64_t ep = 1;                    // parallel.expert_model_parallel_size
  int64_t etp = 1;                   // parallel.expert_tensor_parallel_size
  bool sequence_parallel = false;    // parallel.sequence_parallel
  std::string pipeline_schedule = "1f1b";               // parallel.pipeline_schedule: 1f1b, interleaved, gpipe
  std::optional<std::vector<int64_t>> pipeline_layout;  // blocks per (virtual) stage; unset: an even split

  // The model's shape (model.*); unset: not checked.
  std::optional<int64_t> num_layers;
  std::optional<int64_t> hidden_size;
  std::optional<int64_t> num_attention_heads;
  std::optional<int64_t> ffn_hidden_size;  // 0: 4 * hidden_size
  std::optional<int64_t> seq_length;
  std::optional<int64_t> num_experts;      // 0: a dense model
  std::optional<int64_t> moe_router_topk;

  int64_t global_batch_size = 1;              // train.global_batch_size
  std::optional<int64_t> micro_batch_size;    // train.micro_batch_size; unset: global / dp
  // parallel.data_parallel_shares: each data-parallel rank's weight in the
  // split of the global batch (rank i takes global * share_i / sum rows);
  // empty: an even split.
  std::vector<double> data_parallel_shares;

  // parallel.groups (layout/device_groups.h): device groups of one job, in
  // rank order, each a whole replica of the model in its own layout. Empty:
  // the sizes above for every rank. With groups the job-wide sizes above stay
  // at 1 and each group's own request (groupRequest) is checked instead.
  struct Group {
    std::string name;   // as written, else "group<i>"
    std::string where;  // its entry, "file:line:col"
    int64_t ranks = 0;
    int64_t tp = 1, pp = 1;
    int64_t vpp = 1;                // virtual_pipeline_model_parallel_size: >1 runs the interleaved schedule
    int64_t ep = 1;                 // expert_model_parallel_size
    std::optional<int64_t> etp;     // expert_tensor_parallel_size; unset: its tp (Megatron's default)
    std::optional<int64_t> micro_batch_size;  // unset: train.micro_batch_size
    double share = 0;   // 0: its rank count
  };
  std::vector<Group> groups;
  // Entries of parallel.groups that did not read (an unknown key, a value
  // that is not a number), one line each; checkLayout reports them.
  std::vector<std::string> group_problems;

  // Where messages point. `written` holds the dotted keys the user wrote (in
  // a file or on the command line) rather than left at their defaults; a
  // message about several keys blames the first of them found here, else the
  // first it names. `where(key)` returns the location of that key without a
  // trailing ": ", e.g. "r.yaml:7:3" or "<command line>", and for a key not in
  // `written` where it would be written (its section, or the recipe file).
  // Null: messages carry no location.
  std::set<std::string> written;
  std::function<std::string(const std::string& key)> where;
};

// The layout a request resolves to.
struct LayoutPlan {
  LayoutSizes sizes;                     // world, tp, cp, pp, vpp, ep, etp
  int dp = 1;                            // world / (tp * cp * pp)
  int edp = 1;                           // world / (etp * ep * pp)
  int64_t global_batch_size = 0;
  int64_t micro_batch_size = 0;          // micro_batch_size, or global / dp when it is not set
  bool micro_batch_size_derived = false; // true when not set in the request
  int64_t micro_batches = 0;             // per step and data-parallel rank: global / (micro * dp);
                                         // with uneven shares the fewest any rank takes
  std::vector<int64_t> data_rows;        // rows of the global batch each data-parallel rank takes
};

// The rows of a `global` batch each of `dp` data-parallel ranks takes:
// global * share_i / sum(shares), or global / dp each when `shares` is
// empty. Nullopt when the shares do not give whole rows (or their count is
// not dp, or one is not above 0).
PTRAIN_API std::optional<std::vector<int64_t>> dataParallelRows(int64_t global, int64_t dp,
                                                               const std::vector<double>& shares);

// One device group's own request (request.groups[index]): its ranks as the
// world, its sizes and micro-batch size, its rows of the global batch (0 when
// the shares give no whole rows), the rest as the job's.
PTRAIN_API LayoutRequest groupRequest(const LayoutRequest& request, size_t index);
// The groups as the run uses them (rank ranges, shares; share 0 becomes the
// rank count). Call on a request checkLayout accepts.
PTRAIN_API DeviceGroups deviceGroupsOf(const LayoutRequest& request);

// Every reason the layout cannot run, one line each; empty when it can.
// With device groups: the groups' entries, the job-wide sizes they replace
// (refused when written), their ranks against the world, the split of the
// global batch by share, and each group's own layout (the checks below, on
// groupRequest), each line naming the group.
// Checks: the world splits into tp*pp*cp and into the expert grid
// etp*ep*pp; num_layers splits into pp (times vpp), or pipeline_layout has
// pp*vpp entries summing to num_layers; the schedule fits vpp;
// num_attention_heads and ffn_hidden_size split across tp; hidden_size
// across the heads; num_experts across ep (and moe_router_topk fits
// num_experts); global_batch_size splits into micro_batch_size * dp;
// seq_length splits across cp, and across tp*cp with sequence_parallel;
// data_parallel_shares has one share above 0 per data-parallel rank, gives
// whole rows that split into micro_batch_size (which it needs set), and is
// not used with expert parallelism (whose all-to-alls need every rank to run
// the same micro-batches).
PTRAIN_API std::vector<std::string> checkLayout(const LayoutRequest& request);

// Settings that are allowed but do nothing or waste work, one line each
// (sequence_parallel with tp=1, fewer micro-batches than pipeline stages,
// expert parallel sizes on a dense model).
PTRAIN_API std::vector<std::string> layoutWarnings(const LayoutRequest& request);

// The resolved layout. Throws ConfigError with the first checkLayout()
// message when the request does not fit. With device groups: the first
// group's. A dense model (num_experts unset or
// 0) gets ep = etp = 1.
PTRAIN_API LayoutPlan planLayout(const LayoutRequest& request);

}  // namespace ptrain
