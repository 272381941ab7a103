// Communicator: this rank's view of the job's communication. Built once per
// process from the rank environment and the comm plugin: the rendezvous
// store, the world group, and the groups of every layout a runtime asks for
// (tensor, context, data, pipeline, expert, ...).
//
// Several layouts may share the same ranks (an actor trained at tp=2 beside a
// rollout model at tp=1, say): each gets its own LayoutGroups, and a group of
// the same kind over the same ranks is created once and shared, since its
// members issue their collectives from one thread in one order anyway.
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

// The groups one rank belongs to in one layout.
class PTRAIN_API LayoutGroups {
 public:
  LayoutGroups(ParallelLayout layout, int rank, std::shared_ptr<ProcessGroup> world,
               std::map<GroupKind, std::shared_ptr<ProcessGroup>> groups);

  const ParallelLayout& layout() const { return layout_; }
  // This process's global rank.
  int rank() const { return rank_; }
  ProcessGroup& world() const { return *world_; }
  const std::shared_ptr<ProcessGroup>& worldGroup() const { return world_; }
  // This rank's group of `kind`. Throws InternalError when there is none.
  std::shared_ptr<ProcessGroup> group(GroupKind kind) const;
  // This rank's index within its group of `kind` (its coordinate on that axis).
  int indexIn(GroupKind kind) const { return group(kind)->rank(); }

 private:
  ParallelLayout layout_;
  int rank_ = 0;
  std::shared_ptr<ProcessGroup> world_;
  std::map<GroupKind, std::shared_ptr<ProcessGroup>> groups_;
};

class PTRAIN_API Communicator {
 public:
  // Rendezvous (rank 0 hosts the store at MASTER_ADDR:MASTER_PORT), load the
  // backend plugin, create the world and the groups of `layout` (the job's
  // main layout). Collective: every rank constructs it together. Throws
  // PluginLoadError / TimeoutError / CommError.
  Communicator(const RankEnv& env, ParallelLayout layout, PluginRegistry& registry, const PluginContext& ctx,
               const CommunicatorOptions& options);
  // One process, no store and no plugin: every group has one member and
  // collectives return their input (a loopback for tests and single-process
  // tools).
  static std::unique_ptr<Communicator> loopback(const ParallelLayout& layout = ParallelLayout(LayoutSizes{}));
  ~Communicator();

  int rank() const { return rank_; }
  int worldSize() const { return world_->size(); }
  ProcessGroup& world() { return *world_; }
  // The main layout and this rank's groups in it.
  const ParallelLayout& layout() const { return main_->layout(); }
  const LayoutGroups& groups() const { return *main_; }
  std::shared_ptr<ProcessGroup> group(GroupKind kind) const { return main_->group(kind); }

  // This rank's groups in `layout` over the same world. The first call for a
  // layout creates the groups it does not share with earlier layouts: a
  // collective, so every rank asks for the same layouts in the same order.
  // Throws ConfigError when the layout is for another world size.
  std::shared_ptr<const LayoutGroups> groupsFor(const ParallelLayout& layout);
  // The communicator of this communicator's ranks [first, first + size), for
  // one device group of a job (parallel.groups): its world is those ranks'
  // group, its ranks count from 0 (rank() - first), and the groups of every
  // layout it is asked for hold the job's ranks underneath (so two device
  // groups' "tp[0,1]" never meet). Only the members call it, together. It
  // must not outlive this communicator. Throws InternalError when this rank
  // is not in the range.
  std::unique_ptr<Communicator> part(int first, int size, const ParallelLayout& layout);
  // The job's rank of this communicator's rank 0 (0 unless made by part()).
  int firstJobRank() const { return offset_; }

  // The rendezvous store every rank shares (rank 0 hosts it), for small
  // facts beside the collectives (the engine records each rank's step there,
  // for a timeout's message); null for a loopback.
  Store* store() { return store_.get(); }

 private:
  Communicator() = default;
  // `ranks` in the job's numbering.
  std::shared_ptr<ProcessGroup> groupOf(const std::string& name, const std::vector<int>& ranks);

  int rank_ = 0;
  int offset_ = 0;             // the job's rank of rank 0 here
  Plugin* backend_ = nullptr;  // backendPlugin_, or the parent's (part())
  Timeout timeout_{std::chrono::seconds(300)};
  std::shared_ptr<Store> store_;
  std::unique_ptr<Plugin> backendPlugin_;
  std::shared_ptr<ProcessGroup> world_;
  std::map<std::string, std::shared_ptr<ProcessGroup>> byName_;    // every group created, by name
  std::map<std::string, std::shared_ptr<const LayoutGroups>> layouts_;  // by ParallelLayout::describe()
  std::shared_ptr<const LayoutGroups> main_;
};

}  // namespace ptrain
