// comm/loopback: a communication backend for a world of one process.
//
// It is the smallest complete plugin: one class implementing the kind's
// interface (CommBackend), one PTRAIN_DEFINE_PLUGIN line exporting it. Every
// collective over a single rank leaves the data as it is (allgather and
// all-to-all copy input to output), so it completes immediately.
#include <ATen/ATen.h>

#include "ptrain/comm/backend.h"

namespace {

using namespace ptrain;

// A finished operation: wait() returns at once.
class DoneWork final : public Work {
 public:
  void wait(Timeout) override {}
  bool isCompleted() override { return true; }
};

class LoopbackGroup final : public ProcessGroup {
 public:
  LoopbackGroup(std::string name, int globalRank, Timeout timeout)
      : name_(std::move(name)), ranks_{globalRank}, timeout_(timeout) {}

  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return name_; }
  const std::vector<int>& globalRanks() const override { return ranks_; }
  Timeout timeout() const override { return timeout_; }

  std::shared_ptr<Work> allreduce(at::Tensor&, const AllreduceOptions&) override { return done(); }
  std::shared_ptr<Work> allgather(at::Tensor& output, const at::Tensor& input, Timeout) override {
    output.view_as(input).copy_(input);
    return done();
  }
  std::shared_ptr<Work> reduceScatter(at::Tensor& output, const at::Tensor& input,
                                      const ReduceScatterOptions&) override {
    output.copy_(input.view_as(output));
    return done();
  }
  std::shared_ptr<Work> broadcast(at::Tensor&, const BroadcastOptions&) override { return done(); }
  std::shared_ptr<Work> allToAll(at::Tensor& output, const at::Tensor& input,
                                 const AllToAllOptions&) override {
    output.copy_(input);
    return done();
  }
  std::shared_ptr<Work> barrier(const BarrierOptions&) override { return done(); }

 private:
  static std::shared_ptr<Work> done() { return std::make_shared<DoneWork>(); }
  std::string name_;
  std::vector<int> ranks_;
  Timeout timeout_;
};

class LoopbackBackend final : public CommBackend {
 public:
  explicit LoopbackBackend(const PluginContext&) {}
  std::string backendName() const override { return "loopback"; }
  std::shared_ptr<ProcessGroup> createGroup(std::shared_ptr<Store>, const GroupOptions& opts) override {
    PTRAIN_CHECK_AS(ConfigError, opts.ranks.size() == 1, "communication.backend=loopback serves one process, but group ",
                    opts.name, " has ", opts.ranks.size(), " ranks: use gloo or nccl, or --nproc 1");
    return std::make_shared<LoopbackGroup>(opts.name, opts.global_rank, opts.timeout);
  }
};

}  // namespace

PTRAIN_DEFINE_PLUGIN(ptrain::plugin_kind::kComm, "loopback", "1.0.0", LoopbackBackend)
