#include "ptrain/comm/communicator.h"

#include <torch/torch.h>

#include "ptrain/core/logging.h"
#include "ptrain/comm/rank_env.h"
#include "ptrain/plugin/registry.h"

namespace ptrain {
namespace {

// A group of one member: every collective leaves its member with what it
// passed in, as a group of one must. Used by Communicator::loopback.
class SelfGroup final : public ProcessGroup {
 public:
  SelfGroup(std::string name, int globalRank, Timeout timeout)
      : name_(std::move(name)), ranks_{globalRank}, timeout_(timeout) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return name_; }
  const std::vector<int>& globalRanks() const override { return ranks_; }
  Timeout timeout() const override { return timeout_; }

  std::shared_ptr<Work> allreduce(at::Tensor&, const AllreduceOptions&) override { return done(); }
  std::shared_ptr<Work> allgather(at::Tensor& output, const at::Tensor& input, Timeout) override {
    if (!output.is_same(input)) output.copy_(input.view(output.sizes()));
    return done();
  }
  std::shared_ptr<Work> reduceScatter(at::Tensor& output, const at::Tensor& input,
                                      const ReduceScatterOptions&) override {
    if (!output.is_same(input)) output.copy_(input.view(output.sizes()));
    return done();
  }
  std::shared_ptr<Work> broadcast(at::Tensor&, const BroadcastOptions&) override { return done(); }
  std::shared_ptr<Work> allToAll(at::Tensor& output, const at::Tensor& input, const AllToAllOptions&) override {
    if (!output.is_same(input)) output.copy_(input.view(output.sizes()));
    return done();
  }
  std::shared_ptr<Work> barrier(const BarrierOptions&) override { return done(); }

 private:
  struct Done final : Work {
    void wait(Timeout) override {}
    bool isCompleted() override { return true; }
  };
  static std::shared_ptr<Work> done() { return std::make_shared<Done>(); }

  std::string name_;
  std::vector<int> ranks_;
  Timeout timeout_;
};

constexpr GroupKind kAllKinds[] = {GroupKind::kTensor,   GroupKind::kContext,      GroupKind::kData,
                                   GroupKind::kPipeline, GroupKind::kDataContext,  GroupKind::kModel,
                                   GroupKind::kExpert,   GroupKind::kExpertTensor, GroupKind::kExpertData};

}  // namespace

LayoutGroups::LayoutGroups(ParallelLayout layout, int rank, std::shared_ptr<ProcessGroup> world,
                           std::map<GroupKind, std::shared_ptr<ProcessGroup>> groups)
    : layout_(std::move(layout)), rank_(rank), world_(std::move(world)), groups_(std::move(groups)) {}

std::shared_ptr<ProcessGroup> LayoutGroups::group(GroupKind kind) const {
  auto it = groups_.find(kind);
  PTRAIN_CHECK(it != groups_.end(), "no ", toString(kind), " group was created");
  return it->second;
}

Communicator::Communicator(const RankEnv& env, ParallelLayout layout, PluginRegistry& registry,
                           const PluginContext& ctx, const CommunicatorOptions& options)
    : rank_(env.rank), timeout_(options.timeout) {
  PTRAIN_CHECK_AS(ConfigError, env.world_size == layout.world(), "world size ", env.world_size,
                  " does not match the layout's ", layout.world());
  TcpStoreOptions storeOptions;
  storeOptions.host = env.master_addr;
  storeOptions.port = env.master_port;
  storeOptions.is_server = env.rank == 0;
  storeOptions.world_size = env.world_size;
  storeOptions.timeout = options.timeout;
  store_ = createTcpStore(storeOptions);

  backendPlugin_ = registry.create(plugin_kind::kComm, options.backend, ctx, "communication.backend");
  backend_ = backendPlugin_.get();
  std::vector<int> all(static_cast<size_t>(env.world_size));
  for (int r = 0; r < env.world_size; ++r) all[static_cast<size_t>(r)] = r;
  world_ = groupOf("world", all);
  main_ = groupsFor(layout);
  logger()->debug("communicator ready: {} via {}", layout.describe(), options.backend);
}

std::unique_ptr<Communicator> Communicator::loopback(const ParallelLayout& layout) {
  PTRAIN_CHECK_AS(ConfigError, layout.world() == 1, "a loopback communicator has one rank; the layout has ",
                  layout.world());
  std::unique_ptr<Communicator> comm(new Communicator());
  comm->world_ = comm->groupOf("world", {0});
  comm->main_ = comm->groupsFor(layout);
  return comm;
}

Communicator::~Communicator() = default;

std::unique_ptr<Communicator> Communicator::part(int first, int size, const ParallelLayout& layout) {
  PTRAIN_CHECK(rank_ >= first && rank_ < first + size, "rank ", rank_, " is not in ranks [", first, ", ",
               first + size, ")");
  PTRAIN_CHECK(layout.world() == size, "layout ", layout.describe(), " is not for ", size, " ranks");
  std::unique_ptr<Communicator> sub(new Communicator());
  sub->rank_ = rank_ - first;
  sub->offset_ = offset_ + first;
  sub->timeout_ = timeout_;
  sub->store_ = store_;
  sub->backend_ = backend_;
  std::vector<int> ranks;
  for (int r = 0; r < size; ++r) ranks.push_back(sub->offset_ + r);
  // Made by this communicator: a part spanning all of it is its world.
  std::string name = "part[";
  for (size_t i = 0; i < ranks.size(); ++i) name += (i ? "," : "") + std::to_string(ranks[i]);
  sub->world_ = groupOf(name + "]", ranks);
  sub->main_ = sub->groupsFor(layout);
  return sub;
}

std::shared_ptr<ProcessGroup> Communicator::groupOf(const std::string& name, const std::vector<int>& ranks) {
  auto it = byName_.find(name);
  if (it != byName_.end()) return it->second;
  std::shared_ptr<ProcessGroup> group;
  if (world_ && ranks.size() == static_cast<size_t>(world_->size())) {
    group = world_;  // a layout group spanning every rank is the world
  } else if (ranks.size() == 1 || backend_ == nullptr) {
    // One member needs no backend: its collectives are identities.
    group = std::make_shared<SelfGroup>(name, rank_ + offset_, timeout_);
  } else {
    GroupOptions g;
    g.name = name;
    g.ranks = ranks;
    g.global_rank = rank_ + offset_;
    g.timeout = timeout_;
    group = static_cast<CommBackend*>(backend_)->createGroup(store_, g);
  }
  byName_.emplace(name, group);
  return group;
}

std::shared_ptr<const LayoutGroups> Communicator::groupsFor(const ParallelLayout& layout) {
  PTRAIN_CHECK_AS(ConfigError, layout.world() == world_->size(), "layout ", layout.describe(), " is for ",
                  layout.world(), " ranks, but the job has ", world_->size());
  const std::string key = layout.describe();
  auto it = layouts_.find(key);
  if (it != layouts_.end()) return it->second;
  // Every rank creates its groups in the same order, so members of one group
  // always rendezvous together.
  // A kind whose ranks equal an earlier kind's (the model group at pp=1 is
  // the tensor group, say) shares that group.
  std::map<GroupKind, std::shared_ptr<ProcessGroup>> groups;
  std::map<std::vector<int>, std::shared_ptr<ProcessGroup>> byRanks;
  for (GroupKind kind : kAllKinds) {
    auto ranks = layout.groupOf(kind, rank_);
    for (int& r : ranks) r += offset_;  // the job's numbering
    auto same = byRanks.find(ranks);
    groups[kind] = same != byRanks.end() ? same->second : groupOf(ParallelLayout::groupName(kind, ranks), ranks);
    byRanks.emplace(ranks, groups[kind]);
  }
  auto made = std::make_shared<const LayoutGroups>(layout, rank_, world_, std::move(groups));
  layouts_.emplace(key, made);
  return made;
}

}  // namespace ptrain
