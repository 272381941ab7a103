#include "ptrain/comm/communicator.h"

#include "ptrain/core/logging.h"
#include "ptrain/comm/rank_env.h"
#include "ptrain/plugin/registry.h"

namespace ptrain {

Communicator::Communicator(const RankEnv& env, ParallelLayout layout, PluginRegistry& registry,
                           const PluginContext& ctx, const CommunicatorOptions& options)
    : rank_(env.rank), layout_(std::move(layout)) {
  PTRAIN_CHECK_AS(ConfigError, env.world_size == layout_.world(), "world size ", env.world_size,
                  " does not match the layout's ", layout_.world());
  TcpStoreOptions storeOptions;
  storeOptions.host = env.master_addr;
  storeOptions.port = env.master_port;
  storeOptions.is_server = env.rank == 0;
  storeOptions.world_size = env.world_size;
  storeOptions.timeout = options.timeout;
  store_ = createTcpStore(storeOptions);

  backendPlugin_ = registry.create(plugin_kind::kComm, options.backend, ctx, "communication.backend");
  auto* backend = static_cast<CommBackend*>(backendPlugin_.get());

  auto make = [&](const std::string& name, const std::vector<int>& ranks) {
    GroupOptions g;
    g.name = name;
    g.ranks = ranks;
    g.global_rank = env.rank;
    g.timeout = options.timeout;
    return backend->createGroup(store_, g);
  };
  std::vector<int> all(env.world_size);
  for (int r = 0; r < env.world_size; ++r) all[r] = r;
  world_ = make("world", all);
  // Every rank creates its groups in the same order, so members of one group
  // always rendezvous together.
  for (GroupKind kind : {GroupKind::kTensor, GroupKind::kContext, GroupKind::kData, GroupKind::kPipeline,
                         GroupKind::kModel, GroupKind::kExpert, GroupKind::kExpertTensor, GroupKind::kExpertData}) {
    auto ranks = layout_.groupOf(kind, env.rank);
    groups_[kind] = ranks.size() == all.size() ? world_ : make(ParallelLayout::groupName(kind, ranks), ranks);
  }
  logger()->debug("communicator ready: {} via {}", layout_.describe(), options.backend);
}

Communicator::~Communicator() = default;

std::shared_ptr<ProcessGroup> Communicator::group(GroupKind kind) const {
  auto it = groups_.find(kind);
  PTRAIN_CHECK(it != groups_.end(), "no ", toString(kind), " group was created");
  return it->second;
}

}  // namespace ptrain
