// What every comm conformance test needs inside one forked rank: the backend
// plugin loaded from the build tree, a TCP store, and the world group.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "ptrain/comm/backend.h"
#include "ptrain/plugin/plugin.h"

namespace ptrain::test {

// The comm plugins under test and the largest world each serves.
struct CommPluginUnderTest {
  std::string name;
  std::string path;  // the library in the build tree
  int max_world = 1;
};
const std::vector<CommPluginUnderTest>& commPluginsUnderTest();
std::string commPluginPath(const std::string& backend);

// One rank's connection to the job. Created inside a child of runRanks, never
// in the test process itself (no libtorch threads may exist across fork).
class CommRank {
 public:
  CommRank(const std::string& backend, int rank, int worldSize, int port,
           std::chrono::milliseconds timeout = std::chrono::seconds(30));
  ~CommRank();

  CommBackend& backend() { return *backend_; }
  const std::shared_ptr<Store>& store() const { return store_; }
  ProcessGroup& world() { return *world_; }
  // A group of `ranks` (global, sorted); this rank must be one of them.
  std::shared_ptr<ProcessGroup> group(const std::string& name, const std::vector<int>& ranks,
                                      std::chrono::milliseconds timeout = std::chrono::seconds(30));
  int rank() const { return rank_; }
  int worldSize() const { return world_size_; }

 private:
  int rank_;
  int world_size_;
  std::unique_ptr<Plugin> plugin_;
  CommBackend* backend_ = nullptr;
  std::shared_ptr<Store> store_;
  std::shared_ptr<ProcessGroup> world_;
};

// Runs `body` on `worldSize` forked ranks, each with a CommRank for `backend`;
// fails the current test with the children's report when any rank fails.
void runCommRanks(const std::string& backend, int worldSize,
                  const std::function<void(CommRank& comm)>& body, double timeoutSeconds = 60,
                  std::chrono::milliseconds groupTimeout = std::chrono::seconds(30));

// "float32" etc. for test names.
const char* dtypeName(at::ScalarType t);

}  // namespace ptrain::test
