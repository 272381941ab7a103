// CrossGroupGradients: one gradient for device groups that hold the same
// model in different layouts (parallel.groups, layout/device_groups.h).
//
// Each group first reduces its gradients by its own layout (its data,
// tensor, pipeline plugins' finishGradients), so every rank holds its
// group's sum over the group's rows for the block of each parameter it
// holds. This hook then adds the groups' sums, on those blocks:
//
//   - the blocks are in the whole parameter's coordinates (offsets and sizes
//     along every dimension: a tensor-parallel slice, a pipeline stage's
//     whole tensor), so the exchange does not depend on either layout;
//   - at construction every rank learns every rank's blocks (one
//     all-gather over the job) and works out, for each of its blocks and each
//     other group, which ranks of that group hold the overlapping parts: of
//     the ranks holding the same block in a group (data-parallel replicas,
//     a pipeline's tied copy) the k-th replica here takes from the
//     (k mod n)-th there, so the traffic spreads over the replicas;
//   - each step every rank sends each partner the overlapping parts of its
//     gradients and receives theirs (one message each way per partner), then
//     adds the groups' parts in group order, starting from zero: every rank
//     of every group computes each element as the same sum in the same order,
//     so the groups' gradients are equal bit for bit and their optimizers
//     step alike.
//
// Runs in finishGradients after every parallel plugin (the runtime places it
// right after the precision plugin, whose finishGradients comes last).
//
// Thread-safety: the step's thread only; collective over the job.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ptrain/engine/hooks.h"

namespace ptrain {

class DeviceGroups;
class ProcessGroup;

class PTRAIN_API CrossGroupGradients final : public StepHooks {
 public:
  // A parameter this rank holds: its tensor (whose gradient is summed) and
  // where it sits in the whole parameter.
  struct Held {
    std::string name;
    at::Tensor param;
    std::vector<int64_t> full;     // the whole parameter's sizes
    std::vector<int64_t> offsets;  // of param's block in it (sizes: param's)
    // A table [rows, dim] whose gradient is zero outside the rows a step
    // looked up (ParameterPlacement::row_sparse_gradient): its parts travel
    // as the touched rows and their indices.
    bool row_sparse = false;
  };
  // Collective over `job` (every rank of every group), whose backend works
  // on `device` (the messages and the sums go there; a gradient may rest
  // elsewhere, in an offload tier). Throws ConfigError when another group
  // does not hold all of a block (a different model).
  CrossGroupGradients(std::vector<Held> held, const DeviceGroups& groups, int group,
                      std::shared_ptr<ProcessGroup> job, at::Device device);
  ~CrossGroupGradients() override;

  void finishGradients() override;
  // cross_group_bytes (sent by this rank), cross_group_s (the exchange and
  // the sums).
  std::map<std::string, double> stepStats() const override;

 private:
  struct Box {                      // a part of one held parameter
    size_t param = 0;               // index into held_
    std::vector<int64_t> offsets;   // in the whole parameter
    std::vector<int64_t> sizes;
    int group = 0;                  // the group it comes from (receives)
    int64_t numel() const;
  };
  struct Peer {
    int rank = 0;                   // in the job
    std::vector<Box> send, recv;    // in an order both ends agree on
    int64_t send_numel = 0, recv_numel = 0;
  };
  // Another group's part of a held parameter, as received.
  struct Part {
    const Box* box = nullptr;
    at::Tensor values;  // the box's values; row-sparse: its rows' values
    at::Tensor rows;    // row-sparse: the box's rows they are; else undefined
  };
  at::Tensor local(size_t param, const Box& box, const at::Tensor& t) const;
  void sumRows(size_t param, at::Tensor& grad, const std::vector<std::vector<Part>>& byGroup) const;

  std::vector<Held> held_;
  int group_ = 0;
  int groups_ = 1;
  std::shared_ptr<ProcessGroup> job_;
  at::Device device_;
  std::vector<Peer> peers_;
  double bytes_ = 0, seconds_ = 0;
};

}  // namespace ptrain
