// Communicator: this rank's view of the job's communication. Built once per
// process from the rank environment, the layout and the comm plugin: the
// rendezvous store, the world group and one group per layout dimension this
// rank belongs to (tensor, context, data, pipeline, expert, ...).
#pragma once

#include <map>
#include <memory>
#include <string>

#include "ptrain/comm/backend.h"
#include "ptrain/layout/parallel_layout.h"

namespace ptrain {

class PluginRegistry;
struct RankEnv;

struct CommunicatorOptions {
  std::string backend = "gloo";  // communication.backend
  Timeout timeout{std::chrono::seconds(300)};
};

class PTRAIN_API Communicator {
 public:
  // Rendezvous (rank 0 hosts the store at MASTER_ADDR:MASTER_PORT), load the
  // backend plugin, create the world and every layout group of this rank.
  // Throws PluginLoadError / TimeoutError / CommError.
  Communicator(const RankEnv& env, ParallelLayout layout, PluginRegistry& registry, const PluginContext& ctx,
               const CommunicatorOptions& options);
  ~Communicator();

  int rank() const { return rank_; }
  const ParallelLayout& layout() const { return layout_; }
  ProcessGroup& world() { return *world_; }
  // This rank's group of `kind`.
  std::shared_ptr<ProcessGroup> group(GroupKind kind) const;

 private:
  int rank_ = 0;
  ParallelLayout layout_;
  std::shared_ptr<Store> store_;
  std::unique_ptr<Plugin> backendPlugin_;
  std::shared_ptr<ProcessGroup> world_;
  std::map<GroupKind, std::shared_ptr<ProcessGroup>> groups_;
};

}  // namespace ptrain
