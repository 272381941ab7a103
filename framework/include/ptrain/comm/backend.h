// CommBackend: the interface of a `comm` plugin (gloo, nccl, ...).
//
// The core creates one backend per process, from `communication.backend`,
// then asks it for the world group and one group per layout group.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ptrain/comm/process_group.h"
#include "ptrain/comm/store.h"
#include "ptrain/plugin/plugin.h"

namespace ptrain {

struct GroupOptions {
  std::string name;          // unique across the job, e.g. "tp0"; used as store prefix
  std::vector<int> ranks;    // global ranks of the members, sorted; this rank among them
  int global_rank = 0;       // this process's global rank
  Timeout timeout{std::chrono::seconds(300)};
};

class PTRAIN_API CommBackend : public Plugin {
 public:
  ~CommBackend() override;
  const char* kind() const final { return plugin_kind::kComm; }
  // e.g. "gloo"
  virtual std::string backendName() const = 0;
  // Creates a group of `opts.ranks`. Only members call it; they must all call
  // it with the same name and ranks. Blocks until every member has joined,
  // or throws TimeoutError after opts.timeout.
  virtual std::shared_ptr<ProcessGroup> createGroup(std::shared_ptr<Store> store,
                                                    const GroupOptions& opts) = 0;
};

}  // namespace ptrain
